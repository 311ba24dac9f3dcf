#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "core/log.h"
#include "data/text_internal.h"
#include "parallax/text_data.h"
#include "testing.h"

namespace fs = std::filesystem;
using px::testing::error_of;
using px::data::LmBatch;
using px::data::TextDataOptions;
using px::data::TextDataset;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("px_test_ds_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// n documents of made-up sentences, distinct from each other (each starts with its number).
std::vector<std::string> make_docs(int n) {
  const std::vector<std::string> words = {"the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran",
                                          "far", "away", "from", "home", "to", "see", "sea", "blue", "sky"};
  std::vector<std::string> docs;
  uint64_t s = 12345;
  for (int d = 0; d < n; ++d) {
    std::string t = "doc " + std::to_string(d);
    int len = 3 + static_cast<int>((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 59);
    for (int w = 0; w < len; ++w) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      t += " " + words[(s >> 33) % words.size()];
    }
    docs.push_back(t + ".");
  }
  return docs;
}

fs::path write_corpus(const fs::path& dir, const std::vector<std::string>& docs) {
  fs::path p = dir / "corpus.txt";
  std::ofstream f(p);
  for (const auto& d : docs) f << d << "\n\n";
  return p;
}

TextDataOptions options(const fs::path& dir, const fs::path& corpus) {
  return {.paths = {corpus.string()}, .cache_dir = (dir / "cache").string(), .vocab_size = 300, .seq_len = 8,
          .batch = 2, .eval_fraction = 0.25, .seed = 3};
}

std::vector<int32_t> ints(const px::Array& a) { return a.to_i32(); }
std::vector<float> floats(const px::Array& a) { return a.to_f32(); }

bool same(const LmBatch& a, const LmBatch& b) {
  return ints(a.tokens) == ints(b.tokens) && ints(a.targets) == ints(b.targets) && floats(a.weights) == floats(b.weights);
}

// The documents of a stream of tokens separated by EOS.
std::vector<std::string> split_stream(const px::text::Tokenizer& tok, const std::vector<int32_t>& stream) {
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int32_t t : stream) {
    if (t == tok.eos_id()) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(t);
    }
  }
  return docs;
}

// The eval split's token stream, read back from the eval batches.
std::vector<int32_t> eval_stream(const TextDataset& ds) {
  std::vector<int32_t> s;
  const int64_t L = ds.options().seq_len;
  for (int64_t b = 0; b < ds.num_eval_batches(); ++b) {
    LmBatch e = ds.eval_batch(b);
    auto tok = ints(e.tokens), tgt = ints(e.targets);
    auto w = floats(e.weights);
    for (int64_t r = 0; r < ds.options().batch; ++r)
      for (int64_t p = 0; p < L; ++p)
        if (w[r * L + p] > 0) {
          if (s.empty()) s.push_back(tok[r * L + p]);
          s.push_back(tgt[r * L + p]);
        }
  }
  return s;
}

}  // namespace

TEST(TextDataset, PacksDocumentsWithEosIntoShiftedSequences) {
  fs::path dir = temp_dir("pack");
  auto docs = make_docs(30);
  TextDataOptions o = options(dir, write_corpus(dir, docs));
  o.eval_fraction = 0;
  o.batch = 1;  // one epoch then visits every sequence once
  TextDataset ds(o);
  const auto& tok = ds.tokenizer();
  std::vector<int32_t> stream;
  for (const auto& d : docs) {
    auto ids = tok.encode(d);
    stream.insert(stream.end(), ids.begin(), ids.end());
    stream.push_back(tok.eos_id());
  }
  const int64_t L = o.seq_len, n = static_cast<int64_t>(stream.size());
  ASSERT_EQ(ds.stats().train_tokens, n);
  ASSERT_EQ(ds.stats().train_sequences, (n - 1 + L - 1) / L);  // every token but the first is a target once
  ASSERT_EQ(ds.stats().batches_per_epoch, ds.stats().train_sequences);
  std::set<int64_t> seen;
  for (int64_t b = 0; b < ds.stats().batches_per_epoch; ++b) {
    LmBatch batch = ds.next_train();
    ASSERT_EQ(batch.tokens.shape(), (px::Shape{1, L}));
    ASSERT_EQ(batch.weights.dtype(), px::DType::f32);
    auto t = ints(batch.tokens), g = ints(batch.targets);
    auto w = floats(batch.weights);
    // Find which sequence this is by its first token position.
    int64_t s = -1;
    for (int64_t c = 0; c * L < n - 1; ++c)
      if (std::equal(t.begin(), t.begin() + std::min<int64_t>(L, n - c * L), stream.begin() + c * L) && !seen.count(c)) {
        s = c;
        break;
      }
    ASSERT_GE(s, 0) << "batch " << b << " is no packed sequence";
    seen.insert(s);
    for (int64_t p = 0; p < L; ++p) {
      const int64_t i = s * L + p;
      if (i + 1 < n) {
        EXPECT_EQ(t[p], stream[i]);
        EXPECT_EQ(g[p], stream[i + 1]);
        EXPECT_EQ(w[p], 1.0f);
      } else {  // the tail of the last sequence: padding, weight 0
        EXPECT_EQ(g[p], tok.pad_id());
        EXPECT_EQ(w[p], 0.0f);
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(seen.size()), ds.stats().train_sequences);
  fs::remove_all(dir);
}

TEST(TextDataset, SplitIsDisjointCompleteAndDeterministic) {
  fs::path dir = temp_dir("split");
  auto docs = make_docs(40);
  TextDataOptions o = options(dir, write_corpus(dir, docs));
  TextDataset a(o), b(o);
  EXPECT_EQ(a.stats().eval_documents, 10);  // 25% of 40
  EXPECT_EQ(a.stats().train_documents, 30);
  ASSERT_EQ(a.num_eval_batches(), b.num_eval_batches());
  for (int64_t i = 0; i < a.num_eval_batches(); ++i) EXPECT_TRUE(same(a.eval_batch(i), b.eval_batch(i)));
  // Eval documents, read back from the eval batches, are whole documents of the corpus.
  auto eval_docs = split_stream(a.tokenizer(), eval_stream(a));
  ASSERT_EQ(eval_docs.size(), 10u);
  std::set<std::string> all(docs.begin(), docs.end()), eval(eval_docs.begin(), eval_docs.end());
  for (const auto& d : eval) EXPECT_TRUE(all.count(d)) << d;
  // Train batches over an epoch never contain an eval document's text.
  std::string train_text;
  for (int64_t i = 0; i < a.stats().batches_per_epoch; ++i) {
    LmBatch t = a.next_train();
    train_text += a.tokenizer().decode(ints(t.tokens)) + " ";
  }
  for (const auto& d : eval) EXPECT_EQ(train_text.find(d), std::string::npos) << d;
  // Another seed draws other eval documents.
  o.seed = 4;
  TextDataset c(o);
  auto other = split_stream(c.tokenizer(), eval_stream(c));
  EXPECT_NE(std::set<std::string>(other.begin(), other.end()), eval);
  fs::remove_all(dir);
}

TEST(TextDataset, EvalCoversTheWholeSplitWithZeroWeightPadding) {
  fs::path dir = temp_dir("evalpad");
  TextDataOptions o = options(dir, write_corpus(dir, make_docs(40)));
  o.batch = 4;
  TextDataset ds(o);
  const int64_t seqs = ds.stats().eval_sequences;
  EXPECT_EQ(ds.num_eval_batches(), (seqs + 3) / 4);
  float weight = 0;
  for (int64_t i = 0; i < ds.num_eval_batches(); ++i)
    for (float w : floats(ds.eval_batch(i).weights)) weight += w;
  EXPECT_EQ(static_cast<int64_t>(weight), ds.stats().eval_tokens - 1);  // every eval target once
  EXPECT_NE(error_of([&] { ds.eval_batch(ds.num_eval_batches()); }).find("is not in [0"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TextDataset, EpochsAreSeededShufflesOfAllSequences) {
  fs::path dir = temp_dir("epochs");
  TextDataOptions o = options(dir, write_corpus(dir, make_docs(40)));
  TextDataset ds(o);
  const int64_t per = ds.stats().batches_per_epoch;
  ASSERT_GE(per, 4);
  std::vector<std::vector<int32_t>> e0, e1;
  for (int64_t i = 0; i < per; ++i) e0.push_back(ints(ds.next_train().tokens));
  for (int64_t i = 0; i < per; ++i) e1.push_back(ints(ds.next_train().tokens));
  EXPECT_NE(e0, e1);  // a new order each epoch
  TextDataset again(o);
  for (int64_t i = 0; i < per; ++i) EXPECT_EQ(ints(again.next_train().tokens), e0[i]);  // same seed, same order
  fs::remove_all(dir);
}

TEST(TextDataset, SliceGivesEachDataParallelGroupItsRows) {
  const int64_t B = 8, L = 3;
  std::vector<int32_t> t(B * L), g(B * L);
  std::vector<float> w(B * L);
  for (int i = 0; i < B * L; ++i) t[i] = i, g[i] = 100 + i, w[i] = i % 2;
  LmBatch b{px::Array::from_i32(t, {B, L}), px::Array::from_i32(g, {B, L}), px::Array::from_f32(w, {B, L})};
  for (int64_t groups : {1, 2, 4, 8})
    for (int64_t grp = 0; grp < groups; ++grp) {
      LmBatch s = px::data::slice(b, grp, groups);
      const int64_t rows = B / groups;
      ASSERT_EQ(s.tokens.shape(), (px::Shape{rows, L}));
      auto st = ints(s.tokens), sg = ints(s.targets);
      auto sw = floats(s.weights);
      for (int64_t i = 0; i < rows * L; ++i) {
        EXPECT_EQ(st[i], t[grp * rows * L + i]);
        EXPECT_EQ(sg[i], g[grp * rows * L + i]);
        EXPECT_EQ(sw[i], w[grp * rows * L + i]);
      }
    }
  EXPECT_NE(error_of([&] { px::data::slice(b, 0, 3); }).find("does not split into 3"), std::string::npos);
  EXPECT_NE(error_of([&] { px::data::slice(b, 4, 4); }).find("group 4 is not in [0, 4)"), std::string::npos);
}

TEST(TextDataset, RestoreContinuesExactlyAsAnUninterruptedRun) {
  fs::path dir = temp_dir("resume");
  TextDataOptions o = options(dir, write_corpus(dir, make_docs(40)));
  TextDataset full(o);
  const int64_t per = full.stats().batches_per_epoch;
  const int64_t k = per - 2, more = 5;  // the continuation crosses an epoch boundary
  std::vector<LmBatch> want;
  std::vector<std::string> states;
  for (int64_t i = 0; i < k + more; ++i) {
    states.push_back(full.state());
    want.push_back(full.next_train());
  }
  const std::string saved = states[k];
  // A fresh dataset (a restarted process) restored from the saved state.
  TextDataset resumed = TextDataset(o);  // movable, like any member of a trainer
  resumed.restore(saved);
  for (int64_t i = 0; i < more; ++i) EXPECT_TRUE(same(resumed.next_train(), want[k + i])) << "batch " << k + i;
  // Restoring a dataset whose thread has already prefetched ahead rewinds it too.
  resumed.restore(saved);
  EXPECT_TRUE(same(resumed.next_train(), want[k]));
  EXPECT_EQ(resumed.state(), states[k + 1]);
  // A state from other options is refused, naming the difference.
  TextDataOptions other = o;
  other.batch = 4;
  TextDataset ds4(other);
  std::string e = error_of([&] { ds4.restore(saved); });
  EXPECT_NE(e.find("batch 2, this dataset has 4"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { ds4.restore("{oops"); }).find("not valid JSON"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TextDataset, TokenizerAndTokensAreReusedFromTheCache) {
  fs::path dir = temp_dir("cache");
  fs::path corpus = write_corpus(dir, make_docs(40));
  TextDataOptions o = options(dir, corpus);
  TextDataset first(o);
  EXPECT_FALSE(first.stats().tokenizer_from_cache);
  EXPECT_FALSE(first.stats().tokens_from_cache);
  int models = 0, token_files = 0;
  std::string model;
  for (auto& f : fs::directory_iterator(o.cache_dir)) {
    models += f.path().extension() == ".model";
    token_files += f.path().extension() == ".bin";
    if (f.path().extension() == ".model") model = f.path().string();
  }
  EXPECT_EQ(models, 1);
  EXPECT_EQ(token_files, 1);
  TextDataset second(o);
  EXPECT_TRUE(second.stats().tokenizer_from_cache);
  EXPECT_TRUE(second.stats().tokens_from_cache);
  EXPECT_TRUE(same(first.next_train(), second.next_train()));
  EXPECT_TRUE(same(first.eval_batch(0), second.eval_batch(0)));
  // A changed corpus is read and tokenized again.
  std::ofstream(corpus, std::ios::app) << "a new document at the end.\n";
  TextDataset third(o);
  EXPECT_FALSE(third.stats().tokens_from_cache);
  EXPECT_EQ(third.stats().documents, 41);
  // A given model (the first run's) is used as it is.
  TextDataOptions given = o;
  given.tokenizer_model = model;
  given.cache_dir = (dir / "other_cache").string();
  TextDataset fourth(given);
  EXPECT_EQ(fourth.tokenizer().encode("the cat sat"), first.tokenizer().encode("the cat sat"));
  fs::remove_all(dir);
}

// The token cache was trusted when its size matched: a header whose sizes wrap around 2^64 gave
// std::bad_alloc, and out-of-vocabulary ids reached training. All of it is checked on read; a bad
// cache is reported (a warning naming the file and the fault) and rebuilt.
TEST(TextDataset, ABadTokenCacheIsRefusedAndRebuilt) {
  fs::path dir = temp_dir("bad_cache");
  fs::path corpus = write_corpus(dir, make_docs(40));
  TextDataOptions o = options(dir, corpus);
  TextDataset clean(o);
  fs::path cache;
  for (auto& f : fs::directory_iterator(o.cache_dir))
    if (f.path().extension() == ".bin") cache = f.path();
  ASSERT_FALSE(cache.empty());
  std::ifstream in(cache, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), {});
  uint64_t nd, nt;
  std::memcpy(&nd, good.data() + 8, 8);
  std::memcpy(&nt, good.data() + 16, 8);
  const int64_t vocab = clean.tokenizer().vocab_size();

  auto with = [&](size_t at, const void* bytes, size_t n) {
    std::string b = good;
    std::memcpy(b.data() + at, bytes, n);
    return b;
  };
  const uint64_t wrap = (uint64_t{1} << 61) + nd;  // 8 * (wrap + 1) == 8 * (nd + 1) mod 2^64
  const int32_t out_of_vocab = static_cast<int32_t>(vocab) + 7, negative = -3;
  const int64_t backwards = 1, short_end = static_cast<int64_t>(nt) - 1;
  const size_t tokens_at = 24 + 8 * (nd + 1), last_offset = 24 + 8 * nd;
  int32_t other_token;
  std::memcpy(&other_token, good.data() + tokens_at, 4);
  other_token = static_cast<int32_t>((other_token + 1) % vocab);
  struct Case {
    std::string bytes, fault;
  };
  const std::vector<Case> cases = {
      {with(8, &wrap, 8), "its header says " + std::to_string(wrap) + " documents and " + std::to_string(nt) +
                              " tokens, more than its " + std::to_string(good.size()) + " bytes hold"},
      {good.substr(0, 20), "20 bytes, shorter than its 24-byte header"},
      {"XXXXXXXX" + good.substr(8), "it does not start with the token cache's magic bytes"},
      {good + "tail",
       "which take " + std::to_string(good.size()) + " bytes, but the file has " + std::to_string(good.size() + 4)},
      {with(tokens_at + 4 * 5, &out_of_vocab, 4), "token 5 is id " + std::to_string(out_of_vocab) +
                                                      ", outside the tokenizer's vocabulary [0, " +
                                                      std::to_string(vocab) + ")"},
      {with(tokens_at, &negative, 4), "token 0 is id -3, outside"},
      {with(24 + 8 * 3, &backwards, 8), "document 2 ends at token 1, outside ["},
      {with(last_offset, &short_end, 8),
       "its documents end at token " + std::to_string(short_end) + " of " + std::to_string(nt)},
      // Overwritten with other tokens of the vocabulary, the same size: only the checksum sees it.
      {with(tokens_at, &other_token, 4),
       "its checksum does not match its contents (overwritten or damaged since it was written)"},
      {"PXTOK01\n" + good.substr(8), "it is of an older format, without a checksum"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fault);
    std::ofstream(cache, std::ios::binary | std::ios::trunc) << c.bytes;
    px::data::TokenizedCorpus corpus_tokens;
    std::string e = error_of([&] { px::data::read_token_cache(cache, vocab, corpus_tokens); });
    EXPECT_EQ(e.rfind("[data] token cache '" + cache.string() + "' is not a valid cache: ", 0), 0u) << e;
    EXPECT_NE(e.find(c.fault), std::string::npos) << e;
    EXPECT_NE(e.find("; delete it and it is rebuilt from the corpus"), std::string::npos) << e;
    std::vector<std::string> warnings;
    px::LogSink old = px::set_log_sink([&](const px::LogRecord& r) { warnings.push_back(r.message); });
    TextDataset again(o);
    px::set_log_sink(old);
    EXPECT_FALSE(again.stats().tokens_from_cache);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_EQ(warnings[0], e + ": rebuilding it now");
    EXPECT_TRUE(same(again.eval_batch(0), clean.eval_batch(0)));
    // Rebuilt: the next run reads it.
    EXPECT_TRUE(TextDataset(o).stats().tokens_from_cache);
  }
  // A FIFO in its place is refused (not waited on) and replaced.
  fs::remove(cache);
  ASSERT_EQ(::mkfifo(cache.c_str(), 0600), 0);
  std::vector<std::string> warnings;
  px::LogSink old = px::set_log_sink([&](const px::LogRecord& r) { warnings.push_back(r.message); });
  EXPECT_FALSE(TextDataset(o).stats().tokens_from_cache);
  px::set_log_sink(old);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("is a FIFO (named pipe), not a regular file"), std::string::npos) << warnings[0];
  EXPECT_TRUE(fs::is_regular_file(cache));
  px::data::TokenizedCorpus missing;
  EXPECT_FALSE(px::data::read_token_cache(dir / "none.bin", vocab, missing));
  fs::remove_all(dir);
}

// The check reads every token once: measured here so that a slow one shows (the budget is
// generous for sanitizer builds).
// next_train from two threads ended the process in std::terminate (both started the worker);
// now a second call while one runs is a px::UserError, and the calls that ran give the batches
// one thread would have had, in order.
TEST(TextDataset, ConcurrentCallsAreAnErrorNotACrash) {
  fs::path dir = temp_dir("threads");
  fs::path corpus = write_corpus(dir, make_docs(60));
  TextDataOptions o = options(dir, corpus);
  TextDataset ds(o), alone(o);
  std::atomic<int> ready{0}, refused{0}, other{0};
  std::vector<std::vector<LmBatch>> got(2);
  auto run = [&](int t) {
    ready.fetch_add(1);
    while (ready.load() < 2) {
    }
    for (int i = 0; i < 300; ++i) {
      try {
        got[t].push_back(ds.next_train());
        if (i % 7 == 0) (void)ds.state();
      } catch (const px::UserError& e) {
        if (std::string(e.what()).find("this text dataset (next_train, state, restore) is already running on "
                                       "another thread") != std::string::npos)
          refused.fetch_add(1);
        else
          other.fetch_add(1);
      } catch (...) {
        other.fetch_add(1);
      }
    }
  };
  std::thread a(run, 0), b(run, 1);
  a.join();
  b.join();
  EXPECT_EQ(other.load(), 0);
  std::printf("%d of 600 calls refused as concurrent\n", refused.load());
  // Every batch handed out is the next one of the sequence, whichever thread got it.
  const size_t n = got[0].size() + got[1].size();
  std::vector<LmBatch> want;
  for (size_t i = 0; i < n; ++i) want.push_back(alone.next_train());
  size_t matched = 0;
  for (const LmBatch& w : want)
    for (auto& g : got)
      if (!g.empty() && same(g.front(), w)) {
        g.erase(g.begin());
        ++matched;
        break;
      }
  EXPECT_EQ(matched, n);
  // A moved-from dataset says so instead of crashing.
  TextDataset moved = std::move(ds);
  EXPECT_NE(error_of([&] { ds.next_train(); }).find("this TextDataset was moved from"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TextDataset, TheTokenCacheCheckIsCheap) {
  fs::path dir = temp_dir("cache_speed");
  px::data::TokenizedCorpus c;
  const int64_t n = 5'000'000;
  c.tokens.resize(n);
  for (int64_t i = 0; i < n; ++i) c.tokens[i] = static_cast<int32_t>(i % 8000);
  c.offsets = {0, n};
  px::data::write_token_cache(dir / "tokens.bin", c);
  px::data::TokenizedCorpus back;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(px::data::read_token_cache(dir / "tokens.bin", 8000, back));
  const double read_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(back.tokens, c.tokens);
  std::printf("read and checked %lld tokens in %.1f ms\n", static_cast<long long>(n), read_s * 1e3);
  EXPECT_LT(read_s, 5.0);
  fs::remove_all(dir);
}

TEST(TextDataset, ClearErrors) {
  fs::path dir = temp_dir("errors");
  TextDataOptions o = options(dir, dir / "missing.txt");
  EXPECT_NE(error_of([&] { TextDataset ds(o); }).find("missing.txt' does not exist"), std::string::npos);
  std::ofstream(dir / "blank.txt") << "\n\n   \n";
  o.paths = {(dir / "blank.txt").string()};
  EXPECT_NE(error_of([&] { TextDataset ds(o); }).find("has no documents"), std::string::npos);
  o.paths = {write_corpus(dir, make_docs(10)).string()};
  o.seq_len = 4096;
  std::string e = error_of([&] { TextDataset ds(o); });
  EXPECT_NE(e.find("sequences of seq_len 4096; a batch of 2 needs 2"), std::string::npos) << e;
  o.seq_len = 0;
  EXPECT_NE(error_of([&] { TextDataset ds(o); }).find("seq_len must be >= 1"), std::string::npos);
  o.seq_len = 8;
  o.eval_fraction = 1.0;
  EXPECT_NE(error_of([&] { TextDataset ds(o); }).find("eval_fraction must be in [0, 1)"), std::string::npos);
  fs::remove_all(dir);
}

TEST(TextDataset, GcidePrefix) {
  fs::path dir = temp_dir("gcide");
  TextDataset ds({.paths = {"gcide"}, .cache_dir = (dir / "cache").string(), .vocab_size = 800, .seq_len = 32,
                  .batch = 4, .eval_fraction = 0.05, .max_documents = 400});
  EXPECT_EQ(ds.stats().documents, 400);
  EXPECT_EQ(ds.stats().eval_documents, 20);
  LmBatch b = ds.next_train();
  std::string text = ds.tokenizer().decode(ints(b.tokens));
  EXPECT_GT(text.size(), 4u * 32);  // pieces longer than one character on average
  EXPECT_EQ(text.find('{'), std::string::npos) << text;
  fs::remove_all(dir);
}
