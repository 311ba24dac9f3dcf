// Causal self-attention with grouped-query heads, rotary positions (optionally scaled), sliding
// windows and a key/value cache for decoding.
#include <cmath>
#include <numbers>

#include "parallax/nn/layers.h"
#include "nn/heads.h"

namespace px::nn {

namespace {
void check_rope_input(const Tensor& x, const std::vector<double>& inv_freq) {
  if (x.rank() < 2) throw Error("[apply_rope] expects x[..., seq, head_dim], got " + type_str(x.type()));
  if (x.dim(-1) % 2 != 0) throw Error("[apply_rope] head_dim must be even, got " + type_str(x.type()));
  if (!is_float(x.dtype())) throw Error("[apply_rope] expects a float tensor, got " + type_str(x.type()));
  if (static_cast<int64_t>(inv_freq.size()) != x.dim(-1) / 2)
    throw Error("[apply_rope] " + std::to_string(inv_freq.size()) + " frequencies for head_dim " +
                std::to_string(x.dim(-1)) + " (need head_dim / 2)");
}

// x rotated by the angle tables cos_t, sin_t broadcastable to [..., S, D/2].
Tensor rotate(const Tensor& x, const Tensor& cos_t, const Tensor& sin_t) {
  const int r = x.rank();
  const int64_t d = x.dim(-1), half = d / 2;
  Tensor x1 = slice_axis(x, r - 1, 0, half);
  Tensor x2 = slice_axis(x, r - 1, half, d);
  return concat({x1 * cos_t - x2 * sin_t, x2 * cos_t + x1 * sin_t}, r - 1);
}

// Host tables cos/sin[p, i] = cos/sin((p + offset) * inv_freq[i]) for p < rows.
std::pair<std::vector<float>, std::vector<float>> angle_tables(int64_t rows, int64_t offset,
                                                               const std::vector<double>& inv_freq) {
  const int64_t half = static_cast<int64_t>(inv_freq.size());
  std::vector<float> c(static_cast<size_t>(rows * half)), s(c.size());
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t i = 0; i < half; ++i) {
      double a = static_cast<double>(p + offset) * inv_freq[i];
      c[p * half + i] = static_cast<float>(std::cos(a));
      s[p * half + i] = static_cast<float>(std::sin(a));
    }
  return {c, s};
}
}  // namespace

std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& sc) {
  const int64_t half = head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[i] = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
  if (sc.kind == RopeScaling::Kind::linear) {
    for (auto& v : f) v /= sc.factor;
  } else if (sc.kind == RopeScaling::Kind::llama3) {
    // Wavelengths longer than the original context / low_freq_factor are slowed by factor, those
    // shorter than context / high_freq_factor kept, and the band between interpolated.
    const double ctx = static_cast<double>(sc.original_max_position);
    const double low_wavelen = ctx / sc.low_freq_factor, high_wavelen = ctx / sc.high_freq_factor;
    for (auto& v : f) {
      const double wavelen = 2.0 * std::numbers::pi / v;
      if (wavelen > low_wavelen) {
        v /= sc.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (ctx / wavelen - sc.low_freq_factor) / (sc.high_freq_factor - sc.low_freq_factor);
        v = (1.0 - smooth) * v / sc.factor + smooth * v;
      }
    }
  }
  return f;
}

Tensor apply_rope(const Tensor& x, double theta, int64_t offset) {
  if (x.rank() < 1) throw Error("[apply_rope] expects x[..., seq, head_dim], got " + type_str(x.type()));
  return apply_rope(x, rope_inv_freq(x.dim(-1), theta), offset);
}

Tensor apply_rope(const Tensor& x, const std::vector<double>& inv_freq, int64_t offset) {
  check_rope_input(x, inv_freq);
  const int64_t seq = x.dim(-2), half = x.dim(-1) / 2;
  // Angle tables are host constants; the rotation itself is ordinary (differentiable) ops.
  auto [c, s] = angle_tables(seq, offset, inv_freq);
  TraceScope in_x(x.graph());
  Tensor cos_t = constant(Array::from_f32(c, {seq, half}, x.dtype()));
  Tensor sin_t = constant(Array::from_f32(s, {seq, half}, x.dtype()));
  return rotate(x, cos_t, sin_t);
}

Tensor masked_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask) {
  if (q.rank() != 4 || k.rank() != 4 || k.shape() != v.shape() || q.dim(0) != k.dim(0) || q.dim(3) != k.dim(3) ||
      k.dim(1) == 0 || q.dim(1) % k.dim(1) != 0)
    throw Error("[masked_attention] expects q [B,H,Sq,D] and k, v [B,Hkv,Sk,D] with H % Hkv == 0, got " +
                type_str(q.type()) + ", " + type_str(k.type()) + ", " + type_str(v.type()));
  const int64_t b = q.dim(0), h = q.dim(1), sq = q.dim(2), d = q.dim(3), hkv = k.dim(1), sk = k.dim(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Tensor q5 = reshape(q, {b, hkv, h / hkv, sq, d});
  Tensor scores = dot_general(q5 * scale, k, DotDims{{4}, {3}, {0, 1}, {0, 1}}, DType::f32);  // [B,Hkv,G,Sq,Sk]
  Tensor m = broadcast_to(mask, {sq, sk});
  scores = where(broadcast_in_dim(m, {b, hkv, h / hkv, sq, sk}, {3, 4}), scores, full({}, -1e30, DType::f32));
  Tensor probs = softmax(scores, -1);
  if (probs.dtype() != v.dtype()) probs = cast(probs, v.dtype());
  Tensor o = dot_general(probs, v, DotDims{{4}, {2}, {0, 1}, {0, 1}});  // [B,Hkv,G,Sq,D]
  return reshape(o, {b, h, sq, d});
}

Tensor causal_mask(const Tensor& q_pos, int64_t num_keys, int64_t window) {
  const int64_t sq = q_pos.dim(0);
  Tensor row = broadcast_in_dim(q_pos, {sq, num_keys}, {0});
  Tensor col = iota({sq, num_keys}, 1, DType::i32);
  Tensor m = less_equal(col, row);
  if (window > 0) m = logical_and(m, greater(col, row - full({}, static_cast<double>(window), DType::i32)));
  return m;
}

void AttentionConfig::validate() const {
  auto fail = [](const std::string& m) { throw Error("[CausalSelfAttention] " + m); };
  if (d_model <= 0) fail("d_model must be positive, got " + std::to_string(d_model));
  if (n_heads <= 0) fail("n_heads must be positive, got " + std::to_string(n_heads));
  check_heads(d_model, n_heads, n_kv_heads, fail);
  if (rope && head_dim() % 2 != 0)
    fail("rope needs an even head_dim = d_model / n_heads, got " + std::to_string(head_dim()));
  if (sliding_window < 0) fail("sliding_window must be >= 0 (0 = none), got " + std::to_string(sliding_window));
  if (rope_scaling.kind != RopeScaling::Kind::none && !(rope_scaling.factor > 0))
    fail("rope_scaling.factor must be positive, got " + std::to_string(rope_scaling.factor));
  if (rope_scaling.kind == RopeScaling::Kind::llama3 &&
      (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) || rope_scaling.original_max_position <= 0))
    fail("llama3 rope_scaling needs high_freq_factor > low_freq_factor and original_max_position > 0");
}

CausalSelfAttention::CausalSelfAttention(Scope s, const AttentionConfig& cfg) : Module(s), cfg_(cfg) {
  cfg.validate();
  const int64_t d = cfg.d_model, hq = cfg.n_heads * cfg.head_dim(), hkv = cfg.kv_heads() * cfg.head_dim();
  wq = s.param("wq", {DType::f32, {d, hq}}, cfg.w_init);
  wk = s.param("wk", {DType::f32, {d, hkv}}, cfg.w_init);
  wv = s.param("wv", {DType::f32, {d, hkv}}, cfg.w_init);
  wo = s.param("wo", {DType::f32, {hq, d}}, cfg.out_init);
  if (cfg.bias || cfg.qkv_bias) {
    bq = s.param("bq", {DType::f32, {hq}}, Init::zeros());
    bk = s.param("bk", {DType::f32, {hkv}}, Init::zeros());
    bv = s.param("bv", {DType::f32, {hkv}}, Init::zeros());
  }
  if (cfg.bias) bo = s.param("bo", {DType::f32, {d}}, Init::zeros());
  if (cfg.rope) inv_freq_ = rope_inv_freq(cfg.head_dim(), cfg.rope_theta, cfg.rope_scaling);
}

// [B, S, d] -> [B, heads, S, hd]
Tensor CausalSelfAttention::project(const Tensor& x, const Param& w, const Param& bias, int64_t n) const {
  Tensor y = dense(x, w, cfg_.compute_dtype);
  if (bias.defined()) y = y + bias.value();
  return transpose(reshape(y, {x.dim(0), x.dim(1), n, cfg_.head_dim()}), {0, 2, 1, 3});
}

// [B, H, S, hd] -> [B, S, d]
Tensor CausalSelfAttention::output(const Tensor& o_heads, int64_t batch, int64_t seq) const {
  Tensor o = o_heads.dtype() != DType::f32 ? cast(o_heads, DType::f32) : o_heads;
  o = reshape(transpose(o, {0, 2, 1, 3}), {batch, seq, cfg_.n_heads * cfg_.head_dim()});
  Tensor y = dense(o, wo, cfg_.compute_dtype);
  return bo.defined() ? y + bo.value() : y;
}

std::vector<Tensor> CausalSelfAttention::qkv(const Tensor& x) const {
  if (x.rank() != 3 || x.dim(-1) != cfg_.d_model)
    throw Error("[CausalSelfAttention] '" + path() + "' expects x[batch, seq, " + std::to_string(cfg_.d_model) +
                "], got " + type_str(x.type()));
  Tensor q = project(x, wq, bq, cfg_.n_heads);
  Tensor k = project(x, wk, bk, cfg_.kv_heads());
  Tensor v = project(x, wv, bv, cfg_.kv_heads());
  if (cfg_.rope) {
    q = apply_rope(q, inv_freq_, 0);
    k = apply_rope(k, inv_freq_, 0);
  }
  return {q, k, v};
}

Tensor CausalSelfAttention::operator()(const Tensor& x) const {
  std::vector<Tensor> h = qkv(x);
  const DType c = cfg_.compute_dtype;
  if (c != DType::f32)
    for (auto& t : h) t = cast(t, c);
  const int64_t seq = x.dim(1);
  Tensor o;
  if (cfg_.sliding_window > 0 && cfg_.sliding_window < seq) {
    o = masked_attention(h[0], h[1], h[2], causal_mask(iota({seq}, 0, DType::i32), seq, cfg_.sliding_window));
  } else {
    AttentionOptions opt;
    opt.causal = true;
    o = dot_product_attention(h[0], h[1], h[2], opt);
  }
  return output(o, x.dim(0), seq);
}

}  // namespace px::nn
