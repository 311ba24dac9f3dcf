// Causal self-attention with grouped-query heads and rotary positions.
#include <cmath>

#include "parallax/nn/layers.h"

namespace px::nn {

Tensor apply_rope(const Tensor& x, double theta, int64_t offset) {
  const int r = x.rank();
  if (r < 2) throw Error("[apply_rope] expects x[..., seq, head_dim], got " + type_str(x.type()));
  const int64_t seq = x.dim(-2), d = x.dim(-1);
  if (d % 2 != 0) throw Error("[apply_rope] head_dim must be even, got " + type_str(x.type()));
  if (!is_float(x.dtype())) throw Error("[apply_rope] expects a float tensor, got " + type_str(x.type()));
  const int64_t half = d / 2;
  // Angle tables are host constants; the rotation itself is ordinary (differentiable) ops.
  std::vector<float> c(static_cast<size_t>(seq * half)), s(c.size());
  for (int64_t p = 0; p < seq; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double a =
          static_cast<double>(p + offset) * std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      c[p * half + i] = static_cast<float>(std::cos(a));
      s[p * half + i] = static_cast<float>(std::sin(a));
    }
  TraceScope in_x(x.graph());
  Tensor cos_t = constant(Array::from_f32(c, {seq, half}, x.dtype()));
  Tensor sin_t = constant(Array::from_f32(s, {seq, half}, x.dtype()));
  Tensor x1 = slice_axis(x, r - 1, 0, half);
  Tensor x2 = slice_axis(x, r - 1, half, d);
  return concat({x1 * cos_t - x2 * sin_t, x2 * cos_t + x1 * sin_t}, r - 1);
}

void AttentionConfig::validate() const {
  auto fail = [](const std::string& m) { throw Error("[CausalSelfAttention] " + m); };
  if (d_model <= 0) fail("d_model must be positive, got " + std::to_string(d_model));
  if (n_heads <= 0) fail("n_heads must be positive, got " + std::to_string(n_heads));
  if (n_kv_heads < 0) fail("n_kv_heads must be >= 0 (0 = n_heads), got " + std::to_string(n_kv_heads));
  if (d_model % n_heads != 0)
    fail("d_model (" + std::to_string(d_model) + ") must be divisible by n_heads (" + std::to_string(n_heads) + ")");
  if (n_heads % kv_heads() != 0)
    fail("n_heads (" + std::to_string(n_heads) + ") must be divisible by n_kv_heads (" + std::to_string(kv_heads()) +
         ")");
  if (rope && head_dim() % 2 != 0)
    fail("rope needs an even head_dim = d_model / n_heads, got " + std::to_string(head_dim()));
}

CausalSelfAttention::CausalSelfAttention(Scope s, const AttentionConfig& cfg) : Module(s), cfg_(cfg) {
  cfg.validate();
  const int64_t d = cfg.d_model, hq = cfg.n_heads * cfg.head_dim(), hkv = cfg.kv_heads() * cfg.head_dim();
  wq = s.param("wq", {DType::f32, {d, hq}}, cfg.w_init);
  wk = s.param("wk", {DType::f32, {d, hkv}}, cfg.w_init);
  wv = s.param("wv", {DType::f32, {d, hkv}}, cfg.w_init);
  wo = s.param("wo", {DType::f32, {hq, d}}, cfg.out_init);
  if (cfg.bias) {
    bq = s.param("bq", {DType::f32, {hq}}, Init::zeros());
    bk = s.param("bk", {DType::f32, {hkv}}, Init::zeros());
    bv = s.param("bv", {DType::f32, {hkv}}, Init::zeros());
    bo = s.param("bo", {DType::f32, {d}}, Init::zeros());
  }
}

std::vector<Tensor> CausalSelfAttention::qkv(const Tensor& x) const {
  if (x.rank() != 3 || x.dim(-1) != cfg_.d_model)
    throw Error("[CausalSelfAttention] '" + path() + "' expects x[batch, seq, " + std::to_string(cfg_.d_model) +
                "], got " + type_str(x.type()));
  const int64_t b = x.dim(0), s = x.dim(1), hd = cfg_.head_dim();
  // [B, S, heads*hd] -> [B, heads, S, hd]
  auto heads = [&](const Param& w, const Param& bias, int64_t n) {
    Tensor y = dense(x, w, cfg_.compute_dtype);
    if (bias.defined()) y = y + bias.value();
    return transpose(reshape(y, {b, s, n, hd}), {0, 2, 1, 3});
  };
  Tensor q = heads(wq, bq, cfg_.n_heads);
  Tensor k = heads(wk, bk, cfg_.kv_heads());
  Tensor v = heads(wv, bv, cfg_.kv_heads());
  if (cfg_.rope) {
    q = apply_rope(q, cfg_.rope_theta);
    k = apply_rope(k, cfg_.rope_theta);
  }
  return {q, k, v};
}

Tensor CausalSelfAttention::operator()(const Tensor& x) const {
  std::vector<Tensor> h = qkv(x);
  const DType c = cfg_.compute_dtype;
  if (c != DType::f32)
    for (auto& t : h) t = cast(t, c);
  AttentionOptions opt;
  opt.causal = true;
  Tensor o = dot_product_attention(h[0], h[1], h[2], opt);
  if (o.dtype() != DType::f32) o = cast(o, DType::f32);
  // [B, H, S, hd] -> [B, S, H*hd]
  o = reshape(transpose(o, {0, 2, 1, 3}), {x.dim(0), x.dim(1), cfg_.n_heads * cfg_.head_dim()});
  Tensor y = dense(o, wo, c);
  return bo.defined() ? y + bo.value() : y;
}

}  // namespace px::nn
