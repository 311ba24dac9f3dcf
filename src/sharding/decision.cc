// Applying a sharding decision: the constraints it lists become sharding_constraint nodes of the
// traced program (annotate), which the partitioner then honours. Deciding happens elsewhere (the
// recipes, the user's rules, AUTO); this file only emits.
#include <algorithm>
#include <map>
#include <sstream>

#include "ir/primitive.h"
#include "parallax/ops.h"
#include "parallax/spmd.h"
#include "sharding/prims.h"

namespace px {

std::string ShardingDecision::to_string(const Graph& g) const {
  std::ostringstream os;
  os << "sharding decision on " << mesh.to_string() << "\n";
  for (size_t i = 0; i < inputs.size() && i < g.inputs().size(); ++i)
    os << "  input " << i << " '" << g.input_names()[i] << "': " << inputs[i].to_string() << "\n";
  for (const ValueConstraint& c : constraints) {
    os << "  %" << c.value << " " << c.spec.to_string();
    if (c.readers_begin >= 0)
      os << " as read by nodes [" << c.readers_begin << ", " << c.readers_end << ")" << (c.regather ? " (regather)" : "");
    os << "\n";
  }
  for (const auto& b : buckets) os << "  bucket of " << b.size() << " values reduced together\n";
  return os.str();
}

std::unique_ptr<Graph> annotate(const Graph& g, const ShardingDecision& d, std::vector<int>* value_map) {
  ensure_sharding_registered();
  const size_t nv = g.values().size();
  for (const ValueConstraint& c : d.constraints)
    if (c.value < 0 || c.value >= static_cast<int>(nv))
      throw Error("[annotate] constraint on value %" + std::to_string(c.value) + ", which the program (" +
                  std::to_string(nv) + " values) does not have");
  std::vector<int> pin(nv, -1);  // value -> its constraint of the value itself
  std::vector<std::vector<int>> uses(nv);
  for (size_t k = 0; k < d.constraints.size(); ++k) {
    const ValueConstraint& c = d.constraints[k];
    if (c.readers_begin < 0) pin[c.value] = static_cast<int>(k);
    else uses[c.value].push_back(static_cast<int>(k));
  }
  std::vector<int> bucket_of(nv, -1);
  for (size_t b = 0; b < d.buckets.size(); ++b)
    for (int v : d.buckets[b]) bucket_of.at(v) = static_cast<int>(b);
  std::vector<size_t> bucket_done(d.buckets.size(), 0);

  auto out = std::make_unique<Graph>();
  TraceScope scope(out.get());
  std::vector<Tensor> env(nv), raw(nv);
  std::vector<Tensor> use_value(d.constraints.size());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    raw[g.inputs()[i]] = env[g.inputs()[i]] = out->input(g.type(g.inputs()[i]), g.input_names()[i]);
  auto constrain = [&](const Tensor& x, const ValueConstraint& c) {
    Attrs a{{"spec", c.spec.to_string()}};
    if (c.readers_begin >= 0) a.set("reads", int64_t{1});  // a layout for some readers, not the value's own
    if (c.regather) a.set("regather", int64_t{1});
    return out->emit(*prims::sharding_constraint(), {x}, a).at(0);
  };
  auto produced = [&](int v) {
    if (pin[v] >= 0 && bucket_of[v] < 0) env[v] = constrain(env[v], d.constraints[pin[v]]);
    int b = bucket_of[v];
    if (b < 0 || ++bucket_done[b] < d.buckets[b].size()) return;
    // The last member of a bucket: one flat buffer, one constraint, then each member's slice.
    const auto& members = d.buckets[b];
    if (members.size() == 1) {
      env[members[0]] = with_sharding_constraint(env[members[0]], PartitionSpec());
      return;
    }
    std::vector<Tensor> flat;
    for (int m : members) flat.push_back(reshape(env[m], {env[m].numel()}));
    Tensor all = with_sharding_constraint(concat(flat, 0), PartitionSpec());
    int64_t off = 0;
    for (int m : members) {
      int64_t n = env[m].numel();
      env[m] = reshape(slice_axis(all, 0, off, off + n), env[m].shape());
      off += n;
    }
  };
  for (int v : g.inputs()) produced(v);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    NodeFactsScope facts(*out, n.facts);  // its constraints and bucket slices too
    std::vector<Tensor> ins;
    for (int v : n.inputs) {
      Tensor t = env[v];
      for (int k : uses[v]) {
        const ValueConstraint& c = d.constraints[k];
        if (static_cast<int>(i) < c.readers_begin || static_cast<int>(i) >= c.readers_end) continue;
        if (!use_value[k].defined()) use_value[k] = constrain(env[v], c);  // placed at its first reader
        t = use_value[k];
        break;
      }
      ins.push_back(t);
    }
    std::vector<Tensor> res = out->emit(*n.prim, ins, n.attrs);
    out->mutable_nodes().back().name = n.name;
    for (size_t o = 0; o < res.size(); ++o) {
      raw[n.outputs[o]] = env[n.outputs[o]] = res[o];
      produced(n.outputs[o]);
    }
  }
  std::vector<Tensor> outs;
  for (int v : g.outputs()) outs.push_back(env[v]);
  out->set_outputs(outs);
  out->verify();
  if (value_map) {
    value_map->assign(nv, -1);
    for (size_t v = 0; v < nv; ++v) (*value_map)[v] = raw[v].defined() ? raw[v].id() : -1;
  }
  return out;
}

}  // namespace px
