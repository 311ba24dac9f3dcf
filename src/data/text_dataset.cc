// TextDataset: documents -> tokens (cached) -> train/eval split -> packed sequences -> shuffled
// global batches, prepared ahead by a background thread.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unistd.h>

#include "core/exclusive.h"
#include "core/log.h"
#include "data/text_internal.h"
#include "io/crc32c.h"
#include "io/regular_file.h"
#include "parallax/text_data.h"

namespace px::data {

namespace fs = std::filesystem;

namespace {

uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string hex(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// A seeded permutation of 0..n-1 (Fisher-Yates over splitmix64: the same on every platform).
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[i] = i;
  uint64_t state = mix(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    state = mix(state);
    std::swap(p[i], p[static_cast<int64_t>(state % static_cast<uint64_t>(i + 1))]);
  }
  return p;
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Identifies the corpus by its files' paths, sizes and modification times (no reading), so a
// cached tokenizer or token file is found without touching the text.
std::string corpus_key(const std::vector<fs::path>& files, int64_t max_documents) {
  std::string k = "corpus-v1|max=" + std::to_string(max_documents);
  for (const auto& f : files) {
    fs::path p = f == "gcide" ? fs::path(gcide_path()) : f;
    std::error_code ec;
    fs::path canon = fs::weakly_canonical(p, ec);
    auto size = fs::file_size(p, ec);
    auto mtime = fs::last_write_time(p, ec).time_since_epoch().count();
    k += "|" + (ec ? p.string() : canon.string()) + ":" + std::to_string(size) + ":" + std::to_string(mtime);
  }
  return k;
}

// The crc32c of a token cache's bytes before its checksum.
uint32_t token_cache_checksum(const char* magic, uint64_t nd, uint64_t nt, const TokenizedCorpus& c) {
  uint32_t crc = io::crc32c(magic, 8);
  crc = io::crc32c(&nd, 8, crc);
  crc = io::crc32c(&nt, 8, crc);
  crc = io::crc32c(c.offsets.data(), 8 * (nd + 1), crc);
  return io::crc32c(c.tokens.data(), 4 * nt, crc);
}

}  // namespace

bool read_token_cache(const fs::path& path, int64_t vocab_size, TokenizedCorpus& out) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  const std::string where = "[data] token cache '" + path.string() + "'";
  io::require_regular_file(path.string(), "[data] token cache ");
  auto bad = [&](const std::string& what) {
    throw Error(where + " is not a valid cache: " + what + "; delete it and it is rebuilt from the corpus");
  };
  const uint64_t size = fs::file_size(path, ec);
  if (ec) bad("cannot read its size (" + ec.message() + ")");
  std::ifstream f(path, std::ios::binary);
  if (!f) bad("cannot be opened");
  char magic[8];
  uint64_t nd = 0, nt = 0;
  f.read(magic, 8);
  f.read(reinterpret_cast<char*>(&nd), 8);
  f.read(reinterpret_cast<char*>(&nt), 8);
  if (!f || size < 24) bad(std::to_string(size) + " bytes, shorter than its 24-byte header");
  if (std::memcmp(magic, "PXTOK01\n", 8) == 0) bad("it is of an older format, without a checksum");
  if (std::memcmp(magic, kTokenMagic, 8) != 0) bad("it does not start with the token cache's magic bytes");
  if (size < 28) bad(std::to_string(size) + " bytes, shorter than its header and checksum");
  // The counts are bounded by the file's size before anything is sized by them.
  const uint64_t body = size - 28;
  const std::string counts =
      "its header says " + std::to_string(nd) + " documents and " + std::to_string(nt) + " tokens";
  if (nd >= body / 8 || nt > (body - 8 * (nd + 1)) / 4)
    bad(counts + ", more than its " + std::to_string(size) + " bytes hold");
  if (body != 8 * (nd + 1) + 4 * nt)
    bad(counts + ", which take " + std::to_string(28 + 8 * (nd + 1) + 4 * nt) + " bytes, but the file has " +
        std::to_string(size));
  out.offsets.resize(nd + 1);
  out.tokens.resize(nt);
  f.read(reinterpret_cast<char*>(out.offsets.data()), static_cast<std::streamsize>(8 * (nd + 1)));
  f.read(reinterpret_cast<char*>(out.tokens.data()), static_cast<std::streamsize>(4 * nt));
  if (!f) bad("it is shorter than its size says");
  if (out.offsets[0] != 0) bad("document 0 starts at token " + std::to_string(out.offsets[0]) + ", not 0");
  for (uint64_t d = 0; d < nd; ++d)
    if (out.offsets[d + 1] < out.offsets[d] || out.offsets[d + 1] > static_cast<int64_t>(nt))
      bad("document " + std::to_string(d) + " ends at token " + std::to_string(out.offsets[d + 1]) + ", outside [" +
          std::to_string(out.offsets[d]) + ", " + std::to_string(nt) + "]");
  if (out.offsets[nd] != static_cast<int64_t>(nt))
    bad("its documents end at token " + std::to_string(out.offsets[nd]) + " of " + std::to_string(nt));
  // One pass over the tokens, branch-free per element (a few ms for tens of millions).
  const int32_t* t = out.tokens.data();
  const uint32_t limit = static_cast<uint32_t>(std::clamp<int64_t>(vocab_size, 0, INT32_MAX));
  bool all_in = true;
  for (uint64_t i = 0; i < nt; ++i) all_in &= static_cast<uint32_t>(t[i]) < limit;
  if (!all_in)
    for (uint64_t i = 0; i < nt; ++i)
      if (static_cast<uint32_t>(t[i]) >= limit)
        bad("token " + std::to_string(i) + " is id " + std::to_string(t[i]) +
            ", outside the tokenizer's vocabulary [0, " + std::to_string(vocab_size) + ")");
  uint32_t stored = 0;
  f.read(reinterpret_cast<char*>(&stored), 4);
  if (!f) bad("it is shorter than its size says");
  if (stored != token_cache_checksum(magic, nd, nt, out))
    bad("its checksum does not match its contents (overwritten or damaged since it was written)");
  return true;
}

void write_token_cache(const fs::path& path, const TokenizedCorpus& c) {
  fs::path tmp = path;
  tmp += ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    uint64_t nd = c.documents(), nt = c.tokens.size();
    f.write(kTokenMagic, 8);
    f.write(reinterpret_cast<const char*>(&nd), 8);
    f.write(reinterpret_cast<const char*>(&nt), 8);
    f.write(reinterpret_cast<const char*>(c.offsets.data()), static_cast<std::streamsize>(8 * (nd + 1)));
    f.write(reinterpret_cast<const char*>(c.tokens.data()), static_cast<std::streamsize>(4 * nt));
    const uint32_t crc = token_cache_checksum(kTokenMagic, nd, nt, c);
    f.write(reinterpret_cast<const char*>(&crc), 4);
    if (!f) throw Error("[data] cannot write the token cache '" + tmp.string() + "'; check that cache_dir is writable");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error("[data] cannot move the token cache to '" + path.string() + "': " + ec.message());
}

namespace {

// Tokenizes documents on all cores; the result does not depend on the thread count.
TokenizedCorpus tokenize(const text::Tokenizer& tok, const std::vector<std::string>& docs) {
  std::vector<std::vector<int32_t>> ids(docs.size());
  const size_t threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(threads);
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        for (size_t d = t; d < docs.size(); d += threads) ids[d] = tok.encode(docs[d]);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  TokenizedCorpus c;
  size_t total = 0;
  for (auto& v : ids) total += v.size();
  c.tokens.reserve(total);
  c.offsets.reserve(docs.size() + 1);
  for (auto& v : ids) {
    c.tokens.insert(c.tokens.end(), v.begin(), v.end());
    c.offsets.push_back(static_cast<int64_t>(c.tokens.size()));
  }
  return c;
}

std::string join_paths(const std::vector<std::string>& paths) {
  std::string s;
  for (const auto& p : paths) s += (s.empty() ? "" : ", ") + p;
  return s;
}

}  // namespace

LmBatch slice(const LmBatch& batch, int64_t group, int64_t groups) {
  const Shape& shape = batch.tokens.shape();
  if (shape.size() != 2) throw Error("[data.slice] expected a batch of rank 2 [batch, seq_len]");
  const int64_t rows = shape[0], cols = shape[1];
  if (groups < 1 || group < 0 || group >= groups)
    throw Error("[data.slice] group " + std::to_string(group) + " is not in [0, " + std::to_string(groups) + ")");
  if (rows % groups != 0)
    throw Error("[data.slice] the global batch of " + std::to_string(rows) + " rows does not split into " +
                std::to_string(groups) + " data-parallel groups; make the batch a multiple of " +
                std::to_string(groups));
  const int64_t per = rows / groups, first = group * per;
  auto cut = [&](const Array& a) {
    Array out(a.dtype(), {per, cols});
    const int64_t row_bytes = cols * dtype_size(a.dtype());
    std::memcpy(out.raw(), static_cast<const std::byte*>(a.raw()) + first * row_bytes,
                static_cast<size_t>(per * row_bytes));
    return out;
  };
  return {cut(batch.tokens), cut(batch.targets), cut(batch.weights)};
}

struct TextDataset::Impl {
  TextDataOptions opt;
  std::unique_ptr<text::Tokenizer> tok;
  TextDatasetStats stats;
  std::vector<int32_t> train_stream, eval_stream;  // documents joined by the separator
  int32_t pad = 0;

  // Consumer position: the next batch next_train() returns.
  int64_t epoch = 0, index = 0;
  // next_train, state and restore run one call at a time (ExclusiveCall): they move or read the
  // position and start or stop the worker.
  mutable std::atomic<bool> busy{false};

  // The background producer and its bounded queue.
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<LmBatch> queue;
  bool stop = false;
  std::exception_ptr error;

  ~Impl() { stop_worker(); }

  int64_t sequences(const std::vector<int32_t>& stream) const {
    return stream.size() < 2 ? 0 : (static_cast<int64_t>(stream.size()) - 2) / opt.seq_len + 1;
  }

  // Row r of `out` from sequence s of `stream` (-1: a padding row). Positions past the stream's
  // end are padding with weight 0.
  void fill_row(LmBatch& out, int64_t r, const std::vector<int32_t>& stream, int64_t s) const {
    const int64_t L = opt.seq_len, n = static_cast<int64_t>(stream.size());
    int32_t* tokens = out.tokens.data<int32_t>() + r * L;
    int32_t* targets = out.targets.data<int32_t>() + r * L;
    float* weights = out.weights.data<float>() + r * L;
    for (int64_t p = 0; p < L; ++p) {
      const int64_t i = s * L + p;
      const bool ok = s >= 0 && i + 1 < n;
      tokens[p] = s >= 0 && i < n ? stream[i] : pad;
      targets[p] = ok ? stream[i + 1] : pad;
      weights[p] = ok ? 1.0f : 0.0f;
    }
  }

  LmBatch empty_batch() const {
    return {Array(DType::i32, {opt.batch, opt.seq_len}), Array(DType::i32, {opt.batch, opt.seq_len}),
            Array(DType::f32, {opt.batch, opt.seq_len})};
  }

  std::vector<int64_t> epoch_order(int64_t e) const {
    return permutation(stats.train_sequences, mix(opt.seed ^ 0x5eed0f5e9ull) + static_cast<uint64_t>(e));
  }

  LmBatch make_train(const std::vector<int64_t>& order, int64_t i) const {
    LmBatch b = empty_batch();
    for (int64_t r = 0; r < opt.batch; ++r) fill_row(b, r, train_stream, order[i * opt.batch + r]);
    return b;
  }

  void produce(int64_t e, int64_t i) {
    try {
      std::vector<int64_t> order = epoch_order(e);
      while (true) {
        LmBatch b = make_train(order, i);
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || static_cast<int64_t>(queue.size()) < opt.prefetch; });
          if (stop) return;
          queue.push_back(std::move(b));
        }
        cv.notify_all();
        if (++i == stats.batches_per_epoch) {
          i = 0;
          order = epoch_order(++e);
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
      cv.notify_all();
    }
  }

  void start_worker() {
    stop = false;
    worker = std::thread([this, e = epoch, i = index] { produce(e, i); });
  }

  void stop_worker() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (worker.joinable()) worker.join();
    queue.clear();
    error = nullptr;
  }
};

TextDataset::TextDataset(TextDataOptions opt) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  using clock = std::chrono::steady_clock;
  const auto t_start = clock::now();
  auto since = [](clock::time_point t) { return std::chrono::duration<double>(clock::now() - t).count(); };
  if (opt.seq_len < 1) throw Error("[data] seq_len must be >= 1, got " + std::to_string(opt.seq_len));
  if (opt.batch < 1) throw Error("[data] batch must be >= 1, got " + std::to_string(opt.batch));
  if (!(opt.eval_fraction >= 0.0 && opt.eval_fraction < 1.0))
    throw Error("[data] eval_fraction must be in [0, 1), got " + std::to_string(opt.eval_fraction));
  if (opt.max_documents < 0) throw Error("[data] max_documents must be >= 0 (0: all), got " + std::to_string(opt.max_documents));
  if (opt.prefetch < 1) throw Error("[data] prefetch must be >= 1, got " + std::to_string(opt.prefetch));
  m.opt = std::move(opt);
  const TextDataOptions& o = m.opt;

  const std::vector<fs::path> files = expand_paths(o.paths);
  const std::string ckey = corpus_key(files, o.max_documents);
  fs::path cache = o.cache_dir;
  if (!cache.empty()) {
    std::error_code ec;
    fs::create_directories(cache, ec);
    if (ec || !fs::is_directory(cache))
      throw Error("[data] cannot create cache_dir '" + o.cache_dir + "': " + ec.message());
  }

  // Documents are read at most once, and only when something is not cached.
  std::vector<std::string> docs;
  bool docs_read = false;
  auto documents = [&]() -> const std::vector<std::string>& {
    if (!docs_read) {
      const auto t = clock::now();
      for (const auto& f : files) {
        if (o.max_documents > 0 && static_cast<int64_t>(docs.size()) >= o.max_documents) break;
        read_file_documents(f, docs, o.max_documents, o.max_document_bytes);
      }
      docs_read = true;
      m.stats.read_seconds = since(t);
      if (docs.empty()) throw Error("[data] the corpus (" + join_paths(o.paths) + ") has no documents; check the paths");
    }
    return docs;
  };

  // Tokenizer: the given model, or one trained on the corpus (cached by corpus and options).
  std::string model_path = o.tokenizer_model;
  if (model_path.empty()) {
    const std::string name =
        "spm-" + hex(fnv1a(ckey + "|spm-v1|vocab=" + std::to_string(o.vocab_size) + "|seed=" + std::to_string(o.seed))) +
        ".model";
    std::error_code ec;
    if (!cache.empty() && fs::exists(cache / name, ec)) {
      // A cached model that does not load (damaged, or not a regular file) is trained again.
      try {
        m.tok = text::load_tokenizer((cache / name).string());
        model_path = (cache / name).string();
        m.stats.tokenizer_from_cache = true;
      } catch (const Error& e) {
        PX_LOG(warn) << e.what() << ": training it again";
        m.tok.reset();
      }
    }
    if (!m.tok) {
      // train_sentencepiece writes a temporary file and renames it: a run sharing the cache never
      // reads half a model.
      fs::path out =
          cache.empty() ? fs::temp_directory_path() / ("px-" + std::to_string(::getpid()) + "-" + name) : cache / name;
      const auto& d = documents();
      const auto t = clock::now();
      text::train_sentencepiece(d, out.string(), {.vocab_size = o.vocab_size, .seed = o.seed});
      m.stats.tokenizer_seconds = since(t);
      model_path = out.string();
      m.tok = text::load_tokenizer(model_path);
    }
    if (cache.empty()) fs::remove(model_path, ec);
  } else {
    m.tok = text::load_tokenizer(model_path);
  }
  const int32_t sep = m.tok->eos_id();
  if (sep < 0)
    throw Error("[data] tokenizer '" + model_path + "' has no EOS token to separate documents; use a model with one");
  m.pad = m.tok->pad_id() >= 0 ? m.tok->pad_id() : 0;

  // Tokens of every document, cached by corpus and tokenizer.
  TokenizedCorpus corpus;
  fs::path token_file;
  if (!cache.empty())
    token_file = cache / ("tokens-" + hex(fnv1a(ckey + "|tok=" + hex(fnv1a(file_bytes(model_path))))) + ".bin");
  bool cached = false;
  if (!token_file.empty()) {
    try {
      cached = read_token_cache(token_file, m.tok->vocab_size(), corpus);
    } catch (const Error& e) {
      PX_LOG(warn) << e.what() << ": rebuilding it now";
      corpus = TokenizedCorpus();
    }
  }
  if (cached) {
    m.stats.tokens_from_cache = true;
  } else {
    const auto& d = documents();
    const auto t = clock::now();
    corpus = tokenize(*m.tok, d);
    m.stats.tokenize_seconds = since(t);
    if (!token_file.empty()) write_token_cache(token_file, corpus);
  }
  const int64_t nd = corpus.documents();
  if (nd == 0) throw Error("[data] the corpus (" + join_paths(o.paths) + ") has no documents; check the paths");

  // Split by document: a seeded permutation picks the eval documents; both keep corpus order.
  int64_t n_eval = 0;
  if (o.eval_fraction > 0) {
    if (nd < 2)
      throw Error("[data] the corpus has 1 document; eval_fraction > 0 needs at least 2 (add documents or set "
                  "eval_fraction = 0)");
    n_eval = std::clamp<int64_t>(static_cast<int64_t>(o.eval_fraction * static_cast<double>(nd) + 0.5), 1, nd - 1);
  }
  std::vector<char> is_eval(static_cast<size_t>(nd), 0);
  std::vector<int64_t> perm = permutation(nd, mix(o.seed ^ 0x5911755911ull));
  for (int64_t i = 0; i < n_eval; ++i) is_eval[perm[i]] = 1;
  for (int64_t d = 0; d < nd; ++d) {
    auto& stream = is_eval[d] ? m.eval_stream : m.train_stream;
    stream.insert(stream.end(), corpus.tokens.begin() + corpus.offsets[d], corpus.tokens.begin() + corpus.offsets[d + 1]);
    stream.push_back(sep);
  }

  TextDatasetStats& s = m.stats;
  s.documents = nd;
  s.eval_documents = n_eval;
  s.train_documents = nd - n_eval;
  s.train_tokens = static_cast<int64_t>(m.train_stream.size());
  s.eval_tokens = static_cast<int64_t>(m.eval_stream.size());
  s.train_sequences = m.sequences(m.train_stream);
  s.eval_sequences = m.sequences(m.eval_stream);
  s.batches_per_epoch = s.train_sequences / o.batch;
  s.total_seconds = since(t_start);
  if (s.batches_per_epoch == 0)
    throw Error("[data] the training split has " + std::to_string(s.train_tokens) + " tokens, " +
                std::to_string(s.train_sequences) + " sequences of seq_len " + std::to_string(o.seq_len) +
                "; a batch of " + std::to_string(o.batch) + " needs " + std::to_string(o.batch) +
                ": lower batch or seq_len, or add documents");
}

TextDataset::~TextDataset() = default;
TextDataset::TextDataset(TextDataset&&) noexcept = default;  // the worker thread uses the Impl, which stays put
TextDataset& TextDataset::operator=(TextDataset&&) noexcept = default;

TextDataset::Impl& TextDataset::impl() const {
  if (!impl_) throw UserError("[data] this TextDataset was moved from; use the dataset it was moved to");
  return *impl_;
}

const text::Tokenizer& TextDataset::tokenizer() const { return *impl().tok; }
const TextDataOptions& TextDataset::options() const { return impl().opt; }
const TextDatasetStats& TextDataset::stats() const { return impl().stats; }

LmBatch TextDataset::next_train() {
  Impl& m = impl();
  ExclusiveCall call(m.busy, "text dataset (next_train, state, restore)");
  if (!m.worker.joinable()) m.start_worker();
  LmBatch b;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.cv.wait(lock, [&] { return !m.queue.empty() || m.error; });
    if (m.queue.empty()) std::rethrow_exception(m.error);
    b = std::move(m.queue.front());
    m.queue.pop_front();
  }
  m.cv.notify_all();
  if (++m.index == m.stats.batches_per_epoch) {
    m.index = 0;
    ++m.epoch;
  }
  return b;
}

int64_t TextDataset::num_eval_batches() const {
  return (impl().stats.eval_sequences + impl().opt.batch - 1) / impl().opt.batch;
}

LmBatch TextDataset::eval_batch(int64_t i) const {
  const Impl& m = impl();
  if (i < 0 || i >= num_eval_batches())
    throw Error("[data] eval batch " + std::to_string(i) + " is not in [0, " + std::to_string(num_eval_batches()) +
                ")" + (num_eval_batches() == 0 ? "; the eval split is empty (eval_fraction = 0)" : ""));
  LmBatch b = m.empty_batch();
  for (int64_t r = 0; r < m.opt.batch; ++r) {
    const int64_t s = i * m.opt.batch + r;
    m.fill_row(b, r, m.eval_stream, s < m.stats.eval_sequences ? s : -1);
  }
  return b;
}

std::string TextDataset::state() const {
  const Impl& m = impl();
  ExclusiveCall call(m.busy, "text dataset (next_train, state, restore)");
  nlohmann::json j = {{"epoch", m.epoch},
                      {"index", m.index},
                      {"seed", m.opt.seed},
                      {"batch", m.opt.batch},
                      {"seq_len", m.opt.seq_len},
                      {"train_sequences", m.stats.train_sequences}};
  return j.dump();
}

void TextDataset::restore(const std::string& state) {
  Impl& m = impl();
  ExclusiveCall call(m.busy, "text dataset (next_train, state, restore)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(state);
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("[data] the saved data state is not valid JSON (") + e.what() + ")");
  }
  auto field = [&](const char* name) -> int64_t {
    if (!j.is_object() || !j.contains(name) || !j[name].is_number_integer())
      throw Error(std::string("[data] the saved data state lacks the integer field '") + name + "'");
    return j[name].get<int64_t>();
  };
  auto same = [&](const char* name, int64_t now) {
    int64_t saved = field(name);
    if (saved != now)
      throw Error(std::string("[data] the saved data state has ") + name + " " + std::to_string(saved) +
                  ", this dataset has " + std::to_string(now) +
                  "; resuming with the same batches needs the same data, seed, batch and seq_len");
  };
  same("seed", static_cast<int64_t>(m.opt.seed));
  same("batch", m.opt.batch);
  same("seq_len", m.opt.seq_len);
  same("train_sequences", m.stats.train_sequences);
  const int64_t e = field("epoch"), i = field("index");
  if (e < 0 || i < 0 || i >= m.stats.batches_per_epoch)
    throw Error("[data] the saved data position (epoch " + std::to_string(e) + ", index " + std::to_string(i) +
                ") is out of range");
  m.stop_worker();
  m.epoch = e;
  m.index = i;
}

}  // namespace px::data
