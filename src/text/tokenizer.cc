// load_tokenizer: one entry point that opens a tokenizer file by its kind.
#include <filesystem>

#include "io/regular_file.h"
#include "parallax/core.h"
#include "parallax/text.h"

namespace px::text {

std::vector<int32_t> Tokenizer::add_special_tokens(std::vector<int32_t> ids) const {
  if (bos_id() >= 0) ids.insert(ids.begin(), bos_id());
  return ids;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw Error("[tokenizer] '" + path +
                "' does not exist; give a SentencePiece .model file or a byte-level BPE tokenizer.json");
  io::require_regular_file(path, "[tokenizer] ");
  if (fs::path(path).extension() == ".model") return load_sentencepiece(path);
  if (fs::path(path).filename() == "tokenizer.json") {
    const fs::path dir = fs::path(path).parent_path();
    return load_hf_tokenizer(dir.empty() ? "." : dir.string());
  }
  if (fs::path(path).extension() == ".json") return load_bpe_tokenizer(path);
  throw Error("[tokenizer] '" + path +
              "' is not a supported tokenizer file; supported kinds: SentencePiece (.model), byte-level BPE "
              "(tokenizer.json)");
}

}  // namespace px::text
