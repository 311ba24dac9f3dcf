// Mixed-precision pass: f32 matmuls take 16-bit operands and keep f32 results.
#include "ir/primitive.h"
#include "parallax/ops.h"
#include "parallax/passes.h"

namespace px {

namespace {

// Per value of g, the id of the value that env gives it in the rewritten graph.
void fill_value_map(const std::vector<Tensor>& env, std::vector<int>* value_map) {
  if (!value_map) return;
  value_map->assign(env.size(), -1);
  for (size_t v = 0; v < env.size(); ++v)
    if (env[v].defined()) (*value_map)[v] = env[v].id();
}

void identity_map(const Graph& g, std::vector<int>* value_map) {
  if (!value_map) return;
  value_map->resize(g.values().size());
  for (size_t v = 0; v < g.values().size(); ++v) (*value_map)[v] = static_cast<int>(v);
}

}  // namespace

std::unique_ptr<Graph> autocast(const Graph& g, DType compute, std::vector<int>* value_map) {
  if (compute != DType::f32 && compute != DType::bf16 && compute != DType::f16)
    throw Error(std::string("[autocast] compute dtype must be f32, bf16 or f16, got ") + dtype_name(compute));
  if (compute == DType::f32) {
    identity_map(g, value_map);
    return g.clone();
  }
  auto out = std::make_unique<Graph>();
  TraceScope scope(out.get());
  std::vector<Tensor> env(g.values().size());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    env[g.inputs()[i]] = out->input(g.type(g.inputs()[i]), g.input_names()[i]);
  for (const Node& n : g.nodes()) {
    std::vector<Tensor> ins;
    for (int v : n.inputs) ins.push_back(env[v]);
    std::vector<Tensor> res;
    bool all_f32 = n.prim->name == "dot_general" && ins.size() == 2 && n.outputs.size() == 1 &&
                   ins[0].dtype() == DType::f32 && ins[1].dtype() == DType::f32 &&
                   g.type(n.outputs[0]).dtype == DType::f32;
    if (all_f32) {
      DotDims d{n.attrs.ints("lhs_contract"), n.attrs.ints("rhs_contract"), n.attrs.ints("lhs_batch"),
                n.attrs.ints("rhs_batch")};
      res = {dot_general(cast(ins[0], compute), cast(ins[1], compute), d, DType::f32)};
    } else {
      res = out->emit(*n.prim, ins, n.attrs);
    }
    if (!n.name.empty()) out->mutable_nodes().back().name = n.name;
    for (size_t o = 0; o < res.size(); ++o) env[n.outputs[o]] = res[o];
  }
  std::vector<Tensor> outs;
  for (int v : g.outputs()) outs.push_back(env[v]);
  out->set_outputs(outs);
  out->verify();
  fill_value_map(env, value_map);
  return out;
}

// An all-gather whose every reader casts its result to a narrower float type gathers the cast
// operand instead: under bf16 compute, FSDP moves and holds bf16 weights, not f32.
std::unique_ptr<Graph> narrow_gathers(const Graph& g, std::vector<int>* value_map) {
  std::vector<std::vector<int>> users(g.values().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (int v : g.nodes()[i].inputs) users[v].push_back(static_cast<int>(i));
  std::vector<char> is_output(g.values().size(), 0);
  for (int v : g.outputs()) is_output[v] = 1;
  // The narrow type each gather can move, or f32 when it cannot.
  std::vector<DType> narrow(g.nodes().size(), DType::f32);
  bool any = false;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (n.prim->name != "all_gather" || g.type(n.outputs[0]).dtype != DType::f32 || is_output[n.outputs[0]] ||
        users[n.outputs[0]].empty())
      continue;
    DType to = DType::f32;
    bool ok = true;
    for (int u : users[n.outputs[0]]) {
      const Node& c = g.nodes()[u];
      DType d = c.prim->name == "cast" ? g.type(c.outputs[0]).dtype : DType::f32;
      ok = ok && (d == DType::bf16 || d == DType::f16) && (to == DType::f32 || to == d);
      to = d;
    }
    if (ok) {
      narrow[i] = to;
      any = true;
    }
  }
  if (!any) {
    identity_map(g, value_map);
    return g.clone();
  }
  auto out = std::make_unique<Graph>();
  TraceScope scope(out.get());
  std::vector<Tensor> env(g.values().size());
  for (size_t i = 0; i < g.inputs().size(); ++i)
    env[g.inputs()[i]] = out->input(g.type(g.inputs()[i]), g.input_names()[i]);
  std::vector<char> gathered_narrow(g.values().size(), 0);  // a gather result already in the narrow type
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::vector<Tensor> ins;
    for (int v : n.inputs) ins.push_back(env[v]);
    std::vector<Tensor> res;
    if (narrow[i] != DType::f32) {
      res = out->emit(*n.prim, {cast(ins[0], narrow[i])}, n.attrs);
      gathered_narrow[n.outputs[0]] = 1;
    } else if (n.prim->name == "cast" && gathered_narrow[n.inputs[0]]) {
      res = {ins[0]};  // the gather already holds this dtype
    } else {
      res = out->emit(*n.prim, ins, n.attrs);
      if (!n.name.empty()) out->mutable_nodes().back().name = n.name;
    }
    for (size_t o = 0; o < res.size(); ++o) env[n.outputs[o]] = res[o];
  }
  std::vector<Tensor> outs;
  for (int v : g.outputs()) outs.push_back(env[v]);
  out->set_outputs(outs);
  out->verify();
  fill_value_map(env, value_map);
  return out;
}

}  // namespace px
