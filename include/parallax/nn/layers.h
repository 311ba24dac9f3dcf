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

// x[..., k] @ w[k, n] -> f32[..., n]. With a 16-bit compute dtype both operands are cast to it
// and the product accumulates into an f32 result.
Tensor dense(const Tensor& x, const Tensor& w, DType compute_dtype = DType::f32);

struct LinearOptions {
  bool bias = true;
  Init w_init = Init::lecun_normal();
  Init b_init = Init::zeros();
  DType compute_dtype = DType::f32;
};

// y = x @ w + b with params "w" [in, out] and (optionally) "b" [out].
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
  int64_t head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // Throws px::Error("[CausalSelfAttention] ...") naming the offending fields.
  void validate() const;
};

// Causal multi-head self-attention on x[B, S, d_model]. Params: "wq" [d, H*hd], "wk" and "wv"
// [d, Hkv*hd], "wo" [H*hd, d], and with bias "bq", "bk", "bv", "bo".
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
  AttentionConfig cfg_;
};

}  // namespace px::nn
