// LlamaForCausalLM (Llama 2 and 3 shapes: GQA, rope theta and scaling). Mistral and Qwen2 reuse
// these names and layouts. HF's Linear stores [out, in]: every projection is transposed. HF's
// checkpoints already use the rotate-half rotary layout (the conversion script permuted q and k),
// which is ours, so q and k need no permutation.
#include "nn/pretrained/arch.h"

namespace px::nn::detail {

int64_t require_int(const nlohmann::json& cfg, const char* key, const std::string& path) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null())
    throw Error(path + ": required field '" + key + "' is missing; add it to config.json");
  if (!it->is_number_integer()) throw Error(path + ": field '" + key + "' must be an integer, got " + it->dump());
  return it->get<int64_t>();
}

void unsupported(const std::string& path, const std::string& what) {
  throw Error(path + ": " + what +
              " is not supported by px::nn::load_pretrained; change config.json or convert the "
              "model to a supported layout");
}

namespace {
// Rotary settings: transformers 5 nests them in "rope_parameters"; older configs use "rope_theta"
// and "rope_scaling" at the top level.
void read_rope(const nlohmann::json& j, const std::string& path, LmConfig& c) {
  c.rope_theta = get_or<double>(j, "rope_theta", 10000.0, path);
  nlohmann::json rp;
  if (auto it = j.find("rope_parameters"); it != j.end() && it->is_object()) rp = *it;
  if (rp.is_object() && rp.contains("rope_theta")) c.rope_theta = get_or<double>(rp, "rope_theta", c.rope_theta, path);
  if (auto it = j.find("rope_scaling"); it != j.end() && it->is_object()) rp = *it;
  if (!rp.is_object()) return;
  std::string type = get_or<std::string>(rp, "rope_type", get_or<std::string>(rp, "type", "default", path), path);
  if (get_or<double>(rp, "partial_rotary_factor", 1.0, path) != 1.0) unsupported(path, "partial_rotary_factor != 1");
  RopeScaling& s = c.rope_scaling;
  if (type == "default") return;
  if (type == "linear") {
    s.kind = RopeScaling::Kind::linear;
  } else if (type == "llama3") {
    s.kind = RopeScaling::Kind::llama3;
    s.low_freq_factor = get_or<double>(rp, "low_freq_factor", 1.0, path);
    s.high_freq_factor = get_or<double>(rp, "high_freq_factor", 4.0, path);
    s.original_max_position = get_or<int64_t>(rp, "original_max_position_embeddings", c.max_seq_len, path);
  } else {
    unsupported(path, "rope type '" + type + "' (supported: default, linear, llama3)");
  }
  s.factor = get_or<double>(rp, "factor", 1.0, path);
}
}  // namespace

LmConfig llama_family_from_json(const nlohmann::json& j, const std::string& path, const std::string& arch) {
  const int64_t d = require_int(j, "hidden_size", path), heads = require_int(j, "num_attention_heads", path);
  LmConfig c =
      llama_config(arch, require_int(j, "vocab_size", path), d, heads,
                   get_or<int64_t>(j, "num_key_value_heads", heads, path), require_int(j, "num_hidden_layers", path),
                   require_int(j, "intermediate_size", path), require_int(j, "max_position_embeddings", path));
  c.norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6, path);
  c.tied_embedding = get_or<bool>(j, "tie_word_embeddings", false, path);
  read_rope(j, path, c);
  const std::string act = get_or<std::string>(j, "hidden_act", "silu", path);
  if (act != "silu") unsupported(path, "hidden_act '" + act + "' (supported: silu)");
  if (heads > 0 && get_or<int64_t>(j, "head_dim", d / heads, path) != d / heads)
    unsupported(path, "head_dim != hidden_size / num_attention_heads");
  if (get_or<bool>(j, "attention_bias", false, path)) unsupported(path, "attention_bias = true");
  if (get_or<bool>(j, "mlp_bias", false, path)) unsupported(path, "mlp_bias = true");
  return c;
}

nlohmann::json llama_family_to_json(const LmConfig& c, const std::string& arch, const std::string& model_type) {
  nlohmann::json rope = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  const RopeScaling& s = c.rope_scaling;
  if (s.kind == RopeScaling::Kind::linear) {
    rope["rope_type"] = "linear";
    rope["factor"] = s.factor;
  } else if (s.kind == RopeScaling::Kind::llama3) {
    rope["rope_type"] = "llama3";
    rope["factor"] = s.factor;
    rope["low_freq_factor"] = s.low_freq_factor;
    rope["high_freq_factor"] = s.high_freq_factor;
    rope["original_max_position_embeddings"] = s.original_max_position;
  }
  return {{"architectures", {arch}},
          {"model_type", model_type},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.d_model},
          {"intermediate_size", c.d_ff},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.kv_heads()},
          {"head_dim", c.head_dim()},
          {"max_position_embeddings", c.max_seq_len},
          {"rms_norm_eps", c.norm_eps},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", c.tied_embedding},
          {"rope_theta", c.rope_theta},
          {"rope_parameters", rope},
          {"attention_dropout", 0.0},
          {"torch_dtype", "float32"}};
}

std::vector<TensorMap> llama_family_tensors(const LmConfig& c) {
  std::vector<TensorMap> m{{"model.embed_tokens.weight", {"embed.table"}}};
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".", b = "blocks." + std::to_string(i) + ".";
    m.push_back({h + "input_layernorm.weight", {b + "ln1.scale"}});
    for (const char* p : {"q", "k", "v"}) {
      m.push_back({h + "self_attn." + p + "_proj.weight", {b + "attn.w" + p}, true});
      if (c.qkv_bias || c.bias) m.push_back({h + "self_attn." + p + "_proj.bias", {b + "attn.b" + p}});
    }
    m.push_back({h + "self_attn.o_proj.weight", {b + "attn.wo"}, true});
    m.push_back({h + "post_attention_layernorm.weight", {b + "ln2.scale"}});
    m.push_back({h + "mlp.gate_proj.weight", {b + "mlp.gate.w"}, true});
    m.push_back({h + "mlp.up_proj.weight", {b + "mlp.up.w"}, true});
    m.push_back({h + "mlp.down_proj.weight", {b + "mlp.down.w"}, true});
  }
  m.push_back({"model.norm.weight", {"final_norm.scale"}});
  if (!c.tied_embedding) m.push_back({"lm_head.weight", {"head.w"}, true});
  return m;
}

bool llama_family_ignored(const std::string& n) { return n.find("rotary_emb.inv_freq") != std::string::npos; }

namespace {
LmConfig from_json(const nlohmann::json& j, const std::string& path) {
  return llama_family_from_json(j, path, "llama");
}
nlohmann::json to_json(const LmConfig& c) { return llama_family_to_json(c, "LlamaForCausalLM", "llama"); }
}  // namespace

const ArchSpec& llama_arch() {
  static const ArchSpec a{"LlamaForCausalLM", "llama", from_json, to_json, llama_family_tensors, llama_family_ignored};
  return a;
}

}  // namespace px::nn::detail
