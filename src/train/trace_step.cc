// The first pass of a training step: trace the loss, differentiate it, clip and update, as one
// program over global shapes (trace_train_step), with what each value holds for the memory report.
#include "train/steps.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/dump.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"

namespace px {

namespace {

// Microbatch k of m of a batch input: its rows k, k + m, k + 2m, ... ([B, ...] as [B/m, m, ...],
// index k of dim 1). Where the batch is split over devices along dim 0, each device's rows of a
// microbatch are rows it holds, so slicing needs no communication. A scalar goes whole to each.
Tensor microbatch_rows(const Tensor& x, int k, int m) {
  if (x.rank() == 0) return x;
  Shape rows = x.shape();
  rows[0] /= m;
  Shape split = rows;
  split.insert(split.begin() + 1, m);
  std::vector<int64_t> starts(split.size(), 0), limits = split;
  starts[1] = k;
  limits[1] = k + 1;
  return reshape(slice(reshape(x, split), starts, limits), rows);
}

// Marks gk[i] as param i's gradient of its microbatch (field: micro_grad_of) or of the step
// (grad_of). A value that is already another param's (autodiff gives both operands of an add the
// same cotangent) is copied first, so that each gradient is a value of its own.
void mark_gradients(std::vector<Tensor>& gk, int ValueInfo::*field) {
  Graph& g = *current_graph();
  for (size_t i = 0; i < gk.size(); ++i) {
    if (g.values()[gk[i].id()].*field >= 0) gk[i] = tag(gk[i], "gradient_copy");
    g.mutable_value(gk[i].id()).*field = static_cast<int>(i);
  }
}

// Each microbatch's forward pass, then its backward pass, so that its activations are freed before
// the next one's forward pass; its gradients are added to the earlier ones'. The loss and
// gradients are the means over the microbatches: with a loss that is a mean over the rows (tokens)
// of equal microbatches, those of the whole batch. Each node's phase and microbatch are facts on
// it (NodeFacts); `sums` gets the gradient sums' values.
std::pair<Tensor, std::vector<Tensor>> mean_loss_and_grads(const StepProgram& p, const TrainStep::LossFn& loss_fn,
                                                           const std::vector<Tensor>& params,
                                                           const std::vector<Tensor>& batch, int m,
                                                           const std::string& who, std::vector<int>& sums) {
  Graph& g = *current_graph();
  Tensor loss;
  std::vector<Tensor> grads;
  for (int k = 0; k < m; ++k) {
    Tensor lk;
    {
      NodeFactsScope forward(g, {StepPhase::forward, k});
      std::vector<Tensor> rows = batch;
      if (m > 1)
        for (Tensor& b : rows) b = microbatch_rows(b, k, m);
      lk = loss_fn(rows);
      if (lk.numel() != 1) throw Error("[" + who + "] the loss must be a scalar, got " + type_str(lk.type()));
      lk = cast(reshape(lk, {}), DType::f32);
    }
    NodeFactsScope backward(g, {StepPhase::backward, k});
    std::vector<Tensor> gk = gradients(lk, params);
    for (size_t i = 0; i < gk.size(); ++i)
      if (!gk[i].defined()) throw Error("[" + who + "] param '" + p.paths[i] + "' is not a float tensor");
    mark_gradients(gk, &ValueInfo::micro_grad_of);
    if (k == 0) {
      loss = lk;
      grads = gk;
    } else {
      loss = loss + lk;
      for (size_t i = 0; i < gk.size(); ++i) {
        grads[i] = grads[i] + gk[i];
        sums.push_back(grads[i].id());
      }
    }
    if (m > 1 && k == m - 1) {
      loss = loss / static_cast<double>(m);
      for (Tensor& gr : grads) {
        gr = gr / static_cast<double>(m);
        sums.push_back(gr.id());
      }
    }
    if (k == m - 1) mark_gradients(grads, &ValueInfo::grad_of);
  }
  return {loss, grads};
}

// The step's outputs: the loss, the gradient norm, the learning rate, the params and state updated
// with the (clipped) gradients.
std::vector<Tensor> clip_and_update(const optim::Optimizer& opt, const std::vector<Tensor>& params,
                                    const std::vector<Tensor>& state, const Tensor& step, const Tensor& loss,
                                    std::vector<Tensor> grads, double clip_norm, bool skip_nonfinite,
                                    const std::vector<std::string>& paths) {
  Tensor norm;
  if (clip_norm > 0) {
    optim::Clipped c = optim::clip_by_global_norm(grads, clip_norm);
    grads = c.grads;
    norm = c.norm;
  } else {
    norm = optim::global_norm(grads);
  }
  optim::Update u = opt.apply(params, grads, state, step + 1, paths);
  if (skip_nonfinite) {
    // In the graph, so that sharded steps skip the same way: |x| < inf is false for NaN and inf.
    Tensor inf = full({}, std::numeric_limits<double>::infinity(), DType::f32);
    Tensor ok = logical_and(less(abs(loss), inf), less(abs(norm), inf));
    for (size_t i = 0; i < params.size(); ++i) u.params[i] = where(ok, u.params[i], params[i]);
    for (size_t i = 0; i < state.size(); ++i) u.state[i] = where(ok, u.state[i], state[i]);
  }
  std::vector<Tensor> out = {loss, norm, u.lr};
  out.insert(out.end(), u.params.begin(), u.params.end());
  out.insert(out.end(), u.state.begin(), u.state.end());
  return out;
}

// What each value holds, for the per-device memory report (the rest are temporaries).
void label_memory(StepProgram& p, const std::vector<int>& sums) {
  Graph& g = *p.graph;
  const size_t n_params = p.n_params, n_state = p.n_state;
  auto label = [&](int v, MemoryCategory c) { g.mutable_value(v).category = c; };
  for (int i = 0; i < static_cast<int>(g.nodes().size()); ++i)
    if (p.is_forward(i))
      for (int v : g.nodes()[i].outputs) label(v, MemoryCategory::activations);
  for (size_t v = 0; v < g.values().size(); ++v)
    if (g.values()[v].micro_grad_of >= 0) label(static_cast<int>(v), MemoryCategory::gradients);
  for (size_t i = 0; i < g.inputs().size(); ++i)
    label(g.inputs()[i], i < n_params             ? MemoryCategory::params
                         : i < n_params + n_state ? MemoryCategory::optimizer_state
                                                  : MemoryCategory::activations);
  for (int v : sums) label(v, MemoryCategory::gradients);
  for (size_t o = 3; o < g.outputs().size(); ++o)
    label(g.outputs()[o], o < 3 + n_params ? MemoryCategory::params : MemoryCategory::optimizer_state);
}

}  // namespace

void check_microbatches(int microbatches, const std::vector<TensorType>& batch_types, const std::string& who) {
  if (microbatches < 1)
    throw UserError(fmt::format("[{}] microbatches must be >= 1 (1: the whole batch at once), got {}", who,
                                microbatches));
  for (size_t i = 0; i < batch_types.size(); ++i) {
    const TensorType& t = batch_types[i];
    if (t.rank() > 0 && t.shape[0] % microbatches != 0)
      throw UserError(fmt::format(
          "[{}] microbatches = {} does not divide batch array {} ({}): its leading dim {} is split into {} "
          "microbatches of equal rows; use a batch size that is a multiple of {} or a microbatch count that divides {}",
          who, microbatches, i, type_str(t), t.shape[0], microbatches, microbatches, t.shape[0]));
  }
}

StepProgram trace_train_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                             const std::vector<TensorType>& batch_types, double clip_norm, const std::string& who,
                             bool skip_nonfinite, int microbatches) {
  if (!(clip_norm >= 0.0) || !std::isfinite(clip_norm))
    throw UserError(
        fmt::format("[{}] clip_norm must be a finite number >= 0 (0: no clipping), got {}", who, clip_norm));
  check_microbatches(microbatches, batch_types, who);
  std::vector<TensorType> param_types = store.types();
  std::vector<optim::StateSlot> slots = opt.state_slots(param_types);
  StepProgram p;
  p.paths = store.paths();
  p.n_params = param_types.size();
  p.n_state = slots.size();
  p.n_batch = batch_types.size();
  p.microbatches = microbatches;
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
  std::vector<int> sums;  // the gradients summed over the microbatches so far

  p.graph = trace(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> params(in.begin(), in.begin() + n_params);
        std::vector<Tensor> state(in.begin() + n_params, in.begin() + n_params + n_state);
        std::vector<Tensor> batch(in.begin() + n_params + n_state, in.end() - 1);
        nn::ParamBinding bound = store.bind(params);
        auto [loss, grads] = mean_loss_and_grads(p, loss_fn, params, batch, microbatches, who, sums);
        NodeFactsScope update(*current_graph(), {StepPhase::update, -1});
        return clip_and_update(opt, params, state, in.back(), loss, std::move(grads), clip_norm, skip_nonfinite,
                               p.paths);
      },
      types, names);

  label_memory(p, sums);
  dump_pass("trace_autodiff", [&] { return p.graph->to_string(); });
  return p;
}

}  // namespace px
