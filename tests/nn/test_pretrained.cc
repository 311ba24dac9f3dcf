// Hugging Face interop: small random models made by transformers (GPT-2, Llama 2 and 3 shapes,
// Mistral, Qwen2; tied and untied heads; a sharded checkpoint; f16 and bf16; special ids, sampling
// defaults, a tokenizer) load into px::nn and give the same logits, loss and gradients;
// save_pretrained with save_options_of writes what transformers loads back with the same logits,
// dtype, special ids, generation config and tokenizer; greedy decoding with the cache matches
// transformers' generate and decoding without the cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "parallax/autodiff.h"
#include "parallax/io.h"
#include "parallax/nn/pretrained.h"
#include "parallax/runtime.h"
#include "pretrained_util.h"

namespace px::nn {
namespace {

using testing::rel_close;
using testing::TempDir;

struct Case {
  const char* name;
  const char* spec;  // hf_models.py: ARCH[,flags]
  const char* architecture;
};

// The flags also vary what a round trip must keep: the weights' dtype, special ids (none, some, or
// transformers' defaults: GPT-2's 50256 beyond this vocabulary), sampling defaults in
// generation_config.json, tokenizer files.
const Case kCases[] = {
    {"gpt2_tied", "gpt2", "GPT2LMHeadModel"},
    {"gpt2_untied", "gpt2,--untied", "GPT2LMHeadModel"},
    {"gpt2_f16_default_ids", "gpt2,--f16,--default_ids", "GPT2LMHeadModel"},
    {"llama3_gqa_rope_scaling", "llama,--ids", "LlamaForCausalLM"},
    {"llama3_tied_sharded", "llama,--tied,--shard", "LlamaForCausalLM"},
    {"llama3_bf16_sampling", "llama,--bf16,--ids,--sampling", "LlamaForCausalLM"},
    {"llama2_tokenizer", "llama2,--tokenizer", "LlamaForCausalLM"},
    {"mistral_gqa_window", "mistral,--ids,--sampling", "MistralForCausalLM"},
    {"qwen2_tied_qkv_bias", "qwen2,--ids", "Qwen2ForCausalLM"},
    {"qwen2_untied", "qwen2,--untied", "Qwen2ForCausalLM"},
    {"qwen2_bf16_default_ids", "qwen2,--bf16,--default_ids", "Qwen2ForCausalLM"},
};

// Logits, loss and our gradients (in the HF layout) against transformers' and torch's; exports
// the model to <case>/export. Returns the params for decoding.
void check_case(const Case& c, const std::string& dir) {
  Pretrained p = load_pretrained(dir + "/model");
  EXPECT_EQ(p.architecture, c.architecture);
  const TransformerLm& m = *p.model;
  SafetensorsFile ref = load_safetensors(dir + "/ref.safetensors");
  const Array& tokens = ref.get("tokens");
  const Array& targets = ref.get("targets");

  // Logits, loss and the gradient of every param in one program.
  ParamStore& store = m.store();
  auto g = trace_with_params(store,
                             [&](const std::vector<Tensor>& b) {
                               Tensor logits = m.logits(b[0]);
                               Tensor loss = cross_entropy_loss(logits, b[1]);
                               std::vector<Tensor> params;
                               for (int i = 0; i < store.size(); ++i) params.push_back(store.value(i));
                               std::vector<Tensor> outs = gradients(loss, params);
                               outs.insert(outs.begin(), {logits, loss});
                               return outs;
                             },
                             {tokens.type(), targets.type()});
  std::vector<Array> in = p.params;
  in.push_back(tokens);
  in.push_back(targets);
  std::vector<Array> res = Executable::compile(*g)->run(in);
  EXPECT_TRUE(rel_close(res[0].to_f32(), ref.get("logits").to_f32(), 1e-4)) << "logits";
  EXPECT_TRUE(rel_close(res[1].to_f32(), ref.get("loss").to_f32(), 1e-4)) << "loss";

  // Our gradients, written in the HF layout by save_pretrained, against torch's per tensor.
  std::vector<Array> grads(res.begin() + 2, res.end());
  save_pretrained(m, grads, dir + "/grads", p.architecture);
  SafetensorsFile ours = load_safetensors(dir + "/grads/model.safetensors");
  int compared = 0;
  for (size_t i = 0; i < ref.names.size(); ++i) {
    const std::string& n = ref.names[i];
    if (n.rfind("grad.", 0) != 0) continue;
    std::string hf = n.substr(5);
    if (!ours.contains(hf)) {
      ADD_FAILURE() << "no gradient for " << hf;
      continue;
    }
    EXPECT_TRUE(rel_close(ours.get(hf).to_f32(), ref.arrays[i].to_f32(), 1e-4)) << "gradient of " << hf;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(ours.names.size()));

  // What a user keeps a loaded model with: its architecture, ids, dtype, generation config and
  // tokenizer files (only where the source has some).
  save_pretrained(m, p.params, dir + "/export", save_options_of(p));

  // Greedy decoding: with the cache, as transformers' generate; and as without the cache.
  std::vector<int32_t> prompt = ref.get("prompt").to_i32();
  const int64_t plen = ref.get("prompt").shape()[1];
  std::vector<std::vector<int32_t>> prompts{{prompt.begin(), prompt.begin() + plen},
                                            {prompt.begin() + plen, prompt.end()}};
  GenerateOptions opt;
  opt.max_new_tokens = 32;
  auto cached = generate(m, p.params, prompts, opt);
  std::vector<int32_t> want = ref.get("generated").to_i32();
  for (int r = 0; r < 2; ++r)
    EXPECT_EQ(cached[r], std::vector<int32_t>(want.begin() + 32 * r, want.begin() + 32 * (r + 1))) << "row " << r;
  opt.use_cache = false;
  EXPECT_EQ(generate(m, p.params, prompts, opt), cached) << "decoding without the cache";
}

// One test for all architectures: each Python start costs seconds (importing torch).
TEST(Pretrained, EveryArchitectureMatchesTransformers) {
  if (!testing::has_test_python()) GTEST_SKIP() << testing::no_test_python_reason();
  TempDir root("pretrained");
  std::string args = "cases " + root.str(), out;
  for (const Case& c : kCases) args += std::string(" ") + c.name + "=" + c.spec + ",--generate,32";
  ASSERT_EQ(testing::hf_python(args, &out), 0) << out;
  std::string exported = "logits";
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::string dir = root / c.name;
    check_case(c, dir);
    exported += " " + dir + "/export " + dir + "/ref.safetensors " + dir + "/export_logits.safetensors";
  }
  // Export with save_options_of: transformers loads what we saved and gives the same logits, and
  // reads the same dtype, special ids, generation config and tokenizer as from the source.
  out.clear();
  ASSERT_EQ(testing::hf_python(exported, &out), 0) << out;
  std::string pairs = "roundtrip " + root / "roundtrip.json";
  for (const Case& c : kCases) pairs += " " + root / c.name + "/model " + root / c.name + "/export";
  out.clear();
  ASSERT_EQ(testing::hf_python(pairs, &out), 0) << out;
  std::ifstream in(root / "roundtrip.json");
  const nlohmann::json read = nlohmann::json::parse(in);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::string dir = root / c.name;
    EXPECT_TRUE(rel_close(load_safetensors(dir + "/export_logits.safetensors").get("logits").to_f32(),
                          load_safetensors(dir + "/ref.safetensors").get("logits").to_f32(), 1e-4))
        << "logits of the exported model";
    const nlohmann::json& src = read.at(dir + "/export").at("source");
    const nlohmann::json& exp = read.at(dir + "/export").at("export");
    for (const char* what : {"dtype", "config_ids", "generation", "tokenizer"})
      EXPECT_EQ(exp.at(what), src.at(what)) << what << " of the export differs from the source's";
    EXPECT_EQ(std::filesystem::exists(dir + "/export/tokenizer.json"),
              std::filesystem::exists(dir + "/model/tokenizer.json"));
  }
  // The cases cover what is kept: each dtype, ids beyond the vocabulary, sampling, a tokenizer.
  const nlohmann::json& f16 = read.at(root / "gpt2_f16_default_ids/export").at("export");
  EXPECT_EQ(f16["dtype"], "float16");
  EXPECT_EQ(f16["config_ids"][0], 50256);
  const nlohmann::json& sampling = read.at(root / "llama3_bf16_sampling/export").at("export");
  EXPECT_EQ(sampling["dtype"], "bfloat16");
  EXPECT_EQ(sampling["generation"]["eos_token_id"], nlohmann::json({2, 5}));
  EXPECT_EQ(sampling["generation"]["do_sample"], true);
  EXPECT_DOUBLE_EQ(sampling["generation"]["top_p"].get<double>(), 0.9);
  EXPECT_FALSE(read.at(root / "llama2_tokenizer/export").at("export")["tokenizer"].is_null());
}

}  // namespace
}  // namespace px::nn
