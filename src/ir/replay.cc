// Rebuilding a graph node by node (ir/replay.h).
#include "ir/replay.h"

namespace px {

std::unique_ptr<Graph> replay(const Graph& g, std::vector<int>* value_map, const NodeRewrite& rewrite) {
  auto out = std::make_unique<Graph>();
  TraceScope scope(out.get());
  std::vector<Tensor> env(g.values().size());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    env[g.inputs()[i]] = out->input(g.type(g.inputs()[i]), g.input_names()[i]);
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    NodeFactsScope facts(*out, n.facts);  // what replaces node i is where node i was
    std::vector<Tensor> ins;
    for (int v : n.inputs) ins.push_back(env[v]);
    std::optional<std::vector<Tensor>> res = rewrite(i, ins);
    if (!res) {
      res = out->emit(*n.prim, ins, n.attrs);
      if (!n.name.empty()) out->mutable_nodes().back().name = n.name;
    }
    for (size_t o = 0; o < res->size(); ++o) env[n.outputs[o]] = (*res)[o];
  }
  std::vector<Tensor> outs;
  for (int v : g.outputs()) outs.push_back(env[v]);
  out->set_outputs(outs);
  out->verify();
  std::vector<int> new_id(env.size(), -1);
  for (size_t v = 0; v < env.size(); ++v)
    if (env[v].defined()) new_id[v] = env[v].id();
  out->copy_facts(g, new_id);
  if (value_map) *value_map = std::move(new_id);
  return out;
}

}  // namespace px
