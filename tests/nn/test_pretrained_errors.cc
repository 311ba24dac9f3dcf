// Bad Hugging Face model directories: each error names the file at fault and the fix. The
// checkpoints are written here with save_pretrained (no Python needed).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>

#include "parallax/io.h"
#include "parallax/nn/pretrained.h"
#include "pretrained_util.h"

namespace px::nn {
namespace {

using testing::error_of;
using testing::TempDir;
namespace fs = std::filesystem;

LmConfig small_llama() {
  LmConfig c = llama_config("llama", 64, 32, 4, 2, 2, 48, 32);
  c.norm_eps = 1e-5;
  return c;
}

void save_small(const std::string& dir, const LmConfig& c = small_llama()) {
  TransformerLm m(c);
  save_pretrained(m, m.init(1), dir);
}

nlohmann::json read_config(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  return nlohmann::json::parse(in);
}
void write_config(const std::string& dir, const nlohmann::json& j) { std::ofstream(dir + "/config.json") << j.dump(); }

bool has(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

TEST(PretrainedErrors, RoundTripsWhatItSaves) {
  TempDir d("pretrained_roundtrip");
  LmConfig c = small_llama();
  c.rope_theta = 500000;
  c.rope_scaling = {RopeScaling::Kind::llama3, 8.0, 1.0, 4.0, 16};
  TransformerLm m(c);
  std::vector<Array> params = m.init(3);
  save_pretrained(m, params, d.str());
  Pretrained p = load_pretrained(d.str());
  EXPECT_EQ(p.architecture, "LlamaForCausalLM");
  EXPECT_EQ(p.model->config().rope_theta, 500000);
  EXPECT_EQ(p.model->config().rope_scaling.kind, RopeScaling::Kind::llama3);
  EXPECT_EQ(p.model->config().kv_heads(), 2);
  ASSERT_EQ(p.params.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(p.params[i].to_f32(), params[i].to_f32()) << i;
}

TEST(PretrainedErrors, ReadsHalfPrecisionCheckpoints) {
  TempDir d("pretrained_half");
  save_small(d.str());
  SafetensorsFile f32 = load_safetensors(d / "model.safetensors");
  for (DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    std::vector<Array> converted;
    for (auto& a : f32.arrays) converted.push_back(a.astype(half));
    save_safetensors(d / "model.safetensors", f32.names, converted);
    Pretrained p = load_pretrained(d.str());
    // Each param holds exactly the half-precision values, widened.
    for (auto& path : {"embed.table", "blocks.1.attn.wk", "final_norm.scale"}) {
      int i = p.model->store().index_of(path);
      SafetensorsFile again = load_safetensors(d / "model.safetensors");
      std::string hf = std::string(path) == "embed.table"        ? "model.embed_tokens.weight"
                       : std::string(path) == "final_norm.scale" ? "model.norm.weight"
                                                                 : "model.layers.1.self_attn.k_proj.weight";
      std::vector<float> want = again.get(hf).to_f32(), got = p.params[i].to_f32();
      if (std::string(path) == "blocks.1.attn.wk") {  // stored [out, in], ours [in, out]
        const int64_t out = again.get(hf).shape()[0], in = again.get(hf).shape()[1];
        std::vector<float> t(want.size());
        for (int64_t r = 0; r < out; ++r)
          for (int64_t c = 0; c < in; ++c) t[c * out + r] = want[r * in + c];
        want = t;
      }
      EXPECT_EQ(got, want) << path;
    }
  }
}

TEST(PretrainedErrors, UnsupportedArchitectureNamesTheSupportedOnes) {
  TempDir d("pretrained_arch");
  save_small(d.str());
  nlohmann::json j = read_config(d.str());
  j["architectures"] = {"BertForMaskedLM"};
  write_config(d.str(), j);
  std::string e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, d / "config.json")) << e;
  EXPECT_TRUE(has(e, "'BertForMaskedLM' is not supported")) << e;
  for (auto& a : pretrained_architectures()) EXPECT_TRUE(has(e, a)) << e;
}

TEST(PretrainedErrors, MissingConfigOrWeights) {
  TempDir d("pretrained_missing");
  std::string e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, d / "config.json") && has(e, "not found")) << e;
  save_small(d.str());
  fs::remove(d / "model.safetensors");
  e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, "no model.safetensors or model.safetensors.index.json")) << e;
}

TEST(PretrainedErrors, MissingShardFile) {
  TempDir d("pretrained_shard");
  save_small(d.str());
  // Split the file into two shards with an index, then lose the second.
  SafetensorsFile f = load_safetensors(d / "model.safetensors");
  const size_t half = f.names.size() / 2;
  nlohmann::json wm;
  for (size_t i = 0; i < f.names.size(); ++i)
    wm[f.names[i]] = i < half ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors";
  save_safetensors(d / "model-00001-of-00002.safetensors", {f.names.begin(), f.names.begin() + half},
                   {f.arrays.begin(), f.arrays.begin() + half});
  save_safetensors(d / "model-00002-of-00002.safetensors", {f.names.begin() + half, f.names.end()},
                   {f.arrays.begin() + half, f.arrays.end()});
  fs::remove(d / "model.safetensors");
  std::ofstream(d / "model.safetensors.index.json") << nlohmann::json{{"metadata", {}}, {"weight_map", wm}}.dump();
  EXPECT_NO_THROW(load_pretrained(d.str()));
  fs::remove(d / "model-00002-of-00002.safetensors");
  std::string e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, d / "model-00002-of-00002.safetensors")) << e;
  EXPECT_TRUE(has(e, "missing shard") && has(e, "copy or download")) << e;
}

TEST(PretrainedErrors, ConfigAndWeightsMismatch) {
  TempDir d("pretrained_mismatch");
  save_small(d.str());
  nlohmann::json j = read_config(d.str());
  // A wider model than the weights: a shape mismatch naming the tensor and file.
  nlohmann::json wide = j;
  wide["intermediate_size"] = 64;
  write_config(d.str(), wide);
  std::string e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, d / "model.safetensors") && has(e, "mlp.gate_proj.weight") && has(e, "[48, 32]") &&
              has(e, "implies [64, 32]") && has(e, "do not match"))
      << e;
  // More layers than the weights: the missing tensor.
  nlohmann::json deep = j;
  deep["num_hidden_layers"] = 3;
  write_config(d.str(), deep);
  e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, "model.layers.2.") && has(e, "is missing") && has(e, "config.json")) << e;
  // Fewer layers: tensors nothing uses.
  nlohmann::json shallow = j;
  shallow["num_hidden_layers"] = 1;
  write_config(d.str(), shallow);
  e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, "unexpected tensor 'model.layers.1.") && has(e, d / "model.safetensors")) << e;
}

TEST(PretrainedErrors, TruncatedShard) {
  TempDir d("pretrained_truncated");
  save_small(d.str());
  const auto size = fs::file_size(d / "model.safetensors");
  fs::resize_file(d / "model.safetensors", size - 100);
  std::string e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, d / "model.safetensors") && has(e, "truncated") && has(e, "copy the file again")) << e;
  fs::resize_file(d / "model.safetensors", 5);
  e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, d / "model.safetensors") && has(e, "truncated")) << e;
}

// Rewrites the header of a safetensors file (the data stays; its offsets are relative to the header).
void edit_header(const fs::path& file, const std::function<void(nlohmann::ordered_json&)>& edit) {
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  nlohmann::ordered_json h = nlohmann::ordered_json::parse(bytes.substr(8, n));
  edit(h);
  const std::string text = h.dump();
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << len << text << bytes.substr(8 + n);
}

// The mapped reader checks headers as load_safetensors does (one reader): overlapping tensors,
// non-string metadata and dtypes the format does not define are refused up front.
TEST(PretrainedErrors, MalformedShardHeaders) {
  TempDir d("pretrained_bad_header");
  const fs::path file = d / "model.safetensors";
  save_small(d.str());
  edit_header(file, [](nlohmann::ordered_json& h) {
    h["model.layers.1.mlp.gate_proj.weight"]["data_offsets"] = h["model.layers.0.mlp.gate_proj.weight"]["data_offsets"];
  });
  std::string e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, file) && has(e, "overlap") && has(e, "copy the file again")) << e;

  save_small(d.str());
  edit_header(file, [](nlohmann::ordered_json& h) { h["__metadata__"]["format"] = 1; });
  e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, file) && has(e, "__metadata__ value of 'format' must be a string")) << e;

  save_small(d.str());
  edit_header(file, [](nlohmann::ordered_json& h) { h["model.norm.weight"]["dtype"] = "F5"; });
  e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, file) && has(e, "tensor 'model.norm.weight': unknown dtype 'F5'")) << e;

  save_small(d.str());
  edit_header(file, [](nlohmann::ordered_json& h) { h["model.norm.weight"]["shape"] = {-32}; });
  e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, file) && has(e, "shape entry must be a non-negative integer, got -32")) << e;
}

TEST(PretrainedErrors, UnsupportedOptionsNameTheField) {
  TempDir d("pretrained_options");
  save_small(d.str());
  nlohmann::json j = read_config(d.str());
  j["hidden_act"] = "gelu";
  write_config(d.str(), j);
  std::string e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, d / "config.json") && has(e, "hidden_act 'gelu'")) << e;
  j["hidden_act"] = "silu";
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}};
  write_config(d.str(), j);
  e = error_of([&] { load_pretrained(d.str()); });
  EXPECT_TRUE(has(e, "rope type 'yarn'")) << e;
}

// transformers builds the model from model_type: a config whose model_type names another family
// than its architectures was loaded as the architecture here and as the other there.
TEST(PretrainedErrors, ModelTypeMustAgreeWithTheArchitecture) {
  TempDir d("pretrained_model_type");
  save_small(d.str());
  nlohmann::json j = read_config(d.str());
  EXPECT_EQ(j["model_type"], "llama");
  for (const nlohmann::json& bad : {nlohmann::json("gpt2"), nlohmann::json("Llama"), nlohmann::json(7)}) {
    j["model_type"] = bad;
    write_config(d.str(), j);
    std::string e = error_of([&] { load_pretrained(d.str()); });
    EXPECT_TRUE(has(e, d / "config.json") && has(e, "model_type " + bad.dump() +
                                                        " contradicts architectures[0] "
                                                        "'LlamaForCausalLM' (model_type \"llama\")"))
        << e;
    EXPECT_THROW(read_pretrained_config(d.str()), UserError);
  }
  j.erase("model_type");  // absent (hand-written configs): the architecture decides
  write_config(d.str(), j);
  EXPECT_NO_THROW(load_pretrained(d.str()));
}

// Shards are files of the model directory: an index entry that leaves it is refused.
TEST(PretrainedErrors, IndexEntriesCannotLeaveTheModelDirectory) {
  TempDir d("pretrained_index_escape");
  save_small(d.str());
  SafetensorsFile f = load_safetensors(d / "model.safetensors");
  fs::rename(d / "model.safetensors", d / "model-00001-of-00001.safetensors");
  for (const std::string bad : {"../model-00001-of-00001.safetensors", "/etc/passwd", "sub/../../x.safetensors", ""}) {
    nlohmann::json wm;
    for (size_t i = 0; i < f.names.size(); ++i) wm[f.names[i]] = i == 0 ? bad : "model-00001-of-00001.safetensors";
    std::ofstream(d / "model.safetensors.index.json") << nlohmann::json{{"weight_map", wm}}.dump();
    std::string e = error_of([&] { load_pretrained(d.str()); });
    EXPECT_TRUE(has(e, "weight_map['" + f.names[0] + "'] is '" + bad + "', which is not a file inside " + d.str()))
        << e;
  }
}

// Sampling options out of range were clamped or ignored (top_p 5 meant no cut, temperature -1
// greedy decoding): each is an error naming the option and its range, before anything compiles.
TEST(PretrainedErrors, SamplingOptionsOutOfRange) {
  TransformerLm m(small_llama());
  const std::vector<Array> params;  // never reached: the options are checked first
  const std::vector<std::vector<int32_t>> prompt{{1, 2}};
  auto e = [&](GenerateOptions o) { return error_of([&] { generate(m, params, prompt, o); }); };
  EXPECT_EQ(e({.temperature = -0.5}),
            "[generate] temperature -0.500000 is out of range; use 0 for greedy decoding or a finite value > 0 to "
            "sample (1: the model's distribution)");
  EXPECT_TRUE(has(e({.temperature = std::nan("")}), "temperature nan is out of range"));
  EXPECT_TRUE(has(e({.temperature = INFINITY}), "temperature inf is out of range"));
  EXPECT_EQ(e({.top_p = 0.0}), "[generate] top_p 0.000000 is out of range; use a value in (0, 1] (1: no nucleus cut)");
  EXPECT_TRUE(has(e({.top_p = 1.5}), "top_p 1.500000 is out of range"));
  EXPECT_TRUE(has(e({.top_p = std::nan("")}), "top_p nan is out of range"));
  EXPECT_EQ(e({.top_k = -1}), "[generate] top_k -1 is out of range; use 0 (no cut) or k >= 1");
  EXPECT_TRUE(has(e({.max_new_tokens = -3}), "max_new_tokens -3 is negative"));
  EXPECT_TRUE(has(e({.max_len = -1}), "max_len -1 is negative"));
  EXPECT_THROW(generate(m, params, prompt, {.top_k = -1}), UserError);
}

}  // namespace
}  // namespace px::nn
