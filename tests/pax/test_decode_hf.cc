// pax decode --hf_model (pax::decode_pretrained) on a Llama 2 style directory: a SentencePiece
// tokenizer.model beside the Metaspace tokenizer.json that transformers' LlamaTokenizer writes
// (post-processor "<s> $A", add_bos_token in tokenizer_config.json). The prompt gets the BOS and
// the same ids as transformers' AutoTokenizer, and greedy decoding continues as its generate().
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/pretrained_util.h"
#include "parallax/pax.h"
#include "parallax/text.h"

namespace px::pax {
namespace {

using testing::TempDir;

TEST(PaxDecodeHf, Llama2StyleDirectoryPromptHasTheBosAndContinuesAsTransformers) {
  if (!testing::has_test_python()) GTEST_SKIP() << testing::no_test_python_reason();
  TempDir dir("pax_decode_llama2");
  std::vector<std::string> docs;
  const std::vector<std::string> base = {"The quick brown fox jumps over the lazy dog. Hello world, again.",
                                         "Der schnelle braune Fuchs springt über den faulen Hund.",
                                         "Numbers 1234 and 56.78 here"};
  for (int i = 0; i < 60; ++i) docs.push_back(base[i % base.size()] + " " + std::to_string(i * 37));
  text::train_sentencepiece(docs, dir / "tok/tokenizer.model", {.vocab_size = 400, .model_type = "bpe"});
  std::string out;
  ASSERT_EQ(testing::run_test_script("hf_tokenizers.py", "llama2 " + dir / "tok", &out), 0) << out;
  out.clear();
  ASSERT_EQ(testing::hf_python("decode " + dir / "model " + dir / "tok/llama2 " + dir / "want.json" +
                                   " 12 'Hello world' 'The lazy dog jumps'",
                               &out),
            0)
      << out;
  std::ifstream in(dir / "want.json");
  const nlohmann::json want = nlohmann::json::parse(in);
  const int32_t eos = want["eos"].get<int32_t>();
  for (const nlohmann::json& row : want["rows"]) {
    SCOPED_TRACE(row["prompt"].get<std::string>());
    DecodeOptions d;
    d.prompt = row["prompt"].get<std::string>();
    d.max_new_tokens = 12;
    DecodeResult r = decode_pretrained(dir / "model", d);
    const std::vector<int32_t> prompt_ids = row["prompt_ids"].get<std::vector<int32_t>>();
    ASSERT_FALSE(prompt_ids.empty());
    EXPECT_EQ(prompt_ids[0], 2) << "transformers starts the prompt with the BOS";
    EXPECT_EQ(r.prompt_ids, prompt_ids);
    // transformers' new ids end with the EOS when it stopped there; ours stop before it.
    std::vector<int32_t> want_new = row["new"].get<std::vector<int32_t>>();
    if (!want_new.empty() && want_new.back() == eos) {
      want_new.pop_back();
      EXPECT_TRUE(r.stopped_at_eos);
    }
    EXPECT_EQ(r.new_ids, want_new);
  }
}

}  // namespace
}  // namespace px::pax
