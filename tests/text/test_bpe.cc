// Byte-level BPE from tokenizer.json against the `tokenizers` package: five styles (GPT-2 with and
// without a prefix space, Llama 3, Qwen2 with NFC, and one with added tokens of every flag) trained
// by tests/python/hf_tokenizers.py give the same ids (with and without the post-processor's special
// tokens) and decoded text on a corpus of several languages, emoji, control bytes and whitespace.
// Hugging Face directories with a SentencePiece-style tokenizer.json fall back to tokenizer.model.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/pretrained_util.h"
#include "parallax/text.h"

namespace px::text {
namespace {

using testing::TempDir;

TEST(Bpe, MatchesTokenizersOnAMultilingualCorpus) {
  if (!testing::has_test_python()) GTEST_SKIP() << testing::no_test_python_reason();
  TempDir dir("bpe");
  std::string out;
  ASSERT_EQ(testing::run_test_script("hf_tokenizers.py", dir.str(), &out), 0) << out;
  std::ifstream in(dir / "expected.json");
  nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_EQ(expected.size(), 5u);
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
      EXPECT_EQ(tok->add_special_tokens(ids), row["special_ids"].get<std::vector<int32_t>>()) << "post-processor";
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
  // GPT-2 names a BOS, but its post-processor (ByteLevel) adds none, as transformers' tokenizer().
  EXPECT_EQ(gpt2->encode_with_special_tokens("Hello world"), gpt2->encode("Hello world"));
  std::vector<int32_t> with_bos = llama3->encode("Hello world");
  with_bos.insert(with_bos.begin(), llama3->bos_id());
  EXPECT_EQ(llama3->encode_with_special_tokens("Hello world"), with_bos);
  // load_tokenizer of a tokenizer.json opens its directory the same way.
  EXPECT_EQ(load_tokenizer(dir / "llama3/tokenizer.json")->encode_with_special_tokens("Hello world"), with_bos);
}

// A Llama 2 / Mistral style directory: tokenizer.json is SentencePiece-style (Metaspace), so the
// tokenizer.model beside it encodes; the special tokens follow tokenizer.json and tokenizer_config.json.
TEST(Bpe, SentencePieceStyleDirectoriesUseTokenizerModel) {
  TempDir dir("bpe_spm");
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i)
    docs.push_back("The quick brown fox " + std::to_string(i) + " jumps over the lazy dog. Hello world, again.");
  train_sentencepiece(docs, dir / "tokenizer.model", {.vocab_size = 320});  // pad 0, unk 1, bos 2, eos 3
  auto spm = load_sentencepiece(dir / "tokenizer.model");
  nlohmann::json added = nlohmann::json::array();
  for (auto [id, content] : std::vector<std::pair<int, const char*>>{{1, "<unk>"}, {2, "<s>"}, {3, "</s>"}})
    added.push_back({{"id", id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
  nlohmann::json tj = {
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
        {"pair", nlohmann::json::array()},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {2}}, {"tokens", {"<s>"}}}}}}}},
      {"model",
       {{"type", "BPE"}, {"vocab", {{"<unk>", 1}, {"<s>", 2}, {"</s>", 3}}}, {"merges", nlohmann::json::array()}}}};
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>", "eos_token": "</s>", "pad_token": null})";

  const std::string text = "Hello world, the lazy fox";
  std::vector<int32_t> ids = spm->encode(text);
  std::vector<std::unique_ptr<Tokenizer>> toks;
  toks.push_back(load_hf_tokenizer(dir.str()));
  toks.push_back(load_tokenizer(dir / "tokenizer.json"));
  for (auto& tok : toks) {
    EXPECT_EQ(tok->kind(), "sentencepiece");
    EXPECT_EQ(tok->encode(text), ids);
    EXPECT_EQ(tok->decode(ids), text);
    std::vector<int32_t> with_bos = ids;
    with_bos.insert(with_bos.begin(), 2);
    EXPECT_EQ(tok->encode_with_special_tokens(text), with_bos);
    EXPECT_EQ(tok->bos_id(), 2);
    EXPECT_EQ(tok->eos_id(), 3);
    EXPECT_EQ(tok->pad_id(), -1);
  }
  // Without tokenizer.json, tokenizer_config.json's add_bos_token / add_eos_token decide.
  std::filesystem::remove(dir / "tokenizer.json");
  std::ofstream(dir / "tokenizer_config.json") << R"({"add_bos_token": false, "add_eos_token": true})";
  std::vector<int32_t> with_eos = ids;
  with_eos.push_back(3);
  EXPECT_EQ(load_hf_tokenizer(dir.str())->encode_with_special_tokens(text), with_eos);
  std::ofstream(dir / "tokenizer_config.json") << R"({"add_bos_token": "yes"})";
  std::string e = testing::error_of([&] { load_hf_tokenizer(dir.str()); });
  EXPECT_NE(e.find("'add_bos_token' must be true or false"), std::string::npos) << e;
  // A SentencePiece-style tokenizer.json without its tokenizer.model is refused, naming the fix.
  std::ofstream(dir / "tokenizer.json") << tj.dump();
  std::filesystem::remove(dir / "tokenizer.model");
  e = testing::error_of([&] { load_tokenizer(dir / "tokenizer.json"); });
  EXPECT_NE(e.find("tokenizer.model"), std::string::npos) << e;
  EXPECT_NE(e.find("Metaspace"), std::string::npos) << e;
  std::filesystem::remove(dir / "tokenizer.json");
  e = testing::error_of([&] { load_hf_tokenizer(dir.str()); });
  EXPECT_NE(e.find("no tokenizer.json or tokenizer.model"), std::string::npos) << e;
}

// Llama 2 style directories (tokenizer.model, a Metaspace tokenizer.json as transformers'
// LlamaTokenizer writes it, tokenizer_config.json's add_bos_token / add_eos_token): ids with and
// without special tokens equal transformers' AutoTokenizer on the same directory. With a
// tokenizer.json, transformers 5 adds what its post_processor says ("<s> $A" for Llama 2).
TEST(Bpe, Llama2StyleDirectoriesEncodeAsAutoTokenizer) {
  if (!testing::has_test_python()) GTEST_SKIP() << testing::no_test_python_reason();
  TempDir dir("bpe_llama2");
  std::vector<std::string> docs;
  const std::vector<std::string> base = {"The quick brown fox jumps over the lazy dog. Hello world, again.",
                                         "Der schnelle braune Fuchs springt über den faulen Hund.",
                                         "Numbers 1234 and 56.78 here", "Привет, как дела? Всё хорошо."};
  for (int i = 0; i < 60; ++i) docs.push_back(base[i % base.size()] + " " + std::to_string(i * 37));
  // Llama 2's kind of model: BPE with byte fallback (pad 0, unk 1, bos 2, eos 3 here).
  train_sentencepiece(docs, dir / "tokenizer.model", {.vocab_size = 400, .model_type = "bpe"});
  std::string out;
  ASSERT_EQ(testing::run_test_script("hf_tokenizers.py", "llama2 " + dir.str(), &out), 0) << out;
  std::ifstream in(dir / "expected.json");
  nlohmann::json expected = nlohmann::json::parse(in);
  ASSERT_EQ(expected.size(), 4u);
  for (auto& [style, e] : expected.items()) {
    SCOPED_TRACE(style);
    std::unique_ptr<Tokenizer> tok = load_hf_tokenizer(dir / style);
    EXPECT_EQ(tok->kind(), "sentencepiece");
    EXPECT_EQ(tok->bos_id(), e["bos"].get<int32_t>());
    EXPECT_EQ(tok->eos_id(), e["eos"].get<int32_t>());
    for (auto& row : e["rows"]) {
      const std::string text = row["text"].get<std::string>();
      SCOPED_TRACE("text: " + text);
      EXPECT_EQ(tok->encode(text), row["ids"].get<std::vector<int32_t>>());
      EXPECT_EQ(tok->encode_with_special_tokens(text), row["special_ids"].get<std::vector<int32_t>>());
    }
  }
  // Llama 2 itself: "Hello world" starts with the BOS, also through load_tokenizer.
  EXPECT_EQ(expected["llama2"]["rows"][0]["special_ids"][0], 2);
  EXPECT_EQ(load_tokenizer(dir / "llama2/tokenizer.json")->encode_with_special_tokens("Hello world"),
            expected["llama2"]["rows"][0]["special_ids"].get<std::vector<int32_t>>());
}

// The 256 characters of the byte-level alphabet, each with its byte as id.
nlohmann::json byte_vocab() {
  nlohmann::json vocab;
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
  return vocab;
}

TEST(Bpe, InvalidUtf8InputEncodesByteByByteAndDecodesBack) {
  // A tiny hand-written tokenizer.json: the byte alphabet and one merge.
  TempDir dir("bpe_bytes");
  nlohmann::json vocab = byte_vocab();
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
  // A post-processor we cannot apply, and one whose special id is outside the vocabulary.
  nlohmann::json pp = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", nlohmann::json::array()}}},
                       {"pre_tokenizer", {{"type", "ByteLevel"}}},
                       {"post_processor", {{"type", "Custom"}}}};
  std::ofstream(dir / "pp.json") << pp.dump();
  e = testing::error_of([&] { load_bpe_tokenizer(dir / "pp.json"); });
  EXPECT_NE(e.find("post_processor 'Custom' is not supported"), std::string::npos) << e;
  pp["post_processor"] = {{"type", "RobertaProcessing"}, {"cls", {"<s>", 7}}, {"sep", {"</s>", 0}}};
  std::ofstream(dir / "pp.json") << pp.dump();
  e = testing::error_of([&] { load_bpe_tokenizer(dir / "pp.json"); });
  EXPECT_NE(e.find("post_processor cls has id 7, outside the vocabulary [0, 1)"), std::string::npos) << e;
}

nlohmann::json tokenizer_json(const nlohmann::json& vocab, const nlohmann::json& merges,
                              const nlohmann::json& added = nlohmann::json::array()) {
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"added_tokens", added}};
}

// Ids size the decoding table: a negative one wrote before it (heap corruption), one near
// INT32_MAX asked for a table of 2^31 strings (std::length_error). Both are refused by name.
TEST(Bpe, OutOfRangeIdsAreRefused) {
  TempDir dir("bpe_ids");
  auto error = [&](const nlohmann::json& j) {
    std::ofstream(dir / "tokenizer.json") << j.dump();
    return testing::error_of([&] { load_bpe_tokenizer(dir / "tokenizer.json"); });
  };
  const nlohmann::json vocab = byte_vocab();
  std::string e = error(tokenizer_json(vocab, nlohmann::json::array(), {{{"id", -5}, {"content", "<s>"}}}));
  EXPECT_NE(e.find("token '<s>' has id -5, outside [0, 1538)"), std::string::npos) << e;
  EXPECT_NE(e.find("restore it"), std::string::npos) << e;
  e = error(tokenizer_json(vocab, nlohmann::json::array(), {{{"id", 2147483646}, {"content", "<s>"}}}));
  EXPECT_NE(e.find("token '<s>' has id 2147483646"), std::string::npos) << e;
  e = error(tokenizer_json(vocab, nlohmann::json::array(), {{{"id", 1e300}, {"content", "<s>"}}}));
  EXPECT_NE(e.find("the id of added token '<s>' must be an integer"), std::string::npos) << e;
  e = error(tokenizer_json(vocab, nlohmann::json::array(), {{{"id", 300}}}));
  EXPECT_NE(e.find("must be an object with a string \"content\""), std::string::npos) << e;
  nlohmann::json big = vocab;
  big["zz"] = 2147483647;
  e = error(tokenizer_json(big, nlohmann::json::array()));
  EXPECT_NE(e.find("token 'zz' has id 2147483647"), std::string::npos) << e;
  big["zz"] = -1;
  EXPECT_NE(error(tokenizer_json(big, nlohmann::json::array())).find("token 'zz' has id -1"), std::string::npos);
  // Holes are fine while most ids are used: an added token past the vocabulary.
  std::ofstream(dir / "tokenizer.json")
      << tokenizer_json(vocab, nlohmann::json::array(), {{{"id", 300}, {"content", "<s>"}}}).dump();
  auto tok = load_bpe_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 301);
  EXPECT_EQ(tok->encode("a<s>"), (std::vector<int32_t>{'a', 300}));
}

// "hello world" -> "hello ld": merges made symbols the vocabulary lacks, and encode dropped them.
// Merges are now checked at load (as tokenizers does), and a piece without an id maps to the
// unk_token the file names, or is an error.
TEST(Bpe, UnknownPiecesMapToUnkOrAreRefused) {
  TempDir dir("bpe_unknown");
  auto write = [&](const nlohmann::json& j) { std::ofstream(dir / "tokenizer.json") << j.dump(); };
  nlohmann::json vocab = byte_vocab();
  write(tokenizer_json(vocab, {"w o", "wo r"}));
  std::string e = testing::error_of([&] { load_bpe_tokenizer(dir / "tokenizer.json"); });
  EXPECT_NE(e.find("merge 'w o' (rank 0) needs the token 'wo', which is not in model.vocab"), std::string::npos) << e;

  // A vocabulary without 'w' and no unk_token: encoding "world" is an error, not "orld".
  vocab.erase("w");
  write(tokenizer_json(vocab, nlohmann::json::array()));
  auto tok = load_bpe_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(tok->encode("hello"), (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o'}));
  e = testing::error_of([&] { tok->encode("hello world"); });
  EXPECT_NE(e.find("cannot encode the text 'w' (bytes 77)"), std::string::npos) << e;
  EXPECT_NE(e.find("has no unk_token"), std::string::npos) << e;

  // With an unk_token it stands for the piece, as the file defines.
  nlohmann::json j = tokenizer_json(vocab, nlohmann::json::array());
  j["model"]["vocab"]["<unk>"] = 256;
  j["model"]["unk_token"] = "<unk>";
  write(j);
  tok = load_bpe_tokenizer(dir / "tokenizer.json");
  EXPECT_EQ(tok->encode("ow"), (std::vector<int32_t>{'o', 256}));
  EXPECT_EQ(tok->decode(tok->encode("hello world")), "hello <unk>orld");
  j["model"]["unk_token"] = "<missing>";
  write(j);
  e = testing::error_of([&] { load_bpe_tokenizer(dir / "tokenizer.json"); });
  EXPECT_NE(e.find("model.unk_token '<missing>' is not a token of the file"), std::string::npos) << e;
}

// A FIFO opened for reading waits for a writer forever; directories and devices are no files.
TEST(Bpe, NonRegularFilesAreRefused) {
  TempDir dir("bpe_fifo");
  const std::string fifo = dir / "tokenizer.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string e = testing::error_of([&] { load_bpe_tokenizer(fifo); });
  EXPECT_NE(e.find("'" + fifo + "' is a FIFO (named pipe), not a regular file"), std::string::npos) << e;
  EXPECT_EQ(testing::error_of([&] { load_tokenizer(fifo); }), e);
  e = testing::error_of([&] { load_tokenizer("/dev/null"); });
  EXPECT_NE(e.find("'/dev/null' is a character device, not a regular file"), std::string::npos) << e;
  std::filesystem::create_directory(dir / "tok.model");
  e = testing::error_of([&] { load_sentencepiece(dir / "tok.model"); });
  EXPECT_NE(e.find("is a directory, not a regular file"), std::string::npos) << e;
  // tokenizer_config.json next to a good tokenizer.json.
  std::filesystem::remove(fifo);
  std::ofstream(dir / "tokenizer.json") << tokenizer_json(byte_vocab(), nlohmann::json::array()).dump();
  const std::string cfg = dir / "tokenizer_config.json";
  ASSERT_EQ(::mkfifo(cfg.c_str(), 0600), 0);
  e = testing::error_of([&] { load_bpe_tokenizer(dir / "tokenizer.json"); });
  EXPECT_NE(e.find("'" + cfg + "' is a FIFO"), std::string::npos) << e;
}

}  // namespace
}  // namespace px::text
