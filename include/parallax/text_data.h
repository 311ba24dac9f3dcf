// Language-model batches from real text: documents read from files (plain text, JSON lines,
// gzip, or the GCIDE dictionary), tokenized with SentencePiece, concatenated with EOS, packed into
// fixed-length sequences, split into train and eval, shuffled per epoch, resumable.
//
//   px::data::TextDataset ds({.paths = {"gcide"}, .cache_dir = "data_cache", .seq_len = 128, .batch = 8});
//   px::data::LmBatch b = ds.next_train();             // tokens, targets i32[8, 128]; weights f32[8, 128]
//   px::data::LmBatch mine = px::data::slice(b, 1, 4);  // data-parallel group 1 of 4: rows 2..3
//   std::string pos = ds.state();                       // save with the checkpoint; ds.restore(pos) resumes
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "parallax/data.h"
#include "parallax/text.h"

namespace px::data {

struct TextDataOptions {
  std::vector<std::string> paths;  // files or dirs: .txt, .jsonl (field "text"), .gz of either; "gcide" = the Debian dict-gcide corpus
  std::string tokenizer_model;     // a SentencePiece .model; empty: train one on the corpus (cached in cache_dir)
  std::string cache_dir;           // empty: nothing is cached (the tokenizer is trained in a temporary file)
  int64_t vocab_size = 8000;
  int64_t seq_len = 128;
  int64_t batch = 8;  // global batch
  double eval_fraction = 0.01;
  uint64_t seed = 0;
  int64_t max_documents = 0;  // 0 = all
  // A document is held whole to be tokenized: one longer than this is an error naming the file
  // and line (a file without blank lines would otherwise be one document of its whole size).
  int64_t max_document_bytes = int64_t{64} << 20;
  int64_t prefetch = 4;       // batches the background thread prepares ahead
};

// Reads the documents of `paths` in order (directories recursively, files sorted by path; "gcide"
// for the installed dictionary), at most `max_documents` of them (0: all). Throws px::Error naming
// the path (and line) at fault, also for a document longer than `max_document_bytes`.
std::vector<std::string> read_documents(const std::vector<std::string>& paths, int64_t max_documents = 0,
                                        int64_t max_document_bytes = int64_t{64} << 20);

// The installed GCIDE dictionary (/usr/share/dictd/gcide.dict.dz) as documents, one per entry,
// markup stripped to plain text.
std::string gcide_path();
std::vector<std::string> read_gcide(int64_t max_documents = 0);

// Rows [group * B / groups, (group + 1) * B / groups) of a global batch of B rows: the part of
// data-parallel group `group`. B must be divisible by `groups`.
LmBatch slice(const LmBatch& batch, int64_t group, int64_t groups);

struct TextDatasetStats {
  int64_t documents = 0, train_documents = 0, eval_documents = 0;
  int64_t train_tokens = 0, eval_tokens = 0;        // with the EOS separators
  int64_t train_sequences = 0, eval_sequences = 0;  // of seq_len targets each
  int64_t batches_per_epoch = 0;
  bool tokenizer_from_cache = false, tokens_from_cache = false;
  // Wall seconds of the constructor's phases (0 for a phase served from the cache) and in all.
  double read_seconds = 0, tokenizer_seconds = 0, tokenize_seconds = 0, total_seconds = 0;
};

// Threads: next_train, state and restore run one call at a time; a second call from another
// thread while one runs throws px::UserError ("already running on another thread"). tokenizer,
// options, stats, num_eval_batches and eval_batch may be called from any thread.
class TextDataset {
 public:
  explicit TextDataset(TextDataOptions opt);
  ~TextDataset();
  TextDataset(TextDataset&&) noexcept;
  TextDataset& operator=(TextDataset&&) noexcept;

  const text::Tokenizer& tokenizer() const;
  const TextDataOptions& options() const;
  const TextDatasetStats& stats() const;

  // The next global training batch: tokens/targets i32[batch, seq_len], weights f32[batch, seq_len].
  // Epochs run forever, each a new seeded shuffle of the training sequences.
  LmBatch next_train();
  // The whole eval split in fixed order; rows past its end are padding with weight 0.
  int64_t num_eval_batches() const;
  LmBatch eval_batch(int64_t i) const;

  // The iterator's position (epoch, index in epoch) as JSON; restore() continues from it, so the
  // batches that follow are those an uninterrupted run would have seen.
  std::string state() const;
  void restore(const std::string& state);

 private:
  struct Impl;
  Impl& impl() const;  // throws px::UserError on a moved-from dataset
  std::unique_ptr<Impl> impl_;
};

}  // namespace px::data
