// The remat pass over a traced training step: the backward pass reads only the forward values
// the policy saves and recomputes the others from them, just before their first use there.
#include <string>
#include <vector>

#include "ir/primitive.h"
#include "parallax/train.h"

namespace px {

const char* remat_policy_name(RematPolicy p) {
  switch (p) {
    case RematPolicy::none:
      return "none";
    case RematPolicy::full:
      return "full";
    case RematPolicy::nothing_saveable:
      return "nothing_saveable";
    case RematPolicy::dots_saveable:
      return "dots_saveable";
    case RematPolicy::dots_with_no_batch_dims_saveable:
      return "dots_with_no_batch_dims_saveable";
    case RematPolicy::names:
      return "names";
    case RematPolicy::automatic:
      return "auto";
  }
  return "?";
}

RematPolicy parse_remat_policy(const std::string& name) {
  for (RematPolicy p : {RematPolicy::none, RematPolicy::full, RematPolicy::nothing_saveable, RematPolicy::dots_saveable,
                        RematPolicy::dots_with_no_batch_dims_saveable, RematPolicy::names, RematPolicy::automatic})
    if (name == remat_policy_name(p)) return p;
  throw UserError("[remat] unknown policy '" + name +
                  "'; the policies are none, full, nothing_saveable, dots_saveable, "
                  "dots_with_no_batch_dims_saveable, names, auto");
}

namespace {

bool is_tag(const Node& n, const char* name) { return n.prim->name == "tag" && n.attrs.s("name") == name; }

int count_layers(const Graph& g, int forward_end) {
  int n = 0;
  for (int i = 0; i < forward_end; ++i) n += is_tag(g.nodes()[i], "layer_input");
  return n;
}

}  // namespace

StepProgram StepProgram::clone() const {
  StepProgram c;
  c.graph = graph->clone();
  c.n_params = n_params;
  c.n_state = n_state;
  c.n_batch = n_batch;
  c.paths = paths;
  c.grads = grads;
  c.forward_end = forward_end;
  c.backward_end = backward_end;
  c.categories = categories;
  c.input_kinds = input_kinds;
  c.kinds = kinds;
  return c;
}

StepProgram remat_step(StepProgram p, const RematOptions& o, double* recomputed_flops) {
  if (recomputed_flops) *recomputed_flops = 0;
  if (o.policy == RematPolicy::none || o.layers == 0) return p;
  if (o.policy == RematPolicy::automatic)
    throw UserError("[remat] policy 'auto' needs a budget: use TrainStep or ShardedTrainStep with "
                    "RematOptions::budget_bytes or CompileOptions::memory_limit_bytes");
  if (o.policy == RematPolicy::names && o.names.empty())
    throw UserError("[remat] policy 'names' needs RematOptions::names: the px::tag names of the values to save");
  const Graph& g = *p.graph;
  const std::vector<Node>& nodes = g.nodes();
  const int F = p.forward_end;

  // The layer of each forward node (-1: outside the layers); the boundary tags belong to none.
  std::vector<int> layer(F, -1);
  bool tagged = false;
  for (int i = 0, cur = -1, count = 0; i < F; ++i) {
    if (is_tag(nodes[i], "layer_input")) {
      cur = count++;
      if (o.layers >= 0 && cur >= o.layers) cur = -2;  // past the layers to rematerialize: saved
      tagged = true;
      continue;
    }
    if (is_tag(nodes[i], "layers_end")) {
      cur = -1;
      continue;
    }
    layer[i] = cur;
  }
  if (!tagged) layer.assign(F, 0);  // one layer: the whole forward pass

  std::vector<char> is_output(g.values().size(), 0);
  for (int v : g.outputs()) is_output[v] = 1;
  auto saved = [&](int v) {
    const int i = g.values()[v].producer;
    if (i < 0 || i >= F || is_output[v]) return true;
    const Node& n = nodes[i];
    if (is_tag(n, "layer_input") || is_tag(n, "layers_end")) return true;
    if (layer[i] == -2) return true;
    if (layer[i] < 0) return o.policy != RematPolicy::nothing_saveable;
    switch (o.policy) {
      case RematPolicy::dots_saveable:
        return n.prim->name == "dot_general";
      case RematPolicy::dots_with_no_batch_dims_saveable:
        return n.prim->name == "dot_general" && n.attrs.ints("lhs_batch").empty();
      case RematPolicy::names:
        if (n.prim->name != "tag") return false;
        for (const auto& pattern : o.names)
          if (glob_match(pattern, n.attrs.s("name"))) return true;
        return false;
      default:
        return false;
    }
  };

  std::vector<Node> out(nodes.begin(), nodes.begin() + F);
  std::vector<ValueInfo> values = g.values();
  std::vector<int> clone(values.size(), -1);  // forward value -> its recomputed copy
  double flops = 0;
  // The recomputed copy of v, emitting the copies of its producers first (post-order, iterative:
  // a chain through every layer is thousands of nodes deep).
  auto recompute = [&](int v) {
    std::vector<std::pair<int, bool>> stack{{v, false}};
    while (!stack.empty()) {
      auto [u, expanded] = stack.back();
      stack.pop_back();
      if (saved(u) || clone[u] >= 0) continue;
      const Node& n = nodes[g.values()[u].producer];
      if (!expanded) {
        stack.push_back({u, true});
        for (int in : n.inputs)
          if (!saved(in) && clone[in] < 0) stack.push_back({in, false});
        continue;
      }
      Node c = n;
      std::vector<TensorType> ins, outs;
      for (int& in : c.inputs) {
        if (!saved(in)) in = clone[in];
        ins.push_back(values[in].type);
      }
      // A distinct attribute keeps CSE from merging the copy back into the original.
      c.attrs.set("remat", int64_t{1});
      for (int& o : c.outputs) {
        outs.push_back(values[o].type);
        clone[o] = static_cast<int>(values.size());
        values.push_back({values[o].type, -1, 0});
        o = clone[o];
      }
      flops += cost_of(*c.prim, ins, outs, c.attrs).flops;
      out.push_back(std::move(c));
    }
    return clone[v];
  };
  int backward_end = p.backward_end;
  for (int i = F; i < static_cast<int>(nodes.size()); ++i) {
    Node b = nodes[i];
    const size_t before = out.size();
    for (int& in : b.inputs)
      if (!saved(in)) in = recompute(in);
    if (i < p.backward_end) backward_end += static_cast<int>(out.size() - before);
    out.push_back(std::move(b));
  }
  for (size_t i = 0; i < out.size(); ++i)
    for (size_t k = 0; k < out[i].outputs.size(); ++k) {
      values[out[i].outputs[k]].producer = static_cast<int>(i);
      values[out[i].outputs[k]].output_index = static_cast<int>(k);
    }
  auto result = std::make_unique<Graph>();
  result->reset_ids(std::move(out), std::move(values), g.inputs(), g.input_names(), g.outputs());
  result->verify();
  p.categories.resize(result->values().size(), MemoryCategory::activations);
  p.graph = std::move(result);
  p.backward_end = backward_end;
  if (recomputed_flops) *recomputed_flops = flops;
  return p;
}

StepProgram remat_automatic(StepProgram p, int64_t budget, const std::function<int64_t(const StepProgram&)>& peak_of,
                            RematOptions* chosen) {
  if (budget <= 0)
    throw UserError("[remat] policy 'auto' needs a budget: set RematOptions::budget_bytes or "
                    "CompileOptions::memory_limit_bytes (bytes per device)");
  auto with = [&](RematOptions o) { return remat_step(p.clone(), o); };
  const int layers = count_layers(*p.graph, p.forward_end);
  // Full remat of the first k layers: the peak falls as k grows; the least k that fits.
  auto fits_with = [&](int k) { return peak_of(with({RematPolicy::full, {}, k, 0})) <= budget; };
  int64_t none_peak = peak_of(p);
  if (none_peak <= budget) {
    if (chosen) *chosen = {RematPolicy::none, {}, -1, budget};
    return p;
  }
  if (layers > 0 && fits_with(layers)) {
    int lo = 1, hi = layers;  // fits at hi
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (fits_with(mid)) hi = mid;
      else lo = mid + 1;
    }
    RematOptions o{RematPolicy::full, {}, hi, budget};
    if (chosen) *chosen = o;
    return remat_step(std::move(p), o);
  }
  StepProgram least = with({RematPolicy::nothing_saveable, {}, -1, 0});
  const int64_t least_peak = peak_of(least);
  if (least_peak <= budget) {
    if (chosen) *chosen = {RematPolicy::nothing_saveable, {}, -1, budget};
    return least;
  }
  throw UserError("[remat] auto: no policy fits the budget of " + std::to_string(budget) +
                  " bytes per device: without remat the step needs " + std::to_string(none_peak) +
                  ", with nothing_saveable " + std::to_string(least_peak) +
                  "; split the params and optimizer state over more devices (FSDP), use a smaller batch, or raise "
                  "the budget");
}

}  // namespace px
