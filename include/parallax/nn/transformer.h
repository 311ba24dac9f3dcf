// Decoder-only Transformer language models in two flavours: GPT-2 (LayerNorm, GELU MLP, learned
// positions, tied embedding) and Llama (RMSNorm, SwiGLU, rotary positions, untied head).
//
//   px::nn::TransformerLm model(px::nn::gpt2_tiny());
//   std::vector<px::Array> params = model.init(/*seed=*/0);
//   auto g = px::nn::trace_with_params(model.store(), [&](const std::vector<px::Tensor>& b) {
//     return std::vector<px::Tensor>{px::nn::next_token_loss(model, b[0], b[1])};
//   }, {{px::DType::i32, {8, 128}}, {px::DType::i32, {8, 128}}}, {"tokens", "targets"});
#pragma once

#include <string>

#include "parallax/nn/layers.h"

namespace px::nn {

enum class NormKind { layer_norm, rms_norm };
enum class MlpKind { gelu, swiglu };
enum class PositionKind { learned, rotary };

struct LmConfig {
  std::string name = "lm";
  int64_t vocab_size = 0;
  int64_t d_model = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;  // 0: same as n_heads
  int64_t n_layers = 0;
  int64_t d_ff = 0;
  int64_t max_seq_len = 0;
  NormKind norm = NormKind::layer_norm;
  MlpKind mlp = MlpKind::gelu;
  PositionKind positions = PositionKind::learned;
  bool tied_embedding = true;
  bool bias = true;  // biases in attention and MLP projections (and LayerNorm)
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;    // none unless a checkpoint asks for it (Llama 3.1)
  bool qkv_bias = false;       // biases on q, k and v when `bias` is off (Qwen2)
  int64_t sliding_window = 0;  // > 0: attention sees only the last sliding_window positions (Mistral)
  // Weights ~ normal(init_std); projections into the residual stream use init_std / sqrt(2 * n_layers).
  double init_std = 0.02;
  // Matmul operand dtype (bf16: params cast to bf16 for matmuls; norms, softmax and loss stay f32).
  DType compute_dtype = DType::f32;
  // next_token_loss computes the head and the loss as one primitive (linear_cross_entropy): the
  // [batch, seq, vocab] logits and their gradient are never held whole, forward or backward, at
  // the cost of one more logits matmul in the backward. Off by default; logits() is unchanged.
  bool fused_head = false;

  int64_t head_dim() const { return n_heads > 0 ? d_model / n_heads : 0; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  // Throws px::Error("[LmConfig] ...") naming the offending fields and the config.
  void validate() const;
  std::string to_string() const;  // one line per field
};

// A GPT-2 / Llama style config with the given sizes; flags set per flavour.
LmConfig gpt2_config(std::string name, int64_t vocab, int64_t d_model, int64_t n_heads, int64_t n_layers, int64_t d_ff,
                     int64_t max_seq_len);
LmConfig llama_config(std::string name, int64_t vocab, int64_t d_model, int64_t n_heads, int64_t n_kv_heads,
                      int64_t n_layers, int64_t d_ff, int64_t max_seq_len);

LmConfig gpt2_tiny();    // vocab 2048, d 128, 4 heads, 2 layers, ff 512, seq 128
LmConfig bench_gpt();    // vocab 8192, d 512, 8 heads, 6 layers, ff 2048, seq 256
LmConfig llama_tiny();   // vocab 2048, d 128, 4 heads (2 kv), 2 layers, ff 384, seq 128
LmConfig gpt2_small();   // GPT-2 124M: vocab 50257, d 768, 12 heads, 12 layers, ff 3072, seq 1024
LmConfig llama_small();  // vocab 32000, d 768, 12 heads (4 kv), 12 layers, ff 2048, seq 1024
// One of the presets above by name ("gpt2_tiny", ...); throws px::Error listing the known names.
LmConfig lm_config(const std::string& name);

// LayerNorm or RMSNorm per config.
class Norm : public Module {
 public:
  Norm() = default;
  Norm(Scope s, const LmConfig& cfg);
  Tensor operator()(const Tensor& x) const;

 private:
  LayerNorm ln_;
  RMSNorm rms_;
};

// GELU Mlp or SwiGlu per config.
class FeedForward : public Module {
 public:
  FeedForward() = default;
  FeedForward(Scope s, const LmConfig& cfg);
  Tensor operator()(const Tensor& x) const;

 private:
  Mlp mlp_;
  SwiGlu swiglu_;
};

// Pre-norm block: x + attn(ln1(x)), then + mlp(ln2(x)). Sub-modules "ln1", "attn", "ln2", "mlp".
class TransformerBlock : public Module {
 public:
  TransformerBlock() = default;
  TransformerBlock(Scope s, const LmConfig& cfg);
  Tensor operator()(const Tensor& x) const;
  Norm ln1;
  CausalSelfAttention attn;
  Norm ln2;
  FeedForward mlp;
};

// Sub-modules: "embed", "pos_embed" (learned positions), "blocks.{i}", "final_norm", "head"
// (untied). Owns its ParamStore unless built in a given scope.
class TransformerLm : public Module {
 public:
  explicit TransformerLm(const LmConfig& cfg, Scope s = Scope());
  const LmConfig& config() const { return cfg_; }
  ParamStore& store() const { return scope().store(); }
  std::vector<Array> init(uint64_t seed) const { return store().init(seed); }
  std::string param_table() const { return store().table(); }

  Tensor hidden(const Tensor& tokens) const;  // i32[B, S] -> f32[B, S, d_model], after the final norm
  Tensor logits(const Tensor& tokens) const;  // i32[B, S] -> f32[B, S, vocab]

  Embedding embed, pos_embed;
  std::vector<TransformerBlock> blocks;
  Norm final_norm;
  Linear head;  // undefined params when the embedding is tied

 private:
  LmConfig cfg_;
};

// Mean cross entropy of the model's next-token predictions: tokens, targets i32[B, S]; weights
// (optional) f32[B, S]. Targets equal to -100 are ignored. With LmConfig::fused_head the head
// and the loss are one linear_cross_entropy of the final hidden state (the same value up to f32
// rounding; in bf16 the logits are not rounded to bf16 between the matmul and the loss).
Tensor next_token_loss(const TransformerLm& model, const Tensor& tokens, const Tensor& targets,
                       const Tensor& weights = Tensor());

}  // namespace px::nn
