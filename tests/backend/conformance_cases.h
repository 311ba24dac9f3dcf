// The case table of the backend conformance test (test_conformance.cc): per primitive, a function
// built from the public ops (so that its attributes are what users' programs carry), its inputs
// (shapes and value ranges, one list per variant) and the dtypes it runs in.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ir/primitive.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "parallax/optim.h"
#include "parallax/sharding.h"

namespace px::conformance {

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

#define PX_FN(...)                  \
  [](const Ts& a, DType dt) -> Ts { \
    (void)a;                        \
    (void)dt;                       \
    return {__VA_ARGS__};           \
  }

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
      {"add", kNumeric, binary(), PX_FN(add(a[0], a[1]))},
      {"sub", kNumeric, binary(), PX_FN(sub(a[0], a[1]))},
      {"mul", kNumeric, binary(), PX_FN(mul(a[0], a[1]))},
      {"div", kNumeric, binary(-20, 20, 1, 5), PX_FN(div(a[0], a[1]))},
      {"div_negative_divisor", kNumeric, binary(-20, 20, -5, -1), PX_FN(div(a[0], a[1])), "div"},
      {"pow", kFloat, binary(0.5, 3, -2, 2), PX_FN(pow(a[0], a[1]))},
      {"maximum", kNumeric, binary(), PX_FN(maximum(a[0], a[1]))},
      {"minimum", kNumeric, binary(), PX_FN(minimum(a[0], a[1]))},
      {"neg", kNumeric, unary(), PX_FN(neg(a[0]))},
      {"abs", kNumeric, unary(), PX_FN(abs(a[0]))},
      {"exp", kFloat, unary(-5, 5), PX_FN(exp(a[0]))},
      {"log", kFloat, unary(0.1, 10), PX_FN(log(a[0]))},
      {"tanh", kFloat, unary(-4, 4), PX_FN(tanh(a[0]))},
      {"sqrt", kFloat, unary(0.1, 9), PX_FN(sqrt(a[0]))},
      {"rsqrt", kFloat, unary(0.1, 9), PX_FN(rsqrt(a[0]))},
      {"sigmoid", kFloat, unary(-8, 8), PX_FN(sigmoid(a[0]))},
      // ---- comparisons and logic (bool results) ----
      {"eq", kAny, compare_inputs(), PX_FN(equal(a[0], a[1]))},
      {"ne", kAny, compare_inputs(), PX_FN(not_equal(a[0], a[1]))},
      {"lt", kNumeric, compare_inputs(), PX_FN(less(a[0], a[1]))},
      {"le", kNumeric, compare_inputs(), PX_FN(less_equal(a[0], a[1]))},
      {"gt", kNumeric, compare_inputs(), PX_FN(greater(a[0], a[1]))},
      {"ge", kNumeric, compare_inputs(), PX_FN(greater_equal(a[0], a[1]))},
      {"logical_and", {D::boolean}, binary(), PX_FN(logical_and(a[0], a[1]))},
      {"logical_or", {D::boolean}, binary(), PX_FN(logical_or(a[0], a[1]))},
      {"logical_not", {D::boolean}, unary(), PX_FN(logical_not(a[0]))},
      {"select",
       kAny,
       {{boolean(s357), x(s357), x(s357)},
        {boolean({3, 1, 7}), x(s357), x({1, 5, 1})},
        {boolean({0, 5}), x({0, 5}), x({0, 5})}},
       PX_FN(where(a[0], a[1], a[2]))},
      // cast from f32 to the case's dtype (values with exact integers and halves), and back.
      {"cast_from_f32",
       {D::bf16, D::f16, D::i32, D::boolean},
       {{f32(s357, -6, 6)}, {In{s357, -3, 3, D::f32, true}}, {f32({0, 5})}},
       PX_FN(cast(a[0], dt)),
       "cast"},
      {"cast_to_f32",
       {D::bf16, D::f16, D::i32, D::boolean},
       {{x(s357, -100, 100)}, {x({0, 5})}},
       PX_FN(cast(a[0], D::f32)),
       "cast"},
      {"cast_bf16_f16",
       {D::bf16, D::f16},
       {{x(s357, -100, 100)}},
       PX_FN(cast(a[0], dt == D::bf16 ? D::f16 : D::bf16)),
       "cast"},
      {"stop_gradient", kFloat, unary(), PX_FN(stop_gradient(a[0]) * a[0])},
      {"tag", kAny, unary(), PX_FN(tag(a[0], "conformance"))},
      {"sharding_constraint", kFloat, {{x(s357)}}, PX_FN(with_sharding_constraint(a[0], PartitionSpec{"data"}) * a[0])},
      // ---- constants ----
      {"constant",
       kNumeric,
       {{x(s357)}},
       PX_FN(a[0] + constant(Array::from_f32(std::vector<float>(35, 1.5f), {5, 7}, dt)))},
      {"full", kNumeric, {{x(s357)}, {x({0, 5})}}, PX_FN(a[0] * full(a[0].shape(), 3, dt))},
      {"iota", kNumeric, {{x(s357)}, {x({0, 5})}}, PX_FN(a[0] + iota(a[0].shape(), 1, dt), iota({4, 3}, 0, dt))},
      // ---- shape ----
      {"broadcast_in_dim",
       kAny,
       {{x({5})}, {x({0})}},
       PX_FN(broadcast_in_dim(a[0], {3, a[0].dim(0), 7}, {1}), broadcast_to(a[0], {2, a[0].dim(0)}))},
      {"reshape", kAny, {{x(s357)}, {x({0, 5})}}, PX_FN(reshape(a[0], {a[0].dim(-1), -1}))},
      {"transpose", kAny, {{x(s357)}, {x({0, 5, 2})}}, PX_FN(transpose(a[0], {2, 0, 1}))},
      {"slice",
       kAny,
       {{x(s357)}},
       PX_FN(slice(a[0], {1, 0, 2}, {3, 5, 7}, {1, 2, 3}), slice(a[0], {0, 2, 0}, {3, 2, 7}))},
      {"pad", kAny, {{x(s357)}, {x({0, 5, 2})}}, PX_FN(pad(a[0], {1, 0, 2}, {0, 3, 1}, dt == D::boolean ? 1.0 : 0.5))},
      {"concat", kAny, {{x({3, 2, 7}), x(s357), x({3, 0, 7})}}, PX_FN(concat({a[0], a[1], a[2]}, 1))},
      // ---- reductions ----
      {"reduce_sum", kNumeric, {{x(s357)}, {x({0, 5})}}, PX_FN(sum(a[0], {1}), sum(a[0]), sum(a[0], {0}, true))},
      {"reduce_sum_long", kFloat, {{x({3, 300}, -1, 1)}}, PX_FN(sum(a[0], {1}), mean(a[0], {0})), "reduce_sum", "", 10},
      // The f32 sum of 16-bit values that compile makes of a bias gradient under bf16.
      {"reduce_sum_out_dtype", {D::bf16, D::f16}, {{x(s357)}},
       PX_FN(emit1("reduce_sum", {a[0]}, Attrs{{"axes", std::vector<int64_t>{1}}, {"out_dtype", D::f32}}),
             emit1("reduce_sum", {a[0]}, Attrs{{"axes", std::vector<int64_t>{0, 2}}, {"out_dtype", D::f32}})),
       "reduce_sum"},
      {"reduce_max", kNumeric, {{x(s357)}, {x({0, 5})}}, PX_FN(max(a[0], {a[0].rank() - 1}), max(a[0], {0}, true))},
      // ---- matmul ----
      {"dot_general",
       kFloat,
       {{x({3, 5}), x({5, 7})}, {x({2, 3, 5}), x({2, 5, 7})}, {x({3, 0}), x({0, 4})}, {x({0, 5}), x({5, 3})}},
       PX_FN(matmul(a[0], a[1])),
       "",
       "",
       4},
      {"dot_general_dims",
       kFloat,
       {{x({5, 2, 3}), x({2, 7, 5})}},
       PX_FN(dot_general(a[0], a[1], DotDims{{0}, {2}, {1}, {0}}),
             dot_general(a[0], a[1], DotDims{{0}, {2}, {1}, {0}}, D::f32)),
       "dot_general",
       "",
       4},
      {"dot_general_long",
       kFloat,
       {{x({3, 257}, -1, 1), x({257, 5}, -1, 1)}},
       PX_FN(matmul(a[0], a[1])),
       "dot_general",
       "",
       10},
      // ---- neural-network building blocks ----
      {"softmax", kFloat, {{x(s357, -10, 10)}, {x({0, 5})}}, PX_FN(softmax(a[0], -1), softmax(a[0], 0))},
      {"log_softmax", kFloat, {{x(s357, -10, 10)}, {x({0, 5})}}, PX_FN(log_softmax(a[0], -1), log_softmax(a[0], 1))},
      {"layer_norm",
       kFloat,
       {{x(s357), x({7}), x({7})}, {x({0, 5}), x({5}), x({5})}},
       PX_FN(layer_norm(a[0], a[1], a[2]), layer_norm(a[0], a[1], Tensor(), 1e-3)),
       "",
       "layer_norm_grad"},
      {"rms_norm", kFloat, {{x(s357), x({7})}, {x({0, 5}), x({5})}}, PX_FN(rms_norm(a[0], a[1])), "", "rms_norm_grad"},
      {"gelu_tanh", kFloat, unary(-5, 5), PX_FN(gelu(a[0], true)), "gelu", "gelu_grad"},
      {"gelu_erf", kFloat, unary(-5, 5), PX_FN(gelu(a[0], false)), "gelu", "gelu_grad"},
      {"silu", kFloat, unary(-6, 6), PX_FN(silu(a[0]))},
      {"softmax_cross_entropy",
       kFloat,
       {{x(s357, -5, 5), i32({3, 5}, 0, 6)}, {x({4, 9}, -5, 5), i32({4}, 0, 8)}, {x({0, 7}), i32({0}, 0, 6)}},
       PX_FN(softmax_cross_entropy(a[0], a[1]), softmax_cross_entropy(a[0], a[1], /*ignore_index=*/2)),
       "",
       "softmax_cross_entropy_grad"},
      {"attention_causal",
       kFloat,
       {{x({2, 4, 5, 8}), x({2, 2, 5, 8}), x({2, 2, 5, 8})}},
       PX_FN(dot_product_attention(a[0], a[1], a[2])),
       "attention",
       "attention_grad",
       2},
      {"attention_padded",
       kFloat,
       {{x({2, 2, 3, 4}), x({2, 1, 6, 4}), x({2, 1, 6, 4}), boolean({2, 6})}},
       // key 0 always attends, so that no row is fully masked
       PX_FN(dot_product_attention(a[0], a[1], a[2],
                                   {.causal = false,
                                    .scale = 0.3,
                                    .key_padding = logical_or(a[3], equal(iota({2, 6}, 1), full({}, 0, D::i32)))})),
       "attention",
       "attention_grad",
       2},
      {"attention_causal_sq_lt_sk",
       kFloat,
       {{x({1, 2, 3, 4}), x({1, 2, 7, 4}), x({1, 2, 7, 4})}},
       PX_FN(dot_product_attention(a[0], a[1], a[2])),
       "attention",
       "attention_grad",
       2},
      // ---- indexing ----
      {"take",
       kAny,
       {{x({7, 5}), i32({3, 4}, 0, 6)}, {x({7}), i32({5}, -3, 10)}, {x({7, 5}), i32({0}, 0, 6)}},
       PX_FN(take(a[0], a[1])),
       "",
       "scatter_add"},
      {"scatter_add",
       kNumeric,
       {{i32({3, 4}, 0, 6), x({3, 4, 5})}, {i32({9}, -3, 10), x({9})}, {i32({0}, 0, 6), x({0, 5})}},
       PX_FN(scatter_add(a[0], a[1], 7))},
      {"one_hot", kAny, {{i32({3, 5}, -1, 7)}, {i32({0}, 0, 5)}}, PX_FN(one_hot(a[0], 6, dt))},
      // ---- random numbers (counter-based: exact functions of key and index) ----
      {"random_uniform",
       kFloat,
       {{i32({2}, -100000, 100000)}},
       PX_FN(random_uniform(a[0], {3, 5, 7}, dt, -2, 3), random_uniform(a[0], {0, 5}, dt))},
      {"random_normal", kFloat, {{i32({2}, -100000, 100000)}}, PX_FN(random_normal(a[0], {3, 5, 7}, dt))},
      {"fold_in",
       {D::i32},
       {{i32({2}, -100000, 100000)}},
       PX_FN(fold_in(a[0], 7), fold_in(a[0], -3), random_uniform(fold_in(random_key(42), 1), {4, 3}))},
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

#undef PX_FN

}  // namespace px::conformance
