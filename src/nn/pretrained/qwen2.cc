// Qwen2ForCausalLM: Llama's names and layouts with biases on q, k and v (not on o).
#include "nn/pretrained/arch.h"

namespace px::nn::detail {

namespace {
LmConfig from_json(const nlohmann::json& j, const std::string& path) {
  LmConfig c = llama_family_from_json(j, path, "qwen2");
  c.qkv_bias = true;
  // Qwen2 applies its window only to layers from max_window_layers on: a per-layer option we lack.
  if (get_or<bool>(j, "use_sliding_window", false, path)) unsupported(path, "use_sliding_window = true");
  return c;
}

nlohmann::json to_json(const LmConfig& c) {
  nlohmann::json j = llama_family_to_json(c, "Qwen2ForCausalLM", "qwen2");
  j["use_sliding_window"] = false;
  return j;
}
}  // namespace

const ArchSpec& qwen2_arch() {
  static const ArchSpec a{"Qwen2ForCausalLM", "qwen2", from_json, to_json, llama_family_tensors, llama_family_ignored};
  return a;
}

}  // namespace px::nn::detail
