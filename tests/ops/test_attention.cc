// dot_product_attention against a naive loop (causal with Sq != Sk, key padding, grouped-query
// heads, custom scale, bf16), gradients through the masks, and bad-input errors.
#include <cmath>

#include "ir/primitive.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::check_grads;
using testing::eval1;
using testing::random_array;
using testing::throws_error;

struct Cfg {
  int64_t b, h, hkv, sq, sk, d;
  bool causal;
  bool padding;
  double scale = 0;  // 0: default 1/sqrt(d)
};

std::vector<float> naive_attention(const Cfg& c, const std::vector<float>& q, const std::vector<float>& k,
                                   const std::vector<float>& v, const std::vector<int32_t>& keep) {
  std::vector<float> out(static_cast<size_t>(c.b * c.h * c.sq * c.d));
  double scale = c.scale ? c.scale : 1 / std::sqrt(static_cast<double>(c.d));
  int64_t g = c.h / c.hkv;
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.h; ++h)
      for (int64_t i = 0; i < c.sq; ++i) {
        int64_t kh = h / g;
        std::vector<double> s(c.sk);
        std::vector<bool> ok(c.sk);
        for (int64_t j = 0; j < c.sk; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < c.d; ++x)
            dot += static_cast<double>(q[((b * c.h + h) * c.sq + i) * c.d + x]) * k[((b * c.hkv + kh) * c.sk + j) * c.d + x];
          s[j] = dot * scale;
          ok[j] = (!c.causal || j <= i + (c.sk - c.sq)) && (!c.padding || keep[b * c.sk + j]);
        }
        double m = -INFINITY, z = 0;
        bool any = false;
        for (int64_t j = 0; j < c.sk; ++j)
          if (ok[j]) m = std::max(m, s[j]), any = true;
        std::vector<double> p(c.sk);
        for (int64_t j = 0; j < c.sk; ++j) {
          p[j] = !any ? 1.0 : ok[j] ? std::exp(s[j] - m) : 0.0;  // fully masked rows: uniform
          z += p[j];
        }
        for (int64_t x = 0; x < c.d; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < c.sk; ++j) acc += p[j] / z * v[((b * c.hkv + kh) * c.sk + j) * c.d + x];
          out[((b * c.h + h) * c.sq + i) * c.d + x] = static_cast<float>(acc);
        }
      }
  return out;
}

std::vector<int32_t> padding_pattern(const Cfg& c) {
  std::vector<int32_t> keep(c.b * c.sk, 1);
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t j = c.sk - b; j < c.sk; ++j) keep[b * c.sk + j] = 0;  // batch b pads its last b keys
  return keep;
}

TracedFn attention_fn(const Cfg& c) {
  return [c](const std::vector<Tensor>& in) {
    AttentionOptions opt;
    opt.causal = c.causal;
    if (c.scale) opt.scale = c.scale;
    if (c.padding) opt.key_padding = cast(in[3], DType::boolean);
    return std::vector<Tensor>{dot_product_attention(in[0], in[1], in[2], opt)};
  };
}

std::vector<Array> inputs_of(const Cfg& c, DType dt, uint32_t seed) {
  std::vector<Array> in{random_array({c.b, c.h, c.sq, c.d}, dt, seed, -1.5f, 1.5f),
                        random_array({c.b, c.hkv, c.sk, c.d}, dt, seed + 1, -1.5f, 1.5f),
                        random_array({c.b, c.hkv, c.sk, c.d}, dt, seed + 2)};
  if (c.padding) in.push_back(Array::from_i32(padding_pattern(c), {c.b, c.sk}));
  return in;
}

TEST(Attention, MatchesNaiveLoop) {
  std::vector<Cfg> cfgs = {
      {2, 2, 2, 5, 5, 4, true, false},        // causal self-attention
      {2, 2, 2, 5, 5, 4, false, false},       // bidirectional
      {1, 4, 2, 3, 7, 8, true, false},        // GQA, queries aligned to the end of the keys
      {3, 4, 1, 6, 6, 5, true, true},         // multi-query, causal and padding (batch 2 pads 2 keys)
      {2, 3, 3, 4, 6, 3, false, true, 0.25},  // padding only, custom scale
      {2, 2, 1, 1, 9, 16, true, true},        // one decoding step
      {1, 2, 2, 33, 33, 7, true, false},      // odd sizes
      {1, 4, 2, 130, 150, 16, true, true},    // several row blocks, causal offset and padding
      {2, 2, 2, 6, 3, 4, true, false},        // Sq > Sk: the first rows see no key at all
      {3, 2, 2, 4, 3, 4, false, true},        // batch 2 pads all 3 keys
      {1, 1, 1, 70, 70, 4, true, true},       // a block with a boundary at row 64
  };
  for (const Cfg& c : cfgs) {
    auto in = inputs_of(c, DType::f32, 1);
    Array got = eval1(attention_fn(c), in);
    ASSERT_EQ(got.shape(), (Shape{c.b, c.h, c.sq, c.d}));
    std::vector<int32_t> keep = c.padding ? in[3].to_i32() : std::vector<int32_t>{};
    EXPECT_TRUE(all_close(got.to_f32(), naive_attention(c, in[0].to_f32(), in[1].to_f32(), in[2].to_f32(), keep),
                          1e-5, 1e-4))
        << "b" << c.b << " h" << c.h << " hkv" << c.hkv << " sq" << c.sq << " sk" << c.sk << " causal " << c.causal;
  }
}

TEST(Attention, Bf16MatchesReferenceWithinRounding) {
  Cfg c{2, 4, 2, 8, 8, 16, true, true};
  auto in = inputs_of(c, DType::bf16, 4);
  Array got = eval1(attention_fn(c), in);
  EXPECT_EQ(got.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(got.to_f32(), naive_attention(c, in[0].to_f32(), in[1].to_f32(), in[2].to_f32(), in[3].to_i32()),
                        2e-2, 2e-2));
}

TEST(Attention, FullyMaskedRowsStayFinite) {
  Cfg c{1, 1, 1, 2, 3, 2, false, true};
  auto in = inputs_of(c, DType::f32, 7);
  in[3] = Array::from_i32({0, 0, 0}, {1, 3});
  auto y = eval1(attention_fn(c), in).to_f32();
  for (float v : y) EXPECT_TRUE(std::isfinite(v));
}

TEST(Attention, GradientsWithCausalPaddingAndGroupedHeads) {
  for (const Cfg& c : std::vector<Cfg>{{1, 4, 2, 3, 4, 3, true, true},
                                       {2, 2, 2, 3, 3, 2, false, true},
                                       {1, 2, 1, 2, 3, 4, true, false, 0.7},
                                       {3, 2, 1, 3, 3, 2, false, true},    // batch 2: every key padded
                                       {1, 2, 2, 4, 2, 2, true, false}}) {  // rows before the first key
    auto in = inputs_of(c, DType::f32, 9);
    EXPECT_TRUE(check_grads(attention_fn(c), in)) << "h" << c.h << " hkv" << c.hkv << " causal " << c.causal;
  }
}

TEST(Attention, SecondOrderGradients) {
  // d/dx of a first-order gradient goes through attention_grad's vjp.
  for (const Cfg& c : std::vector<Cfg>{{1, 2, 1, 3, 3, 2, true, true}, {1, 2, 2, 2, 3, 2, false, false}}) {
    auto in = inputs_of(c, DType::f32, 11);
    TracedFn f = [c](const std::vector<Tensor>& x) {
      Tensor o = attention_fn(c)(x)[0];
      auto g = gradients(sum(o * o), {x[0], x[1], x[2]});
      return std::vector<Tensor>{g[0] + 0.0, g[1] * 2.0 + sum(g[2])};
    };
    EXPECT_TRUE(check_grads([f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x)[0]}; }, in));
    EXPECT_TRUE(check_grads([f](const std::vector<Tensor>& x) { return std::vector<Tensor>{f(x)[1]}; }, in));
  }
}

TEST(Attention, Bf16GradientsTrackF32) {
  Cfg c{2, 4, 2, 9, 9, 8, true, true};
  auto in = inputs_of(c, DType::f32, 12);
  for (int i = 0; i < 3; ++i) in[i] = in[i].astype(DType::bf16).astype(DType::f32);  // same values in both runs
  auto grads = [c](DType dt) {
    return [c, dt](const std::vector<Tensor>& x) {
      std::vector<Tensor> y = x;
      for (int i = 0; i < 3; ++i) y[i] = cast(x[i], dt);
      Tensor o = cast(attention_fn(c)(y)[0], DType::f32);
      auto g = gradients(sum(o * o), {x[0], x[1], x[2]});
      return g;
    };
  };
  auto want = testing::eval(grads(DType::f32), in), got = testing::eval(grads(DType::bf16), in);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(all_close(got[i].to_f32(), want[i].to_f32(), 3e-2, 3e-2)) << i;
}

// bf16 runs its block products on native bf16 matmuls where the CPU has them (f32 softmax, bf16
// probabilities): over several row blocks (of 64 rows, and of 128 from 512 rows on), causal offsets,
// padding, grouped heads and rows that see no key, the outputs and gradients stay within bf16
// rounding of the f32 computation.
TEST(Attention, Bf16OverSeveralRowBlocksTracksF32) {
  for (const Cfg& c : std::vector<Cfg>{{1, 4, 2, 130, 150, 16, true, true},
                                       {2, 2, 2, 70, 70, 32, true, false},
                                       {3, 2, 1, 66, 40, 8, false, true},     // batch 2 pads keys; multi-query
                                       {1, 2, 2, 80, 20, 8, true, false},     // rows before the first key
                                       {1, 2, 1, 530, 540, 8, true, true}}) {  // 128-row blocks, a short last one
    auto in = inputs_of(c, DType::f32, 21);
    for (int i = 0; i < 3; ++i) in[i] = in[i].astype(DType::bf16).astype(DType::f32);  // same values in both runs
    auto run = [c](DType dt) {
      return [c, dt](const std::vector<Tensor>& x) {
        std::vector<Tensor> y = x;
        for (int i = 0; i < 3; ++i) y[i] = cast(x[i], dt);
        Tensor o = cast(attention_fn(c)(y)[0], DType::f32);
        std::vector<Tensor> r = gradients(sum(o * o), {x[0], x[1], x[2]});
        r.push_back(o);
        return r;
      };
    };
    auto want = testing::eval(run(DType::f32), in), got = testing::eval(run(DType::bf16), in);
    for (int i = 0; i < 4; ++i)
      EXPECT_TRUE(all_close(got[i].to_f32(), want[i].to_f32(), 3e-2, 3e-2))
          << (i < 3 ? "gradient " : "output ") << i << " sq" << c.sq << " sk" << c.sk << " d" << c.d;
  }
}

TEST(Attention, EmptyDims) {
  for (const Cfg& c : std::vector<Cfg>{{2, 2, 1, 0, 3, 4, true, false}, {1, 2, 2, 3, 0, 4, false, false},
                                       {1, 2, 1, 3, 3, 0, true, false}, {0, 2, 2, 3, 3, 4, true, false}}) {
    auto in = inputs_of(c, DType::f32, 13);
    auto out = testing::eval(
        [c](const std::vector<Tensor>& x) {
          Tensor o = attention_fn(c)(x)[0];
          auto g = gradients(sum(o), {x[0], x[1], x[2]});
          return std::vector<Tensor>{o, g[0], g[1], g[2]};
        },
        in);
    EXPECT_EQ(out[0].shape(), (Shape{c.b, c.h, c.sq, c.d}));
    for (float x : out[0].to_f32()) EXPECT_EQ(x, 0.0f);  // no keys: zeros
    for (int i = 1; i < 4; ++i) EXPECT_EQ(out[i].shape(), in[i - 1].shape());
  }
}

TEST(Attention, FusedPrimitiveRuleAndCost) {
  auto g = trace(attention_fn({2, 4, 2, 8, 8, 16, true, false}),
                 {{DType::f32, {2, 4, 8, 16}}, {DType::f32, {2, 2, 8, 16}}, {DType::f32, {2, 2, 8, 16}}});
  const Node* att = nullptr;
  for (const Node& n : g->nodes())
    if (n.prim->name == "attention") att = &n;
  ASSERT_NE(att, nullptr) << g->to_string();
  std::vector<TensorType> in, out;
  for (int v : att->inputs) in.push_back(g->type(v));
  for (int v : att->outputs) out.push_back(g->type(v));
  EXPECT_EQ(sharding_of(*att->prim, in, out, att->attrs).to_string(), "abcdf,abef,abef->abcdf,abcd {d: whole, e: whole, f: whole}");
  // Causal: 36 of the 64 (query, key) pairs per head, two matmuls of 2 flops per pair and dim.
  EXPECT_DOUBLE_EQ(cost_of(*att->prim, in, out, att->attrs).flops, 2 * 4 * 36 * (2 * 2.0 * 16 + 6));
}

TEST(Attention, BadInputsGiveClearErrors) {
  auto fn = [](const std::vector<Tensor>& in) {
    AttentionOptions opt;
    if (in.size() > 3) opt.key_padding = in[3];
    return std::vector<Tensor>{dot_product_attention(in[0], in[1], in[2], opt)};
  };
  TensorType q{DType::f32, {2, 4, 5, 8}}, kv{DType::f32, {2, 2, 6, 8}};
  EXPECT_TRUE(throws_error(fn, {{DType::f32, {4, 5, 8}}, kv, kv}, {"[dot_product_attention]", "f32[4,5,8]"}));
  EXPECT_TRUE(throws_error(fn, {q, {DType::f32, {2, 3, 6, 8}}, {DType::f32, {2, 3, 6, 8}}},
                           {"[dot_product_attention]", "multiple of key/value heads 3"}));
  EXPECT_TRUE(throws_error(fn, {q, {DType::f32, {2, 2, 6, 4}}, {DType::f32, {2, 2, 6, 4}}},
                           {"[dot_product_attention]", "head dim 8"}));
  EXPECT_TRUE(throws_error(fn, {q, kv, {DType::f32, {2, 2, 7, 8}}}, {"[dot_product_attention]", "one shape"}));
  EXPECT_TRUE(throws_error(fn, {q, kv, {DType::bf16, {2, 2, 6, 8}}}, {"[dot_product_attention]", "dtype"}));
  EXPECT_TRUE(throws_error(fn, {q, kv, kv, {DType::boolean, {2, 5}}}, {"[dot_product_attention]", "bool[2,6]"}));
}

}  // namespace
}  // namespace px
