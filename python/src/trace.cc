// Tracing: symbolic Tensors, the ops of ops.h, gradients, and compiled Executables.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/operators.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "parallax/autodiff.h"
#include "parallax/nn/layers.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"

namespace pxpy {
namespace {

using px::Tensor;
using Axes = std::vector<int64_t>;

std::vector<px::TensorType> to_types(const std::vector<std::pair<px::DType, px::Shape>>& ts) {
  std::vector<px::TensorType> out;
  for (auto& [d, s] : ts) out.push_back({d, s});
  return out;
}

void bind_ops(nb::module_& m) {
  // constants
  m.def("constant", &px::constant, nb::arg("value"));
  m.def("full", &px::full, nb::arg("shape"), nb::arg("value"), nb::arg("dtype") = px::DType::f32);
  m.def("full_like", &px::full_like, nb::arg("x"), nb::arg("value"));
  m.def("zeros_like", &px::zeros_like);
  m.def("ones_like", &px::ones_like);
  m.def("iota", &px::iota, nb::arg("shape"), nb::arg("axis"), nb::arg("dtype") = px::DType::i32);
  // elementwise
#define PX_UNARY(name) \
  m.def(               \
      #name, [](const Tensor& x) { return px::name(x); }, nb::arg("x"))
#define PX_BINARY(name) \
  m.def(                \
      #name, [](const Tensor& a, const Tensor& b) { return px::name(a, b); }, nb::arg("a"), nb::arg("b"))
  PX_BINARY(add);
  PX_BINARY(sub);
  PX_BINARY(mul);
  PX_BINARY(div);
  PX_BINARY(pow);
  PX_BINARY(maximum);
  PX_BINARY(minimum);
  PX_BINARY(equal);
  PX_BINARY(not_equal);
  PX_BINARY(less);
  PX_BINARY(less_equal);
  PX_BINARY(greater);
  PX_BINARY(greater_equal);
  PX_BINARY(logical_and);
  PX_BINARY(logical_or);
  PX_UNARY(neg);
  PX_UNARY(exp);
  PX_UNARY(log);
  PX_UNARY(tanh);
  PX_UNARY(sqrt);
  PX_UNARY(rsqrt);
  PX_UNARY(abs);
  PX_UNARY(square);
  PX_UNARY(sigmoid);
  PX_UNARY(logical_not);
  PX_UNARY(stop_gradient);
  PX_UNARY(silu);
#undef PX_UNARY
#undef PX_BINARY
  m.def("where", &px::where, nb::arg("cond"), nb::arg("a"), nb::arg("b"));
  m.def("cast", &px::cast, nb::arg("x"), nb::arg("dtype"));
  // shape
  m.def("broadcast_to", &px::broadcast_to, nb::arg("x"), nb::arg("shape"));
  m.def("broadcast_in_dim", &px::broadcast_in_dim, nb::arg("x"), nb::arg("shape"), nb::arg("dims"));
  m.def("reshape", &px::reshape, nb::arg("x"), nb::arg("shape"));
  m.def("transpose", &px::transpose, nb::arg("x"), nb::arg("perm"));
  m.def("swap_axes", &px::swap_axes, nb::arg("x"), nb::arg("a"), nb::arg("b"));
  m.def("slice", &px::slice, nb::arg("x"), nb::arg("starts"), nb::arg("limits"), nb::arg("strides") = Axes{});
  m.def("slice_axis", &px::slice_axis, nb::arg("x"), nb::arg("axis"), nb::arg("start"), nb::arg("limit"));
  m.def("split", &px::split, nb::arg("x"), nb::arg("sizes"), nb::arg("axis"));
  m.def("concat", &px::concat, nb::arg("xs"), nb::arg("axis"));
  m.def("pad", &px::pad, nb::arg("x"), nb::arg("lo"), nb::arg("hi"), nb::arg("value") = 0.0);
  m.def("expand_dims", &px::expand_dims, nb::arg("x"), nb::arg("axis"));
  m.def("squeeze", &px::squeeze, nb::arg("x"), nb::arg("axis"));
  // reductions
  m.def("sum", &px::sum, nb::arg("x"), nb::arg("axes") = Axes{}, nb::arg("keepdims") = false);
  m.def("max", &px::max, nb::arg("x"), nb::arg("axes") = Axes{}, nb::arg("keepdims") = false);
  m.def("mean", &px::mean, nb::arg("x"), nb::arg("axes") = Axes{}, nb::arg("keepdims") = false);
  // contractions
  m.def(
      "dot_general",
      [](const Tensor& a, const Tensor& b, const Axes& lc, const Axes& rc, const Axes& lb, const Axes& rb,
         std::optional<px::DType> out) {
        return px::dot_general(a, b, px::DotDims{lc, rc, lb, rb}, out);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("lhs_contract"), nb::arg("rhs_contract"), nb::arg("lhs_batch") = Axes{},
      nb::arg("rhs_batch") = Axes{}, nb::arg("out_dtype") = nb::none());
  m.def("matmul", &px::matmul, nb::arg("a"), nb::arg("b"));
  // neural-network blocks
  m.def("softmax", &px::softmax, nb::arg("x"), nb::arg("axis") = -1);
  m.def("log_softmax", &px::log_softmax, nb::arg("x"), nb::arg("axis") = -1);
  m.def("logsumexp", &px::logsumexp, nb::arg("x"), nb::arg("axis") = -1, nb::arg("keepdims") = false);
  m.def(
      "layer_norm",
      [](const Tensor& x, const Tensor& g, std::optional<Tensor> b, double eps) {
        return px::layer_norm(x, g, b ? *b : Tensor(), eps);
      },
      nb::arg("x"), nb::arg("gamma"), nb::arg("beta") = nb::none(), nb::arg("eps") = 1e-5);
  m.def("rms_norm", &px::rms_norm, nb::arg("x"), nb::arg("gamma"), nb::arg("eps") = 1e-6);
  m.def("gelu", &px::gelu, nb::arg("x"), nb::arg("approximate") = true);
  m.def("softmax_cross_entropy", &px::softmax_cross_entropy, nb::arg("logits"), nb::arg("labels"),
        nb::arg("ignore_index") = -100);
  m.def(
      "cross_entropy_loss",
      [](const Tensor& logits, const Tensor& labels, std::optional<Tensor> w, int64_t ignore) {
        return px::cross_entropy_loss(logits, labels, w ? *w : Tensor(), ignore);
      },
      nb::arg("logits"), nb::arg("labels"), nb::arg("weights") = nb::none(), nb::arg("ignore_index") = -100);
  m.def(
      "dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, bool causal, std::optional<double> scale,
         std::optional<Tensor> key_padding) {
        px::AttentionOptions o;
        o.causal = causal;
        o.scale = scale;
        if (key_padding) o.key_padding = *key_padding;
        return px::dot_product_attention(q, k, v, o);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("causal") = true, nb::arg("scale") = nb::none(),
      nb::arg("key_padding") = nb::none());
  // indexing
  m.def("take", &px::take, nb::arg("table"), nb::arg("indices"));
  m.def("scatter_add", &px::scatter_add, nb::arg("indices"), nb::arg("updates"), nb::arg("num_rows"));
  m.def("one_hot", &px::one_hot, nb::arg("indices"), nb::arg("depth"), nb::arg("dtype") = px::DType::f32);
  // random numbers
  m.def("random_key", &px::random_key, nb::arg("seed"));
  m.def("fold_in", &px::fold_in, nb::arg("key"), nb::arg("data"));
  m.def("random_uniform", &px::random_uniform, nb::arg("key"), nb::arg("shape"), nb::arg("dtype") = px::DType::f32,
        nb::arg("lo") = 0.0, nb::arg("hi") = 1.0);
  m.def("random_normal", &px::random_normal, nb::arg("key"), nb::arg("shape"), nb::arg("dtype") = px::DType::f32);
  m.def("dropout", &px::dropout, nb::arg("key"), nb::arg("x"), nb::arg("rate"));
  m.def("tag", &px::tag, nb::arg("x"), nb::arg("name"));
  m.def(
      "apply_rope", [](const Tensor& x, double theta, int64_t offset) { return px::nn::apply_rope(x, theta, offset); },
      nb::arg("x"), nb::arg("theta") = 10000.0, nb::arg("offset") = 0,
      "Rotary positions on x[..., S, D] (rotate-half convention), positions offset .. offset+S-1.");
}

}  // namespace

void bind_trace(nb::module_& m) {
  nb::class_<px::Graph>(m, "Graph", "A traced program (px::Graph).")
      .def("to_string", &px::Graph::to_string)
      .def("__str__", &px::Graph::to_string)
      .def_prop_ro("num_nodes", [](const px::Graph& g) { return g.nodes().size(); })
      .def_prop_ro("num_inputs", [](const px::Graph& g) { return g.inputs().size(); })
      .def_prop_ro("num_outputs", [](const px::Graph& g) { return g.outputs().size(); });

  nb::class_<Tensor>(m, "Tensor", "A symbolic value while tracing: a shape and a dtype, no data.")
      .def_prop_ro("shape", [](const Tensor& t) { return nb::tuple(nb::cast(t.shape())); })
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("ndim", &Tensor::rank)
      .def_prop_ro("size", &Tensor::numel)
      .def_prop_ro("alive", &Tensor::alive)
      .def("__repr__", [](const Tensor& t) { return "Tensor(" + px::type_str(t.type()) + ")"; })
      .def(nb::self + nb::self)
      .def(nb::self - nb::self)
      .def(nb::self * nb::self)
      .def(nb::self / nb::self)
      .def(-nb::self)
      .def(nb::self + double())
      .def(nb::self - double())
      .def(nb::self * double())
      .def(nb::self / double())
      .def(double() + nb::self)
      .def(double() - nb::self)
      .def(double() * nb::self)
      .def(double() / nb::self)
      .def("__matmul__", [](const Tensor& a, const Tensor& b) { return px::matmul(a, b); })
      .def("__pow__", [](const Tensor& a, const Tensor& b) { return px::pow(a, b); })
      .def("__pow__", [](const Tensor& a, double b) { return px::pow(a, px::full_like(a, b)); })
      .def("__lt__", [](const Tensor& a, const Tensor& b) { return px::less(a, b); })
      .def("__le__", [](const Tensor& a, const Tensor& b) { return px::less_equal(a, b); })
      .def("__gt__", [](const Tensor& a, const Tensor& b) { return px::greater(a, b); })
      .def("__ge__", [](const Tensor& a, const Tensor& b) { return px::greater_equal(a, b); })
      .def("__lt__", [](const Tensor& a, double b) { return px::less(a, px::full_like(a, b)); })
      .def("__le__", [](const Tensor& a, double b) { return px::less_equal(a, px::full_like(a, b)); })
      .def("__gt__", [](const Tensor& a, double b) { return px::greater(a, px::full_like(a, b)); })
      .def("__ge__", [](const Tensor& a, double b) { return px::greater_equal(a, px::full_like(a, b)); });

  m.def(
      "trace",
      [](const px::TracedFn& fn, const std::vector<std::pair<px::DType, px::Shape>>& types,
         const std::vector<std::string>& names) { return px::trace(fn, to_types(types), names); },
      nb::arg("fn"), nb::arg("types"), nb::arg("names") = std::vector<std::string>{},
      "Traces fn(list of Tensors) -> list of Tensors on inputs of the given (dtype, shape) into a Graph.");
  m.def(
      "gradients",
      [](const std::vector<Tensor>& ys, const std::vector<Tensor>& xs, const std::vector<std::optional<Tensor>>& dys) {
        std::vector<Tensor> d;
        for (auto& t : dys) d.push_back(t ? *t : Tensor());
        std::vector<Tensor> g = px::gradients(ys, xs, d);
        std::vector<std::optional<Tensor>> out;
        for (auto& t : g) out.push_back(t.defined() ? std::optional<Tensor>(t) : std::nullopt);
        return out;
      },
      nb::arg("ys"), nb::arg("xs"), nb::arg("dys") = std::vector<std::optional<Tensor>>{},
      "d(sum_i <ys[i], dys[i]>)/d xs; None for integer inputs.");

  nb::class_<px::CompileOptions>(m, "CompileOptions")
      .def(nb::init<>())
      .def_rw("platform", &px::CompileOptions::platform)
      .def_rw("fuse_elementwise", &px::CompileOptions::fuse_elementwise)
      .def_rw("optimize", &px::CompileOptions::optimize)
      .def_rw("compute_dtype", &px::CompileOptions::compute_dtype)
      .def_rw("memory_limit_bytes", &px::CompileOptions::memory_limit_bytes)
      .def_rw("profile", &px::CompileOptions::profile);

  nb::class_<px::Executable>(m, "Executable", "A compiled Graph (px::Executable).")
      .def_static("compile", &px::Executable::compile, nb::arg("graph"), nb::arg("options") = px::CompileOptions())
      .def("run", &px::Executable::run, nb::arg("inputs"), nb::call_guard<nb::gil_scoped_release>())
      .def("peak_bytes", &px::Executable::peak_bytes)
      .def("num_steps", &px::Executable::num_steps)
      .def("summary", &px::Executable::summary)
      .def("memory_report", [](const px::Executable& e) { return e.memory().to_string(); });

  bind_ops(m);
}

}  // namespace pxpy
