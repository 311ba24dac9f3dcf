// Sharding propagation: forward and backward passes over the graph that refine each value's
// spec from its neighbours through the nodes' factor rules, until nothing changes.
#include "sharding/spmd_internal.h"
#include "sharding/prims.h"

namespace px::spmd {

namespace {

// Adds the proposal's axes to dims that are still unsplit, when the axis is free in the value
// and the dim divides. Returns whether anything changed.
bool refine(std::optional<Spec>& cur, const Spec& prop, const Shape& shape, const Mesh& mesh) {
  if (!cur) {
    cur = prop;
    cur->resize(shape.size());
    return true;
  }
  bool changed = false;
  std::vector<char> used(static_cast<size_t>(mesh.rank()), 0);
  for (auto& d : *cur)
    for (int a : d) used[a] = 1;
  for (size_t d = 0; d < shape.size() && d < prop.size(); ++d) {
    if (!(*cur)[d].empty() || prop[d].empty()) continue;
    bool ok = shape[d] % shards_of(mesh, prop[d]) == 0;
    for (int a : prop[d]) ok = ok && !used[a];
    if (!ok) continue;
    (*cur)[d] = prop[d];
    for (int a : prop[d]) used[a] = 1;
    changed = true;
  }
  return changed;
}

}  // namespace

Propagation propagate(const Graph& g, const Mesh& mesh, const std::vector<Spec>& inputs,
                      const std::vector<std::optional<Spec>>& outputs) {
  const size_t nv = g.values().size();
  std::vector<std::optional<Spec>> cur(nv);
  std::vector<char> fixed(nv, 0);
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    cur[g.inputs()[i]] = inputs.at(i);
    fixed[g.inputs()[i]] = 1;
  }
  const auto& nodes = g.nodes();
  for (const Node& n : nodes) {
    if (n.prim != prims::sharding_constraint()) continue;
    int v = n.outputs[0];
    Sharding s(mesh, PartitionSpec::parse(n.attrs.s("spec")));
    s.validate(g.type(v),
               "sharding_constraint on %" + std::to_string(v) + (n.name.empty() ? "" : " ('" + n.name + "')"));
    cur[v] = to_spec(s, g.type(v).rank());
    fixed[v] = n.attrs.has("reads") ? kFixedForReaders : 1;
  }
  for (size_t o = 0; o < outputs.size() && o < g.outputs().size(); ++o) {
    int v = g.outputs()[o];
    // A hint, not a fixed layout: the producer may still leave partial sums (then reduce-scattered).
    if (outputs[o] && !fixed[v]) cur[v] = *outputs[o];
  }

  std::vector<NodeRule> rules;
  rules.reserve(nodes.size());
  for (const Node& n : nodes) rules.push_back(node_rule(g, n));

  auto visit = [&](size_t i) {
    const Node& n = nodes[i];
    const NodeRule& r = rules[i];
    FactorAxes fa = assign_factors(g, n, r, mesh, cur, fixed);
    bool changed = false;
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      int v = n.outputs[j];
      if (!fixed[v]) changed |= refine(cur[v], spec_from_factors(r.rule.results[j], r, fa), g.type(v).shape, mesh);
    }
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      int v = n.inputs[k];
      if (!fixed[v]) changed |= refine(cur[v], spec_from_factors(r.rule.operands[k], r, fa), g.type(v).shape, mesh);
    }
    return changed;
  };
  // Each changing round sets a value's first spec or splits a dim that was unsplit (never undone),
  // so a fixed point comes within (values + dims) rounds; not reaching it is a bug, never a silent stop.
  int64_t max_rounds = 1 + static_cast<int64_t>(nv);
  for (size_t v = 0; v < nv; ++v) max_rounds += g.type(static_cast<int>(v)).rank();
  bool converged = false;
  for (int64_t round = 0; round < max_rounds && !converged; ++round) {
    bool changed = false;
    for (size_t i = 0; i < nodes.size(); ++i) changed |= visit(i);
    for (size_t i = nodes.size(); i-- > 0;) changed |= visit(i);
    converged = !changed;
  }
  if (!converged)
    throw InternalError("[sharding] propagation did not reach a fixed point in " + std::to_string(max_rounds) +
                        " rounds over " + std::to_string(nodes.size()) + " nodes");

  Propagation p;
  p.fixed = fixed;
  p.spec.resize(nv);
  for (size_t v = 0; v < nv; ++v) {
    p.spec[v] = cur[v] ? *cur[v] : Spec();
    p.spec[v].resize(g.type(static_cast<int>(v)).shape.size());
  }
  return p;
}

}  // namespace px::spmd
