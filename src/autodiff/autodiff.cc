#include "parallax/autodiff.h"

#include "ir/primitive.h"
#include "parallax/ops.h"

namespace px {

std::vector<Tensor> gradients(const std::vector<Tensor>& ys, const std::vector<Tensor>& xs,
                              const std::vector<Tensor>& dys) {
  if (ys.empty()) throw Error("[gradients] no outputs to differentiate");
  Graph* g = ys[0].graph();
  if (!g) throw Error("[gradients] output 0 is an undefined tensor");
  for (auto& t : ys)
    if (t.graph() != g) throw Error("[gradients] outputs belong to different graphs");
  for (auto& t : xs)
    if (t.graph() != g) throw Error("[gradients] an input is undefined or belongs to another graph");
  if (!dys.empty() && dys.size() != ys.size())
    throw Error("[gradients] got " + std::to_string(dys.size()) + " cotangents for " + std::to_string(ys.size()) +
                " outputs");

  const size_t nv = g->values().size();
  const size_t nn = g->nodes().size();  // nodes emitted below are not revisited

  // Forward reachability from xs (only float values carry gradients).
  std::vector<char> reach(nv, 0);
  for (auto& x : xs) reach[x.id()] = is_float(x.dtype());
  for (size_t i = 0; i < nn; ++i) {
    const Node& n = g->nodes()[i];
    bool any = false;
    for (int v : n.inputs) any = any || reach[v];
    if (any)
      for (int v : n.outputs) reach[v] = is_float(g->type(v).dtype);
  }

  std::vector<Tensor> ct(nv);
  auto accumulate = [&](int v, const Tensor& d) {
    if (!d.defined()) return;
    if (d.type() != g->type(v))
      throw Error("[gradients] cotangent of type " + type_str(d.type()) + " for a value of type " +
                  type_str(g->type(v)) + " (a vjp rule is wrong)");
    ct[v] = ct[v].defined() ? add(ct[v], d) : d;
  };
  for (size_t i = 0; i < ys.size(); ++i) {
    Tensor dy = dys.empty() ? Tensor() : dys[i];
    if (dy.defined() && (dy.graph() != g || dy.type() != ys[i].type()))
      throw Error("[gradients] cotangent " + std::to_string(i) + " has type " + type_str(dy.type()) +
                  (dy.graph() != g ? " and belongs to another graph" : "") + "; output " + std::to_string(i) +
                  " has type " + type_str(ys[i].type()));
    if (!dy.defined()) {
      if (ys[i].numel() != 1)
        throw Error("[gradients] output " + std::to_string(i) + " has shape " + shape_str(ys[i].shape()) +
                    "; pass a cotangent for non-scalar outputs");
      dy = ones_like(ys[i]);
    }
    if (reach[ys[i].id()]) accumulate(ys[i].id(), dy);
  }

  for (size_t i = nn; i-- > 0;) {
    // Copy: emitting vjp nodes may grow (and reallocate) the node list.
    Node n = g->nodes()[i];
    bool has_ct = false;
    for (int v : n.outputs) has_ct = has_ct || ct[v].defined();
    if (!has_ct) continue;
    bool needs = false;
    for (int v : n.inputs) needs = needs || reach[v];
    if (!needs) continue;
    if (!n.prim->vjp)
      throw Error("[gradients] primitive '" + n.prim->name + "' is not differentiable, but a gradient flows through it");
    std::vector<Tensor> ins, outs, cts;
    for (int v : n.inputs) ins.emplace_back(g, v);
    for (int v : n.outputs) {
      outs.emplace_back(g, v);
      cts.push_back(ct[v]);
    }
    std::vector<Tensor> din = n.prim->vjp(VjpArgs{ins, outs, cts, n.attrs});
    if (din.size() != ins.size())
      throw Error("[gradients] vjp of '" + n.prim->name + "' returned " + std::to_string(din.size()) +
                  " cotangents for " + std::to_string(ins.size()) + " operands");
    for (size_t k = 0; k < ins.size(); ++k)
      if (reach[n.inputs[k]]) accumulate(n.inputs[k], din[k]);
  }

  std::vector<Tensor> out;
  for (auto& x : xs) {
    if (!is_float(x.dtype())) out.emplace_back();
    else out.push_back(ct[x.id()].defined() ? ct[x.id()] : zeros_like(x));
  }
  return out;
}

TensorFn value_and_grad(TensorFn f, std::vector<int> argnums) {
  return [f, argnums](const std::vector<Tensor>& args) {
    std::vector<Tensor> outs = f(args);
    if (outs.empty()) throw Error("[value_and_grad] the function returned no outputs");
    std::vector<Tensor> wrt;
    for (int a : argnums) {
      if (a < 0 || a >= static_cast<int>(args.size()))
        throw Error("[value_and_grad] argnum " + std::to_string(a) + " out of range for " +
                    std::to_string(args.size()) + " arguments");
      wrt.push_back(args[a]);
    }
    std::vector<Tensor> d = gradients(outs[0], wrt);
    outs.insert(outs.end(), d.begin(), d.end());
    return outs;
  };
}

TensorFn grad(TensorFn f, std::vector<int> argnums) {
  TensorFn vg = value_and_grad(std::move(f), argnums);
  size_t n = argnums.size();
  return [vg, n](const std::vector<Tensor>& args) {
    std::vector<Tensor> all = vg(args);
    return std::vector<Tensor>(all.end() - static_cast<long>(n), all.end());
  };
}

std::pair<std::vector<Tensor>, TensorFn> vjp(const TensorFn& f, const std::vector<Tensor>& primals) {
  std::vector<Tensor> outs = f(primals);
  TensorFn back = [outs, primals](const std::vector<Tensor>& cts) { return gradients(outs, primals, cts); };
  return {outs, back};
}

std::vector<Tensor> call(const Graph& g, const std::vector<Tensor>& args) {
  if (args.size() != g.inputs().size())
    throw Error("[call] graph takes " + std::to_string(g.inputs().size()) + " arguments, got " +
                std::to_string(args.size()));
  Graph* target = args.empty() ? current_graph() : args[0].graph();
  if (!target) throw Error("[call] called outside of a trace: use px::trace or a px::TraceScope");
  TraceScope scope(target);  // nodes without operands (constants) land in the same graph
  std::vector<Tensor> env(g.values().size());
  for (size_t i = 0; i < args.size(); ++i) {
    if (!args[i].defined()) throw Error("[call] argument " + std::to_string(i) + " is an undefined tensor");
    if (args[i].graph() != target) throw Error("[call] argument " + std::to_string(i) + " belongs to another graph");
    if (args[i].type() != g.type(g.inputs()[i]))
      throw Error("[call] argument " + std::to_string(i) + " has type " + type_str(args[i].type()) + ", expected " +
                  type_str(g.type(g.inputs()[i])));
    env[g.inputs()[i]] = args[i];
  }
  for (const Node& n : g.nodes()) {
    std::vector<Tensor> ins;
    for (int v : n.inputs) ins.push_back(env[v]);
    std::vector<Tensor> outs = target->emit(*n.prim, ins, n.attrs);
    if (!n.name.empty()) target->mutable_nodes().back().name = n.name;  // keep remat/debug tags
    for (size_t o = 0; o < outs.size(); ++o) env[n.outputs[o]] = outs[o];
  }
  std::vector<Tensor> result;
  for (int v : g.outputs()) result.push_back(env[v]);
  return result;
}

std::unique_ptr<Graph> grad_graph(const Graph& g, const std::vector<int>& wrt, int of) {
  std::vector<TensorType> types;
  for (int v : g.inputs()) types.push_back(g.type(v));
  if (of < 0 || of >= static_cast<int>(g.outputs().size()))
    throw Error("[grad_graph] output " + std::to_string(of) + " does not exist");
  const TensorType& ot = g.type(g.outputs()[of]);
  if (ot.numel() != 1 || !is_float(ot.dtype))
    throw Error("[grad_graph] output " + std::to_string(of) + " has type " + type_str(ot) +
                "; only a float scalar output can be differentiated");
  return trace(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> outs = call(g, in);
        std::vector<Tensor> xs;
        for (int w : wrt) {
          if (w < 0 || w >= static_cast<int>(in.size()))
            throw Error("[grad_graph] input " + std::to_string(w) + " does not exist");
          xs.push_back(in[w]);
        }
        std::vector<Tensor> d = gradients(outs[of], xs);
        for (auto& t : d)
          if (!t.defined()) throw Error("[grad_graph] cannot differentiate with respect to an integer input");
        outs.insert(outs.end(), d.begin(), d.end());
        return outs;
      },
      types, g.input_names());
}

}  // namespace px
