// parallax._core._testing: programs written in C++ against which the tests compare the Python
// frontend (the same ops traced from Python must give the same graph and the same bits).
#include <memory>
#include <string>
#include <vector>

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"

namespace pxpy {
namespace {

using px::Tensor;

// Traces a named C++ reference program for the inputs' types, runs it, returns (graph text, outputs).
std::pair<std::string, std::vector<px::Array>> reference(const std::string& name, const std::vector<px::Array>& in) {
  px::TracedFn fn;
  if (name == "tanh_matmul") {
    // loss = sum(tanh(x @ w)) * 2, and d loss / d (x, w)
    fn = [](const std::vector<Tensor>& a) {
      Tensor loss = px::sum(px::tanh(px::matmul(a[0], a[1]))) * 2.0;
      std::vector<Tensor> g = px::gradients(loss, {a[0], a[1]});
      return std::vector<Tensor>{loss, g[0], g[1]};
    };
  } else if (name == "gelu_ce") {
    // loss = cross_entropy(gelu(x @ w + b), labels), and d loss / d (w, b)
    fn = [](const std::vector<Tensor>& a) {
      Tensor loss = px::cross_entropy_loss(px::gelu(px::matmul(a[0], a[1]) + a[2]), a[3]);
      std::vector<Tensor> g = px::gradients(loss, {a[1], a[2]});
      return std::vector<Tensor>{loss, g[0], g[1]};
    };
  } else if (name == "attention") {
    // y = sum(softmax(q k^T / 2, -1) v * v), causal attention op, and d y / d q
    fn = [](const std::vector<Tensor>& a) {
      Tensor y = px::sum(px::dot_product_attention(a[0], a[1], a[2]) * a[2]);
      return std::vector<Tensor>{y, px::gradients(y, {a[0]})[0]};
    };
  } else {
    throw px::UserError("_testing.reference: unknown program '" + name + "'");
  }
  std::vector<px::TensorType> types;
  for (auto& a : in) types.push_back(a.type());
  auto graph = px::trace(fn, types);
  auto exe = px::Executable::compile(*graph);
  return {graph->to_string(), exe->run(in)};
}

}  // namespace

void bind_testing(nb::module_& m) {
  nb::module_ t = m.def_submodule("_testing", "C++ reference programs for the tests");
  t.def("reference", &reference, nb::arg("name"), nb::arg("inputs"));
}

}  // namespace pxpy
