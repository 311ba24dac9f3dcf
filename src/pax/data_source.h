// The one place pax touches a data pipeline: the built-in copy task, or text through the text
// data module (px::data::TextDataset) when this build has it.
#pragma once

#include <memory>
#include <string>

#include "parallax/data.h"
#include "parallax/pax.h"
#include "parallax/text.h"

namespace px::pax {

class DataSource {
 public:
  virtual ~DataSource() = default;
  virtual data::LmBatch next_train() = 0;
  virtual int64_t num_eval_batches() const = 0;
  virtual data::LmBatch eval_batch(int64_t i) const = 0;
  // The iterator position (JSON), kept in checkpoints so a resumed run sees the same batches.
  virtual std::string state() const = 0;
  virtual void restore(const std::string& state) = 0;
  virtual int64_t vocab_size() const = 0;
  // Text data: its tokenizer; the copy task: none (its tokens are plain ids).
  virtual const text::Tokenizer* tokenizer() const { return nullptr; }
};

// Where text data keeps its trained tokenizer and token cache: data.cache_dir; else DIR/data when a
// job dir prepared before the cache was shared has one; else the shared cache
// $XDG_CACHE_HOME/parallax/data (~/.cache/parallax/data), created if needed; else DIR/data. The files
// there are named by a hash of what determines them (the files' paths, sizes and mtimes, the
// vocabulary size and seed; the tokenizer's bytes for the tokens), so runs on the same data share
// them and a changed corpus gets new ones.
std::string data_cache_dir(const ExperimentConfig& c, const std::string& job_dir);

// Throws px::Error (a user error) for missing paths or a data kind this build lacks. With `log`,
// text data says what it prepares (tokenizer training and tokenization take a while on first
// use), every few seconds while it runs, and how long it took.
std::unique_ptr<DataSource> make_data_source(const ExperimentConfig& c, const std::string& job_dir,
                                             std::ostream* log = nullptr);

}  // namespace px::pax
