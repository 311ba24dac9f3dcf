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
  }
  return "?";
}

RematPolicy parse_remat_policy(const std::string& name) {
  for (RematPolicy p : {RematPolicy::none, RematPolicy::full, RematPolicy::nothing_saveable, RematPolicy::dots_saveable,
                        RematPolicy::dots_with_no_batch_dims_saveable, RematPolicy::names})
    if (name == remat_policy_name(p)) return p;
  throw UserError("[remat] unknown policy '" + name +
                  "'; the policies are none, full, nothing_saveable, dots_saveable, "
                  "dots_with_no_batch_dims_saveable, names");
}

namespace {

bool is_tag(const Node& n, const char* name) { return n.prim->name == "tag" && n.attrs.s("name") == name; }

}  // namespace

StepProgram remat_step(StepProgram p, const RematOptions& o, double* recomputed_flops) {
  if (recomputed_flops) *recomputed_flops = 0;
  if (o.policy == RematPolicy::none) return p;
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

}  // namespace px
