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
  // The ids of one sequence with the special tokens the tokenizer itself adds, as transformers'
  // tokenizer(text) (add_special_tokens=True) does. A tokenizer.json applies its post_processor
  // (TemplateProcessing's single template, RobertaProcessing, ByteLevel and none add nothing, a
  // Sequence applies each): Llama 3 prepends <|begin_of_text|>, GPT-2 and Qwen2 add nothing. A
  // SentencePiece model of a Hugging Face directory follows tokenizer_config.json's add_bos_token
  // (default true) and add_eos_token (default false). Otherwise: the BOS when there is one.
  virtual std::vector<int32_t> add_special_tokens(std::vector<int32_t> ids) const;
  std::vector<int32_t> encode_with_special_tokens(std::string_view text) const {
    return add_special_tokens(encode(text));
  }
};

// Opens a tokenizer file by its kind: a SentencePiece `.model` or a byte-level BPE `tokenizer.json`. Throws px::Error
// naming the file and the supported kinds when it is missing, of an unknown kind, or corrupt. A file named
// tokenizer.json is opened as its directory by load_hf_tokenizer (so a SentencePiece-style one falls
// back to the tokenizer.model beside it).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

// The tokenizer of a Hugging Face model directory: its byte-level BPE tokenizer.json, or, when that
// is SentencePiece-style (Metaspace pre-tokenizer or Prepend normalizer: Llama 2, Mistral) or absent,
// its tokenizer.model, with the special tokens of tokenizer.json's post_processor, tokenizer_config.json
// and its added tokens. Throws px::Error naming the directory and what is missing or unsupported.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir);

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
// or none), the split regexes and ByteLevel pre-tokenizer, the merges (ignore_merges too), the
// post_processor (add_special_tokens) and the added tokens, matched before anything else as the
// `tokenizers` package does, flags included: those with normalized = false in the raw text, then
// those with normalized = true in the normalized rest; lstrip / rstrip take the whitespace on that
// side into the token, single_word matches only between non-word characters. decode() keeps added
// tokens and replaces invalid UTF-8 with U+FFFD, as `tokenizers` does. bos/eos/pad come from a
// tokenizer_config.json next to the file when there is one. Throws px::Error naming the file and
// the unsupported part for anything else (SentencePiece-style BPE, WordPiece, ...).
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& tokenizer_json);

}  // namespace px::text
