// Builds the model, optimizer and mesh from a config; plans sharding from shapes alone.
// Designated initializers leave the fields they do not name at their defaults, on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "pax/model.h"

#include <fmt/format.h>

#include "parallax/auto.h"
#include "parallax/plan.h"

#include "core/env.h"
#include "parallax/nn/pretrained.h"
#include "pax/step_runner.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

namespace px::pax {

namespace {

// train.init_from_hf: the checkpoint's config, after checking that the model section describes
// the same sizes (so that config.toml and the plan stay true); pax's dtype and name are kept.
nn::LmConfig pretrained_lm_config(const ExperimentConfig& c, const nn::LmConfig& ours) {
  std::string arch;
  nn::LmConfig hf = nn::read_pretrained_config(c.train.init_from_hf, &arch);
  std::vector<std::string> fixes;
  auto same = [&](const char* field, int64_t want, int64_t have) {
    if (want != have) fixes.push_back(std::string("--set model.") + field + "=" + std::to_string(want));
  };
  const bool learned = hf.positions == nn::PositionKind::learned;
  if (ours.positions != hf.positions) fixes.push_back(std::string("--set model.flavour=") + (learned ? "gpt2" : "llama"));
  same("vocab_size", hf.vocab_size, ours.vocab_size);
  same("d_model", hf.d_model, ours.d_model);
  same("n_heads", hf.n_heads, ours.n_heads);
  same("n_kv_heads", hf.kv_heads(), ours.kv_heads());
  same("n_layers", hf.n_layers, ours.n_layers);
  same("d_ff", hf.d_ff, ours.d_ff);
  if (hf.tied_embedding != ours.tied_embedding)
    fixes.push_back(std::string("--set model.tied_embedding=") + (hf.tied_embedding ? "true" : "false"));
  if (!fixes.empty()) {
    std::string all;
    for (const auto& f : fixes) all += " " + f;
    throw UserError("[pax] train.init_from_hf='" + c.train.init_from_hf + "' is a " + arch +
                    " whose sizes differ from the model section; make them match:" + all);
  }
  if (c.model.seq_len > hf.max_seq_len)
    throw UserError("[pax] model.seq_len=" + std::to_string(c.model.seq_len) + " exceeds the " +
                    std::to_string(hf.max_seq_len) + " positions of train.init_from_hf='" + c.train.init_from_hf +
                    "'; set model.seq_len to at most " + std::to_string(hf.max_seq_len));
  hf.name = ours.name;
  hf.compute_dtype = ours.compute_dtype;
  hf.fused_head = ours.fused_head;
  hf.init_std = ours.init_std;
  hf.validate();
  return hf;
}

}  // namespace

nn::LmConfig lm_config(const ExperimentConfig& c) {
  const ModelConfig& m = c.model;
  nn::LmConfig cfg = m.flavour == "llama"
                         ? nn::llama_config("pax", m.vocab_size, m.d_model, m.n_heads, m.n_kv_heads, m.n_layers,
                                            m.d_ff, m.seq_len)
                         : nn::gpt2_config("pax", m.vocab_size, m.d_model, m.n_heads, m.n_layers, m.d_ff, m.seq_len);
  cfg.name = c.name.empty() ? "pax" : c.name;
  cfg.n_kv_heads = m.n_kv_heads;
  cfg.init_std = m.init_std;
  cfg.tied_embedding = m.tied_embedding;
  cfg.compute_dtype = m.dtype == "bf16" ? DType::bf16 : DType::f32;
  cfg.fused_head = m.fused_head;
  if (!c.train.init_from_hf.empty()) return pretrained_lm_config(c, cfg);
  cfg.validate();
  return cfg;
}

optim::OptimizerPtr make_optimizer(const ExperimentConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  optim::Schedule lr = make_schedule(c);
  if (o.name == "sgd") return optim::sgd({.lr = lr, .momentum = o.momentum, .weight_decay = o.weight_decay});
  if (o.name == "adafactor")
    return optim::adafactor({.lr = lr, .relative_step = false, .weight_decay = o.weight_decay});
  optim::AdamWOptions a{.lr = lr, .beta1 = o.beta1, .beta2 = o.beta2, .eps = o.eps, .weight_decay = o.weight_decay,
                        .decay_mask = optim::rank_at_least(2)};
  return o.name == "adam" ? optim::adam(a) : optim::adamw(a);
}

std::vector<TensorType> batch_types(const ExperimentConfig& c) {
  Shape s{c.data.batch, c.model.seq_len};
  return {{DType::i32, s}, {DType::i32, s}, {DType::f32, s}};
}

const ProcessWorld* launched_world() {
  if (env().launch_size == 0) return nullptr;
  return &process_world();
}

DeviceSet resolve_devices(const ExperimentConfig& c, const std::string& text, bool for_planning) {
  if (!for_planning)
    if (const ProcessWorld* w = launched_world()) {
      if (!text.empty() && parse_devices(text) != default_devices())
        throw Error("[pax] --devices " + text + " under " + w->launcher + ": each process's devices come from " +
                    "PX_DEVICES (here " + default_devices().to_string() + "); drop --devices, or export PX_DEVICES=" +
                    text + " to every process");
      return w->devices;
    }
  if (!text.empty()) return parse_devices(text);
  if (for_planning && !c.sharding.mesh.empty() && c.sharding.mesh.find("-1") == std::string::npos) {
    // Planning needs no real devices: as many virtual ones as the mesh names.
    DeviceSet d;
    d.count = 1;
    std::stringstream ss(c.sharding.mesh);
    std::string part;
    while (std::getline(ss, part, ',')) d.count *= std::stoll(part.substr(part.find(':') + 1));
    return d;
  }
  return default_devices();
}

Mesh make_mesh(const ExperimentConfig& c, const DeviceSet& devices) {
  if (c.sharding.mesh.empty()) {
    if (devices.count != 1)
      throw Error("[pax] " + devices.to_string() + " given but sharding.mesh is empty (one device); set e.g. --set " +
                  "sharding.mesh=data:" + std::to_string(devices.count));
    return Mesh::cpu({{c.sharding.data_axis, 1}});
  }
  Mesh mesh;
  try {
    mesh = Mesh::parse(c.sharding.mesh, devices);
  } catch (const Error& e) {
    throw Error("[pax] sharding.mesh=" + c.sharding.mesh + " on " + devices.to_string() + ": " + e.what() +
                " (pass --devices cpu:N to match the mesh)");
  }
  // The batch is split over the data axis at its resolved size (data:-1 takes the devices left).
  for (const MeshAxis& a : mesh.axes())
    if (a.name == c.sharding.data_axis && c.data.batch % a.size != 0)
      throw UserError("[pax] data.batch=" + std::to_string(c.data.batch) + " is not divisible by the data axis '" +
                      a.name + "' of size " + std::to_string(a.size) + " in the mesh " + mesh.to_string() +
                      ": each data shard takes an equal share of the rows; set data.batch to a multiple of " +
                      std::to_string(a.size) + " (e.g. " + std::to_string((c.data.batch / a.size + 1) * a.size) +
                      ") or change sharding.mesh");
  return mesh;
}

namespace {

// A cluster file's links per axis ([axis.NAME]) must name axes of the mesh they are applied to:
// a misspelt or stale name would leave that axis on the default links without a word.
Mesh apply_cluster(const Cluster& cl, const Mesh& mesh) {
  for (const auto& [name, link] : cl.axis_links) {
    const auto& axes = mesh.axes();
    if (std::none_of(axes.begin(), axes.end(), [&](const MeshAxis& a) { return a.name == name; })) {
      std::string have;
      for (const MeshAxis& a : axes) have += (have.empty() ? "" : ", ") + a.name;
      throw UserError("[pax] cluster " + cl.name + " gives a link for axis '" + name + "' ([axis." + name +
                      "]) but the mesh " + mesh.to_string() + " has no such axis (its axes: " + have +
                      "); rename the table to one of those axes, or remove it");
    }
  }
  return cl.apply(mesh);
}

}  // namespace

ShardingStrategy strategy_of(const ExperimentConfig& c) {
  const std::string& s = c.sharding.strategy;
  if (s == "fsdp") return ShardingStrategy::FSDP;
  if (s == "tp") return ShardingStrategy::TP;
  if (s == "fsdp_tp") return ShardingStrategy::FSDP_TP;
  if (s == "manual") return ShardingStrategy::MANUAL;
  if (s == "auto") return ShardingStrategy::AUTO;
  return ShardingStrategy::DDP;
}

ShardingOptions sharding_options(const ExperimentConfig& c) {
  ShardingOptions o;
  o.data_axis = c.sharding.data_axis;
  o.model_axis = c.sharding.model_axis;
  o.fsdp_min_bytes = c.sharding.fsdp_min_bytes;
  o.auto_cluster = c.sharding.cluster;
  o.auto_pipeline = c.sharding.auto_pipeline;
  for (const std::string& r : c.sharding.rules) {
    size_t eq = r.find('=');
    std::string glob = r.substr(0, eq), spec = r.substr(eq + 1);
    while (!glob.empty() && glob.back() == ' ') glob.pop_back();
    o.rules.push_back({glob, PartitionSpec::parse(spec)});
  }
  return o;
}

PipelineOptions pipeline_options(const ExperimentConfig& c) {
  PipelineOptions o;
  o.schedule = pipeline::parse_kind(c.sharding.schedule);
  o.virtual_stages = static_cast<int>(c.sharding.virtual_stages);
  o.balance = c.sharding.balance_stages;
  for (const std::string& k : c.sharding.layers_per_stage) {
    size_t used = 0;
    int n = -1;
    try {
      n = std::stoi(k, &used);
    } catch (const std::exception&) {
    }
    if (used != k.size() || n < 1)
      throw UserError("[pax] sharding.layers_per_stage has '" + k +
                      "': give whole numbers of at least 1, one per stage, e.g. --set sharding.layers_per_stage=2,2");
    o.layers_per_stage.push_back(n);
  }
  return o;
}

ShardingPlan sharding_plan(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh,
                           const std::string& cluster) {
  if (c.sharding.strategy == "auto") return auto_plan(c, model, mesh, cluster);
  // The forward loss, traced on types only: the recipes read which matmul consumes each param.
  auto fwd = nn::trace_with_params(
      model.store(),
      [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{nn::next_token_loss(model, b[0], b[1], b[2])}; },
      batch_types(c), {"tokens", "targets", "weights"});
  return plan_sharding(*fwd, model.store().paths(), mesh, strategy_of(c), sharding_options(c));
}

int64_t optimizer_bytes_per_device(const ExperimentConfig& c, const ShardingPlan& plan) {
  std::vector<TensorType> types;
  for (const auto& p : plan.params) types.push_back(p.type);
  int64_t total = 0;
  for (const optim::StateSlot& s : make_optimizer(c)->state_slots(types)) {
    const ParamPlacement& p = plan.params.at(s.param);
    if (s.type.shape == p.type.shape) {
      Shape local = Sharding(plan.mesh, p.spec).local_shape(s.type.shape);
      total += numel(local) * dtype_size(s.type.dtype);
    } else {
      total += s.type.nbytes();
    }
  }
  return total;
}

std::string model_params_text(const ShardingPlan& plan) {
  std::ostringstream os;
  os << "# path  shape  dtype  spec  (mesh " << plan.mesh.to_string() << ", " << strategy_name(plan.strategy) << ")\n";
  for (const auto& p : plan.params)
    os << p.path << "  " << shape_str(p.type.shape) << "  " << dtype_name(p.type.dtype) << "  " << p.spec.to_string()
       << "\n";
  return os.str();
}

namespace {
std::string human_bytes(int64_t b) {
  char buf[64];
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}
}  // namespace

std::string PlanReport::text() const {
  std::ostringstream os;
  os << "mesh: " << mesh << "  strategy: " << strategy;
  if (microbatches > 1) os << "  microbatches: " << microbatches << " (gradient accumulation, one update per step)";
  os << "\n";
  os << table << (table.empty() || table.back() == '\n' ? "" : "\n");
  os << "parameters: " << param_count << "\n";
  if (!pipeline.empty()) {  // a mesh with a `stage` axis: per stage and device group
    os << pipeline;
    if (!cluster.empty())
      os << "predicted on " << cluster << ": step " << fmt::format("{:.4g}", step_s) << " s; peak per device "
         << human_bytes(peak_bytes_per_device) << " of " << human_bytes(device_memory_bytes)
         << (peak_bytes_per_device <= device_memory_bytes ? " (fits)" : " (DOES NOT FIT)") << "\n";
    else
      os << "predicted step time: " << cost_note << "\n";
    return os.str();
  }
  os << "per device: params " << human_bytes(param_bytes_per_device) << ", gradients "
     << human_bytes(gradient_bytes_per_device) << ", optimizer state " << human_bytes(optimizer_bytes_per_device)
     << ", total " << human_bytes(param_bytes_per_device + gradient_bytes_per_device + optimizer_bytes_per_device)
     << " (activations not counted)\n";
  if (!cluster.empty()) {
    os << "predicted on " << cluster << ": step " << fmt::format("{:.4g}", step_s) << " s (compute "
       << fmt::format("{:.4g}", compute_s) << " s, collectives " << fmt::format("{:.4g}", comm_s)
       << " s before overlap); peak per device " << human_bytes(peak_bytes_per_device) << " of "
       << human_bytes(device_memory_bytes) << (peak_bytes_per_device <= device_memory_bytes ? " (fits)" : " (DOES NOT FIT)")
       << "\n";
  } else {
    os << "predicted step time: " << (cost_note.empty() ? "pass --cluster (cpu, h100x8, h200x8, tpuv4 or a .toml file)" : cost_note)
       << "\n";
  }
  os << pipelined;
  return os.str();
}

namespace {

// What every plan report says first: the model's size, the mesh, the strategy, the microbatches.
PlanReport report_head(const ExperimentConfig& c, const nn::TransformerLm& model, const Mesh& mesh) {
  PlanReport r;
  r.param_count = model.store().param_count();
  r.devices = mesh.size();
  r.mesh = mesh.to_string();
  r.strategy = c.sharding.strategy;
  r.microbatches = c.train.microbatches;
  return r;
}

StepSetup step_setup(const ExperimentConfig& c) {
  StepSetup setup;
  setup.batch = c.data.batch;
  setup.seq = c.model.seq_len;
  setup.optimizer = make_optimizer(c);
  setup.compute_dtype = c.model.dtype == "bf16" ? DType::bf16 : DType::f32;
  setup.sharding = sharding_options(c);
  setup.clip_norm = c.optimizer.clip_norm;
  setup.microbatches = static_cast<int>(c.train.microbatches);
  const TrainStepOptions o = step_options(c);
  if (o.remat.policy != RematPolicy::automatic) setup.remat = o.remat;
  setup.offload = o.offload;
  return setup;
}

// A mesh with a `stage` axis: the pipeline planned (and predicted on the cluster, when given).
PlanReport plan_pipelined(const ExperimentConfig& c, const Mesh& mesh, const nn::TransformerLm& model,
                          const std::string& cluster) {
  PlanReport r = report_head(c, model, mesh);
  std::optional<Cluster> cl;
  if (!cluster.empty()) cl = load_cluster(cluster);
  const PipelineReport p = plan_pipeline(lm_config(c), cl ? apply_cluster(*cl, mesh) : mesh, strategy_of(c), step_setup(c),
                                         pipeline_options(c), cl ? &*cl : nullptr);
  r.pipeline = p.to_string();
  for (int d = 0; d < p.schedule.devices; ++d) {
    r.peak_bytes_per_device = std::max(r.peak_bytes_per_device, p.planned_peak(d));
    r.param_bytes_per_device = std::max(r.param_bytes_per_device, p.param_bytes[d]);
    r.optimizer_bytes_per_device = std::max(r.optimizer_bytes_per_device, p.state_bytes[d] - p.param_bytes[d]);
  }
  r.gradient_bytes_per_device = r.param_bytes_per_device;
  if (cl) {
    r.cluster = cl->name;
    r.step_s = p.predicted_step_s;
    r.compute_s = p.predicted_schedule_s;
    r.device_memory_bytes = cl->device.memory_bytes;
  } else {
    r.cost_note = "pass --cluster (cpu, h100x8, h200x8, tpuv4 or a .toml file)";
  }
  return r;
}

}  // namespace

PlanReport plan(const ExperimentConfig& c, const std::string& devices, const std::string& cluster) {
  validate(c);
  Mesh mesh = make_mesh(c, resolve_devices(c, devices, /*for_planning=*/true));
  nn::TransformerLm model(lm_config(c));  // declares params; allocates nothing
  if (pipeline::has_stage_axis(mesh)) return plan_pipelined(c, mesh, model, cluster);
  const ShardingPlan sp = sharding_plan(c, model, mesh, cluster);
  const double plan_step_s = sp.predicted_step_s;  // AUTO's prediction
  PlanReport r = plan_report(c, model, sp);
  if (cluster.empty()) return r;
  if (c.sharding.strategy == "auto") {
    r.cost_note = "AUTO's prediction on " + cluster + " is in its explanation above";
    // Beside the plan on this mesh: the same devices pipelined, when that is predicted faster.
    const Cluster cl = load_cluster(cluster);
    const double auto_s = r.step_s > 0 ? r.step_s : plan_step_s;
    const std::vector<PipelineCandidate> piped = search_pipelines(lm_config(c), mesh.size(), cl, step_setup(c));
    if (!piped.empty() && piped[0].fits) {
      const PipelineCandidate& best = piped[0];
      r.pipelined = fmt::format(
          "pipelined, the fastest of {} candidates: {}: predicted {:.4g} s per step (bubble {:.3f}){}\n  {}\n",
          piped.size(), best.mesh.to_string(), best.report.predicted_step_s, best.report.predicted_bubble,
          auto_s > 0 ? fmt::format(", {} than the plan above ({:.4g} s)",
                                   best.report.predicted_step_s < auto_s ? "faster" : "slower", auto_s)
                     : "",
          best.settings());
    }
    return r;
  }
  Cluster cl = load_cluster(cluster);
  const StepSetup setup = step_setup(c);
  std::vector<RecipeCost> costs = cost_recipes(lm_config(c), apply_cluster(cl, mesh), cl, setup, {strategy_of(c)});
  if (costs.empty() || !costs[0].applies) {
    r.cost_note = "not predicted: " + (costs.empty() ? std::string("no cost") : costs[0].reason);
    return r;
  }
  const StepCost& sc = costs[0].cost;
  r.cluster = cl.name;
  r.step_s = sc.step_s;
  r.compute_s = sc.compute_s;
  r.comm_s = sc.comm_s;
  r.peak_bytes_per_device = sc.memory.peak_bytes;
  r.device_memory_bytes = sc.memory_capacity;
  return r;
}

PlanReport plan_report(const ExperimentConfig& c, const nn::TransformerLm& model, const ShardingPlan& p) {
  PlanReport r = report_head(c, model, p.mesh);
  r.table = p.table() + p.explanation;
  r.param_bytes_per_device = p.param_bytes_per_device();
  r.gradient_bytes_per_device = r.param_bytes_per_device;  // gradients are placed like their params
  r.optimizer_bytes_per_device = optimizer_bytes_per_device(c, p);
  return r;
}

std::string describe(const ExperimentConfig& c) {
  std::ostringstream os;
  os << to_toml(c) << "\n";
  PlanReport r = plan(c);
  os << "parameters: " << r.param_count << "\n\nsharding plan (mesh " << r.mesh << ", " << r.strategy << "):\n"
     << r.table << (r.table.empty() || r.table.back() == '\n' ? "" : "\n");
  if (c.memory.remat == "auto" && c.sharding.strategy == "auto")
    os << "note: memory.remat=auto with sharding.strategy=auto is not available yet; name a remat policy\n";
  return os.str();
}

}  // namespace px::pax
