// GPT-2 and Llama style Transformer language models.
#include "parallax/nn/transformer.h"

#include <cmath>
#include <sstream>

#include "nn/heads.h"

namespace px::nn {

// ---- configs ---------------------------------------------------------------------------------

void LmConfig::validate() const {
  auto fail = [&](const std::string& m) { throw Error("[LmConfig] " + name + ": " + m); };
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0) fail(std::string(field) + " must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("d_model", d_model);
  positive("n_heads", n_heads);
  positive("n_layers", n_layers);
  positive("d_ff", d_ff);
  positive("max_seq_len", max_seq_len);
  check_heads(d_model, n_heads, n_kv_heads, fail);
  if (positions == PositionKind::rotary && head_dim() % 2 != 0)
    fail("rotary positions need an even head_dim = d_model / n_heads, got " + std::to_string(head_dim()));
  if (!(norm_eps > 0)) fail("norm_eps must be positive, got " + std::to_string(norm_eps));
  if (!(init_std > 0)) fail("init_std must be positive, got " + std::to_string(init_std));
  if (sliding_window < 0) fail("sliding_window must be >= 0 (0 = none), got " + std::to_string(sliding_window));
  if (!is_float(compute_dtype))
    fail(std::string("compute_dtype must be a float type, got ") + dtype_name(compute_dtype));
}

std::string LmConfig::to_string() const {
  std::ostringstream os;
  os << "name = " << name << "\nvocab_size = " << vocab_size << "\nd_model = " << d_model << "\nn_heads = " << n_heads
     << "\nn_kv_heads = " << kv_heads() << "\nn_layers = " << n_layers << "\nd_ff = " << d_ff
     << "\nmax_seq_len = " << max_seq_len << "\nnorm = " << (norm == NormKind::layer_norm ? "layer_norm" : "rms_norm")
     << "\nmlp = " << (mlp == MlpKind::gelu ? "gelu" : "swiglu")
     << "\npositions = " << (positions == PositionKind::learned ? "learned" : "rotary")
     << "\ntied_embedding = " << (tied_embedding ? "true" : "false") << "\nbias = " << (bias ? "true" : "false")
     << "\nnorm_eps = " << norm_eps << "\nrope_theta = " << rope_theta << "\ninit_std = " << init_std
     << "\ncompute_dtype = " << dtype_name(compute_dtype) << "\n";
  // Options the presets leave off are listed only when set.
  if (qkv_bias) os << "qkv_bias = true\n";
  if (fused_head) os << "fused_head = true\n";
  if (sliding_window > 0) os << "sliding_window = " << sliding_window << "\n";
  if (rope_scaling.kind != RopeScaling::Kind::none)
    os << "rope_scaling = " << (rope_scaling.kind == RopeScaling::Kind::linear ? "linear" : "llama3") << " x"
       << rope_scaling.factor << "\n";
  return os.str();
}

LmConfig gpt2_config(std::string name, int64_t vocab, int64_t d_model, int64_t n_heads, int64_t n_layers, int64_t d_ff,
                     int64_t max_seq_len) {
  LmConfig c;
  c.name = std::move(name);
  c.vocab_size = vocab;
  c.d_model = d_model;
  c.n_heads = n_heads;
  c.n_layers = n_layers;
  c.d_ff = d_ff;
  c.max_seq_len = max_seq_len;
  return c;  // the defaults are the GPT-2 flavour
}

LmConfig llama_config(std::string name, int64_t vocab, int64_t d_model, int64_t n_heads, int64_t n_kv_heads,
                      int64_t n_layers, int64_t d_ff, int64_t max_seq_len) {
  LmConfig c = gpt2_config(std::move(name), vocab, d_model, n_heads, n_layers, d_ff, max_seq_len);
  c.n_kv_heads = n_kv_heads;
  c.norm = NormKind::rms_norm;
  c.mlp = MlpKind::swiglu;
  c.positions = PositionKind::rotary;
  c.tied_embedding = false;
  c.bias = false;
  return c;
}

LmConfig gpt2_tiny() { return gpt2_config("gpt2_tiny", 2048, 128, 4, 2, 512, 128); }
LmConfig bench_gpt() { return gpt2_config("bench_gpt", 8192, 512, 8, 6, 2048, 256); }
LmConfig llama_tiny() { return llama_config("llama_tiny", 2048, 128, 4, 2, 2, 384, 128); }
LmConfig gpt2_small() { return gpt2_config("gpt2_small", 50257, 768, 12, 12, 3072, 1024); }
LmConfig llama_small() { return llama_config("llama_small", 32000, 768, 12, 4, 12, 2048, 1024); }

LmConfig lm_config(const std::string& name) {
  for (auto f : {gpt2_tiny, bench_gpt, llama_tiny, gpt2_small, llama_small}) {
    LmConfig c = f();
    if (c.name == name) return c;
  }
  throw Error("[lm_config] unknown model config '" + name +
              "'; known: gpt2_tiny, bench_gpt, llama_tiny, gpt2_small, llama_small");
}

// ---- blocks ----------------------------------------------------------------------------------

namespace {
Init residual_init(const LmConfig& c) { return Init::normal(c.init_std / std::sqrt(2.0 * c.n_layers)); }
}  // namespace

Norm::Norm(Scope s, const LmConfig& cfg) : Module(s) {
  if (cfg.norm == NormKind::layer_norm)
    ln_ = LayerNorm(s, cfg.d_model, cfg.norm_eps, cfg.bias);
  else
    rms_ = RMSNorm(s, cfg.d_model, cfg.norm_eps);
}

Tensor Norm::operator()(const Tensor& x) const { return ln_.scale.defined() ? ln_(x) : rms_(x); }

FeedForward::FeedForward(Scope s, const LmConfig& cfg) : Module(s) {
  FfnOptions o{cfg.bias, Init::normal(cfg.init_std), residual_init(cfg), cfg.compute_dtype};
  if (cfg.mlp == MlpKind::gelu)
    mlp_ = Mlp(s, cfg.d_model, cfg.d_ff, o);
  else
    swiglu_ = SwiGlu(s, cfg.d_model, cfg.d_ff, o);
}

Tensor FeedForward::operator()(const Tensor& x) const { return mlp_.fc.w.defined() ? mlp_(x) : swiglu_(x); }

TransformerBlock::TransformerBlock(Scope s, const LmConfig& cfg)
    : Module(s),
      ln1(s.sub("ln1"), cfg),
      attn(s.sub("attn"),
           AttentionConfig{cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.positions == PositionKind::rotary,
                           cfg.rope_theta, cfg.bias, Init::normal(cfg.init_std), residual_init(cfg), cfg.compute_dtype,
                           cfg.qkv_bias, cfg.sliding_window, cfg.rope_scaling}),
      ln2(s.sub("ln2"), cfg),
      mlp(s.sub("mlp"), cfg) {}

Tensor TransformerBlock::operator()(const Tensor& x) const {
  Tensor h = x + attn(ln1(x));
  return h + mlp(ln2(h));
}

// ---- the LM ----------------------------------------------------------------------------------

TransformerLm::TransformerLm(const LmConfig& cfg, Scope s) : Module(s), cfg_(cfg) {
  cfg_.validate();
  embed = Embedding(s.sub("embed"), cfg_.vocab_size, cfg_.d_model, Init::normal(cfg_.init_std));
  if (cfg_.positions == PositionKind::learned)
    pos_embed = Embedding(s.sub("pos_embed"), cfg_.max_seq_len, cfg_.d_model, Init::normal(cfg_.init_std));
  Scope bs = s.sub("blocks");
  for (int64_t i = 0; i < cfg_.n_layers; ++i) blocks.emplace_back(bs.sub(i), cfg_);
  final_norm = Norm(s.sub("final_norm"), cfg_);
  if (!cfg_.tied_embedding)
    head = Linear(s.sub("head"), cfg_.d_model, cfg_.vocab_size,
                  {false, Init::normal(cfg_.init_std), Init::zeros(), cfg_.compute_dtype});
}

Tensor TransformerLm::hidden(const Tensor& tokens) const {
  if (tokens.dtype() != DType::i32 || tokens.rank() != 2)
    throw Error("[TransformerLm] " + cfg_.name + ": tokens must be i32[batch, seq], got " + type_str(tokens.type()));
  const int64_t seq = tokens.dim(1);
  if (seq > cfg_.max_seq_len)
    throw Error("[TransformerLm] " + cfg_.name + ": sequence length " + std::to_string(seq) + " exceeds max_seq_len " +
                std::to_string(cfg_.max_seq_len));
  Tensor x = embed(tokens);
  if (pos_embed.table.defined()) x = x + slice_axis(pos_embed.table, 0, 0, seq);
  // The layer boundaries remat policies keep (RematPolicy): each block's input and the last output.
  for (auto& b : blocks) x = b(tag(x, "layer_input"));
  return final_norm(tag(x, "layers_end"));
}

Tensor TransformerLm::logits(const Tensor& tokens) const {
  Tensor h = hidden(tokens);
  return head.w.defined() ? head(h) : embed.attend(h, cfg_.compute_dtype);
}

Tensor next_token_loss(const TransformerLm& model, const Tensor& tokens, const Tensor& targets, const Tensor& weights) {
  if (targets.dtype() != DType::i32 || targets.shape() != tokens.shape())
    throw Error("[next_token_loss] targets must be i32 with the tokens' shape " + type_str(tokens.type()) + ", got " +
                type_str(targets.type()));
  if (weights.defined() && weights.shape() != targets.shape())
    throw Error("[next_token_loss] weights must have the targets' shape " + shape_str(targets.shape()) + ", got " +
                type_str(weights.type()));
  if (!model.config().fused_head) return cross_entropy_loss(model.logits(tokens), targets, weights);
  // The head's weight as it is: a Linear's [d_model, vocab] (vocab_axis 1) or the tied table
  // [vocab, d_model] (vocab_axis 0), in the compute dtype as the unfused head's matmul reads it.
  Tensor h = model.hidden(tokens);
  const bool untied = model.head.w.defined();
  Tensor w = untied ? model.head.w.value() : model.embed.table.value();
  const DType cd = model.config().compute_dtype;
  if (cd != DType::f32) {
    h = cast(h, cd);
    w = cast(w, cd);
  }
  return linear_cross_entropy_loss(h, w, targets, untied ? 1 : 0, weights);
}

}  // namespace px::nn
