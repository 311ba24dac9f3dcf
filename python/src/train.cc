// Modules' param stores, the built-in Transformer LMs, optimizers, meshes and px::TrainStep.
// Thin: TrainStep is bound through its public constructor and calls only (not its executables).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "parallax/memory.h"
#include "parallax/nn/transformer.h"
#include "parallax/optim.h"
#include "parallax/parallel.h"
#include "parallax/train.h"

namespace pxpy {
namespace {

using px::Tensor;
namespace nn = px::nn;
namespace optim = px::optim;

// An optimizer handle (OptimizerPtr is a shared_ptr to const).
struct Optimizer {
  optim::OptimizerPtr ptr;
};

// Declares a param at a dotted path under the root scope (the values come from Python).
// `init` draws it when the step initializes from a seed (a param a factory made without values).
void declare(nn::Scope& root, const std::string& path, px::DType dtype, const px::Shape& shape,
             const nn::Init& init) {
  nn::Scope s = root;
  size_t start = 0;
  for (size_t dot; (dot = path.find('.', start)) != std::string::npos; start = dot + 1)
    s = s.sub(path.substr(start, dot - start));
  s.param(path.substr(start), {dtype, shape}, init);
}

// A state whose params are `values[i]` where given (full host arrays, split onto the devices) and
// otherwise drawn from the store's initializers where each shard lives (nn::init_box): a model
// built by a create_sharded_model factory never exists whole.
px::TrainState init_partly(const px::TrainStep& step, const nn::ParamStore& store, uint64_t seed,
                           const std::vector<std::optional<px::Array>>& values) {
  if (values.size() != static_cast<size_t>(store.size()))
    throw px::Error("TrainStep.init: " + std::to_string(values.size()) + " values for " +
                    std::to_string(store.size()) + " params");
  px::TrainState s = step.begin_state();
  for (int i = 0; i < store.size(); ++i) {
    if (values[i]) {
      step.set_param(s, i, *values[i]);
      continue;
    }
    const nn::ParamSpec& spec = store.spec(i);
    step.set_param(s, i, [&spec, seed](const std::vector<int64_t>& offsets, px::Array& out) {
      nn::init_box(spec, seed, offsets, out);
    });
  }
  return s;
}

void bind_memory(nb::module_& m) {
  nb::class_<px::MemoryStats>(m, "MemoryStats", "Bytes px holds (px::MemoryStats).")
      .def_ro("bytes_in_use", &px::MemoryStats::bytes_in_use)
      .def_ro("peak_bytes_in_use", &px::MemoryStats::peak_bytes_in_use)
      .def_ro("allocations", &px::MemoryStats::allocations)
      .def("__repr__", [](const px::MemoryStats& s) {
        return "MemoryStats(bytes_in_use=" + std::to_string(s.bytes_in_use) +
               ", peak_bytes_in_use=" + std::to_string(s.peak_bytes_in_use) + ")";
      });
  auto placement = [](int device, const std::string& kind, const std::string& platform) {
    return px::Placement{device, px::parse_memory_kind(kind), platform};
  };
  m.def(
      "memory_stats",
      [placement](int device, const std::string& kind, const std::string& platform) {
        return px::memory_stats(placement(device, kind, platform));
      },
      nb::arg("device") = 0, nb::arg("kind") = "device", nb::arg("platform") = "cpu",
      "The bytes px holds on one device (on the CPU backend: that device's pool of host memory).");
  m.def(
      "reset_peak_memory",
      [placement](int device, const std::string& kind, const std::string& platform) {
        px::reset_peak_memory(placement(device, kind, platform));
      },
      nb::arg("device") = 0, nb::arg("kind") = "device", nb::arg("platform") = "cpu");
  m.def("platform_memory_stats", &px::platform_memory_stats, nb::arg("platform") = "cpu",
        "The bytes px holds over every device and memory kind of a platform (cpu: the host memory px holds).");
  m.def("reset_platform_peak_memory", &px::reset_platform_peak_memory, nb::arg("platform") = "cpu");
}

optim::ParamFilter decay_filter(const std::optional<std::vector<std::string>>& exclude, int min_rank) {
  if (exclude) return optim::exclude_paths(*exclude);
  return min_rank > 0 ? optim::rank_at_least(min_rank) : optim::all_params();
}

// (glob, spec text) pairs: sharding rules as ShardingOptions::rules and activation_rules take them.
using Rules = std::vector<std::pair<std::string, std::string>>;

px::TrainStepOptions step_options(std::optional<px::Mesh> mesh, px::ShardingStrategy strategy,
                                  const std::string& data_axis, const std::string& model_axis, double clip_norm,
                                  int microbatches, bool skip_nonfinite, const px::CompileOptions& compile,
                                  double auto_time_limit_s, const std::string& auto_cluster, const std::string& remat,
                                  int64_t remat_budget_bytes, const std::vector<std::string>& offload_params,
                                  bool offload_optimizer_state, const Rules& rules, const Rules& activation_rules) {
  px::TrainStepOptions o;
  o.mesh = std::move(mesh);
  o.strategy = strategy;
  o.sharding.data_axis = data_axis;
  o.sharding.model_axis = model_axis;
  o.sharding.auto_time_limit_s = auto_time_limit_s;
  o.sharding.auto_cluster = auto_cluster;
  o.clip_norm = clip_norm;
  o.microbatches = microbatches;
  o.skip_nonfinite = skip_nonfinite;
  o.compile = compile;
  o.remat.policy = px::parse_remat_policy(remat);
  o.remat.budget_bytes = remat_budget_bytes;
  o.offload.params = offload_params;
  o.offload.optimizer_state = offload_optimizer_state;
  for (auto& [glob, spec] : rules) o.sharding.rules.push_back({glob, px::PartitionSpec::parse(spec)});
  for (auto& [glob, spec] : activation_rules)
    o.sharding.activation_rules.push_back({glob, px::PartitionSpec::parse(spec)});
  return o;
}

std::vector<px::TensorType> batch_types(const std::vector<std::pair<px::DType, px::Shape>>& ts) {
  std::vector<px::TensorType> out;
  for (auto& [d, s] : ts) out.push_back({d, s});
  return out;
}

// The keyword arguments every TrainStep constructor takes.
#define PX_STEP_KWARGS                                                                                               \
  nb::kw_only(), nb::arg("mesh") = nb::none(), nb::arg("strategy") = px::ShardingStrategy::DDP,                      \
                 nb::arg("data_axis") = "data", nb::arg("model_axis") = "model", nb::arg("clip_norm") = 0.0,         \
                 nb::arg("microbatches") = 1, nb::arg("skip_nonfinite") = false,                                     \
                 nb::arg("compile") = px::CompileOptions(), nb::arg("auto_time_limit_s") = 10.0,                     \
                 nb::arg("auto_cluster") = "cpu", nb::arg("remat") = "none", nb::arg("remat_budget_bytes") = 0,      \
                 nb::arg("offload_params") = std::vector<std::string>{}, nb::arg("offload_optimizer_state") = false, \
                 nb::arg("rules") = Rules{}, nb::arg("activation_rules") = Rules {}

}  // namespace

void bind_train(nb::module_& m) {
  bind_memory(m);
  // ---- params ----------------------------------------------------------------------------------
  nb::class_<nn::ParamStore>(m, "ParamStore", "The params of one model, in declaration order.")
      .def_prop_ro("size", &nn::ParamStore::size)
      .def("paths", &nn::ParamStore::paths)
      .def("types",
           [](const nn::ParamStore& s) {
             std::vector<std::pair<px::DType, px::Shape>> out;
             for (auto& t : s.types()) out.emplace_back(t.dtype, t.shape);
             return out;
           })
      .def("param_count", &nn::ParamStore::param_count)
      .def("table", &nn::ParamStore::table)
      .def("init", &nn::ParamStore::init, nb::arg("seed"), "Initial values of every param (declaration order).")
      .def(
          "values",
          [](const nn::ParamStore& s) {
            std::vector<Tensor> out;
            for (int i = 0; i < s.size(); ++i) out.push_back(s.value(i));
            return out;
          },
          "The Tensors bound to the params while a step traces its loss.");

  nb::class_<nn::Init>(m, "Init",
                       "How a param's initial values are drawn (px::nn::Init): counter-based, the same bits on any mesh.")
      .def_static("zeros", &nn::Init::zeros)
      .def_static("ones", &nn::Init::ones)
      .def_static("constant", &nn::Init::constant, nb::arg("value"))
      .def_static("normal", &nn::Init::normal, nb::arg("std"))
      .def_static("truncated_normal", &nn::Init::truncated_normal, nb::arg("std"))
      .def_static("uniform", &nn::Init::uniform, nb::arg("lo"), nb::arg("hi"))
      .def_static("lecun_normal", &nn::Init::lecun_normal, nb::arg("scale") = 1.0)
      .def_rw("fan_in_scaled", &nn::Init::fan_in_scaled, "std (or the bounds) divided by sqrt(fan_in)")
      .def("__repr__", &nn::Init::to_string);

  nb::class_<nn::Scope>(m, "Scope", "The root of a module tree: a new ParamStore.")
      .def(nb::init<>())
      .def_prop_ro("store", &nn::Scope::store, nb::rv_policy::reference_internal)
      .def("declare", &declare, nb::arg("path"), nb::arg("dtype"), nb::arg("shape"),
           nb::arg("init") = nn::Init::zeros());

  // ---- Transformer LMs -------------------------------------------------------------------------
  nb::enum_<nn::NormKind>(m, "NormKind")
      .value("layer_norm", nn::NormKind::layer_norm)
      .value("rms_norm", nn::NormKind::rms_norm);
  nb::enum_<nn::MlpKind>(m, "MlpKind").value("gelu", nn::MlpKind::gelu).value("swiglu", nn::MlpKind::swiglu);
  nb::enum_<nn::PositionKind>(m, "PositionKind")
      .value("learned", nn::PositionKind::learned)
      .value("rotary", nn::PositionKind::rotary);
  nb::class_<nn::LmConfig>(m, "LmConfig", "A Transformer LM's sizes and flavour (px::nn::LmConfig).")
      .def(nb::init<>())
      .def_rw("name", &nn::LmConfig::name)
      .def_rw("vocab_size", &nn::LmConfig::vocab_size)
      .def_rw("d_model", &nn::LmConfig::d_model)
      .def_rw("n_heads", &nn::LmConfig::n_heads)
      .def_rw("n_kv_heads", &nn::LmConfig::n_kv_heads)
      .def_rw("n_layers", &nn::LmConfig::n_layers)
      .def_rw("d_ff", &nn::LmConfig::d_ff)
      .def_rw("max_seq_len", &nn::LmConfig::max_seq_len)
      .def_rw("norm", &nn::LmConfig::norm)
      .def_rw("mlp", &nn::LmConfig::mlp)
      .def_rw("positions", &nn::LmConfig::positions)
      .def_rw("tied_embedding", &nn::LmConfig::tied_embedding)
      .def_rw("bias", &nn::LmConfig::bias)
      .def_rw("norm_eps", &nn::LmConfig::norm_eps)
      .def_rw("rope_theta", &nn::LmConfig::rope_theta)
      .def_rw("init_std", &nn::LmConfig::init_std)
      .def_rw("compute_dtype", &nn::LmConfig::compute_dtype)
      .def_rw("fused_head", &nn::LmConfig::fused_head, "the LM head and loss as one linear_cross_entropy")
      .def("validate", &nn::LmConfig::validate)
      .def("__str__", &nn::LmConfig::to_string)
      .def_static("preset", &nn::lm_config, nb::arg("name"), "gpt2_tiny, bench_gpt, llama_tiny, gpt2_small, ...")
      .def_static("gpt2", &nn::gpt2_config, nb::arg("name"), nb::arg("vocab"), nb::arg("d_model"), nb::arg("n_heads"),
                  nb::arg("n_layers"), nb::arg("d_ff"), nb::arg("max_seq_len"))
      .def_static("llama", &nn::llama_config, nb::arg("name"), nb::arg("vocab"), nb::arg("d_model"), nb::arg("n_heads"),
                  nb::arg("n_kv_heads"), nb::arg("n_layers"), nb::arg("d_ff"), nb::arg("max_seq_len"));

  nb::class_<nn::TransformerLm>(m, "TransformerLm", nb::is_weak_referenceable(),
                                "The built-in GPT-2 / Llama LM (px::nn::TransformerLm).")
      .def(nb::init<const nn::LmConfig&>(), nb::arg("config"))
      .def_prop_ro("config", &nn::TransformerLm::config)
      .def_prop_ro("store", &nn::TransformerLm::store, nb::rv_policy::reference_internal)
      .def("init", &nn::TransformerLm::init, nb::arg("seed"))
      .def("param_table", &nn::TransformerLm::param_table)
      .def("logits", &nn::TransformerLm::logits, nb::arg("tokens"), "While a step traces (params bound).")
      .def(
          "loss",
          [](const nn::TransformerLm& lm, const Tensor& tokens, const Tensor& targets) {
            return nn::next_token_loss(lm, tokens, targets);
          },
          nb::arg("tokens"), nb::arg("targets"), "next_token_loss, while a step traces (params bound).");

  // ---- optimizers --------------------------------------------------------------------------------
  nb::class_<optim::Schedule>(m, "Schedule")
      .def(nb::init<double>())
      .def("__call__", &optim::Schedule::at, nb::arg("step"))
      .def("__str__", &optim::Schedule::describe);
  nb::implicitly_convertible<double, optim::Schedule>();
  m.def("constant_schedule", &optim::constant, nb::arg("value"));
  m.def("linear_warmup", &optim::linear_warmup, nb::arg("peak"), nb::arg("warmup_steps"));
  m.def("warmup_cosine", &optim::warmup_cosine, nb::arg("peak"), nb::arg("warmup_steps"), nb::arg("total_steps"),
        nb::arg("final_fraction") = 0.0);
  m.def("rsqrt_schedule", &optim::rsqrt, nb::arg("peak"), nb::arg("warmup_steps"));

  nb::class_<Optimizer>(m, "Optimizer", "An optimizer (px::optim), applied inside a TrainStep.")
      .def_prop_ro("name", [](const Optimizer& o) { return o.ptr->name(); })
      .def(
          "lr_at", [](const Optimizer& o, int64_t step) { return o.ptr->lr_at(step); }, nb::arg("step"))
      .def("__repr__", [](const Optimizer& o) { return "px.optim." + o.ptr->name(); });
  m.def(
      "adamw",
      [](const optim::Schedule& lr, double b1, double b2, double eps, double wd,
         std::optional<std::vector<std::string>> exclude, int decay_min_rank) {
        optim::AdamWOptions o;
        o.lr = lr;
        o.beta1 = b1;
        o.beta2 = b2;
        o.eps = eps;
        o.weight_decay = wd;
        o.decay_mask = decay_filter(exclude, decay_min_rank);
        return Optimizer{optim::adamw(o)};
      },
      nb::arg("learning_rate") = optim::Schedule(1e-3), nb::arg("b1") = 0.9, nb::arg("b2") = 0.999,
      nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 0.01, nb::arg("decay_exclude") = nb::none(),
      nb::arg("decay_min_rank") = 0);
  m.def(
      "sgd",
      [](const optim::Schedule& lr, double momentum, bool nesterov, double wd) {
        optim::SgdOptions o;
        o.lr = lr;
        o.momentum = momentum;
        o.nesterov = nesterov;
        o.weight_decay = wd;
        return Optimizer{optim::sgd(o)};
      },
      nb::arg("learning_rate") = optim::Schedule(1e-2), nb::arg("momentum") = 0.0, nb::arg("nesterov") = false,
      nb::arg("weight_decay") = 0.0);

  // ---- meshes and plans -------------------------------------------------------------------------
  nb::class_<px::Mesh>(m, "Mesh", "Named axes over devices, e.g. Mesh.cpu([('data', 4)]).")
      .def(nb::init<>())
      .def_static("cpu", &px::Mesh::cpu, nb::arg("axes"))
      .def_static(
          "create",
          [](const std::vector<std::pair<std::string, int64_t>>& axes, std::optional<std::string> devices) {
            return px::Mesh::create(axes, devices ? px::parse_devices(*devices) : px::default_devices());
          },
          nb::arg("axes"), nb::arg("devices") = nb::none())
      .def_static(
          "parse",
          [](const std::string& text, std::optional<std::string> devices) {
            return px::Mesh::parse(text, devices ? px::parse_devices(*devices) : px::default_devices());
          },
          nb::arg("text"), nb::arg("devices") = nb::none())
      .def_prop_ro("size", &px::Mesh::size)
      .def_prop_ro("platform", &px::Mesh::platform, "The backend's platform its devices are on: 'cpu', 'ref', ...")
      .def_prop_ro("axis_names", &px::Mesh::axis_names)
      .def("axis_size", &px::Mesh::axis_size)
      .def("__str__", &px::Mesh::to_string)
      .def("__repr__", &px::Mesh::to_string)
      .def("__eq__", [](const px::Mesh& a, const px::Mesh& b) { return a == b; });

  nb::class_<px::PartitionSpec>(m, "_PartitionSpec")
      .def_static("parse", &px::PartitionSpec::parse, nb::arg("text"))
      .def("__str__", &px::PartitionSpec::to_string)
      .def("__eq__", [](const px::PartitionSpec& a, const px::PartitionSpec& b) { return a == b; })
      .def("is_replicated", &px::PartitionSpec::is_replicated);

  nb::enum_<px::ShardingStrategy>(m, "ShardingStrategy")
      .value("AUTO", px::ShardingStrategy::AUTO)
      .value("DDP", px::ShardingStrategy::DDP)
      .value("FSDP", px::ShardingStrategy::FSDP)
      .value("TP", px::ShardingStrategy::TP)
      .value("FSDP_TP", px::ShardingStrategy::FSDP_TP)
      .value("MANUAL", px::ShardingStrategy::MANUAL);

  nb::class_<px::ParamPlacement>(m, "ParamPlacement")
      .def_ro("path", &px::ParamPlacement::path)
      .def_prop_ro("spec", [](const px::ParamPlacement& p) { return p.spec.to_string(); })
      .def_ro("bytes_per_device", &px::ParamPlacement::bytes_per_device)
      .def_ro("reason", &px::ParamPlacement::reason);
  nb::class_<px::ShardingPlan>(m, "ShardingPlan", "Each param's spec and bytes per device.")
      .def_ro("mesh", &px::ShardingPlan::mesh)
      .def_ro("strategy", &px::ShardingPlan::strategy)
      .def_ro("params", &px::ShardingPlan::params)
      .def_ro("batch_axes", &px::ShardingPlan::batch_axes)
      .def_ro("predicted_step_s", &px::ShardingPlan::predicted_step_s)
      .def(
          "explain", [](const px::ShardingPlan& p) { return p.explanation; }, "AUTO's explanation of the plan.")
      .def("table", &px::ShardingPlan::table)
      .def("param_bytes_per_device", &px::ShardingPlan::param_bytes_per_device);

  // ---- rematerialization -----------------------------------------------------------------------
  m.def(
      "remat",
      [](px::TensorFn fn, const std::string& policy, std::vector<std::string> names) {
        return px::remat(std::move(fn), px::parse_remat_policy(policy), std::move(names));
      },
      nb::arg("fn"), nb::arg("policy"), nb::arg("names") = std::vector<std::string>{},
      "fn (list of Tensors -> list of Tensors) whose forward values follow the policy in a training step.");

  // ---- training ---------------------------------------------------------------------------------
  nb::class_<px::TrainState>(m, "TrainState", "Params and optimizer state (this process's shards).")
      .def_ro("step", &px::TrainState::step)
      .def_ro("skipped", &px::TrainState::skipped);
  nb::class_<px::StepMetrics>(m, "StepMetrics")
      .def_ro("loss", &px::StepMetrics::loss)
      .def_ro("grad_norm", &px::StepMetrics::grad_norm)
      .def_ro("lr", &px::StepMetrics::lr)
      .def_ro("finite", &px::StepMetrics::finite)
      .def_ro("skipped", &px::StepMetrics::skipped)
      .def("__repr__", [](const px::StepMetrics& s) {
        return "StepMetrics(loss=" + std::to_string(s.loss) + ", grad_norm=" + std::to_string(s.grad_norm) +
               ", lr=" + std::to_string(s.lr) + ")";
      });

  nb::class_<px::TrainStep>(m, "TrainStep", "One training step as one compiled program (px::TrainStep).")
      .def(
          "__init__",
          [](px::TrainStep* self, nn::ParamStore& store, const Optimizer& opt, px::TrainStep::LossFn loss_fn,
             const std::vector<std::pair<px::DType, px::Shape>>& batch, std::optional<px::Mesh> mesh,
             px::ShardingStrategy strategy, const std::string& data_axis, const std::string& model_axis,
             double clip_norm, int microbatches, bool skip_nonfinite, const px::CompileOptions& compile,
             double auto_time_limit_s, const std::string& auto_cluster, const std::string& remat, int64_t remat_budget,
             const std::vector<std::string>& offload_params, bool offload_state, const Rules& rules,
             const Rules& activation_rules) {
            new (self)
                px::TrainStep(store, opt.ptr, std::move(loss_fn), batch_types(batch),
                              step_options(std::move(mesh), strategy, data_axis, model_axis, clip_norm, microbatches,
                                           skip_nonfinite, compile, auto_time_limit_s, auto_cluster, remat,
                                           remat_budget, offload_params, offload_state, rules, activation_rules));
          },
          nb::arg("store"), nb::arg("optimizer"), nb::arg("loss_fn"), nb::arg("batch_types"), PX_STEP_KWARGS,
          nb::keep_alive<1, 2>())
      .def_static(
          "for_lm",
          [](nn::TransformerLm& lm, const Optimizer& opt, const std::vector<std::pair<px::DType, px::Shape>>& batch,
             std::optional<px::Mesh> mesh, px::ShardingStrategy strategy, const std::string& data_axis,
             const std::string& model_axis, double clip_norm, int microbatches, bool skip_nonfinite,
             const px::CompileOptions& compile, double auto_time_limit_s, const std::string& auto_cluster,
             const std::string& remat, int64_t remat_budget, const std::vector<std::string>& offload_params,
             bool offload_state, const Rules& rules, const Rules& activation_rules) {
            // The loss is C++ (no Python callback): next_token_loss(tokens = batch[0], targets = batch[1]).
            px::TrainStep::LossFn loss = [&lm](const std::vector<Tensor>& b) {
              if (b.size() != 2) throw px::UserError("TrainStep.for_lm: the batch is (tokens, targets)");
              return nn::next_token_loss(lm, b[0], b[1]);
            };
            return std::make_unique<px::TrainStep>(
                lm.store(), opt.ptr, loss, batch_types(batch),
                step_options(std::move(mesh), strategy, data_axis, model_axis, clip_norm, microbatches, skip_nonfinite,
                             compile, auto_time_limit_s, auto_cluster, remat, remat_budget, offload_params,
                             offload_state, rules, activation_rules));
          },
          nb::arg("model"), nb::arg("optimizer"), nb::arg("batch_types"), PX_STEP_KWARGS, nb::keep_alive<0, 1>())
      .def("init", nb::overload_cast<uint64_t>(&px::TrainStep::init, nb::const_), nb::arg("seed"))
      .def("init", nb::overload_cast<const std::vector<px::Array>&>(&px::TrainStep::init, nb::const_),
           nb::arg("params"))
      .def("init_partly", &init_partly, nb::arg("store"), nb::arg("seed"), nb::arg("values"))
      .def("__call__", &px::TrainStep::operator(), nb::arg("state"), nb::arg("batch"),
           nb::call_guard<nb::gil_scoped_release>())
      .def("gather_params", &px::TrainStep::gather_params, nb::arg("state"))
      .def("gather_opt_state", &px::TrainStep::gather_opt_state, nb::arg("state"))
      .def("save", &px::TrainStep::save, nb::arg("path"), nb::arg("state"), nb::call_guard<nb::gil_scoped_release>())
      .def("load", &px::TrainStep::load, nb::arg("path"), nb::call_guard<nb::gil_scoped_release>())
      .def("state_names", &px::TrainStep::state_names)
      .def("plan", &px::TrainStep::plan, nb::rv_policy::reference_internal)
      .def("table", &px::TrainStep::table)
      .def("collectives_table", &px::TrainStep::collectives_table)
      .def("peak_bytes", &px::TrainStep::peak_bytes)
      .def(
          "num_kernels",
          [](const px::TrainStep& s) {
            int n = 0;
            for (int i = 0; i < s.num_programs(); ++i) n += s.program(i).executable().num_steps();
            return n;
          },
          "The kernels the compiled step runs, over all its programs (a pipeline's stages included).")
      .def("steps_run", &px::TrainStep::steps_run);
}

}  // namespace pxpy
