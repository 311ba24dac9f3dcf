// GPT2LMHeadModel: Conv1D weights are stored [in, out] (our layout), and c_attn fuses q, k and v.
#include "nn/pretrained/arch.h"

namespace px::nn::detail {

namespace {

LmConfig from_json(const nlohmann::json& j, const std::string& path) {
  const int64_t d = require_int(j, "n_embd", path);
  LmConfig c = gpt2_config("gpt2", require_int(j, "vocab_size", path), d, require_int(j, "n_head", path),
                           require_int(j, "n_layer", path), get_or<int64_t>(j, "n_inner", 4 * d, path),
                           require_int(j, "n_positions", path));
  c.norm_eps = get_or<double>(j, "layer_norm_epsilon", 1e-5, path);
  c.tied_embedding = get_or<bool>(j, "tie_word_embeddings", true, path);
  const std::string act = get_or<std::string>(j, "activation_function", "gelu_new", path);
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
    unsupported(path, "activation_function '" + act + "' (supported: gelu_new, gelu_pytorch_tanh, gelu_fast)");
  if (!get_or<bool>(j, "scale_attn_weights", true, path)) unsupported(path, "scale_attn_weights = false");
  if (get_or<bool>(j, "scale_attn_by_inverse_layer_idx", false, path))
    unsupported(path, "scale_attn_by_inverse_layer_idx = true");
  if (get_or<bool>(j, "add_cross_attention", false, path)) unsupported(path, "add_cross_attention = true");
  return c;
}

nlohmann::json to_json(const LmConfig& c) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocab_size},
          {"n_embd", c.d_model},
          {"n_head", c.n_heads},
          {"n_layer", c.n_layers},
          {"n_inner", c.d_ff},
          {"n_positions", c.max_seq_len},
          {"layer_norm_epsilon", c.norm_eps},
          {"activation_function", "gelu_new"},
          {"tie_word_embeddings", c.tied_embedding},
          {"scale_attn_weights", true},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"torch_dtype", "float32"}};
}

std::vector<TensorMap> tensors(const LmConfig& c) {
  std::vector<TensorMap> m{{"transformer.wte.weight", {"embed.table"}},
                           {"transformer.wpe.weight", {"pos_embed.table"}}};
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".", b = "blocks." + std::to_string(i) + ".";
    m.push_back({h + "ln_1.weight", {b + "ln1.scale"}});
    m.push_back({h + "ln_1.bias", {b + "ln1.bias"}});
    m.push_back({h + "attn.c_attn.weight", {b + "attn.wq", b + "attn.wk", b + "attn.wv"}});
    m.push_back({h + "attn.c_attn.bias", {b + "attn.bq", b + "attn.bk", b + "attn.bv"}});
    m.push_back({h + "attn.c_proj.weight", {b + "attn.wo"}});
    m.push_back({h + "attn.c_proj.bias", {b + "attn.bo"}});
    m.push_back({h + "ln_2.weight", {b + "ln2.scale"}});
    m.push_back({h + "ln_2.bias", {b + "ln2.bias"}});
    m.push_back({h + "mlp.c_fc.weight", {b + "mlp.fc.w"}});
    m.push_back({h + "mlp.c_fc.bias", {b + "mlp.fc.b"}});
    m.push_back({h + "mlp.c_proj.weight", {b + "mlp.proj.w"}});
    m.push_back({h + "mlp.c_proj.bias", {b + "mlp.proj.b"}});
  }
  m.push_back({"transformer.ln_f.weight", {"final_norm.scale"}});
  m.push_back({"transformer.ln_f.bias", {"final_norm.bias"}});
  if (!c.tied_embedding) m.push_back({"lm_head.weight", {"head.w"}, true});
  return m;
}

// The causal-mask buffers older GPT-2 checkpoints carry.
bool ignored(const std::string& n) {
  auto ends = [&](const std::string& s) {
    return n.size() >= s.size() && n.compare(n.size() - s.size(), s.size(), s) == 0;
  };
  return ends(".attn.bias") || ends(".attn.masked_bias");
}

}  // namespace

const ArchSpec& gpt2_arch() {
  static const ArchSpec a{"GPT2LMHeadModel", "gpt2", from_json, to_json, tensors, ignored};
  return a;
}

}  // namespace px::nn::detail
