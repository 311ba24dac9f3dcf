// Layers: Linear, Embedding, LayerNorm, RMSNorm, Mlp (GELU), SwiGlu and CausalSelfAttention
// (multi-head, grouped-query, optional rotary positions). Each declares its params when
// constructed and applies ops when called inside a binding.
//
//   px::nn::Scope root;
//   px::nn::CausalSelfAttention attn(root.sub("attn"), {.d_model = 128, .n_heads = 4, .n_kv_heads = 2,
//                                                       .rope = true});
//   // params: attn.wq f32[128,128], attn.wk f32[128,64], attn.wv f32[128,64], attn.wo f32[128,128]
//   px::Tensor y = attn(x);   // x, y: f32[batch, seq, 128]
#pragma once

#include "parallax/nn/module.h"
#include "parallax/ops.h"

namespace px::nn {

// x[..., k] @ w[k, n] -> f32[..., n]. With a 16-bit compute dtype both operands are cast to it,
// the product accumulates in f32 and is written in the compute dtype (as a Linear under PyTorch's
// autocast), then widened to f32 for what follows (bias, activation, residual add).
Tensor dense(const Tensor& x, const Tensor& w, DType compute_dtype = DType::f32);

struct LinearOptions {
  bool bias = true;
  Init w_init = Init::lecun_normal();
  Init b_init = Init::zeros();
  DType compute_dtype = DType::f32;
};

// y = x @ w + b with params "w" [in, out] and (optionally) "b" [out]. With a 16-bit compute dtype
// y holds values of that dtype (the sum with the bias rounded to it, as under PyTorch's autocast),
// widened to f32: an activation after it keeps the 16-bit value for its gradient.
class Linear : public Module {
 public:
  Linear() = default;
  Linear(Scope s, int64_t in_features, int64_t out_features, LinearOptions opt = {});
  Tensor operator()(const Tensor& x) const;
  Param w, b;  // b is undefined without bias

 private:
  DType compute_dtype_ = DType::f32;
};

// A table "table" [vocab, dim]: tokens (i32) -> rows; attend() maps features back to logits
// over the vocabulary with the same table (tied output embedding).
class Embedding : public Module {
 public:
  Embedding() = default;
  Embedding(Scope s, int64_t vocab, int64_t dim, Init init = Init::normal(0.02));
  Tensor operator()(const Tensor& tokens) const;  // i32[...] -> f32[..., dim]
  // x[..., dim] -> f32[..., vocab] = x @ table^T.
  Tensor attend(const Tensor& x, DType compute_dtype = DType::f32) const;
  Tensor as_logits(const Tensor& x, DType compute_dtype = DType::f32) const { return attend(x, compute_dtype); }
  Param table;
};

// Normalizes the last axis; params "scale" [dim] (ones) and, with bias, "bias" [dim] (zeros).
class LayerNorm : public Module {
 public:
  LayerNorm() = default;
  LayerNorm(Scope s, int64_t dim, double eps = 1e-5, bool bias = true);
  Tensor operator()(const Tensor& x) const;
  Param scale, bias;

 private:
  double eps_ = 1e-5;
};

class RMSNorm : public Module {
 public:
  RMSNorm() = default;
  RMSNorm(Scope s, int64_t dim, double eps = 1e-6);
  Tensor operator()(const Tensor& x) const;
  Param scale;

 private:
  double eps_ = 1e-6;
};

// Options shared by the feed-forward layers: w_init for input projections, out_init for the
// projection back to the residual stream.
struct FfnOptions {
  bool bias = true;
  Init w_init = Init::lecun_normal();
  Init out_init = Init::lecun_normal();
  DType compute_dtype = DType::f32;
};

// proj(gelu(fc(x))): sub-modules "fc" (dim -> hidden) and "proj" (hidden -> dim).
class Mlp : public Module {
 public:
  Mlp() = default;
  Mlp(Scope s, int64_t dim, int64_t hidden, FfnOptions opt = {});
  Tensor operator()(const Tensor& x) const;
  Linear fc, proj;
};

// down(silu(gate(x)) * up(x)): sub-modules "gate", "up" (dim -> hidden) and "down".
class SwiGlu : public Module {
 public:
  SwiGlu() = default;
  SwiGlu(Scope s, int64_t dim, int64_t hidden, FfnOptions opt = {});
  Tensor operator()(const Tensor& x) const;
  Linear gate, up, down;
};

// Rotates pairs (x[..., i], x[..., i + D/2]) of x[..., S, D] by angle (offset + s) * theta^(-2i/D),
// for position s along axis -2 (the "rotate half" convention). D must be even.
Tensor apply_rope(const Tensor& x, double theta = 10000.0, int64_t offset = 0);

// Rotary frequency scaling for long contexts: "linear" divides every frequency by factor; "llama3"
// divides the low frequencies by factor and blends the middle band (Llama 3.1's rope_scaling).
struct RopeScaling {
  enum class Kind { none, linear, llama3 };
  Kind kind = Kind::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};
// The D/2 rotary frequencies theta^(-2i/D), scaled.
std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& scaling = {});
// apply_rope with explicit frequencies (rope_inv_freq).
Tensor apply_rope(const Tensor& x, const std::vector<double>& inv_freq, int64_t offset);

struct AttentionConfig {
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: same as n_heads; fewer: grouped-query attention
  bool rope = false;
  double rope_theta = 10000.0;
  bool bias = false;
  Init w_init = Init::lecun_normal();
  Init out_init = Init::lecun_normal();
  DType compute_dtype = DType::f32;
  bool qkv_bias = false;       // biases on q, k and v (not the output) even when `bias` is off (Qwen2)
  int64_t sliding_window = 0;  // > 0: a query sees only the last sliding_window keys, itself included
  RopeScaling rope_scaling;
  int64_t head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // Throws px::Error("[CausalSelfAttention] ...") naming the offending fields.
  void validate() const;
};

// softmax(q k^T * scale + mask) v with q [B, H, Sq, D], k and v [B, Hkv, Sk, D] (grouped-query) and
// a bool mask broadcastable to [Sq, Sk] (true = attend), f32 scores. The unfused path, for masks
// dot_product_attention lacks (sliding windows, cache positions).
Tensor masked_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);
// Causal mask bool[Sq, Sk] for queries at absolute positions q_pos i32[Sq] over keys 0..Sk-1,
// limited to the last `window` keys when window > 0.
Tensor causal_mask(const Tensor& q_pos, int64_t num_keys, int64_t window = 0);

// Causal multi-head self-attention on x[B, S, d_model]. Params: "wq" [d, H*hd], "wk" and "wv"
// [d, Hkv*hd], "wo" [H*hd, d], and with bias "bq", "bk", "bv", "bo" (qkv_bias: "bq", "bk", "bv").
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention() = default;
  CausalSelfAttention(Scope s, const AttentionConfig& cfg);
  Tensor operator()(const Tensor& x) const;
  // The projected heads: q [B, H, S, hd], k and v [B, Hkv, S, hd], rotated when cfg.rope.
  std::vector<Tensor> qkv(const Tensor& x) const;
  const AttentionConfig& config() const { return cfg_; }
  Param wq, wk, wv, wo, bq, bk, bv, bo;

 private:
  Tensor project(const Tensor& x, const Param& w, const Param& b, int64_t heads) const;
  Tensor output(const Tensor& o, int64_t batch, int64_t seq) const;
  AttentionConfig cfg_;
  std::vector<double> inv_freq_;
};

}  // namespace px::nn
