// Mixed-precision pass: f32 matmuls take 16-bit operands and keep f32 results.
#include "ir/primitive.h"
#include "parallax/ops.h"
#include "parallax/passes.h"

namespace px {

std::unique_ptr<Graph> autocast(const Graph& g, DType compute) {
  if (compute != DType::f32 && compute != DType::bf16 && compute != DType::f16)
    throw Error(std::string("[autocast] compute dtype must be f32, bf16 or f16, got ") + dtype_name(compute));
  if (compute == DType::f32) return g.clone();
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
  return out;
}

}  // namespace px
