// Tokenizers: text to token ids and back. SentencePiece models (`.model`, trained here or given)
// and byte-level BPE (`tokenizer.json` of GPT-2, Llama 3, Qwen2) behind one interface.
//
//   std::unique_ptr<px::text::Tokenizer> tok = px::text::load_tokenizer("tokenizer.model");
//   std::vector<int32_t> ids = tok->encode("Hello world");
//   std::string back = tok->decode(ids);
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

}  // namespace px::text
