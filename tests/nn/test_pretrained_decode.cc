// generate(): the cached prefill + one-token decode programs give what recomputing the whole
// sequence gives (greedy and sampled, with rotary scaling, GQA, a sliding window and learned
// positions); prompts of different lengths in one batch decode as each alone; several EOS ids;
// sampling options behave; bad requests are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <set>

#include "parallax/nn/pretrained.h"
#include "testing.h"

namespace px::nn {
namespace {

LmConfig windowed_llama() {
  LmConfig c = llama_config("llama", 50, 32, 4, 2, 2, 48, 40);
  c.sliding_window = 5;
  c.rope_scaling = {RopeScaling::Kind::llama3, 4.0, 1.0, 4.0, 8};
  c.init_std = 0.3;  // varied continuations
  return c;
}

LmConfig small_gpt2() {
  LmConfig c = gpt2_config("gpt2", 50, 32, 4, 2, 64, 40);
  c.init_std = 0.3;
  return c;
}

const std::vector<std::vector<int32_t>> kPrompts{{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}};

TEST(Generate, CachedEqualsRecomputedGreedyAndSampled) {
  for (const LmConfig& c : {windowed_llama(), small_gpt2()}) {
    SCOPED_TRACE(c.name);
    TransformerLm m(c);
    std::vector<Array> params = m.init(5);
    GenerateOptions opt;
    opt.max_new_tokens = 24;
    auto greedy = generate(m, params, kPrompts, opt);
    ASSERT_EQ(greedy.size(), 2u);
    EXPECT_EQ(greedy[0].size(), 24u);
    EXPECT_GT(std::set<int32_t>(greedy[0].begin(), greedy[0].end()).size(), 2u) << "a degenerate continuation";
    opt.use_cache = false;
    EXPECT_EQ(generate(m, params, kPrompts, opt), greedy);

    opt.temperature = 0.8;
    opt.top_k = 10;
    opt.top_p = 0.9;
    opt.seed = 11;
    auto sampled = generate(m, params, kPrompts, opt);
    opt.use_cache = true;
    EXPECT_EQ(generate(m, params, kPrompts, opt), sampled);
    EXPECT_NE(sampled, greedy);
    opt.seed = 12;
    EXPECT_NE(generate(m, params, kPrompts, opt), sampled) << "the seed changes the samples";

    // top_k = 1 is greedy whatever the temperature.
    opt.top_k = 1;
    opt.top_p = 1.0;
    EXPECT_EQ(generate(m, params, kPrompts, opt), greedy);
  }
}

TEST(Generate, StopsAtEosAndHonoursALongerCache) {
  TransformerLm m(windowed_llama());
  std::vector<Array> params = m.init(5);
  GenerateOptions opt;
  opt.max_new_tokens = 16;
  auto free_run = generate(m, params, kPrompts, opt);
  opt.eos_id = free_run[0][3];
  auto stopped = generate(m, params, kPrompts, opt);
  auto first = std::find(free_run[0].begin(), free_run[0].end(), opt.eos_id) - free_run[0].begin();
  for (size_t i = 0; i < stopped[0].size(); ++i)
    EXPECT_EQ(stopped[0][i], static_cast<int64_t>(i) <= first ? free_run[0][i] : opt.eos_id) << i;
  opt.eos_id = -1;
  opt.max_len = 40;  // a longer cache than needed changes nothing
  EXPECT_EQ(generate(m, params, kPrompts, opt), free_run);
}

TEST(Generate, PromptsOfDifferentLengthsDecodeAsEachAlone) {
  // Lengths 3, 9 and 6: the window (5) and the learned positions see each row's own positions.
  const std::vector<std::vector<int32_t>> prompts{{4, 9, 1}, {7, 8, 9, 10, 11, 12, 13, 2, 30}, {21, 3, 3, 40, 5, 6}};
  for (const LmConfig& c : {windowed_llama(), small_gpt2()}) {
    SCOPED_TRACE(c.name);
    TransformerLm m(c);
    std::vector<Array> params = m.init(5);
    GenerateOptions opt;
    opt.max_new_tokens = 20;
    auto batched = generate(m, params, prompts, opt);
    ASSERT_EQ(batched.size(), 3u);
    std::set<int32_t> seen;
    for (size_t r = 0; r < prompts.size(); ++r) {
      EXPECT_EQ(batched[r], generate(m, params, {prompts[r]}, opt)[0]) << "row " << r;
      seen.insert(batched[r].begin(), batched[r].end());
    }
    EXPECT_GT(seen.size(), 5u) << "degenerate continuations";
    EXPECT_NE(batched[0], batched[1]);
    EXPECT_NE(batched[1], batched[2]);
    opt.use_cache = false;
    EXPECT_EQ(generate(m, params, prompts, opt), batched) << "without the cache";
  }
}

TEST(Generate, SeveralEosIdsAndAnEarlyEnd) {
  TransformerLm m(windowed_llama());
  std::vector<Array> params = m.init(5);
  GenerateOptions opt;
  opt.max_new_tokens = 16;
  auto free_run = generate(m, params, kPrompts, opt);
  // Row 0 stops at its 3rd token, row 1 at its 5th (unless either id comes earlier).
  opt.eos_ids = {free_run[0][2], free_run[1][4]};
  std::vector<double> seconds;
  opt.token_seconds = &seconds;
  auto stopped = generate(m, params, kPrompts, opt);
  size_t last = 0;
  for (int r = 0; r < 2; ++r) {
    auto hit = std::find_if(free_run[r].begin(), free_run[r].end(),
                            [&](int32_t t) { return t == opt.eos_ids[0] || t == opt.eos_ids[1]; });
    const size_t first = static_cast<size_t>(hit - free_run[r].begin());
    ASSERT_LE(first, 4u);
    last = std::max(last, first);
    ASSERT_EQ(stopped[r].size(), 16u);
    for (size_t i = 0; i < 16; ++i) EXPECT_EQ(stopped[r][i], i <= first ? free_run[r][i] : *hit) << r << " " << i;
  }
  EXPECT_EQ(seconds.size(), last + 1) << "decoding ends once every row has stopped";
  opt.use_cache = false;
  opt.token_seconds = nullptr;
  EXPECT_EQ(generate(m, params, kPrompts, opt), stopped);
}

TEST(Generate, RefusesBadRequests) {
  TransformerLm m(small_gpt2());
  std::vector<Array> params = m.init(1);
  using testing::error_of;
  EXPECT_NE(error_of([&] { generate(m, params, {{1, 2}, {}}); }).find("prompt 1 is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { generate(m, params, {{1, 99}}); }).find("outside the vocabulary"), std::string::npos);
  GenerateOptions opt;
  opt.max_new_tokens = 40;
  EXPECT_NE(error_of([&] { generate(m, params, {{1, 2}}, opt); }).find("max_seq_len 40"), std::string::npos);
  EXPECT_NE(error_of([&] { generate(m, {}, {{1, 2}}); }).find("params given"), std::string::npos);
}

// NaN logits (params that diverged) gave token 0s without a word; now an error naming the row.
TEST(Generate, NonFiniteLogitsAreAnError) {
  TransformerLm m(small_gpt2());
  std::vector<Array> params = m.init(1);
  for (Array& p : params)
    if (p.dtype() == DType::f32) {
      std::vector<float> nan(static_cast<size_t>(p.numel()), std::numeric_limits<float>::quiet_NaN());
      p = Array::from_f32(nan, p.shape());
    }
  for (bool cache : {true, false})
    for (double temperature : {0.0, 0.8}) {
      SCOPED_TRACE(std::string(cache ? "cached" : "recomputed") + ", temperature " + std::to_string(temperature));
      GenerateOptions opt;
      opt.use_cache = cache;
      opt.temperature = temperature;
      const std::string e = testing::error_of([&] { generate(m, params, kPrompts, opt); });
      EXPECT_NE(e.find("[generate] the logits of new token 0 of prompt 0 hold 50 NaN"), std::string::npos) << e;
      EXPECT_NE(e.find("no token can be picked"), std::string::npos) << e;
    }
}

}  // namespace
}  // namespace px::nn
