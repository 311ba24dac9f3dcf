// save_pretrained: our params written as a Hugging Face model directory (config.json,
// generation_config.json with the source's fields kept, the weights in f32, bf16 or f16, in one
// file or in shards with their index, and the tokenizer files of the source), and the special ids
// read back from one.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "nn/pretrained/arch.h"
#include "parallax/io.h"
#include "parallax/nn/pretrained.h"

namespace px::nn {

using detail::ArchSpec;
using detail::TensorMap;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::string shape_str(const Shape& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

json id_json(int32_t id) { return id >= 0 ? json(id) : json(nullptr); }

// One id as an integer, several as a list (both forms transformers reads), none as null.
json eos_json(const std::vector<int32_t>& eos) {
  if (eos.empty()) return nullptr;
  if (eos.size() == 1) return eos[0];
  return eos;
}

const char* torch_dtype_name(DType d) {
  switch (d) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    default:
      throw Error(std::string("[save_pretrained] dtype ") + dtype_name(d) +
                  " cannot hold weights; use f32, bf16 or f16");
  }
}

void write_json(const fs::path& path, const json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  if (!out) throw Error(path.string() + ": write failed");
}

// One id field ("bos_token_id": 5, [2, 7] or null) of a config file; -1 / empty when absent or null.
std::vector<int32_t> ids_of(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return {};
  std::vector<int32_t> out;
  auto one = [&](const json& v) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max())
      throw Error(path + ": '" + key + "' must be a token id (an integer >= 0) or a list of them, got " + it->dump() +
                  "; fix the file");
    out.push_back(static_cast<int32_t>(v.get<int64_t>()));
  };
  if (it->is_array())
    for (auto& v : *it) one(v);
  else
    one(*it);
  return out;
}

// Materializes HF tensor `m` from our params: the params side by side on the last axis, transposed
// when the layouts differ, converted to `dtype`.
Array hf_tensor(const TensorMap& m, const ParamStore& store, const std::vector<Array>& params, DType dtype) {
  std::vector<const ParamSpec*> specs;
  std::vector<const Array*> ins;
  for (auto& p : m.ours) {
    const int i = store.index_of(p);
    specs.push_back(&store.spec(i));
    ins.push_back(&params[i]);
  }
  const Shape hf = detail::hf_tensor_shape(m, specs);
  Array t(DType::f32, hf);
  float* dst = t.data<float>();
  const int64_t hf_cols = hf.size() == 2 ? hf[1] : hf[0];
  int64_t c0 = 0;
  for (const Array* a : ins) {
    std::vector<float> v = a->to_f32();
    const int64_t ck = a->shape().back(), rows = static_cast<int64_t>(v.size()) / ck;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < ck; ++c) {
        const float x = v[r * ck + c];
        if (m.transpose)
          dst[(c0 + c) * hf_cols + r] = x;
        else
          dst[r * hf_cols + c0 + c] = x;
      }
    c0 += ck;
  }
  return dtype == DType::f32 ? t : t.astype(dtype);
}

// Weights files a previous save left in `dir` in the other form: the shards its index lists and the
// index, or model.safetensors.
void remove_stale_weights(const fs::path& dir, bool sharded) {
  std::error_code ec;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    std::ifstream in(index);
    json idx = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object())
      for (auto& [name, f] : idx["weight_map"].items())
        if (f.is_string() && fs::path(f.get<std::string>()).filename() == fs::path(f.get<std::string>()))
          fs::remove(dir / f.get<std::string>(), ec);
    fs::remove(index, ec);
  }
  if (sharded) fs::remove(dir / "model.safetensors", ec);
}

const char* const kTokenizerFiles[] = {
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model",    "special_tokens_map.json", "vocab.json",
    "merges.txt",     "added_tokens.json",     "chat_template.jinja"};

bool has_tokenizer_files(const std::string& dir) {
  std::error_code ec;
  for (const char* f : kTokenizerFiles)
    if (fs::is_regular_file(fs::path(dir) / f, ec)) return true;
  return false;
}

// generation_config.json of `from` (an object; its fields are kept), or an empty object.
json source_generation_config(const std::string& from) {
  if (from.empty()) return json::object();
  const fs::path path = fs::path(from) / "generation_config.json";
  std::ifstream in(path);
  if (!in)
    throw Error("[save_pretrained] generation_config_from '" + from +
                "' has no readable generation_config.json; give the model directory it came from, or leave it empty");
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object())
    throw Error("[save_pretrained] " + path.string() +
                " is not a JSON object; restore the file or leave generation_config_from empty");
  return j;
}

void copy_tokenizer(const std::string& from, const fs::path& dir) {
  std::error_code ec;
  if (fs::equivalent(from, dir, ec)) return;
  for (const char* f : kTokenizerFiles) {
    const fs::path src = fs::path(from) / f;
    if (!fs::is_regular_file(src, ec)) continue;
    fs::copy_file(src, dir / f, fs::copy_options::overwrite_existing, ec);
    if (ec)
      throw Error((dir / f).string() + ": cannot copy the tokenizer file from " + src.string() + ": " + ec.message());
  }
}

}  // namespace

SpecialTokenIds read_special_token_ids(const std::string& dir) {
  SpecialTokenIds s;
  for (const char* file : {"config.json", "generation_config.json"}) {  // the second wins, as in transformers
    const fs::path path = fs::path(dir) / file;
    std::ifstream in(path);
    if (!in) continue;
    json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) throw Error(path.string() + ": not a JSON object; restore the file");
    const std::string p = path.string();
    if (j.contains("bos_token_id")) {
      std::vector<int32_t> b = ids_of(j, "bos_token_id", p);
      s.bos = b.empty() ? -1 : b[0];
    }
    if (j.contains("eos_token_id")) s.eos = ids_of(j, "eos_token_id", p);
    if (j.contains("pad_token_id")) {
      std::vector<int32_t> b = ids_of(j, "pad_token_id", p);
      s.pad = b.empty() ? -1 : b[0];
    }
  }
  return s;
}

SavePretrainedOptions save_options_of(const Pretrained& p) {
  SavePretrainedOptions o;
  o.architecture = p.architecture;
  o.special = p.special;
  o.dtype = p.dtype;
  std::error_code ec;
  if (!p.dir.empty() && fs::is_regular_file(fs::path(p.dir) / "generation_config.json", ec))
    o.generation_config_from = p.dir;
  if (!p.dir.empty() && has_tokenizer_files(p.dir)) o.tokenizer_from = p.dir;
  return o;
}

void save_pretrained(const TransformerLm& model, const std::vector<Array>& params, const std::string& dir,
                     const std::string& architecture) {
  SavePretrainedOptions o;
  o.architecture = architecture;
  save_pretrained(model, params, dir, o);
}

void save_pretrained(const TransformerLm& model, const std::vector<Array>& params, const std::string& dir,
                     const SavePretrainedOptions& opt) {
  const LmConfig& cfg = model.config();
  std::string name = opt.architecture;
  if (name.empty())
    name = cfg.positions == PositionKind::learned ? "GPT2LMHeadModel"
           : cfg.qkv_bias                         ? "Qwen2ForCausalLM"
           : cfg.sliding_window > 0               ? "MistralForCausalLM"
                                                  : "LlamaForCausalLM";
  const ArchSpec& arch = detail::arch_by_name(name, "[save_pretrained]");
  const ParamStore& store = model.store();
  if (static_cast<int>(params.size()) != store.size())
    throw Error("[save_pretrained] " + std::to_string(params.size()) + " params given, the model has " +
                std::to_string(store.size()) + "; pass the arrays of model.store() in order");
  for (int i = 0; i < store.size(); ++i)
    if (params[i].shape() != store.spec(i).type.shape)
      throw Error("[save_pretrained] param '" + store.spec(i).path + "' has shape " + shape_str(params[i].shape()) +
                  ", the model declares " + shape_str(store.spec(i).type.shape));
  const char* dtype_str = torch_dtype_name(opt.dtype);
  if (opt.max_shard_bytes < 0)
    throw Error("[save_pretrained] max_shard_bytes must be >= 0 (0: one file), got " +
                std::to_string(opt.max_shard_bytes));
  // Ids beyond the vocabulary are written as given: transformers saves them too (GPT-2's 50256 in
  // a small vocabulary), load_pretrained reads them, and they are never generated.
  auto check_id = [&](int32_t id, const char* what, bool none_ok = true) {
    if (id < (none_ok ? -1 : 0))
      throw Error("[save_pretrained] " + std::string(what) + " " + std::to_string(id) +
                  std::string(" is not a token id; give the id of the tokenizer's token (>= 0)") +
                  (none_ok ? ", or -1 for none" : ""));
  };
  check_id(opt.special.bos, "bos id");
  check_id(opt.special.pad, "pad id");
  for (int32_t e : opt.special.eos) check_id(e, "eos id", false);
  if (!opt.tokenizer_from.empty()) {
    if (!fs::is_directory(opt.tokenizer_from))
      throw Error("[save_pretrained] tokenizer_from '" + opt.tokenizer_from +
                  "' is not a directory; give the model directory whose tokenizer files to copy, or leave it empty");
    if (!has_tokenizer_files(opt.tokenizer_from))
      throw Error("[save_pretrained] tokenizer_from '" + opt.tokenizer_from +
                  "' holds no tokenizer file (tokenizer.json, tokenizer.model, vocab.json, ...); give the directory "
                  "the tokenizer came from, or leave tokenizer_from empty");
  }

  json generation = source_generation_config(opt.generation_config_from);  // read before anything is written

  // The config must round-trip: the mapping decides which params exist, so check it covers all.
  json j = arch.to_json(cfg);
  LmConfig bs = arch.from_json(j, name);
  if (bs.positions != cfg.positions || bs.norm != cfg.norm || bs.mlp != cfg.mlp || bs.bias != cfg.bias ||
      bs.qkv_bias != cfg.qkv_bias || bs.sliding_window != cfg.sliding_window)
    throw Error("[save_pretrained] the model '" + cfg.name + "' does not have the " + name +
                " layout (norm, MLP, positions, biases or window differ); pick the architecture that matches it");
  const std::vector<TensorMap> maps = arch.tensors(cfg);
  std::vector<bool> covered(store.size(), false);
  std::vector<int64_t> bytes;  // per map, in the chosen dtype
  for (const TensorMap& m : maps) {
    std::vector<const ParamSpec*> specs;
    for (auto& p : m.ours) {
      const int i = store.index_of(p);
      specs.push_back(&store.spec(i));
      covered[i] = true;
    }
    bytes.push_back(TensorType{opt.dtype, detail::hf_tensor_shape(m, specs)}.nbytes());
  }
  for (int i = 0; i < store.size(); ++i)
    if (!covered[i])
      throw Error("[save_pretrained] param '" + store.spec(i).path + "' has no place in the " + name + " layout");

  // Shards: consecutive tensors while they fit max_shard_bytes (one file when 0).
  std::vector<std::vector<size_t>> shards(1);
  int64_t in_shard = 0, total = 0;
  for (size_t k = 0; k < maps.size(); ++k) {
    if (opt.max_shard_bytes > 0 && !shards.back().empty() && in_shard + bytes[k] > opt.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(k);
    in_shard += bytes[k];
    total += bytes[k];
  }
  const bool sharded = opt.max_shard_bytes > 0;

  const fs::path out(dir);
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw Error(dir + ": cannot create the directory: " + ec.message());
  remove_stale_weights(out, sharded);
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    char file[64];
    std::snprintf(file, sizeof file, "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
    const std::string fname = sharded ? file : "model.safetensors";
    std::vector<std::string> names;
    std::vector<Array> arrays;  // one shard in memory at a time
    for (size_t k : shards[s]) {
      names.push_back(maps[k].hf);
      arrays.push_back(hf_tensor(maps[k], store, params, opt.dtype));
      weight_map[maps[k].hf] = fname;
    }
    save_safetensors((out / fname).string(), names, arrays, {{"format", "pt"}});
  }
  if (sharded)
    write_json(out / "model.safetensors.index.json",
               {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}});

  // Ids not given are null: transformers would otherwise use its class defaults (Llama: bos 1,
  // eos 2; GPT-2: 50256), which need not be tokens of this vocabulary.
  j["bos_token_id"] = id_json(opt.special.bos);
  j["eos_token_id"] = eos_json(opt.special.eos);
  j["pad_token_id"] = id_json(opt.special.pad);
  j["torch_dtype"] = dtype_str;  // transformers < 4.56
  j["dtype"] = dtype_str;        // later versions
  write_json(out / "config.json", j);
  generation["bos_token_id"] = id_json(opt.special.bos);
  generation["eos_token_id"] = eos_json(opt.special.eos);
  generation["pad_token_id"] = id_json(opt.special.pad);
  write_json(out / "generation_config.json", generation);
  if (!opt.tokenizer_from.empty()) copy_tokenizer(opt.tokenizer_from, out);
}

}  // namespace px::nn
