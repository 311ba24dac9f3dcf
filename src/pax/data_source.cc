// Designated initializers leave the fields they do not name at their defaults, on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "pax/data_source.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <ostream>
#include <thread>

#if __has_include("parallax/text_data.h")
#include "core/env.h"
#include "io/json_number.h"
#include "parallax/text.h"
#include "parallax/text_data.h"
#define PX_PAX_HAVE_TEXT_DATA 1
#endif

namespace px::pax {
namespace {

class CopySource : public DataSource {
 public:
  explicit CopySource(const ExperimentConfig& c)
      : train_{.batch = c.data.batch, .seq_len = c.model.seq_len, .vocab = c.model.vocab_size, .seed = c.train.seed},
        eval_(train_),
        n_eval_(c.data.copy_eval_batches) {
    eval_.seed = c.train.seed + 1000003;  // a fixed eval set, disjoint from the train stream's seed
  }
  data::LmBatch next_train() override { return data::copy_task(train_, next_++); }
  int64_t num_eval_batches() const override { return n_eval_; }
  data::LmBatch eval_batch(int64_t i) const override { return data::copy_task(eval_, i); }
  std::string state() const override { return nlohmann::json{{"kind", "copy_task"}, {"next", next_}}.dump(); }
  void restore(const std::string& s) override {
    try {
      next_ = json_int(nlohmann::json::parse(s).at("next"), "next");
    } catch (const std::exception& e) {
      throw Error("[pax] checkpoint data state '" + s + "' is not a copy_task position: " + e.what());
    }
  }
  int64_t vocab_size() const override { return train_.vocab; }

 private:
  data::CopyTaskOptions train_, eval_;
  int64_t n_eval_ = 1;
  int64_t next_ = 0;
};

}  // namespace

std::string data_cache_dir(const ExperimentConfig& c, const std::string& job_dir) {
  namespace fs = std::filesystem;
  if (!c.data.cache_dir.empty()) return c.data.cache_dir;
  // A job dir prepared before the cache was shared keeps reading its own.
  std::error_code ec;
  if (!job_dir.empty() && fs::is_directory(fs::path(job_dir) / "data", ec)) return job_dir + "/data";
  const fs::path base = user_cache_dir();
  if (!base.empty()) {
    const fs::path shared = base / "parallax" / "data";
    fs::create_directories(shared, ec);
    if (!ec && fs::is_directory(shared, ec)) return shared.string();
  }
  return job_dir + "/data";  // no writable shared cache: the job dir's own
}

namespace {

#ifdef PX_PAX_HAVE_TEXT_DATA
class TextSource : public DataSource {
 public:
  TextSource(const ExperimentConfig& c, const std::string& job_dir) : ds_(options(c, job_dir)) {}
  const data::TextDatasetStats& stats() const { return ds_.stats(); }
  data::LmBatch next_train() override { return ds_.next_train(); }
  int64_t num_eval_batches() const override { return ds_.num_eval_batches(); }
  data::LmBatch eval_batch(int64_t i) const override { return ds_.eval_batch(i); }
  std::string state() const override { return ds_.state(); }
  void restore(const std::string& s) override { ds_.restore(s); }
  int64_t vocab_size() const override { return ds_.tokenizer().vocab_size(); }
  const text::Tokenizer* tokenizer() const override { return &ds_.tokenizer(); }

 private:
  static data::TextDataOptions options(const ExperimentConfig& c, const std::string& job_dir) {
    data::TextDataOptions o;
    o.paths = c.data.paths;
    o.tokenizer_model = c.tokenizer.model;
    o.cache_dir = data_cache_dir(c, job_dir);
    o.vocab_size = c.model.vocab_size;
    o.seq_len = c.model.seq_len;
    o.batch = c.data.batch;
    o.eval_fraction = c.data.eval_fraction;
    o.seed = c.train.seed;
    o.max_documents = c.data.max_documents;
    o.max_document_bytes = c.data.max_document_bytes;
    return o;
  }
  data::TextDataset ds_;
};

// Says every `every` seconds that the data is still being prepared, until destroyed.
class Ticker {
 public:
  Ticker(std::ostream* log, double every) : log_(log) {
    if (!log_) return;
    thread_ = std::thread([this, every] {
      const auto t0 = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(mu_);
      while (!cv_.wait_for(lock, std::chrono::duration<double>(every), [this] { return done_; })) {
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        char buf[96];
        std::snprintf(buf, sizeof buf, "data: still preparing (%.0f s)\n", s);
        *log_ << buf << std::flush;
      }
    });
  }
  ~Ticker() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::ostream* log_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

std::string secs(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}
#endif

}  // namespace

std::unique_ptr<DataSource> make_data_source(const ExperimentConfig& c, const std::string& job_dir, std::ostream* log) {
  if (c.data.kind == "copy_task") return std::make_unique<CopySource>(c);
  const std::string who = c.name.empty() ? "this experiment" : c.name;
  if (c.data.paths.empty())
    throw Error("[pax] " + who + " reads text from data.paths, which is empty; give files or folders of .txt or " +
                ".jsonl(.gz) (C4's layout) with --set data.paths=/path/to/c4/en");
  for (const std::string& p : c.data.paths)
    if (p != "gcide" && !std::filesystem::exists(p))
      throw Error("[pax] data.paths: '" + p + "' does not exist; give existing files or folders (or 'gcide')");
#ifdef PX_PAX_HAVE_TEXT_DATA
  std::unique_ptr<TextSource> src;
  const std::string cache = data_cache_dir(c, job_dir);
  if (log)
    *log << "data: preparing " << c.data.paths.size() << " path" << (c.data.paths.size() == 1 ? "" : "s")
         << " (a tokenizer is trained and the text tokenized on first use, then read from the cache " << cache
         << ", shared by runs on the same files and settings; data.cache_dir overrides)\n"
         << std::flush;
  {
    Ticker ticker(log, 5.0);
    src = std::make_unique<TextSource>(c, job_dir);
  }
  if (log) {
    const data::TextDatasetStats& st = src->stats();
    *log << "data: " << st.documents << " documents, " << st.train_tokens << " train and " << st.eval_tokens
         << " eval tokens; tokenizer "
         << (st.tokenizer_from_cache || !c.tokenizer.model.empty() ? std::string("read")
                                                                   : "trained in " + secs(st.tokenizer_seconds))
         << ", text "
         << (st.tokens_from_cache ? std::string("read from the token cache")
                                  : "tokenized in " + secs(st.tokenize_seconds))
         << "; " << secs(st.total_seconds) << " in all\n"
         << std::flush;
  }
  if (src->vocab_size() != c.model.vocab_size)
    throw Error("[pax] the tokenizer has " + std::to_string(src->vocab_size()) + " tokens but model.vocab_size=" +
                std::to_string(c.model.vocab_size) + "; set --set model.vocab_size=" +
                std::to_string(src->vocab_size()));
  return src;
#else
  throw Error("[pax] data.kind=text needs the text data module (px::data::TextDataset in parallax/text_data.h), "
              "which this build does not have yet; run an experiment on the copy task, e.g. copy.TransformerLmTiny");
#endif
}

}  // namespace px::pax
