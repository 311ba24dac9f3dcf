// The first pass of a training step: trace the loss, differentiate it, clip and update, as one
// program over global shapes (trace_train_step), with what each value holds for the memory report.
#include "train/steps.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/dump.h"
#include "train/state_file.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"

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

}  // namespace px
