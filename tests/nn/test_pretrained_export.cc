// save_pretrained against transformers: special ids in config.json and generation_config.json (so
// generate() on an export stops at its EOS, with prompts of different lengths decoded here in one
// batch), bf16 shards with their index, tokenizer files copied, and the options refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "parallax/io.h"
#include "parallax/nn/pretrained.h"
#include "parallax/runtime.h"
#include "pretrained_util.h"

namespace px::nn {
namespace {

using testing::rel_close;
using testing::TempDir;

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

std::string csv(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids) s += (s.empty() ? "" : ",") + std::to_string(t);
  return s;
}

LmConfig small_llama() {
  LmConfig c = llama_config("llama", 96, 32, 4, 2, 2, 48, 64);
  c.init_std = 0.3;  // varied continuations
  return c;
}

TEST(PretrainedExport, TransformersGenerateStopsAtTheExportedEosAndReadsBf16Shards) {
  if (!testing::has_test_python()) GTEST_SKIP() << testing::no_test_python_reason();
  TempDir root("pretrained_export");
  TransformerLm m(small_llama());
  std::vector<Array> params = m.init(3);
  const std::vector<std::vector<int32_t>> prompts{{5, 17, 33, 2, 61, 8, 40, 12}, {70, 3, 9, 88, 1}};
  GenerateOptions opt;
  opt.max_new_tokens = 12;
  const std::vector<int32_t> free_run = generate(m, params, {prompts[0]}, opt)[0];
  const int32_t eos = free_run[3];  // the first row stops at its 4th token or before

  // A source directory with tokenizer files (their content is copied, not read).
  const std::string src = root / "src";
  std::filesystem::create_directories(src);
  std::ofstream(src + "/tokenizer.json") << R"({"version": "1.0", "model": {"type": "BPE"}})";
  std::ofstream(src + "/tokenizer_config.json") << R"({"eos_token": "</s>"})";

  SavePretrainedOptions so;
  so.special = {1, {eos, 95}, 0};
  so.tokenizer_from = src;
  const std::string f32_dir = root / "f32";
  save_pretrained(m, params, f32_dir, so);
  so.dtype = DType::bf16;
  so.max_shard_bytes = 6000;  // several shards
  const std::string bf16_dir = root / "bf16";
  save_pretrained(m, params, bf16_dir, so);

  // Our files: ids in config.json and generation_config.json, the tokenizer files, the index.
  for (const std::string& d : {f32_dir, bf16_dir}) {
    SCOPED_TRACE(d);
    nlohmann::json cfg = read_json(d + "/config.json"), gen = read_json(d + "/generation_config.json");
    EXPECT_EQ(cfg["bos_token_id"], 1);
    EXPECT_EQ(cfg["eos_token_id"], nlohmann::json({eos, 95}));
    EXPECT_EQ(cfg["pad_token_id"], 0);
    EXPECT_EQ(gen["eos_token_id"], cfg["eos_token_id"]);
    EXPECT_EQ(slurp(d + "/tokenizer.json"), slurp(src + "/tokenizer.json"));
    EXPECT_EQ(slurp(d + "/tokenizer_config.json"), slurp(src + "/tokenizer_config.json"));
  }
  EXPECT_EQ(read_json(bf16_dir + "/config.json")["torch_dtype"], "bfloat16");
  EXPECT_FALSE(std::filesystem::exists(bf16_dir + "/model.safetensors"));
  nlohmann::json index = read_json(bf16_dir + "/model.safetensors.index.json");
  std::set<std::string> shards;
  int64_t total = 0;
  for (auto& [name, file] : index["weight_map"].items()) {
    shards.insert(file.get<std::string>());
    SafetensorsFile f = load_safetensors(bf16_dir + "/" + file.get<std::string>());
    EXPECT_EQ(f.get(name).dtype(), DType::bf16) << name;
    total += f.get(name).nbytes();
  }
  EXPECT_GT(shards.size(), 2u);
  EXPECT_EQ(index["metadata"]["total_size"], total);

  // Read back here: the ids, and params equal to the originals rounded to bf16.
  Pretrained back = load_pretrained(bf16_dir);
  EXPECT_EQ(back.special.bos, 1);
  EXPECT_EQ(back.special.eos, (std::vector<int32_t>{eos, 95}));
  EXPECT_EQ(back.special.pad, 0);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(back.params[i].to_f32(), params[i].astype(DType::bf16).to_f32()) << m.store().spec(i).path;
  SavePretrainedOptions again = save_options_of(back);
  EXPECT_EQ(again.architecture, "LlamaForCausalLM");
  EXPECT_EQ(again.tokenizer_from, bf16_dir);
  // Saving again as one file removes the shards and their index.
  save_pretrained(*back.model, back.params, bf16_dir, again);
  EXPECT_TRUE(std::filesystem::exists(bf16_dir + "/model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(bf16_dir + "/model.safetensors.index.json"));
  for (const std::string& s : shards) EXPECT_FALSE(std::filesystem::exists(bf16_dir + "/" + s)) << s;
  save_pretrained(*back.model, back.params, bf16_dir, so);  // sharded bf16 again for transformers

  // transformers: generate() with no eos argument stops at the EOS of generation_config.json, and
  // our batch of two prompts of different lengths gives what it gives for each alone.
  std::string out;
  const std::string all = csv(prompts[0]) + ";" + csv(prompts[1]);
  ASSERT_EQ(testing::hf_python("check " + root / "check.json 12 " + f32_dir + " '" + all + "' " + bf16_dir + " '" +
                                   csv(prompts[0]) + "'",
                               &out),
            0)
      << out;
  nlohmann::json hf = read_json(root / "check.json");
  const nlohmann::json& f = hf[f32_dir];
  EXPECT_EQ(f["dtype"], "float32");
  EXPECT_EQ(f["bos"], 1);
  EXPECT_EQ(f["eos"], nlohmann::json({eos, 95}));
  EXPECT_EQ(f["pad"], 0);
  Pretrained p = load_pretrained(f32_dir);
  opt.eos_ids = p.special.eos;
  std::vector<std::vector<int32_t>> ours = generate(*p.model, p.params, prompts, opt);
  for (size_t r = 0; r < prompts.size(); ++r) {
    SCOPED_TRACE("row " + std::to_string(r));
    std::vector<int32_t> want = f["new"][r].get<std::vector<int32_t>>();
    ASSERT_FALSE(want.empty());
    // Ours runs to max_new_tokens, repeating the EOS; transformers stops after it.
    std::vector<int32_t> got = ours[r];
    auto stop = std::find_if(got.begin(), got.end(), [&](int32_t t) { return t == eos || t == 95; });
    if (stop != got.end()) got.erase(stop + 1, got.end());
    EXPECT_EQ(got, want);
  }
  EXPECT_EQ(f["new"][0].size(),
            static_cast<size_t>(std::find(free_run.begin(), free_run.end(), eos) - free_run.begin() + 1))
      << "transformers did not stop at the exported eos";

  // The bf16 shards: transformers picks bf16 itself and, in f32, gives the logits we give.
  const nlohmann::json& b = hf[bf16_dir];
  EXPECT_EQ(b["dtype"], "bfloat16");
  auto g =
      trace_with_params(back.model->store(),
                        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{back.model->logits(in[0])}; },
                        {{DType::i32, {1, static_cast<int64_t>(prompts[0].size())}}});
  std::vector<Array> in = back.params;
  in.push_back(Array::from_i32(prompts[0], {1, static_cast<int64_t>(prompts[0].size())}));
  EXPECT_TRUE(rel_close(Executable::compile(*g)->run(in)[0].to_f32(), b["logits"].get<std::vector<float>>(), 1e-4));
}

TEST(PretrainedExport, RefusesBadOptions) {
  TempDir root("pretrained_export_errors");
  TransformerLm m(small_llama());
  std::vector<Array> params = m.init(1);
  using testing::error_of;
  SavePretrainedOptions so;
  so.special.eos = {2, -3};
  EXPECT_NE(error_of([&] { save_pretrained(m, params, root / "a", so); }).find("eos id -3 is not a token id"),
            std::string::npos);
  so.special = {-5, {}, -1};
  EXPECT_NE(error_of([&] { save_pretrained(m, params, root / "a", so); }).find("bos id -5"), std::string::npos);
  so.special = {};
  so.generation_config_from = root / "nowhere";
  EXPECT_NE(
      error_of([&] { save_pretrained(m, params, root / "a", so); }).find("has no readable generation_config.json"),
      std::string::npos);
  so.generation_config_from.clear();
  so.special = {};
  so.dtype = DType::i32;
  EXPECT_NE(error_of([&] { save_pretrained(m, params, root / "a", so); }).find("use f32, bf16 or f16"),
            std::string::npos);
  so.dtype = DType::f16;
  so.max_shard_bytes = -1;
  EXPECT_NE(error_of([&] { save_pretrained(m, params, root / "a", so); }).find("max_shard_bytes must be >= 0"),
            std::string::npos);
  so.max_shard_bytes = 0;
  so.tokenizer_from = root / "nowhere";
  EXPECT_NE(error_of([&] { save_pretrained(m, params, root / "a", so); }).find("is not a directory"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(root / "a")) << "nothing is written before the options are checked";
  std::filesystem::create_directories(root / "empty");
  so.tokenizer_from = root / "empty";
  EXPECT_NE(error_of([&] { save_pretrained(m, params, root / "a", so); }).find("holds no tokenizer file"),
            std::string::npos);
  // f16 without ids: written as null, so transformers does not use Llama's defaults (bos 1, eos 2).
  so.tokenizer_from.clear();
  save_pretrained(m, params, root / "b", so);
  nlohmann::json cfg = read_json(root / "b/config.json");
  EXPECT_TRUE(cfg["eos_token_id"].is_null());
  EXPECT_TRUE(cfg["bos_token_id"].is_null());
  EXPECT_EQ(cfg["torch_dtype"], "float16");
  EXPECT_EQ(load_pretrained(root / "b").special.eos, std::vector<int32_t>{});
  // Ids beyond the vocabulary (GPT-2's default 50256 in a small one) are written as transformers
  // writes them, and read back; save_options_of keeps them, the f16 dtype and the generation
  // config, and names no tokenizer for a directory without tokenizer files.
  so.special = {50256, {50256}, -1};
  save_pretrained(m, params, root / "c", so);
  std::ofstream(root / "c/generation_config.json") << R"({"eos_token_id": 50256, "top_k": 7, "do_sample": true})";
  Pretrained c = load_pretrained(root / "c");
  EXPECT_EQ(c.special.eos, std::vector<int32_t>{50256});
  EXPECT_EQ(c.dtype, DType::f16);
  SavePretrainedOptions keep = save_options_of(c);
  EXPECT_EQ(keep.tokenizer_from, "");
  EXPECT_EQ(keep.dtype, DType::f16);
  save_pretrained(*c.model, c.params, root / "c", keep);  // over itself: read before written
  nlohmann::json gen = read_json(root / "c/generation_config.json");
  EXPECT_EQ(gen["top_k"], 7);
  EXPECT_EQ(gen["do_sample"], true);
  EXPECT_EQ(gen["eos_token_id"], 50256);
}

}  // namespace
}  // namespace px::nn
