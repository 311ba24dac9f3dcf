// load_pretrained: the architecture-independent part (save_pretrained is in save.cc). Finds the files, maps them,
// and moves each tensor through its architecture's TensorMap.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "io/regular_file.h"
#include "nn/pretrained/arch.h"
#include "nn/pretrained/mapped_safetensors.h"
#include "parallax/io.h"
#include "parallax/nn/pretrained.h"

namespace px::nn {

using detail::ArchSpec;
using detail::TensorMap;
namespace fs = std::filesystem;

namespace {

const std::vector<const ArchSpec*>& archs() {
  static const std::vector<const ArchSpec*> a{&detail::gpt2_arch(), &detail::llama_arch(), &detail::mistral_arch(),
                                              &detail::qwen2_arch()};
  return a;
}

std::string supported_list() {
  std::string s;
  for (auto* a : archs()) s += (s.empty() ? "" : ", ") + a->name;
  return s;
}

const ArchSpec& arch_named(const std::string& name, const std::string& where) {
  for (auto* a : archs())
    if (a->name == name) return *a;
  throw Error(where + ": architecture '" + name + "' is not supported; supported: " + supported_list());
}

std::string shape_text(const Shape& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

nlohmann::json read_json(const std::string& path, const std::string& missing_fix) {
  io::require_regular_file(path, "[pretrained] ");
  std::ifstream in(path);
  if (!in) throw Error(path + ": not found; " + missing_fix);
  try {
    return nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + "); restore the file");
  }
}

const ArchSpec& arch_of(const nlohmann::json& j, const std::string& path) {
  auto it = j.find("architectures");
  if (it == j.end() || !it->is_array() || it->empty() || !(*it)[0].is_string())
    throw Error(path + ": no \"architectures\" list; add e.g. \"architectures\": [\"LlamaForCausalLM\"] (supported: " +
                supported_list() + ")");
  const ArchSpec& a = arch_named((*it)[0].get<std::string>(), path);
  // transformers builds the model from model_type: one that names another family would load
  // these weights as another architecture there.
  if (auto mt = j.find("model_type"); mt != j.end() && !mt->is_null()) {
    if (!mt->is_string() || mt->get<std::string>() != a.model_type)
      throw UserError(path + ": model_type " + mt->dump() + " contradicts architectures[0] '" + a.name +
                      "' (model_type \"" + a.model_type + "\"); fix config.json so that the two agree");
  }
  return a;
}

// The logical (ours) shape of an HF tensor's view and its expected HF shape.
Shape hf_shape_of(const TensorMap& m, const std::vector<const ParamSpec*>& specs) {
  Shape logical = specs[0]->type.shape;
  int64_t cols = 0;
  for (auto* s : specs) cols += s->type.shape.back();
  logical.back() = cols;
  if (m.transpose && logical.size() == 2) std::swap(logical[0], logical[1]);
  return logical;
}

// Copies a box of one param out of t into `out`. The param is the columns [c0, c0 + its width) of
// t's logical view (t transposed when `transpose`; params that share one tensor split its last
// axis); the box starts at `off` within the param and has out's shape. Rd converts one element;
// as a template argument it inlines into the loops.
template <float (*Rd)(const std::byte*, int64_t)>
void fill_box(const detail::MappedTensor& t, bool transpose, int64_t c0, const std::vector<int64_t>& off, Array& out) {
  const int64_t hf_cols = t.shape.size() == 2 ? t.shape[1] : t.shape[0];
  const bool two_d = out.shape().size() == 2;
  const int64_t rows = two_d ? out.shape()[0] : 1, cols = out.shape().back();
  const int64_t r0 = two_d ? off[0] : 0, cc = c0 + off.back();
  float* dst = out.data<float>();
  if (!transpose) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = Rd(t.data, (r0 + r) * hf_cols + cc + c);
  } else {
    // dst[r, c] = T[cc + c, r0 + r]; in tiles so both sides stay in cache.
    constexpr int64_t kB = 64;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t cb = 0; cb < cols; cb += kB)
      for (int64_t rb = 0; rb < rows; rb += kB)
        for (int64_t c = cb; c < std::min(cols, cb + kB); ++c)
          for (int64_t r = rb; r < std::min(rows, rb + kB); ++r)
            dst[r * cols + c] = Rd(t.data, (cc + c) * hf_cols + r0 + r);
  }
}

void fill_from(const detail::MappedTensor& t, const std::string& file, const std::string& name, bool transpose,
               int64_t c0, const std::vector<int64_t>& off, Array& out) {
  if (out.dtype() != DType::f32 || out.shape().size() != off.size())
    throw Error("[load_pretrained] a box of '" + name + "' must be read into an f32 array of the param's rank");
  detail::ElementReader rd = detail::element_reader(t, file, name);
  if (rd == detail::read_f32) return fill_box<detail::read_f32>(t, transpose, c0, off, out);
  if (rd == detail::read_bf16) return fill_box<detail::read_bf16>(t, transpose, c0, off, out);
  if (rd == detail::read_f64) return fill_box<detail::read_f64>(t, transpose, c0, off, out);
  return fill_box<detail::read_f16>(t, transpose, c0, off, out);
}

// bf16 or f16 when every tensor the model reads is stored so, else f32.
template <class Where>
DType stored_dtype(const Where& where, const std::vector<std::string>& names) {
  std::set<std::string> kinds;
  for (const std::string& n : names) kinds.insert(where.at(n).first->dtype);
  if (kinds.size() != 1) return DType::f32;
  return *kinds.begin() == "BF16" ? DType::bf16 : *kinds.begin() == "F16" ? DType::f16 : DType::f32;
}

}  // namespace

std::vector<std::string> pretrained_architectures() {
  std::vector<std::string> v;
  for (auto* a : archs()) v.push_back(a->name);
  return v;
}

LmConfig read_pretrained_config(const std::string& dir, std::string* architecture) {
  const std::string path = (fs::path(dir) / "config.json").string();
  nlohmann::json j = read_json(path, "a Hugging Face model directory holds config.json next to its weights");
  if (!j.is_object()) throw Error(path + ": expected a JSON object; restore the file");
  const ArchSpec& a = arch_of(j, path);
  LmConfig c = a.from_json(j, path);
  try {
    c.validate();
  } catch (const Error& e) {
    throw Error(path + ": " + e.what() + "; fix config.json");
  }
  if (architecture) *architecture = a.name;
  return c;
}

namespace {

// The loader behind both load_pretrained forms. Every check (files, names, shapes, unexpected
// tensors) runs before any data is read; then each param goes to `sink` as soon as it is filled
// when one is given, else into out.params.
// Reads the model in `dir`: whole params into Pretrained::params, or each to `sink` as it is read,
// or, with `slices`, a reader of each param's boxes (nothing read until it is called).
Pretrained load(const std::string& dir, const std::function<void(int, Array)>* sink,
                const std::function<void(int, const BoxReader&)>* slices = nullptr) {
  Pretrained out;
  LmConfig cfg = read_pretrained_config(dir, &out.architecture);
  const ArchSpec& arch = arch_named(out.architecture, dir);

  // The files: one model.safetensors, or the shards an index lists.
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  std::vector<std::string> files;
  std::map<std::string, std::string> listed;  // tensor -> file, from the index
  if (fs::exists(index_path)) {
    nlohmann::json idx = read_json(index_path.string(), "");
    auto wm = idx.find("weight_map");
    if (wm == idx.end() || !wm->is_object())
      throw Error(index_path.string() + ": no \"weight_map\" object; restore the index file");
    std::set<std::string> seen;
    for (auto& [name, f] : wm->items()) {
      if (!f.is_string()) throw Error(index_path.string() + ": weight_map['" + name + "'] must be a file name");
      // Shards live in the model directory: an absolute path or a ".." would read elsewhere.
      const fs::path rel(f.get<std::string>());
      bool escapes = rel.empty() || rel.is_absolute();
      for (const fs::path& part : rel) escapes = escapes || part == "..";
      if (escapes)
        throw UserError(index_path.string() + ": weight_map['" + name + "'] is '" + f.get<std::string>() +
                        "', which is not a file inside " + dir +
                        "; shards are named relative to the model "
                        "directory (e.g. model-00001-of-00002.safetensors): fix the index");
      listed[name] = f.get<std::string>();
      if (seen.insert(f.get<std::string>()).second) files.push_back(f.get<std::string>());
    }
    for (auto& f : files)
      if (!fs::exists(fs::path(dir) / f))
        throw Error((fs::path(dir) / f).string() + ": missing shard (listed in " + index_path.string() +
                    "); copy or download the missing file into " + dir);
  } else if (fs::exists(single_path)) {
    files.push_back("model.safetensors");
  } else {
    throw Error(dir +
                ": no model.safetensors or model.safetensors.index.json; save the model with "
                "safe_serialization=True (pytorch_model.bin is not read)");
  }
  std::vector<std::unique_ptr<detail::MappedSafetensors>> mapped;
  std::map<std::string, std::pair<const detail::MappedTensor*, const detail::MappedSafetensors*>> where;
  for (auto& f : files) {
    mapped.push_back(std::make_unique<detail::MappedSafetensors>((fs::path(dir) / f).string()));
    for (auto& [name, t] : mapped.back()->tensors()) where[name] = {&t, mapped.back().get()};
  }
  for (auto& [name, f] : listed)
    if (!where.count(name))
      throw Error((fs::path(dir) / f).string() + ": tensor '" + name + "' is listed for this shard in " +
                  index_path.string() + " but absent; the shard and the index do not match: copy them again");

  out.model = std::make_unique<TransformerLm>(cfg);
  ParamStore& store = out.model->store();
  out.params.resize(store.size());
  std::vector<bool> filled(store.size(), false);
  std::set<std::string> used;
  const std::string cfg_path = (fs::path(dir) / "config.json").string();
  const std::vector<TensorMap> maps = arch.tensors(cfg);
  std::vector<std::string> names;  // per map: the tensor's name in the files
  for (const TensorMap& m : maps) {
    std::string name = m.hf;
    // Some GPT-2 checkpoints were saved from the bare model, without the "transformer." prefix.
    if (!where.count(name) && name.rfind("transformer.", 0) == 0 && where.count(name.substr(12)))
      name = name.substr(12);
    auto it = where.find(name);
    if (it == where.end()) {
      std::string fl;
      for (auto& f : files) fl += (fl.empty() ? "" : ", ") + f;
      throw Error(dir + ": tensor '" + m.hf + "' is missing from " + fl + " but " + cfg_path + " (" + arch.name + ", " +
                  std::to_string(cfg.n_layers) +
                  " layers) needs it; the config and the weights do not match: use the config.json saved with "
                  "these weights");
    }
    const auto& [t, file] = it->second;
    used.insert(name);
    std::vector<const ParamSpec*> specs;
    for (auto& p : m.ours) {
      int i = store.index_of(p);
      specs.push_back(&store.spec(i));
      filled[i] = true;
    }
    Shape want = hf_shape_of(m, specs);
    if (t->shape != want)
      throw Error(file->path() + ": tensor '" + name + "' has shape " + shape_text(t->shape) + " but " + cfg_path +
                  " implies " + shape_text(want) + " (d_model " + std::to_string(cfg.d_model) + ", vocab " +
                  std::to_string(cfg.vocab_size) + ", ff " + std::to_string(cfg.d_ff) + ", heads " +
                  std::to_string(cfg.n_heads) + "/" + std::to_string(cfg.kv_heads()) +
                  "); the config and the weights do not match: use the config.json saved with these weights");
    names.push_back(name);
  }
  for (auto& [name, tf] : where) {
    if (used.count(name) || arch.ignored(name)) continue;
    if (cfg.tied_embedding && name == "lm_head.weight") continue;  // a tied copy of the embedding
    throw Error(tf.second->path() + ": unexpected tensor '" + name + "' that " + arch.name + " with " + cfg_path +
                " does not use; the config and the weights do not match (e.g. more layers, or an untied head): use "
                "the config.json saved with these weights");
  }
  for (int i = 0; i < store.size(); ++i)
    if (!filled[i]) throw Error("[load_pretrained] internal: param '" + store.spec(i).path + "' has no mapping");
  out.dtype = stored_dtype(where, names);

  for (size_t k = 0; k < maps.size(); ++k) {
    const auto& [t, file] = where.at(names[k]);
    int64_t c0 = 0;  // the param's first column in the tensor's logical view
    for (auto& p : maps[k].ours) {
      const int i = store.index_of(p);
      const Shape& shape = store.spec(i).type.shape;
      auto read = [&, c0](const std::vector<int64_t>& off, Array& a) {
        fill_from(*t, file->path(), names[k], maps[k].transpose, c0, off, a);
      };
      c0 += shape.back();
      if (slices) {
        (*slices)(i, read);
        continue;
      }
      Array a(DType::f32, shape);
      read(std::vector<int64_t>(shape.size(), 0), a);
      if (sink)
        (*sink)(i, std::move(a));
      else
        out.params[i] = std::move(a);
    }
  }
  if (sink || slices) out.params.clear();
  out.special = read_special_token_ids(dir);
  out.dir = dir;
  return out;
}

}  // namespace

Pretrained load_pretrained(const std::string& dir) { return load(dir, nullptr); }

Pretrained load_pretrained(const std::string& dir, const std::function<void(int, Array)>& sink) {
  return load(dir, &sink);
}

Pretrained load_pretrained_slices(const std::string& dir, const std::function<void(int, const BoxReader&)>& sink) {
  return load(dir, nullptr, &sink);
}

namespace detail {
const ArchSpec& arch_by_name(const std::string& name, const std::string& where) { return arch_named(name, where); }
Shape hf_tensor_shape(const TensorMap& m, const std::vector<const ParamSpec*>& specs) { return hf_shape_of(m, specs); }
}  // namespace detail

}  // namespace px::nn
