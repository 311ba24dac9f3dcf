// Layers against straightforward host references, their gradients, RoPE and GQA shapes, errors.
#include <cmath>

#include "parallax/nn.h"
#include "testing.h"

namespace px::nn {
namespace {

using testing::all_close;
using Vec = std::vector<float>;

// Runs fn with the store's params bound to `params`, followed by the batch inputs.
std::vector<Array> run(ParamStore& st, const BatchFn& fn, const std::vector<Array>& params,
                       const std::vector<Array>& batch) {
  auto g = trace_with_params(st, fn, testing::types_of(batch));
  std::vector<Array> in = params;
  in.insert(in.end(), batch.begin(), batch.end());
  return Executable::compile(*g)->run(in);
}

// Random values for every param (not the layer's init), so that biases and scales matter.
std::vector<Array> random_params(const ParamStore& st, uint32_t seed = 5) {
  std::vector<Array> p;
  for (auto& s : st.specs()) p.push_back(testing::random_array(s.type.shape, DType::f32, seed++, -1.0f, 1.0f));
  return p;
}

// A traced function over (params..., batch...) for check_grads.
TracedFn with_params(ParamStore& st, const BatchFn& fn) {
  return [&st, fn](const std::vector<Tensor>& in) {
    const size_t np = st.specs().size();
    ParamBinding b = st.bind(std::vector<Tensor>(in.begin(), in.begin() + np));
    return fn(std::vector<Tensor>(in.begin() + np, in.end()));
  };
}

// y[m, n] = x[m, k] @ w[k, n] (+ b[n])
Vec ref_dense(const Vec& x, const Vec& w, const Vec* b, int64_t m, int64_t k, int64_t n) {
  Vec y(m * n, 0.0f);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = b ? (*b)[j] : 0.0;
      for (int64_t p = 0; p < k; ++p) acc += double(x[i * k + p]) * w[p * n + j];
      y[i * n + j] = float(acc);
    }
  return y;
}

float ref_gelu(float x) { return 0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x))); }
float ref_silu(float x) { return x / (1.0f + std::exp(-x)); }

TEST(Linear, MatchesReference) {
  Scope root;
  Linear fc(root.sub("fc"), 5, 3);
  Linear nob(root.sub("nob"), 3, 2, {.bias = false});
  EXPECT_FALSE(nob.b.defined());
  Array x = testing::random_array({2, 3, 5}, DType::f32, 9);
  auto p = random_params(root.store());
  auto out =
      run(root.store(), [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{nob(fc(in[0]))}; }, p, {x});
  Vec b = p[1].to_f32();
  Vec h = ref_dense(x.to_f32(), p[0].to_f32(), &b, 6, 5, 3);
  Vec want = ref_dense(h, p[2].to_f32(), nullptr, 6, 3, 2);
  EXPECT_EQ(out[0].shape(), (Shape{2, 3, 2}));
  EXPECT_TRUE(all_close(out[0].to_f32(), want, 1e-4, 1e-4));
}

TEST(Linear, Bf16ComputeIsCloseToF32) {
  Scope root;
  Linear fc(root.sub("fc"), 64, 8, {.compute_dtype = DType::bf16});
  Array x = testing::random_array({4, 64}, DType::f32, 3);
  auto p = random_params(root.store());
  auto out = run(root.store(), [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{fc(in[0])}; }, p, {x});
  EXPECT_EQ(out[0].dtype(), DType::f32);
  Vec b = p[1].to_f32();
  EXPECT_TRUE(all_close(out[0].to_f32(), ref_dense(x.to_f32(), p[0].to_f32(), &b, 4, 64, 8), 0.1, 0.02));
  // The output holds bf16 values, bias included (as a Linear under autocast): what a following
  // activation keeps for its gradient is 16-bit.
  Vec y = out[0].to_f32();
  EXPECT_EQ(y, Array::from_f32(y, {4, 8}, DType::bf16).to_f32());
}

TEST(Norms, MatchReference) {
  Scope root;
  LayerNorm ln(root.sub("ln"), 6, 1e-5);
  RMSNorm rms(root.sub("rms"), 6, 1e-6);
  LayerNorm nob(root.sub("nob"), 6, 1e-5, /*bias=*/false);
  EXPECT_EQ(root.store().paths(), (std::vector<std::string>{"ln.scale", "ln.bias", "rms.scale", "nob.scale"}));
  Array x = testing::random_array({3, 6}, DType::f32, 4, -2.0f, 3.0f);
  auto p = random_params(root.store());
  auto out = run(root.store(),
                 [&](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{ln(in[0]), rms(in[0]), nob(in[0])};
                 },
                 p, {x});
  Vec xv = x.to_f32(), g = p[0].to_f32(), bt = p[1].to_f32(), gr = p[2].to_f32(), gn = p[3].to_f32();
  Vec want_ln(18), want_rms(18), want_nob(18);
  for (int r = 0; r < 3; ++r) {
    double mu = 0, var = 0, ms = 0;
    for (int i = 0; i < 6; ++i) mu += xv[r * 6 + i] / 6.0;
    for (int i = 0; i < 6; ++i) var += (xv[r * 6 + i] - mu) * (xv[r * 6 + i] - mu) / 6.0;
    for (int i = 0; i < 6; ++i) ms += xv[r * 6 + i] * xv[r * 6 + i] / 6.0;
    for (int i = 0; i < 6; ++i) {
      double z = (xv[r * 6 + i] - mu) / std::sqrt(var + 1e-5);
      want_ln[r * 6 + i] = float(z * g[i] + bt[i]);
      want_nob[r * 6 + i] = float(z * gn[i]);
      want_rms[r * 6 + i] = float(xv[r * 6 + i] / std::sqrt(ms + 1e-6) * gr[i]);
    }
  }
  EXPECT_TRUE(all_close(out[0].to_f32(), want_ln, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(out[1].to_f32(), want_rms, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(out[2].to_f32(), want_nob, 1e-4, 1e-4));
}

TEST(FeedForward, MlpAndSwiGluMatchReference) {
  Scope root;
  Mlp mlp(root.sub("mlp"), 4, 7);
  SwiGlu glu(root.sub("glu"), 4, 5, {.bias = false});
  EXPECT_EQ(root.store().paths(), (std::vector<std::string>{"mlp.fc.w", "mlp.fc.b", "mlp.proj.w", "mlp.proj.b",
                                                            "glu.gate.w", "glu.up.w", "glu.down.w"}));
  Array x = testing::random_array({3, 4}, DType::f32, 2);
  auto p = random_params(root.store());
  auto out = run(root.store(),
                 [&](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{mlp(in[0]), glu(in[0])};
                 },
                 p, {x});
  Vec b0 = p[1].to_f32(), b1 = p[3].to_f32();
  Vec h = ref_dense(x.to_f32(), p[0].to_f32(), &b0, 3, 4, 7);
  for (auto& v : h) v = ref_gelu(v);
  EXPECT_TRUE(all_close(out[0].to_f32(), ref_dense(h, p[2].to_f32(), &b1, 3, 7, 4), 1e-4, 1e-4));
  Vec gt = ref_dense(x.to_f32(), p[4].to_f32(), nullptr, 3, 4, 5),
      up = ref_dense(x.to_f32(), p[5].to_f32(), nullptr, 3, 4, 5);
  for (size_t i = 0; i < gt.size(); ++i) gt[i] = ref_silu(gt[i]) * up[i];
  EXPECT_TRUE(all_close(out[1].to_f32(), ref_dense(gt, p[6].to_f32(), nullptr, 3, 5, 4), 1e-4, 1e-4));
}

TEST(Embedding, LookupAndAttend) {
  Scope root;
  Embedding emb(root.sub("embed"), 7, 3);
  Array tokens = Array::from_i32({6, 0, 2, 2}, {2, 2});
  Array h = testing::random_array({2, 3}, DType::f32, 8);
  auto p = random_params(root.store());
  auto out = run(root.store(),
                 [&](const std::vector<Tensor>& in) {
                   return std::vector<Tensor>{emb(in[0]), emb.attend(in[1])};
                 },
                 p, {tokens, h});
  Vec t = p[0].to_f32(), want;
  for (int tok : {6, 0, 2, 2})
    for (int j = 0; j < 3; ++j) want.push_back(t[tok * 3 + j]);
  EXPECT_EQ(out[0].shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(out[0].to_f32(), want);
  Vec logits(14);
  for (int r = 0; r < 2; ++r)
    for (int v = 0; v < 7; ++v) {
      double a = 0;
      for (int j = 0; j < 3; ++j) a += double(h.to_f32()[r * 3 + j]) * t[v * 3 + j];
      logits[r * 7 + v] = float(a);
    }
  EXPECT_TRUE(all_close(out[1].to_f32(), logits, 1e-5, 1e-5));
}

// Rotate-half RoPE on x[n, s, d] at positions offset + s.
Vec ref_rope(const Vec& x, int64_t n, int64_t s, int64_t d, double theta, int64_t offset) {
  Vec y(x.size());
  int64_t h = d / 2;
  for (int64_t a = 0; a < n; ++a)
    for (int64_t p = 0; p < s; ++p)
      for (int64_t i = 0; i < h; ++i) {
        double ang = double(p + offset) * std::pow(theta, -2.0 * i / d);
        double x1 = x[(a * s + p) * d + i], x2 = x[(a * s + p) * d + h + i];
        y[(a * s + p) * d + i] = float(x1 * std::cos(ang) - x2 * std::sin(ang));
        y[(a * s + p) * d + h + i] = float(x2 * std::cos(ang) + x1 * std::sin(ang));
      }
  return y;
}

TEST(Rope, MatchesReferenceAndGradients) {
  Array x = testing::random_array({2, 3, 5, 6}, DType::f32, 12);
  auto rope = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{apply_rope(in[0], 100.0, 3)}; };
  Array y = testing::eval1(rope, {x});
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_TRUE(all_close(y.to_f32(), ref_rope(x.to_f32(), 6, 5, 6, 100.0, 3), 1e-5, 1e-5));
  // Position 0 with no offset is the identity.
  Array x0 = testing::random_array({1, 4}, DType::f32, 13);
  EXPECT_TRUE(all_close(
      testing::eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{apply_rope(in[0])}; }, {x0})
          .to_f32(),
      x0.to_f32(), 1e-6, 0));
  EXPECT_TRUE(testing::check_grads(rope, {testing::random_array({1, 2, 3, 4}, DType::f32, 14)}));
  EXPECT_TRUE(
      testing::throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{apply_rope(in[0])}; },
                            {{DType::f32, {2, 5}}}, {"[apply_rope]", "even"}));
}

// Reference attention: x[b, s, dm] -> y[b, s, dm], causal, grouped-query, optional rope, biases.
Vec ref_attention(const Vec& x, const std::vector<Array>& p, bool bias, bool rope, int64_t B, int64_t S, int64_t dm,
                  int64_t H, int64_t Hkv) {
  const int64_t hd = dm / H;
  int k = 0;
  Vec wq = p[k++].to_f32(), wk = p[k++].to_f32(), wv = p[k++].to_f32(), wo = p[k++].to_f32();
  Vec bq, bk, bv, bo;
  if (bias) bq = p[k++].to_f32(), bk = p[k++].to_f32(), bv = p[k++].to_f32(), bo = p[k++].to_f32();
  Vec q = ref_dense(x, wq, bias ? &bq : nullptr, B * S, dm, H * hd);
  Vec kk = ref_dense(x, wk, bias ? &bk : nullptr, B * S, dm, Hkv * hd);
  Vec v = ref_dense(x, wv, bias ? &bv : nullptr, B * S, dm, Hkv * hd);
  // To [b, head, s, hd].
  auto heads = [&](const Vec& t, int64_t n) {
    Vec o(t.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s)
        for (int64_t h = 0; h < n; ++h)
          for (int64_t e = 0; e < hd; ++e) o[((b * n + h) * S + s) * hd + e] = t[(b * S + s) * n * hd + h * hd + e];
    return o;
  };
  q = heads(q, H), kk = heads(kk, Hkv), v = heads(v, Hkv);
  if (rope) q = ref_rope(q, B * H, S, hd, 10000.0, 0), kk = ref_rope(kk, B * Hkv, S, hd, 10000.0, 0);
  Vec o(B * S * H * hd);  // [b, s, h, hd]
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      int64_t g = h / (H / Hkv);
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> sc(i + 1);
        double mx = -1e30, den = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double a = 0;
          for (int64_t e = 0; e < hd; ++e)
            a += double(q[((b * H + h) * S + i) * hd + e]) * kk[((b * Hkv + g) * S + j) * hd + e];
          sc[j] = a / std::sqrt(double(hd));
          mx = std::max(mx, sc[j]);
        }
        for (auto& s : sc) den += (s = std::exp(s - mx));
        for (int64_t e = 0; e < hd; ++e) {
          double a = 0;
          for (int64_t j = 0; j <= i; ++j) a += sc[j] / den * v[((b * Hkv + g) * S + j) * hd + e];
          o[((b * S + i) * H + h) * hd + e] = float(a);
        }
      }
    }
  return ref_dense(o, wo, bias ? &bo : nullptr, B * S, H * hd, dm);
}

TEST(Attention, GqaAndRopeShapesAndNumerics) {
  for (bool rope : {false, true})
    for (bool bias : {false, true})
      for (int64_t hkv : {4, 2, 1}) {
        Scope root;
        CausalSelfAttention attn(root.sub("attn"),
                                 {.d_model = 8, .n_heads = 4, .n_kv_heads = hkv, .rope = rope, .bias = bias});
        EXPECT_EQ(attn.wq.shape(), (Shape{8, 8}));
        EXPECT_EQ(attn.wk.shape(), (Shape{8, 2 * hkv}));
        EXPECT_EQ(attn.wv.shape(), (Shape{8, 2 * hkv}));
        EXPECT_EQ(attn.wo.shape(), (Shape{8, 8}));
        EXPECT_EQ(root.store().size(), bias ? 8 : 4);
        Array x = testing::random_array({2, 5, 8}, DType::f32, 21);
        auto p = random_params(root.store());
        auto out = run(root.store(),
                       [&](const std::vector<Tensor>& in) {
                         std::vector<Tensor> h = attn.qkv(in[0]);
                         EXPECT_EQ(h[0].shape(), (Shape{2, 4, 5, 2}));
                         EXPECT_EQ(h[1].shape(), (Shape{2, hkv, 5, 2}));
                         EXPECT_EQ(h[2].shape(), (Shape{2, hkv, 5, 2}));
                         return std::vector<Tensor>{attn(in[0])};
                       },
                       p, {x});
        EXPECT_EQ(out[0].shape(), (Shape{2, 5, 8}));
        EXPECT_TRUE(all_close(out[0].to_f32(), ref_attention(x.to_f32(), p, bias, rope, 2, 5, 8, 4, hkv), 1e-4, 1e-4))
            << "rope " << rope << " bias " << bias << " kv heads " << hkv;
      }
}

TEST(Attention, Gradients) {
  Scope root;
  CausalSelfAttention attn(root.sub("attn"), {.d_model = 4, .n_heads = 2, .n_kv_heads = 1, .rope = true, .bias = true});
  std::vector<Array> in = random_params(root.store());
  in.push_back(testing::random_array({1, 3, 4}, DType::f32, 31));
  EXPECT_TRUE(testing::check_grads(
      with_params(root.store(), [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{attn(b[0])}; }), in));
}

TEST(Layers, MlpGradients) {
  Scope root;
  Mlp mlp(root.sub("mlp"), 3, 5);
  RMSNorm norm(root.sub("norm"), 3);
  std::vector<Array> in = random_params(root.store());
  in.push_back(testing::random_array({2, 3}, DType::f32, 41));
  EXPECT_TRUE(testing::check_grads(
      with_params(root.store(), [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{mlp(norm(b[0]))}; }),
      in));
}

TEST(Layers, ErrorsNameTheFieldsAndShapes) {
  Scope root;
  auto msg = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  std::string m = msg([&] { CausalSelfAttention(root.sub("a"), {.d_model = 10, .n_heads = 4}); });
  EXPECT_NE(m.find("[CausalSelfAttention] d_model (10) must be divisible by n_heads (4)"), std::string::npos) << m;
  m = msg([&] { CausalSelfAttention(root.sub("b"), {.d_model = 12, .n_heads = 4, .n_kv_heads = 3}); });
  EXPECT_NE(m.find("n_heads (4) must be divisible by n_kv_heads (3)"), std::string::npos) << m;
  m = msg([&] { CausalSelfAttention(root.sub("c"), {.d_model = 12, .n_heads = 4, .rope = true}); });
  EXPECT_NE(m.find("even head_dim"), std::string::npos) << m;

  Linear fc(root.sub("fc"), 4, 2);
  Embedding emb(root.sub("emb"), 5, 4);
  CausalSelfAttention attn(root.sub("attn"), {.d_model = 4, .n_heads = 2});
  ParamStore& st = root.store();
  auto bound = [&](std::function<void(const Tensor&)> f) {
    return [&st, f](const std::vector<Tensor>& in) {
      ParamBinding b = st.bind(std::vector<Tensor>(in.begin(), in.end() - 1));
      f(in.back());
      return std::vector<Tensor>{in.back()};
    };
  };
  std::vector<TensorType> types = st.types();
  auto with = [&](TensorType t) {
    auto v = types;
    v.push_back(t);
    return v;
  };
  EXPECT_TRUE(testing::throws_error(bound([&](const Tensor& x) { fc(x); }), with({DType::f32, {2, 3}}),
                                    {"[Linear]", "'fc'", "last dim 4", "f32[2,3]"}));
  EXPECT_TRUE(testing::throws_error(bound([&](const Tensor& x) { emb(x); }), with({DType::f32, {2}}),
                                    {"[Embedding]", "i32", "f32[2]"}));
  EXPECT_TRUE(testing::throws_error(bound([&](const Tensor& x) { attn(x); }), with({DType::f32, {2, 4}}),
                                    {"[CausalSelfAttention]", "'attn'", "f32[2,4]"}));
}

}  // namespace
}  // namespace px::nn
