// Reverse-mode autodiff over the graph being traced. Gradients are ordinary graph nodes,
// emitted with each primitive's vjp rule, so they can be differentiated again.
//
//   auto g = px::trace([](const std::vector<px::Tensor>& in) {
//     px::Tensor loss = px::sum(px::tanh(in[0]) * in[1]);
//     std::vector<px::Tensor> d = px::gradients(loss, {in[0], in[1]});
//     return std::vector<px::Tensor>{loss, d[0], d[1]};
//   }, {{px::DType::f32, {3}}, {px::DType::f32, {3}}});
#pragma once

#include <functional>
#include <vector>

#include "parallax/graph.h"

namespace px {

// d(sum_i <ys[i], dys[i]>)/d xs. A missing dys[i] means ones (ys[i] must then be a scalar).
// A float x that ys do not depend on gets zeros; an integer or bool x gets an undefined Tensor.
std::vector<Tensor> gradients(const std::vector<Tensor>& ys, const std::vector<Tensor>& xs,
                              const std::vector<Tensor>& dys = {});
inline std::vector<Tensor> gradients(const Tensor& y, const std::vector<Tensor>& xs) {
  return gradients(std::vector<Tensor>{y}, xs);
}

using TensorFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

// Function transforms in the style of JAX, used while tracing. f's first output is the scalar
// that is differentiated; the result of value_and_grad holds all of f's outputs then the
// gradients with respect to args[argnums[k]].
TensorFn grad(TensorFn f, std::vector<int> argnums = {0});
TensorFn value_and_grad(TensorFn f, std::vector<int> argnums = {0});
// Returns f(primals) and a function from output cotangents to input cotangents.
std::pair<std::vector<Tensor>, TensorFn> vjp(const TensorFn& f, const std::vector<Tensor>& primals);

// Emits g's nodes into the graph of `args` (or current_graph()), returning g's outputs.
std::vector<Tensor> call(const Graph& g, const std::vector<Tensor>& args);
// A graph with g's inputs whose outputs are g's outputs followed by d(output `of`)/d(inputs[wrt]).
std::unique_ptr<Graph> grad_graph(const Graph& g, const std::vector<int>& wrt, int of = 0);

}  // namespace px
