// Tokenizers: text to token ids and back. SentencePiece models (`.model`, trained here or given)
// and byte-level BPE (`tokenizer.json` of GPT-2, Llama 3, Qwen2) behind one interface.
//
//   std::unique_ptr<px::text::Tokenizer> tok = px::text::load_tokenizer("tokenizer.model");
//   std::vector<int32_t> ids = tok->encode("Hello world");
//   std::string back = tok->decode(ids);
//   px::text::train_sentencepiece(docs, "cache/spm.model", {.vocab_size = 8000});  // then load it
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace px::text {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "sentencepiece", "bpe"
  // Ids of the text without special tokens added (no BOS/EOS): callers add what they need.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  // Special ids, -1 when the tokenizer has none.
  virtual int32_t bos_id() const { return -1; }
  virtual int32_t eos_id() const { return -1; }
  virtual int32_t pad_id() const { return -1; }
};

// Opens a tokenizer file by its kind: a SentencePiece `.model` or a byte-level BPE `tokenizer.json`. Throws px::Error naming the file
// and the supported kinds when it is missing, of an unknown kind, or corrupt.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// SentencePiece (https://github.com/google/sentencepiece) over a `.model` file.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);

struct SentencePieceTrainOptions {
  int64_t vocab_size = 8000;
  std::string model_type = "unigram";  // "unigram" or "bpe"
  double character_coverage = 0.9995;
  // Training reads at most this many lines (paragraphs) of the corpus, drawn with `seed`; the
  // same corpus, options and seed always give the same model.
  int64_t max_sentences = 100000;
  uint64_t seed = 0;
};

// Trains a SentencePiece model on `documents` (split into lines) and writes it to `model_path`
// (atomically). Special ids: pad 0, unk 1, bos 2, eos 3.
void train_sentencepiece(const std::vector<std::string>& documents, const std::string& model_path,
                         const SentencePieceTrainOptions& opt = {});

// Byte-level BPE from a Hugging Face `tokenizer.json` (GPT-2, Llama 3, Qwen2): the normalizer (NFC
// or none), the split regexes and ByteLevel pre-tokenizer, the merges (ignore_merges too) and the
// added tokens, which are matched in the raw text before anything else. decode() keeps added
// tokens and replaces invalid UTF-8 with U+FFFD, as `tokenizers` does. bos/eos/pad come from a
// tokenizer_config.json next to the file when there is one. Throws px::Error naming the file and
// the unsupported part for anything else (SentencePiece-style BPE, WordPiece, ...).
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& tokenizer_json);

}  // namespace px::text
