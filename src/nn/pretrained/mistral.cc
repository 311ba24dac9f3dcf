// MistralForCausalLM: Llama's names and layouts plus a sliding attention window.
#include "nn/pretrained/arch.h"

namespace px::nn::detail {

namespace {
LmConfig from_json(const nlohmann::json& j, const std::string& path) {
  LmConfig c = llama_family_from_json(j, path, "mistral");
  c.sliding_window = get_or<int64_t>(j, "sliding_window", 0, path);
  return c;
}

nlohmann::json to_json(const LmConfig& c) {
  nlohmann::json j = llama_family_to_json(c, "MistralForCausalLM", "mistral");
  j["sliding_window"] = c.sliding_window > 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  return j;
}
}  // namespace

const ArchSpec& mistral_arch() {
  static const ArchSpec a{"MistralForCausalLM", "mistral",           from_json, to_json,
                          llama_family_tensors, llama_family_ignored};
  return a;
}

}  // namespace px::nn::detail
