// generate(): the cached prefill + one-token decode programs give what recomputing the whole
// sequence gives (greedy and sampled, with rotary scaling, GQA, a sliding window and learned
// positions); sampling options behave; bad requests are refused.
#include <gtest/gtest.h>

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

TEST(Generate, RefusesBadRequests) {
  TransformerLm m(small_gpt2());
  std::vector<Array> params = m.init(1);
  using testing::error_of;
  EXPECT_NE(error_of([&] { generate(m, params, {{1, 2}, {3}}); }).find("share one length"), std::string::npos);
  EXPECT_NE(error_of([&] { generate(m, params, {{1, 99}}); }).find("outside the vocabulary"), std::string::npos);
  GenerateOptions opt;
  opt.max_new_tokens = 40;
  EXPECT_NE(error_of([&] { generate(m, params, {{1, 2}}, opt); }).find("max_seq_len 40"), std::string::npos);
  EXPECT_NE(error_of([&] { generate(m, {}, {{1, 2}}); }).find("params given"), std::string::npos);
}

}  // namespace
}  // namespace px::nn
