// The traced training step (trace_train_step) and TrainStep on one device.
#include "train/steps.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/dump.h"
#include "core/exclusive.h"
#include "memory/rewrite.h"
#include "optim/checkpoint.h"
#include "parallax/autodiff.h"
#include "parallax/io.h"
#include "parallax/ops.h"
#include "runtime/program.h"

namespace px {

StepProgram trace_train_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                             const std::vector<TensorType>& batch_types, double clip_norm, const std::string& who,
                             bool skip_nonfinite) {
  if (!(clip_norm >= 0.0) || !std::isfinite(clip_norm))
    throw UserError(
        fmt::format("[{}] clip_norm must be a finite number >= 0 (0: no clipping), got {}", who, clip_norm));
  std::vector<TensorType> param_types = store.types();
  std::vector<optim::StateSlot> slots = opt.state_slots(param_types);
  StepProgram p;
  p.paths = store.paths();
  p.n_params = param_types.size();
  p.n_state = slots.size();
  p.n_batch = batch_types.size();
  const size_t n_params = p.n_params, n_state = p.n_state;

  std::vector<TensorType> types = param_types;
  std::vector<std::string> names = p.paths;
  for (const auto& s : slots) {
    types.push_back(s.type);
    names.push_back(p.paths[s.param] + "." + s.name);
  }
  types.insert(types.end(), batch_types.begin(), batch_types.end());
  for (size_t i = 0; i < batch_types.size(); ++i) names.push_back("batch." + std::to_string(i));
  types.push_back({DType::i32, {}});
  names.push_back("step");

  p.graph = trace(
      [&](const std::vector<Tensor>& in) {
        Graph& g = *current_graph();
        std::vector<Tensor> params(in.begin(), in.begin() + n_params);
        std::vector<Tensor> state(in.begin() + n_params, in.begin() + n_params + n_state);
        std::vector<Tensor> batch(in.begin() + n_params + n_state, in.end() - 1);
        Tensor step = in.back();
        nn::ParamBinding bound = store.bind(params);
        Tensor loss = loss_fn(batch);
        if (loss.numel() != 1) throw Error("[" + who + "] the loss must be a scalar, got " + type_str(loss.type()));
        loss = cast(reshape(loss, {}), DType::f32);
        p.forward_end = static_cast<int>(g.nodes().size());
        std::vector<Tensor> grads = gradients(loss, params);
        p.backward_end = static_cast<int>(g.nodes().size());
        for (size_t i = 0; i < grads.size(); ++i) {
          if (!grads[i].defined()) throw Error("[" + who + "] param '" + p.paths[i] + "' is not a float tensor");
          p.grads.push_back(grads[i].id());
        }
        Tensor norm;
        if (clip_norm > 0) {
          optim::Clipped c = optim::clip_by_global_norm(grads, clip_norm);
          grads = c.grads;
          norm = c.norm;
        } else {
          norm = optim::global_norm(grads);
        }
        optim::Update u = opt.apply(params, grads, state, step + 1, p.paths);
        if (skip_nonfinite) {
          // In the graph, so that sharded steps skip the same way: |x| < inf is false for NaN and inf.
          Tensor inf = full({}, std::numeric_limits<double>::infinity(), DType::f32);
          Tensor ok = logical_and(less(abs(loss), inf), less(abs(norm), inf));
          for (size_t i = 0; i < n_params; ++i) u.params[i] = where(ok, u.params[i], params[i]);
          for (size_t i = 0; i < n_state; ++i) u.state[i] = where(ok, u.state[i], state[i]);
        }
        std::vector<Tensor> out = {loss, norm, u.lr};
        out.insert(out.end(), u.params.begin(), u.params.end());
        out.insert(out.end(), u.state.begin(), u.state.end());
        return out;
      },
      types, names);

  // What each value holds, for the per-device memory report.
  const Graph& g = *p.graph;
  p.categories.assign(g.values().size(), MemoryCategory::temporaries);
  for (int i = 0; i < p.graph->nodes().size(); ++i)
    if (i < p.forward_end)
      for (int v : g.nodes()[i].outputs) p.categories[v] = MemoryCategory::activations;
  for (size_t i = 0; i < g.inputs().size(); ++i)
    p.categories[g.inputs()[i]] = i < n_params             ? MemoryCategory::params
                                  : i < n_params + n_state ? MemoryCategory::optimizer_state
                                                           : MemoryCategory::activations;
  for (int v : p.grads) p.categories[v] = MemoryCategory::gradients;
  for (size_t o = 3; o < g.outputs().size(); ++o)
    p.categories[g.outputs()[o]] = o < 3 + n_params ? MemoryCategory::params : MemoryCategory::optimizer_state;
  dump_pass("trace_autodiff", [&] {
    return "# forward: nodes [0, " + std::to_string(p.forward_end) + "), backward: [" + std::to_string(p.forward_end) +
           ", " + std::to_string(p.backward_end) + "), clipping and update: [" + std::to_string(p.backward_end) + ", " +
           std::to_string(g.nodes().size()) + ")\n" + g.to_string();
  });
  return p;
}

namespace detail {

OneDeviceStep::OneDeviceStep(nn::ParamStore& store, optim::OptimizerPtr opt, TrainStep::LossFn loss_fn,
                             std::vector<TensorType> batch_types, const TrainStepOptions& options)
    : store_(store),
      opt_(std::move(opt)),
      batch_types_(std::move(batch_types)),
      replicated_(Sharding::replicated(Mesh())) {
  n_params_ = static_cast<size_t>(store_.size());
  n_state_ = opt_->state_slots(store_.types()).size();
  skip_nonfinite_ = options.skip_nonfinite;
  const int64_t capacity = memory_capacity({0, MemoryKind::device});
  const int64_t limit = options.compile.memory_limit_bytes > 0 ? options.compile.memory_limit_bytes : capacity;
  auto traced = [&] {
    return trace_train_step(store_, *opt_, loss_fn, batch_types_, options.clip_norm, "TrainStep",
                            options.skip_nonfinite);
  };
  // The buffer planner that plans the step measures each candidate (remat and offload applied).
  auto compile_options = [&](const StepProgram& p, const OffloadOptions& o) {
    CompileOptions c = options.compile;
    if (c.value_categories.empty()) c.value_categories = p.categories;
    if (c.value_layers.empty()) c.value_layers = memory_pass::value_layers(p);
    c.value_kinds = p.kinds;
    c.prefetch_depth = o.prefetch_depth;
    return c;
  };
  auto report_with = [&](const StepProgram& rematted, const OffloadOptions& o) {
    StepProgram q = offload_step(rematted.clone(), o);
    CompileOptions c = compile_options(q, o);
    c.memory_limit_bytes = c.host_memory_limit_bytes = 0;
    return plan_program(*q.graph, c, nullptr).report;
  };
  auto peak_with = [&](const StepProgram& rematted, const OffloadOptions& o) {
    return report_with(rematted, o).peak_bytes;
  };
  StepProgram program = traced();
  if (options.remat.policy == RematPolicy::automatic) {
    auto peak_of = [&](const StepProgram& p) { return peak_with(p, options.offload); };
    program = remat_automatic(std::move(program), options.remat.budget_bytes > 0 ? options.remat.budget_bytes : limit,
                              peak_of);
  } else {
    program = remat_step(std::move(program), options.remat);
    const MemoryReport planned = limit > 0 ? report_with(program, options.offload) : MemoryReport{};
    const int64_t peak = planned.peak_bytes;
    if (peak > limit) {
      // Over the limit: say which settings would fit, each with its planned peak.
      std::string alternatives;
      for (RematPolicy p : {RematPolicy::dots_saveable, RematPolicy::full, RematPolicy::nothing_saveable}) {
        if (p == options.remat.policy) continue;
        const int64_t q = peak_with(remat_step(traced(), {p, {}}), options.offload);
        alternatives += fmt::format("\n  remat {}: {} bytes{}", remat_policy_name(p), q, q <= limit ? " (fits)" : "");
      }
      OffloadOptions all = options.offload;
      all.params = {"*"};
      all.optimizer_state = true;
      const int64_t q = peak_with(program, all);
      alternatives += fmt::format("\n  offload params and optimizer state: {} bytes{}", q, q <= limit ? " (fits)" : "");
      const int64_t both = peak_with(remat_step(traced(), {RematPolicy::full, {}}), all);
      alternatives += fmt::format("\n  remat full and offload both: {} bytes{}", both, both <= limit ? " (fits)" : "");
      // FSDP over n devices splits params, gradients and optimizer state n ways (an estimate from
      // the split above: activations stay as they are, collective buffers are left out).
      auto at_peak = [&](MemoryCategory c) { return planned.by_category[static_cast<int>(c)]; };
      const int64_t state = at_peak(MemoryCategory::params) + at_peak(MemoryCategory::gradients) +
                            at_peak(MemoryCategory::optimizer_state);
      for (int n : {2, 4, 8}) {
        const int64_t est = peak - state + state / n;
        alternatives +=
            fmt::format("\n  FSDP over {} devices: about {} bytes{}", n, est, est <= limit ? " (fits)" : "");
      }
      throw UserError(fmt::format(
          "[TrainStep] the step needs {} bytes per device with remat {}{}, over the memory limit of {} bytes. "
          "At the peak:\n{}Planned peaks with other settings:{}\nSet TrainStepOptions::remat (RematPolicy::automatic "
          "picks "
          "the least recompute that fits) or TrainStepOptions::offload, shrink the batch, or shard the step over "
          "more devices (TrainStepOptions::mesh with FSDP)",
          peak, remat_policy_name(options.remat.policy),
          options.offload.params.empty() && !options.offload.optimizer_state ? "" : " and the offload set", limit,
          planned.to_string(), alternatives));
    }
  }
  program = offload_step(std::move(program), options.offload);
  CompileOptions copt = compile_options(program, options.offload);
  graph_ = std::move(program.graph);
  exe_ = Executable::compile(*graph_, copt);
  for (size_t o = 0; o < exe_->graph().outputs().size(); ++o) {
    const TensorType& t = exe_->graph().type(exe_->graph().outputs()[o]);
    outputs_.emplace_back(t.dtype, t.shape, Placement{0, exe_->output_kind(static_cast<int>(o))});
  }
  inputs_.resize(graph_->inputs().size());
  inputs_.back() = Array(DType::i32, {});
  // Seen as a mesh: one device, every param replicated.
  plan_.strategy = ShardingStrategy::DDP;
  const std::vector<std::string> paths = store_.paths();
  const std::vector<TensorType> types = store_.types();
  for (size_t i = 0; i < paths.size(); ++i)
    plan_.params.push_back(
        {paths[i], types[i], PartitionSpec(), numel(types[i].shape) * dtype_size(types[i].dtype), "one device"});
}

StepMetrics OneDeviceStep::run(std::vector<Array>& params, std::vector<Array>& opt_state, int64_t& step,
                               int64_t& skipped, const std::vector<Array>& batch) {
  ExclusiveCall call(busy_, "training step");  // inputs_ and outputs_ are reused by every call
  if (batch.size() != batch_types_.size())
    throw Error("[TrainStep] expected " + std::to_string(batch_types_.size()) + " batch arrays, got " +
                std::to_string(batch.size()));
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].type() != batch_types_[i])
      throw Error("[TrainStep] batch array " + std::to_string(i) + " has type " + type_str(batch[i].type()) +
                  ", the step was traced for " + type_str(batch_types_[i]));
  size_t k = 0;
  // Params and state live where the step keeps them (offload: pinned_host); moved there once.
  for (auto* group : {&params, &opt_state})
    for (auto& a : *group) {
      const MemoryKind want = exe_->input_kind(static_cast<int>(k));
      if (a.placement().kind != want) a = a.to({a.placement().device, want});
      inputs_[k++] = a;
    }
  for (auto& b : batch) inputs_[k++] = b;
  inputs_[k].data<int32_t>()[0] = traced_step(step, "TrainStep");
  // Reuse last step's buffers unless the caller kept a handle to them (a copied TrainState).
  for (auto& o : outputs_)
    if (!o.sole_owner()) o = Array(o.dtype(), o.shape(), o.placement());
  exe_->run_into(inputs_, outputs_);

  StepMetrics m =
      step_metrics(outputs_[0].to_f32()[0], outputs_[1].to_f32()[0], outputs_[2].to_f32()[0], skip_nonfinite_);
  // Double buffering: the new values become the state, the old buffers take the next outputs.
  for (size_t i = 0; i < n_params_; ++i) std::swap(params[i], outputs_[3 + i]);
  for (size_t i = 0; i < n_state_; ++i) std::swap(opt_state[i], outputs_[3 + n_params_ + i]);
  if (m.skipped)
    ++skipped;
  else
    ++step;
  ++steps_run_;
  for (size_t i = 0; i < inputs_.size() - 1; ++i) inputs_[i] = Array();
  return m;
}

}  // namespace detail

}  // namespace px
