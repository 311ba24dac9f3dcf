// The backend conformance suite, for every backend, a backend of your own included: every primitive
// in every dtype it takes and a few shapes (odd sizes, size-1 broadcasts, empty dims, out-of-range
// indices) runs on the backend under test and on the reference backend `ref` (plain loops in double,
// rounded to the dtype), forward and vjp (the gradient of the outputs against fixed random
// cotangents), and the results are compared within a per-dtype tolerance. Header-only: a backend's
// own test includes it, links parallax::parallax and calls check_backend after registering the
// backend (docs/adding-a-backend.md):
//
//   px::register_backend("mydev", [] () -> px::Backend& { return my_backend; });
//   px::conformance::Report r = px::conformance::check_backend("mydev");
//   std::cout << r.table();                     // passed / run per primitive and dtype
//   for (const std::string& f : r.failures) std::cerr << f << "\n";
//   return r.ok() ? 0 : 1;
//
// Options::filter picks cases by name (a backend that has only some kernels yet); a case whose
// program the backend cannot compile (no kernel) is a failure naming the primitive.
// tests/backend/test_conformance.cc runs it on every registered platform but `ref`.
//
// Tolerances (|got - ref| <= atol * max(1, max|ref|) + rtol * |ref|, elementwise; NaN == NaN and
// equal infinities pass; max|ref| is over the whole output, so an entry that cancels to ~0 in a
// 16-bit result is judged against the output's scale, not its own):
//   f32   atol 1e-5, rtol 1e-5    (vectorized exp/tanh/... are a few ulps off; sums reorder)
//   bf16  atol 1e-2, rtol 1e-2    (~1 bf16 ulp = 2^-8 .. 2^-7 relative: both round once, from f32
//                                  on the cpu and from double on ref, which may differ by one ulp)
//   f16   atol 2e-3, rtol 2e-3    (~1-2 f16 ulps, 2^-11 .. 2^-10 relative)
//   i32, bool: exact.
// Cases with long reductions (sums over >= 100 terms, matmuls) scale the float tolerances by
// Case::tol. VJP graphs chain several primitives, each rounding to the dtype, so their float
// tolerances are 4x the forward ones (4 roundings' worth).
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "parallax/autodiff.h"
#include "parallax/backend.h"
#include "parallax/ops.h"
#include "parallax/optim.h"
#include "parallax/runtime.h"
#include "parallax/sharding.h"

namespace px::conformance {

// In and Case are aggregates whose brace-initializers leave trailing fields at their defaults.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

using Ts = std::vector<Tensor>;

// One input: its shape, value range and dtype (unset: the case's dtype). i32 values are integers
// in [lo, hi]; bool values are random; `integral` rounds float values to integers (comparisons).
struct In {
  Shape shape;
  double lo = -2, hi = 2;
  std::optional<DType> dtype;
  bool integral = false;
};
inline In x(Shape s, double lo = -2, double hi = 2) { return In{std::move(s), lo, hi}; }
inline In xi(Shape s, double lo = -3, double hi = 3) { return In{std::move(s), lo, hi, std::nullopt, true}; }
inline In f32(Shape s, double lo = -2, double hi = 2) { return In{std::move(s), lo, hi, DType::f32}; }
inline In i32(Shape s, double lo, double hi) { return In{std::move(s), lo, hi, DType::i32}; }
inline In boolean(Shape s) { return In{std::move(s), 0, 1, DType::boolean}; }

// One case: a function built from the public ops (so that its attributes are what users' programs
// carry), its inputs (one list per variant) and the dtypes it runs in.
struct Case {
  std::string name;
  std::vector<DType> dtypes;
  std::vector<std::vector<In>> variants;
  std::function<Ts(const Ts&, DType)> fn;
  std::string prim;      // the summary row (default: name)
  std::string vjp_prim;  // the summary row of the vjp results (default: prim)
  double tol = 1;        // scales the float tolerances (long reductions, matmuls)
  bool vjp = true;       // also compare the gradient w.r.t. the float inputs
};

#define PXC_FN(...)                 \
  [](const Ts& a, DType dt) -> Ts { \
    (void)a;                        \
    (void)dt;                       \
    return {__VA_ARGS__};           \
  }

// The cases, per primitive.
inline const std::vector<Case>& cases() {
  using D = DType;
  const std::vector<D> kFloat{D::f32, D::bf16, D::f16};
  const std::vector<D> kNumeric{D::f32, D::bf16, D::f16, D::i32};
  const std::vector<D> kAny{D::f32, D::bf16, D::f16, D::i32, D::boolean};
  const Shape s357{3, 5, 7};
  // Odd sizes, a size-1 broadcast, an empty dim, a scalar.
  auto binary = [&](double lo = -2, double hi = 2, double lo2 = -2, double hi2 = 2) {
    return std::vector<std::vector<In>>{{x(s357, lo, hi), x(s357, lo2, hi2)},
                                        {x(s357, lo, hi), x({1, 5, 1}, lo2, hi2)},
                                        {x({0, 5}, lo, hi), x({0, 5}, lo2, hi2)},
                                        {x({}, lo, hi), x({}, lo2, hi2)}};
  };
  auto unary = [&](double lo = -2, double hi = 2) {
    return std::vector<std::vector<In>>{{x(s357, lo, hi)}, {x({0, 5}, lo, hi)}, {x({}, lo, hi)}};
  };
  auto compare_inputs = [&] {
    return std::vector<std::vector<In>>{
        {xi(s357, -2, 2), xi(s357, -2, 2)}, {xi(s357, -2, 2), xi({1, 5, 1}, -2, 2)}, {xi({0, 5}), xi({0, 5})}};
  };
  static const std::vector<Case> table = {
      // ---- elementwise arithmetic (numpy broadcasting emits broadcast_in_dim) ----
      {"add", kNumeric, binary(), PXC_FN(add(a[0], a[1]))},
      {"sub", kNumeric, binary(), PXC_FN(sub(a[0], a[1]))},
      {"mul", kNumeric, binary(), PXC_FN(mul(a[0], a[1]))},
      {"div", kNumeric, binary(-20, 20, 1, 5), PXC_FN(div(a[0], a[1]))},
      {"div_negative_divisor", kNumeric, binary(-20, 20, -5, -1), PXC_FN(div(a[0], a[1])), "div"},
      {"pow", kFloat, binary(0.5, 3, -2, 2), PXC_FN(pow(a[0], a[1]))},
      {"maximum", kNumeric, binary(), PXC_FN(maximum(a[0], a[1]))},
      {"minimum", kNumeric, binary(), PXC_FN(minimum(a[0], a[1]))},
      {"neg", kNumeric, unary(), PXC_FN(neg(a[0]))},
      {"abs", kNumeric, unary(), PXC_FN(abs(a[0]))},
      {"exp", kFloat, unary(-5, 5), PXC_FN(exp(a[0]))},
      {"log", kFloat, unary(0.1, 10), PXC_FN(log(a[0]))},
      {"tanh", kFloat, unary(-4, 4), PXC_FN(tanh(a[0]))},
      {"sqrt", kFloat, unary(0.1, 9), PXC_FN(sqrt(a[0]))},
      {"rsqrt", kFloat, unary(0.1, 9), PXC_FN(rsqrt(a[0]))},
      {"sigmoid", kFloat, unary(-8, 8), PXC_FN(sigmoid(a[0]))},
      // ---- comparisons and logic (bool results) ----
      {"eq", kAny, compare_inputs(), PXC_FN(equal(a[0], a[1]))},
      {"ne", kAny, compare_inputs(), PXC_FN(not_equal(a[0], a[1]))},
      {"lt", kNumeric, compare_inputs(), PXC_FN(less(a[0], a[1]))},
      {"le", kNumeric, compare_inputs(), PXC_FN(less_equal(a[0], a[1]))},
      {"gt", kNumeric, compare_inputs(), PXC_FN(greater(a[0], a[1]))},
      {"ge", kNumeric, compare_inputs(), PXC_FN(greater_equal(a[0], a[1]))},
      {"logical_and", {D::boolean}, binary(), PXC_FN(logical_and(a[0], a[1]))},
      {"logical_or", {D::boolean}, binary(), PXC_FN(logical_or(a[0], a[1]))},
      {"logical_not", {D::boolean}, unary(), PXC_FN(logical_not(a[0]))},
      {"select",
       kAny,
       {{boolean(s357), x(s357), x(s357)},
        {boolean({3, 1, 7}), x(s357), x({1, 5, 1})},
        {boolean({0, 5}), x({0, 5}), x({0, 5})}},
       PXC_FN(where(a[0], a[1], a[2]))},
      // cast from f32 to the case's dtype (values with exact integers and halves), and back.
      {"cast_from_f32",
       {D::bf16, D::f16, D::i32, D::boolean},
       {{f32(s357, -6, 6)}, {In{s357, -3, 3, D::f32, true}}, {f32({0, 5})}},
       PXC_FN(cast(a[0], dt)),
       "cast"},
      {"cast_to_f32",
       {D::bf16, D::f16, D::i32, D::boolean},
       {{x(s357, -100, 100)}, {x({0, 5})}},
       PXC_FN(cast(a[0], D::f32)),
       "cast"},
      {"cast_bf16_f16",
       {D::bf16, D::f16},
       {{x(s357, -100, 100)}},
       PXC_FN(cast(a[0], dt == D::bf16 ? D::f16 : D::bf16)),
       "cast"},
      {"stop_gradient", kFloat, unary(), PXC_FN(stop_gradient(a[0]) * a[0])},
      {"tag", kAny, unary(), PXC_FN(tag(a[0], "conformance"))},
      {"sharding_constraint",
       kFloat,
       {{x(s357)}},
       PXC_FN(with_sharding_constraint(a[0], PartitionSpec{"data"}) * a[0])},
      // ---- constants ----
      {"constant",
       kNumeric,
       {{x(s357)}},
       PXC_FN(a[0] + constant(Array::from_f32(std::vector<float>(35, 1.5f), {5, 7}, dt)))},
      {"full", kNumeric, {{x(s357)}, {x({0, 5})}}, PXC_FN(a[0] * full(a[0].shape(), 3, dt))},
      {"iota", kNumeric, {{x(s357)}, {x({0, 5})}}, PXC_FN(a[0] + iota(a[0].shape(), 1, dt), iota({4, 3}, 0, dt))},
      // ---- shape ----
      {"broadcast_in_dim",
       kAny,
       {{x({5})}, {x({0})}},
       PXC_FN(broadcast_in_dim(a[0], {3, a[0].dim(0), 7}, {1}), broadcast_to(a[0], {2, a[0].dim(0)}))},
      {"reshape", kAny, {{x(s357)}, {x({0, 5})}}, PXC_FN(reshape(a[0], {a[0].dim(-1), -1}))},
      {"transpose", kAny, {{x(s357)}, {x({0, 5, 2})}}, PXC_FN(transpose(a[0], {2, 0, 1}))},
      {"slice",
       kAny,
       {{x(s357)}},
       PXC_FN(slice(a[0], {1, 0, 2}, {3, 5, 7}, {1, 2, 3}), slice(a[0], {0, 2, 0}, {3, 2, 7}))},
      {"pad", kAny, {{x(s357)}, {x({0, 5, 2})}}, PXC_FN(pad(a[0], {1, 0, 2}, {0, 3, 1}, dt == D::boolean ? 1.0 : 0.5))},
      {"concat", kAny, {{x({3, 2, 7}), x(s357), x({3, 0, 7})}}, PXC_FN(concat({a[0], a[1], a[2]}, 1))},
      // ---- reductions ----
      {"reduce_sum", kNumeric, {{x(s357)}, {x({0, 5})}}, PXC_FN(sum(a[0], {1}), sum(a[0]), sum(a[0], {0}, true))},
      {"reduce_sum_long",
       kFloat,
       {{x({3, 300}, -1, 1)}},
       PXC_FN(sum(a[0], {1}), mean(a[0], {0})),
       "reduce_sum",
       "",
       10},
      {"reduce_max", kNumeric, {{x(s357)}, {x({0, 5})}}, PXC_FN(max(a[0], {a[0].rank() - 1}), max(a[0], {0}, true))},
      // ---- matmul ----
      {"dot_general",
       kFloat,
       {{x({3, 5}), x({5, 7})}, {x({2, 3, 5}), x({2, 5, 7})}, {x({3, 0}), x({0, 4})}, {x({0, 5}), x({5, 3})}},
       PXC_FN(matmul(a[0], a[1])),
       "",
       "",
       4},
      {"dot_general_dims",
       kFloat,
       {{x({5, 2, 3}), x({2, 7, 5})}},
       PXC_FN(dot_general(a[0], a[1], DotDims{{0}, {2}, {1}, {0}}),
             dot_general(a[0], a[1], DotDims{{0}, {2}, {1}, {0}}, D::f32)),
       "dot_general",
       "",
       4},
      {"dot_general_long",
       kFloat,
       {{x({3, 257}, -1, 1), x({257, 5}, -1, 1)}},
       PXC_FN(matmul(a[0], a[1])),
       "dot_general",
       "",
       10},
      // ---- neural-network building blocks ----
      {"softmax", kFloat, {{x(s357, -10, 10)}, {x({0, 5})}}, PXC_FN(softmax(a[0], -1), softmax(a[0], 0))},
      {"log_softmax", kFloat, {{x(s357, -10, 10)}, {x({0, 5})}}, PXC_FN(log_softmax(a[0], -1), log_softmax(a[0], 1))},
      {"layer_norm",
       kFloat,
       {{x(s357), x({7}), x({7})}, {x({0, 5}), x({5}), x({5})}},
       PXC_FN(layer_norm(a[0], a[1], a[2]), layer_norm(a[0], a[1], Tensor(), 1e-3)),
       "",
       "layer_norm_grad"},
      {"rms_norm",
       kFloat,
       {{x(s357), x({7})}, {x({0, 5}), x({5})}},
       PXC_FN(rms_norm(a[0], a[1])),
       "",
       "rms_norm_grad"},
      {"gelu_tanh",
       kFloat,
       unary(-5, 5),
       PXC_FN(gelu(a[0], true)),
       "gelu",
       "gelu_grad"},
      {"gelu_erf",
       kFloat,
       unary(-5, 5),
       PXC_FN(gelu(a[0], false)),
       "gelu",
       "gelu_grad"},
      {"silu", kFloat, unary(-6, 6), PXC_FN(silu(a[0]))},
      {"softmax_cross_entropy",
       kFloat,
       {{x(s357, -5, 5), i32({3, 5}, 0, 6)}, {x({4, 9}, -5, 5), i32({4}, 0, 8)}, {x({0, 7}), i32({0}, 0, 6)}},
       PXC_FN(softmax_cross_entropy(a[0], a[1]), softmax_cross_entropy(a[0], a[1], /*ignore_index=*/2)),
       "",
       "softmax_cross_entropy_grad"},
      // The fused head and loss: w as an embedding table [V, D] (vocab_axis 0) and as a Linear
      // weight [D, V] (vocab_axis 1); rows of rank 1 and 2, and none.
      {"linear_cross_entropy_table",
       kFloat,
       {{x({5, 7}), x({9, 7}), i32({5}, 0, 8)},
        {x({2, 3, 7}), x({9, 7}), i32({2, 3}, 0, 8)},
        {x({0, 7}), x({9, 7}), i32({0}, 0, 8)}},
       PXC_FN(linear_cross_entropy(a[0], a[1], a[2], 0), linear_cross_entropy(a[0], a[1], a[2], 0, /*ignore_index=*/2)),
       "linear_cross_entropy",
       "linear_cross_entropy_grad",
       2},
      {"linear_cross_entropy_linear",
       kFloat,
       {{x({5, 7}), x({7, 9}), i32({5}, 0, 8)}, {x({4, 1}), x({1, 3}), i32({4}, 0, 2)}},
       PXC_FN(linear_cross_entropy(a[0], a[1], a[2], 1), linear_cross_entropy(a[0], a[1], a[2], 1, /*ignore_index=*/2)),
       "linear_cross_entropy",
       "linear_cross_entropy_grad",
       2},
      {"attention_causal",
       kFloat,
       {{x({2, 4, 5, 8}), x({2, 2, 5, 8}), x({2, 2, 5, 8})}},
       PXC_FN(dot_product_attention(a[0], a[1], a[2])),
       "attention",
       "attention_grad",
       2},
      {"attention_padded",
       kFloat,
       {{x({2, 2, 3, 4}), x({2, 1, 6, 4}), x({2, 1, 6, 4}), boolean({2, 6})}},
       // key 0 always attends, so that no row is fully masked
       PXC_FN(dot_product_attention(a[0], a[1], a[2],
                                   {.causal = false,
                                    .scale = 0.3,
                                    .key_padding = logical_or(a[3], equal(iota({2, 6}, 1), full({}, 0, D::i32)))})),
       "attention",
       "attention_grad",
       2},
      {"attention_causal_sq_lt_sk",
       kFloat,
       {{x({1, 2, 3, 4}), x({1, 2, 7, 4}), x({1, 2, 7, 4})}},
       PXC_FN(dot_product_attention(a[0], a[1], a[2])),
       "attention",
       "attention_grad",
       2},
      // ---- indexing ----
      {"take",
       kAny,
       {{x({7, 5}), i32({3, 4}, 0, 6)}, {x({7}), i32({5}, -3, 10)}, {x({7, 5}), i32({0}, 0, 6)}},
       PXC_FN(take(a[0], a[1])),
       "",
       "scatter_add"},
      {"scatter_add",
       kNumeric,
       {{i32({3, 4}, 0, 6), x({3, 4, 5})}, {i32({9}, -3, 10), x({9})}, {i32({0}, 0, 6), x({0, 5})}},
       PXC_FN(scatter_add(a[0], a[1], 7))},
      {"one_hot", kAny, {{i32({3, 5}, -1, 7)}, {i32({0}, 0, 5)}}, PXC_FN(one_hot(a[0], 6, dt))},
      // ---- random numbers (counter-based: exact functions of key and index) ----
      {"random_uniform",
       kFloat,
       {{i32({2}, -100000, 100000)}},
       PXC_FN(random_uniform(a[0], {3, 5, 7}, dt, -2, 3), random_uniform(a[0], {0, 5}, dt))},
      {"random_normal", kFloat, {{i32({2}, -100000, 100000)}}, PXC_FN(random_normal(a[0], {3, 5, 7}, dt))},
      {"fold_in",
       {D::i32},
       {{i32({2}, -100000, 100000)}},
       PXC_FN(fold_in(a[0], 7), fold_in(a[0], -3), random_uniform(fold_in(random_key(42), 1), {4, 3}))},
      // ---- optimizer ----
      {
          "adamw_update",
          kFloat,
          {{x({3, 5}), x({3, 5}), f32({3, 5}), f32({3, 5}, 0, 1)}},
          [](const Ts& a, DType) -> Ts {
            auto opt = optim::adamw({.lr = 1e-2, .weight_decay = 0.1, .decay_mask = optim::rank_at_least(2)});
            // the second param (a row of p, rank 1) takes the update without weight decay
            Tensor row = reshape(slice_axis(a[0], 0, 0, 1), {5});
            Tensor grow = reshape(slice_axis(a[1], 0, 0, 1), {5});
            Tensor mrow = reshape(slice_axis(a[2], 0, 0, 1), {5}), vrow = reshape(slice_axis(a[3], 0, 0, 1), {5});
            optim::Update u = opt->apply({a[0], row}, {a[1], grow}, {a[2], a[3], mrow, vrow}, full({}, 3, D::i32));
            Ts out = u.params;
            out.insert(out.end(), u.state.begin(), u.state.end());
            return out;
          },
          "",
          "",
          1,
          /*vjp=*/false},
  };
  return table;
}

#undef PXC_FN

// ---- tolerances ----------------------------------------------------------------------------

struct Tol {
  double atol = 0, rtol = 0;
};
inline Tol tolerance(DType d, double scale) {
  switch (d) {
    case DType::f32:
      return {1e-5 * scale, 1e-5 * scale};
    case DType::bf16:
      return {1e-2 * scale, 1e-2 * scale};
    case DType::f16:
      return {2e-3 * scale, 2e-3 * scale};
    default:
      return {0, 0};
  }
}
inline constexpr double kVjpTolFactor = 4;

// ---- inputs --------------------------------------------------------------------------------

inline uint32_t seed_of(const std::string& s) {
  uint32_t h = 2166136261u;  // FNV-1a: stable across runs and platforms
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

// Deterministic pseudo-random values of `in`'s dtype (dflt when In::dtype is unset).
inline Array make_input(const In& in, DType dflt, uint32_t seed) {
  const DType dt = in.dtype.value_or(dflt);
  std::mt19937 rng(seed);
  const int64_t n = numel(in.shape);
  if (dt == DType::boolean || dt == DType::i32) {
    std::uniform_int_distribution<int32_t> u(static_cast<int32_t>(std::ceil(in.lo)),
                                             static_cast<int32_t>(std::floor(in.hi)));
    std::bernoulli_distribution b(0.5);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& e : v) e = dt == DType::boolean ? static_cast<int32_t>(b(rng)) : u(rng);
    Array a = Array::from_i32(v, in.shape);
    return dt == DType::boolean ? a.astype(DType::boolean) : a;
  }
  std::uniform_real_distribution<double> u(in.lo, in.hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& e : v) e = static_cast<float>(in.integral ? std::round(u(rng)) : u(rng));
  return Array::from_f32(v, in.shape, dt);
}

// ---- comparison ----------------------------------------------------------------------------

// "" when `got` equals `want` (the reference's) within the tolerance, else the first differing
// element; `name` names the backend under test in the message.
inline std::string compare(const Array& got, const Array& want, double scale, const std::string& name = "got") {
  if (got.type() != want.type())
    return "types differ: " + name + " " + type_str(got.type()) + ", ref " + type_str(want.type());
  std::ostringstream os;
  if (!is_float(got.dtype())) {
    std::vector<int32_t> a = got.to_i32(), b = want.to_i32();
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i]) {
        os << "index " << i << ": " << name << " " << a[i] << ", ref " << b[i] << " (exact)";
        return os.str();
      }
    return "";
  }
  std::vector<float> a = got.to_f32(), b = want.to_f32();
  double mx = 1;
  for (float v : b)
    if (std::isfinite(v)) mx = std::max(mx, static_cast<double>(std::fabs(v)));
  const Tol t = tolerance(got.dtype(), scale);
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if ((std::isnan(a[i]) && std::isnan(b[i])) || (std::isinf(a[i]) && a[i] == b[i])) continue;
    if (std::fabs(a[i] - b[i]) <= t.atol * mx + t.rtol * std::fabs(b[i])) continue;
    if (bad++ == 0) {
      os.precision(9);
      os << "index " << i << ": " << name << " " << a[i] << ", ref " << b[i] << " (|diff| " << std::fabs(a[i] - b[i])
         << " > atol " << t.atol << " * " << mx << " + rtol " << t.rtol << " * |ref|)";
    }
  }
  if (bad > 1) os << "; " << bad << " of " << a.size() << " elements differ";
  return os.str();
}

// ---- running a case ------------------------------------------------------------------------

inline std::vector<TensorType> types_of(const std::vector<Array>& xs) {
  std::vector<TensorType> t;
  for (const Array& a : xs) t.push_back(a.type());
  return t;
}

// The names of the primitives of g's nodes, added to `seen`.
inline void add_prims(const Graph& g, std::set<std::string>& seen) {
  for (const Node& n : g.nodes()) seen.insert(primitive_name(n));
}

// Compiles g for `platform` and runs it; adds the primitives of the compiled program to `ran`.
inline std::vector<Array> run_on(const Graph& g, const std::string& platform, const std::vector<Array>& in,
                                 std::set<std::string>& ran) {
  CompileOptions o;
  o.platform = platform;
  auto exe = Executable::compile(g, o);
  // A backend that never fuses gets no fused group: one would mean the program ran elsewhere.
  if (!backend_for(platform).fusion().enabled && exe->num_fused_groups() != 0)
    throw Error("the " + platform + " program has fused groups, but its backend never fuses");
  add_prims(exe->graph(), ran);
  return exe->run(in);
}

// The vjp program of a case: inputs, then one cotangent per float output; outputs the gradients
// of sum_k <out_k, ct_k> with respect to the float inputs. Null when the case has none.
inline std::unique_ptr<Graph> vjp_graph(const Case& c, DType dt, const std::vector<TensorType>& in_types,
                                        const Graph& fwd, std::vector<TensorType>* ct_types) {
  std::vector<int> wrt;
  for (size_t i = 0; i < in_types.size(); ++i)
    if (is_float(in_types[i].dtype)) wrt.push_back(static_cast<int>(i));
  std::vector<int> outs;
  for (size_t o = 0; o < fwd.outputs().size(); ++o)
    if (is_float(fwd.type(fwd.outputs()[o]).dtype)) outs.push_back(static_cast<int>(o));
  if (!c.vjp || wrt.empty() || outs.empty()) return nullptr;
  ct_types->clear();
  for (int o : outs) ct_types->push_back(fwd.type(fwd.outputs()[o]));
  std::vector<TensorType> all = in_types;
  all.insert(all.end(), ct_types->begin(), ct_types->end());
  const size_t n_in = in_types.size();
  return trace(
      [&](const std::vector<Tensor>& a) {
        std::vector<Tensor> xs(a.begin(), a.begin() + static_cast<long>(n_in));
        std::vector<Tensor> ys = c.fn(xs, dt), fys, dys, wx;
        for (size_t k = 0; k < outs.size(); ++k) {
          fys.push_back(ys[outs[k]]);
          dys.push_back(a[n_in + k]);
        }
        for (int w : wrt) wx.push_back(xs[w]);
        return gradients(fys, wx, dys);
      },
      all);
}

// ---- the report ----------------------------------------------------------------------------

struct Counts {
  int fwd_pass = 0, fwd_fail = 0, vjp_pass = 0, vjp_fail = 0;
};

struct Options {
  std::string reference = "ref";  // the platform the results are compared with
  // Runs only the cases it accepts (all when null): a backend with some kernels only.
  std::function<bool(const Case&)> filter;
};

struct Report {
  std::string platform, reference;
  int passed = 0;                     // comparisons (forward and vjp) within the tolerance
  std::vector<std::string> failures;  // one per failed comparison: the case, dtype, inputs and the difference
  std::map<std::string, std::map<DType, Counts>> summary;  // [summary row][dtype]
  std::set<std::string> traced;  // the primitives of the cases' forward and vjp graphs
  std::set<std::string> ran;     // the primitives of the compiled programs on the backend under test
  bool ok() const { return failures.empty(); }
  // The summary as a Markdown table: passed / run per primitive and dtype, FAIL where one failed.
  std::string table() const {
    const std::vector<DType> cols = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean};
    std::ostringstream os;
    os << "Backend conformance, " << platform << " vs " << reference
       << ": passed/run per primitive and dtype (fwd = forward, vjp = gradient)\n\n";
    os << "| primitive |";
    for (DType d : cols) os << " " << dtype_name(d) << " |";
    os << "\n|---|";
    for (size_t i = 0; i < cols.size(); ++i) os << "---|";
    os << "\n";
    for (const auto& [prim, by_dt] : summary) {
      os << "| " << prim << " |";
      for (DType d : cols) {
        auto it = by_dt.find(d);
        if (it == by_dt.end()) {
          os << " - |";
          continue;
        }
        const Counts& c = it->second;
        std::string cell;
        if (c.fwd_pass + c.fwd_fail)
          cell += "fwd " + std::to_string(c.fwd_pass) + "/" + std::to_string(c.fwd_pass + c.fwd_fail);
        if (c.vjp_pass + c.vjp_fail)
          cell += std::string(cell.empty() ? "" : ", ") + "vjp " + std::to_string(c.vjp_pass) + "/" +
                  std::to_string(c.vjp_pass + c.vjp_fail);
        if (c.fwd_fail + c.vjp_fail) cell += " FAIL";
        os << " " << cell << " |";
      }
      os << "\n";
    }
    return os.str();
  }
};

// Runs graph g on `platform` and on `reference` and compares; returns "" or what went wrong.
inline std::string check_graph(const Graph& g, const std::vector<Array>& in, double scale, const std::string& platform,
                               const std::string& reference, std::set<std::string>& ran) {
  std::vector<Array> a, b;
  std::set<std::string> on_ref;
  try {
    a = run_on(g, platform, in, ran);
  } catch (const std::exception& e) {
    return platform + " threw: " + e.what();
  }
  try {
    b = run_on(g, reference, in, on_ref);
  } catch (const std::exception& e) {
    return reference + " threw: " + e.what();
  }
  if (a.size() != b.size()) return "output counts differ";
  std::string msg;
  for (size_t o = 0; o < a.size(); ++o) {
    std::string m = compare(a[o], b[o], scale, platform);
    if (!m.empty()) msg += (msg.empty() ? "" : "\n    ") + ("output " + std::to_string(o) + ": " + m);
  }
  return msg;
}

inline std::string variant_str(const std::vector<Array>& in) {
  std::string s;
  for (const Array& a : in) s += (s.empty() ? "" : ", ") + type_str(a.type());
  return "(" + s + ")";
}

// Runs `cases` (every dtype and variant, forward and vjp) on `platform` and on the reference.
inline Report run_cases(const std::vector<Case>& cases, const std::string& platform, const Options& options = {}) {
  Report r;
  r.platform = platform;
  r.reference = options.reference;
  backend_for(platform);  // throws naming the registered platforms when it has none
  for (const Case& c : cases) {
    if (options.filter && !options.filter(c)) continue;
    const std::string row = c.prim.empty() ? c.name : c.prim;
    for (DType dt : c.dtypes) {
      for (size_t vi = 0; vi < c.variants.size(); ++vi) {
        const std::string what = c.name + " " + dtype_name(dt) + " variant " + std::to_string(vi);
        std::vector<Array> in;
        for (size_t k = 0; k < c.variants[vi].size(); ++k)
          in.push_back(make_input(c.variants[vi][k], dt, seed_of(what + "#" + std::to_string(k))));
        std::unique_ptr<Graph> fwd;
        try {
          fwd = trace([&](const std::vector<Tensor>& a) { return c.fn(a, dt); }, types_of(in));
        } catch (const std::exception& e) {
          r.failures.push_back(what + " " + variant_str(in) + ": the case does not trace: " + e.what());
          r.summary[row][dt].fwd_fail++;
          continue;
        }
        add_prims(*fwd, r.traced);
        std::string m = check_graph(*fwd, in, c.tol, platform, options.reference, r.ran);
        (m.empty() ? r.summary[row][dt].fwd_pass : r.summary[row][dt].fwd_fail)++;
        if (m.empty())
          r.passed++;
        else
          r.failures.push_back("[forward] " + what + " " + variant_str(in) + ":\n    " + m);

        std::vector<TensorType> ct_types;
        std::unique_ptr<Graph> bwd;
        const std::string vrow = c.vjp_prim.empty() ? row : c.vjp_prim;
        try {
          bwd = vjp_graph(c, dt, types_of(in), *fwd, &ct_types);
        } catch (const std::exception& e) {
          r.failures.push_back("[vjp] " + what + ": the gradient does not trace: " + e.what());
          r.summary[vrow][dt].vjp_fail++;
          continue;
        }
        if (!bwd) continue;
        add_prims(*bwd, r.traced);
        std::vector<Array> bin = in;
        for (size_t k = 0; k < ct_types.size(); ++k)
          bin.push_back(
              make_input(In{ct_types[k].shape, -1, 1}, ct_types[k].dtype, seed_of(what + "#ct" + std::to_string(k))));
        m = check_graph(*bwd, bin, c.tol * kVjpTolFactor, platform, options.reference, r.ran);
        (m.empty() ? r.summary[vrow][dt].vjp_pass : r.summary[vrow][dt].vjp_fail)++;
        if (m.empty())
          r.passed++;
        else
          r.failures.push_back("[vjp] " + what + " " + variant_str(in) + ":\n    " + m);
      }
    }
  }
  return r;
}

// The whole suite on a registered platform.
inline Report check_backend(const std::string& platform, const Options& options = {}) {
  return run_cases(cases(), platform, options);
}

#pragma GCC diagnostic pop

}  // namespace px::conformance
