// Byte-level BPE from tokenizer.json against the `tokenizers` package: three styles (GPT-2 with and
// without a prefix space, Llama 3, Qwen2 with NFC) trained by tests/python/hf_tokenizers.py give the
// same ids and decoded text on a corpus of several languages, emoji, control bytes and whitespace.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/pretrained_util.h"
#include "parallax/text.h"

namespace px::text {
namespace {

using testing::TempDir;

TEST(Bpe, MatchesTokenizersOnAMultilingualCorpus) {
  TempDir dir("bpe");
  std::string out;
  ASSERT_EQ(testing::run_test_script("hf_tokenizers.py", dir.str(), &out), 0) << out;
  std::ifstream in(dir / "expected.json");
  nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_EQ(expected.size(), 4u);
  for (auto& [style, e] : expected.items()) {
    SCOPED_TRACE(style);
    std::unique_ptr<Tokenizer> tok = load_bpe_tokenizer(dir / (style + "/tokenizer.json"));
    EXPECT_EQ(tok->kind(), "bpe");
    EXPECT_EQ(tok->vocab_size(), e["vocab_size"].get<int64_t>());
    int rows = 0;
    for (auto& row : e["rows"]) {
      const std::string text = row["text"].get<std::string>();
      SCOPED_TRACE("text: " + text);
      std::vector<int32_t> ids = tok->encode(text);
      EXPECT_EQ(ids, row["ids"].get<std::vector<int32_t>>());
      EXPECT_EQ(tok->decode(row["ids"].get<std::vector<int32_t>>()), row["decoded"].get<std::string>());
      // Half the ids can end inside a character: the rest becomes U+FFFD, as in tokenizers.
      EXPECT_EQ(tok->decode(row["prefix_ids"].get<std::vector<int32_t>>()), row["prefix_decoded"].get<std::string>());
      ++rows;
    }
    EXPECT_GT(rows, 20);
  }
  // Special ids come from tokenizer_config.json.
  auto gpt2 = load_bpe_tokenizer(dir / "gpt2/tokenizer.json");
  EXPECT_EQ(gpt2->encode("<|endoftext|>"), std::vector<int32_t>{gpt2->eos_id()});
  EXPECT_EQ(gpt2->bos_id(), gpt2->eos_id());
  auto llama3 = load_bpe_tokenizer(dir / "llama3/tokenizer.json");
  EXPECT_EQ(llama3->encode("<|begin_of_text|>"), std::vector<int32_t>{llama3->bos_id()});
  EXPECT_EQ(llama3->encode("<|end_of_text|>"), std::vector<int32_t>{llama3->eos_id()});
  auto qwen2 = load_bpe_tokenizer(dir / "qwen2/tokenizer.json");
  EXPECT_EQ(qwen2->encode("<|im_end|>"), std::vector<int32_t>{qwen2->eos_id()});
  EXPECT_EQ(qwen2->encode("<|endoftext|>"), std::vector<int32_t>{qwen2->pad_id()});
  EXPECT_EQ(qwen2->bos_id(), -1);
}

TEST(Bpe, InvalidUtf8InputEncodesByteByByteAndDecodesBack) {
  // A tiny hand-written tokenizer.json: the byte alphabet and one merge.
  TempDir dir("bpe_bytes");
  nlohmann::json vocab;
  std::vector<std::string> chars;
  for (int b = 0, next = 256; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80)
      s += static_cast<char>(cp);
    else
      s += static_cast<char>(0xC0 | (cp >> 6)), s += static_cast<char>(0x80 | (cp & 0x3F));
    vocab[s] = b;
  }
  vocab["ab"] = 256;
  nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"a b"}}}},
                      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
                      {"added_tokens", nlohmann::json::array()}};
  std::ofstream(dir / "tokenizer.json") << j.dump();
  auto tok = load_bpe_tokenizer(dir / "tokenizer.json");
  const std::string odd =
      "ab\xff\xfe"
      "ab\xc3";  // invalid UTF-8
  std::vector<int32_t> ids = tok->encode(odd);
  EXPECT_EQ(ids, (std::vector<int32_t>{256, 0xff, 0xfe, 256, 0xc3}));
  EXPECT_EQ(tok->decode(ids),
            "ab\xEF\xBF\xBD\xEF\xBF\xBD"
            "ab\xEF\xBF\xBD");
  EXPECT_EQ(tok->decode(tok->encode("é ab")), "é ab");
}

TEST(Bpe, ErrorsNameTheFileAndTheUnsupportedPart) {
  TempDir dir("bpe_errors");
  std::string e = testing::error_of([&] { load_bpe_tokenizer(dir / "none.json"); });
  EXPECT_NE(e.find(dir / "none.json"), std::string::npos) << e;
  EXPECT_NE(e.find("not found"), std::string::npos) << e;
  nlohmann::json wp = {{"model", {{"type", "WordPiece"}, {"vocab", nlohmann::json::object()}}}};
  std::ofstream(dir / "wp.json") << wp.dump();
  e = testing::error_of([&] { load_bpe_tokenizer(dir / "wp.json"); });
  EXPECT_NE(e.find("model type 'WordPiece' is not supported"), std::string::npos) << e;
  nlohmann::json meta = {
      {"model", {{"type", "BPE"}, {"vocab", nlohmann::json::object()}, {"merges", nlohmann::json::array()}}},
      {"pre_tokenizer", {{"type", "Metaspace"}}}};
  std::ofstream(dir / "meta.json") << meta.dump();
  e = testing::error_of([&] { load_bpe_tokenizer(dir / "meta.json"); });
  EXPECT_NE(e.find("pre-tokenizer 'Metaspace'"), std::string::npos) << e;
  EXPECT_NE(e.find("SentencePiece"), std::string::npos) << e;
  std::ofstream(dir / "bad.json") << "{";
  e = testing::error_of([&] { load_bpe_tokenizer(dir / "bad.json"); });
  EXPECT_NE(e.find("not valid JSON"), std::string::npos) << e;
}

}  // namespace
}  // namespace px::text
