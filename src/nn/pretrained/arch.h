// One Hugging Face architecture: how its config.json maps to an LmConfig and back, and how each of
// its tensors maps to our params. Each supported architecture defines one ArchSpec in its own file.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallax/nn/transformer.h"

namespace px::nn::detail {

// One checkpoint tensor. Its logical view is the HF tensor, transposed when `transpose` (HF's
// Linear stores [out, in], we store [in, out]); the view's last axis is the concatenation of the
// last axes of `ours` (GPT-2's fused c_attn holds q, k and v).
struct TensorMap {
  std::string hf;
  std::vector<std::string> ours;
  bool transpose = false;
};

struct ArchSpec {
  std::string name;        // "LlamaForCausalLM"
  std::string model_type;  // "llama"
  // config.json -> our config; throws px::Error naming config_path and the field for values we
  // cannot represent.
  LmConfig (*from_json)(const nlohmann::json& cfg, const std::string& config_path);
  nlohmann::json (*to_json)(const LmConfig& cfg);
  std::vector<TensorMap> (*tensors)(const LmConfig& cfg);
  // Checkpoint tensors that are buffers, not weights (ignored when loading).
  bool (*ignored)(const std::string& hf_name);
};

const ArchSpec& gpt2_arch();
const ArchSpec& llama_arch();
const ArchSpec& mistral_arch();
const ArchSpec& qwen2_arch();

// The spec named `name` (config.json's architectures[0]); throws px::Error naming `where` and
// listing the supported ones.
const ArchSpec& arch_by_name(const std::string& name, const std::string& where);
// The HF shape of tensor m whose params (in m.ours order) are `specs`.
Shape hf_tensor_shape(const TensorMap& m, const std::vector<const ParamSpec*>& specs);

// ---- helpers shared by the mapping files ---------------------------------------------------------
// Reads cfg[key] as T, or `fallback` when absent or null; throws px::Error naming the file and key
// when the value has the wrong type.
template <class T>
T get_or(const nlohmann::json& cfg, const char* key, T fallback, const std::string& config_path) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw Error(config_path + ": field '" + key + "' has the wrong type (" + it->dump() + ")");
  }
}
// cfg[key], which must be present.
int64_t require_int(const nlohmann::json& cfg, const char* key, const std::string& config_path);
[[noreturn]] void unsupported(const std::string& config_path, const std::string& what);

// The Llama family (Llama, Mistral, Qwen2) shares names and layouts.
LmConfig llama_family_from_json(const nlohmann::json& cfg, const std::string& config_path, const std::string& arch);
nlohmann::json llama_family_to_json(const LmConfig& c, const std::string& arch, const std::string& model_type);
std::vector<TensorMap> llama_family_tensors(const LmConfig& c);
bool llama_family_ignored(const std::string& hf_name);

}  // namespace px::nn::detail
