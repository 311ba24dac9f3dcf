// SentencePiece tokenizer over a `.model` file, and deterministic training of one on a corpus.
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <unordered_map>
#include <unistd.h>

#include "io/regular_file.h"
#include "parallax/core.h"
#include "parallax/text.h"

namespace px::text {

namespace fs = std::filesystem;

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec))
      throw Error("[tokenizer] SentencePiece model '" + path + "' does not exist; give a .model file");
    io::require_regular_file(path, "[tokenizer] SentencePiece model ");
    auto st = sp_.Load(path);
    if (!st.ok())
      throw Error("[tokenizer] '" + path + "' is not a valid SentencePiece model (" + st.ToString() +
                  "); retrain it or give another .model file");
  }

  std::string kind() const override { return "sentencepiece"; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    if (!st.ok()) throw Error("[tokenizer] SentencePiece encode failed: " + st.ToString());
    return {ids.begin(), ids.end()};
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    const int n = sp_.GetPieceSize();
    for (int32_t id : ids)
      if (id < 0 || id >= n)
        throw Error("[tokenizer] id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n) +
                    ")");
    std::vector<int> v(ids.begin(), ids.end());
    std::string out;
    auto st = sp_.Decode(v, &out);
    if (!st.ok()) throw Error("[tokenizer] SentencePiece decode failed: " + st.ToString());
    return out;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }
  int32_t pad_id() const override { return sp_.pad_id(); }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

class VectorIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit VectorIterator(const std::vector<std::string>& v) : v_(v) {}
  bool done() const override { return i_ >= v_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return v_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& v_;
  size_t i_ = 0;
};

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The non-empty lines of the documents, each cut to SentencePiece's sentence limit.
std::vector<std::string> training_lines(const std::vector<std::string>& documents) {
  constexpr size_t kMaxLine = 4000;  // the trainer skips sentences over max_sentence_length (4192 bytes)
  std::vector<std::string> lines;
  for (const auto& d : documents) {
    size_t start = 0;
    while (start <= d.size()) {
      size_t end = d.find('\n', start);
      if (end == std::string::npos) end = d.size();
      std::string_view line(d.data() + start, end - start);
      while (!line.empty() && (line.back() == ' ' || line.back() == '\r' || line.back() == '\t'))
        line.remove_suffix(1);
      while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
      while (!line.empty()) {
        size_t n = std::min(kMaxLine, line.size());
        // Keep UTF-8 sequences whole: move the cut back off continuation bytes.
        while (n < line.size() && n > 1 && (static_cast<unsigned char>(line[n]) & 0xC0) == 0x80) --n;
        lines.emplace_back(line.substr(0, n));
        line.remove_prefix(n);
      }
      start = end + 1;
    }
  }
  return lines;
}

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

void train_sentencepiece(const std::vector<std::string>& documents, const std::string& model_path,
                         const SentencePieceTrainOptions& opt) {
  if (opt.vocab_size < 8)
    throw Error("[tokenizer] vocab_size " + std::to_string(opt.vocab_size) + " is too small; use at least 8");
  if (opt.model_type != "unigram" && opt.model_type != "bpe")
    throw Error("[tokenizer] model_type '" + opt.model_type + "' is not one of: unigram, bpe");
  std::vector<std::string> lines = training_lines(documents);
  if (lines.empty()) throw Error("[tokenizer] cannot train a SentencePiece model on an empty corpus");
  // Deterministic sample: the max_sentences lines with the smallest seeded hash of their index,
  // kept in corpus order (the trainer's own sampling is not seeded through its API).
  if (opt.max_sentences > 0 && static_cast<int64_t>(lines.size()) > opt.max_sentences) {
    std::vector<std::pair<uint64_t, size_t>> keys(lines.size());
    for (size_t i = 0; i < lines.size(); ++i) keys[i] = {mix(mix(opt.seed) ^ i), i};
    std::nth_element(keys.begin(), keys.begin() + opt.max_sentences, keys.end());
    keys.resize(opt.max_sentences);
    std::vector<size_t> keep;
    for (auto& k : keys) keep.push_back(k.second);
    std::sort(keep.begin(), keep.end());
    std::vector<std::string> sample;
    sample.reserve(keep.size());
    for (size_t i : keep) sample.push_back(std::move(lines[i]));
    lines = std::move(sample);
  }
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(opt.seed));
  std::unordered_map<std::string, std::string> args = {
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"model_type", opt.model_type},
      {"character_coverage", std::to_string(opt.character_coverage)},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      // A fixed thread count: the unigram trainer's sums are split by thread.
      {"num_threads", "2"},
      {"pad_id", "0"},
      {"unk_id", "1"},
      {"bos_id", "2"},
      {"eos_id", "3"},
      {"hard_vocab_limit", "false"},
      // Text comes back exactly: no normalization, whitespace kept, unseen characters (and
      // newlines, which training lines lack) as bytes.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"byte_fallback", "true"},
      {"minloglevel", "2"},
  };
  VectorIterator it(lines);
  std::string proto;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &it, &proto);
  if (!st.ok())
    throw Error("[tokenizer] SentencePiece training failed: " + st.ToString() +
                "; check vocab_size against the corpus (every character and the 256 byte pieces need an id)");
  fs::path out(model_path);
  std::error_code ec;
  if (out.has_parent_path()) fs::create_directories(out.parent_path(), ec);
  fs::path tmp = out;
  tmp += ".tmp" + std::to_string(::getpid());  // processes sharing a cache each write their own
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(proto.data(), static_cast<std::streamsize>(proto.size()));
    if (!f) throw Error("[tokenizer] cannot write '" + tmp.string() + "'; check that the directory is writable");
  }
  fs::rename(tmp, out, ec);
  if (ec) throw Error("[tokenizer] cannot move the model to '" + out.string() + "': " + ec.message());
}

}  // namespace px::text
