// Hugging Face interop: small random models made by transformers (GPT-2, Llama 2 and 3 shapes,
// Mistral, Qwen2; tied and untied heads; a sharded checkpoint) load into px::nn and give the same
// logits, loss and gradients; save_pretrained writes what transformers loads back; greedy decoding
// with the cache matches transformers' generate and decoding without the cache.
#include <gtest/gtest.h>

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

const Case kCases[] = {
    {"gpt2_tied", "gpt2", "GPT2LMHeadModel"},
    {"gpt2_untied", "gpt2,--untied", "GPT2LMHeadModel"},
    {"llama3_gqa_rope_scaling", "llama", "LlamaForCausalLM"},
    {"llama3_tied_sharded", "llama,--tied,--shard", "LlamaForCausalLM"},
    {"llama2", "llama2", "LlamaForCausalLM"},
    {"mistral_gqa_window", "mistral", "MistralForCausalLM"},
    {"qwen2_tied_qkv_bias", "qwen2", "Qwen2ForCausalLM"},
    {"qwen2_untied", "qwen2,--untied", "Qwen2ForCausalLM"},
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

  save_pretrained(m, p.params, dir + "/export");

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
  // Export: transformers loads what we saved and gives the same logits.
  out.clear();
  ASSERT_EQ(testing::hf_python(exported, &out), 0) << out;
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::string dir = root / c.name;
    EXPECT_TRUE(rel_close(load_safetensors(dir + "/export_logits.safetensors").get("logits").to_f32(),
                          load_safetensors(dir + "/ref.safetensors").get("logits").to_f32(), 1e-4))
        << "logits of the exported model";
  }
}

}  // namespace
}  // namespace px::nn
