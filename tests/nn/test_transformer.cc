// GPT-2 and Llama style LMs: param counts, names, loss at init, gradients, causality, errors.
#include <cmath>
#include <random>

#include "parallax/nn.h"
#include "testing.h"

namespace px::nn {
namespace {

// Closed-form counts, written from the config.
int64_t gpt2_count(const LmConfig& c) {
  const int64_t d = c.d_model, kv = c.kv_heads() * c.head_dim();
  int64_t attn = d * d + 2 * d * kv + d * d + (d + 2 * kv + d);  // wq, wk, wv, wo + biases
  int64_t mlp = d * c.d_ff + c.d_ff + c.d_ff * d + d;
  int64_t block = 2 * d + attn + 2 * d + mlp;                                // ln1, attn, ln2, mlp
  return c.vocab_size * d + c.max_seq_len * d + c.n_layers * block + 2 * d;  // tied: no head
}

int64_t llama_count(const LmConfig& c) {
  const int64_t d = c.d_model, kv = c.kv_heads() * c.head_dim();
  int64_t block = d + (d * d + 2 * d * kv + d * d) + d + 3 * d * c.d_ff;
  return c.vocab_size * d + c.n_layers * block + d + d * c.vocab_size;  // untied head
}

Array random_tokens(const Shape& s, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(numel(s));
  for (auto& t : v) t = static_cast<int32_t>(rng() % vocab);
  return Array::from_i32(v, s);
}

std::vector<Array> run(TransformerLm& m, const BatchFn& fn, const std::vector<Array>& params,
                       const std::vector<Array>& batch) {
  auto g = trace_with_params(m.store(), fn, testing::types_of(batch));
  std::vector<Array> in = params;
  in.insert(in.end(), batch.begin(), batch.end());
  return Executable::compile(*g)->run(in);
}

float loss_of(TransformerLm& m, const std::vector<Array>& params, const Array& tokens, const Array& targets) {
  return run(m, [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{next_token_loss(m, b[0], b[1])}; },
             params, {tokens, targets})[0]
      .to_f32()[0];
}

TEST(LmConfig, PresetsHaveTheDocumentedSizes) {
  LmConfig g = gpt2_tiny(), b = bench_gpt(), l = llama_tiny();
  EXPECT_EQ((std::vector<int64_t>{g.vocab_size, g.d_model, g.n_heads, g.n_layers, g.d_ff, g.max_seq_len}),
            (std::vector<int64_t>{2048, 128, 4, 2, 512, 128}));
  EXPECT_EQ((std::vector<int64_t>{b.vocab_size, b.d_model, b.n_heads, b.n_layers, b.d_ff, b.max_seq_len}),
            (std::vector<int64_t>{8192, 512, 8, 6, 2048, 256}));
  EXPECT_TRUE(g.tied_embedding && g.bias && g.norm == NormKind::layer_norm && g.positions == PositionKind::learned);
  EXPECT_TRUE(!l.tied_embedding && !l.bias && l.norm == NormKind::rms_norm && l.mlp == MlpKind::swiglu &&
              l.positions == PositionKind::rotary && l.kv_heads() < l.n_heads);
  EXPECT_NE(l.to_string().find("positions = rotary"), std::string::npos);
  EXPECT_EQ(lm_config("bench_gpt").d_model, 512);
  EXPECT_EQ(lm_config("llama_small").n_kv_heads, 4);
  EXPECT_THROW(lm_config("gpt5"), Error);
}

TEST(TransformerLm, ParamCountsMatchClosedForm) {
  for (LmConfig c : {gpt2_tiny(), bench_gpt(), gpt2_small()}) {
    TransformerLm m(c);
    EXPECT_EQ(m.param_count(), gpt2_count(c)) << c.name;
    EXPECT_EQ(m.store().param_count(), gpt2_count(c)) << c.name;
  }
  for (LmConfig c : {llama_tiny(), llama_small()}) EXPECT_EQ(TransformerLm(c).param_count(), llama_count(c)) << c.name;
  EXPECT_EQ(TransformerLm(gpt2_small()).param_count(), 124439808);  // the published GPT-2 small size
  TransformerLm m(gpt2_tiny());
  EXPECT_EQ(m.blocks[1].param_count(), (gpt2_count(gpt2_tiny()) - 2048 * 128 - 128 * 128 - 256) / 2);
  std::string table = m.param_table();
  EXPECT_NE(table.find("blocks.1.mlp.proj.w"), std::string::npos);
  EXPECT_NE(table.find("total: " + std::to_string(gpt2_count(gpt2_tiny())) + " params"), std::string::npos);
}

TEST(TransformerLm, StablePathNames) {
  std::vector<std::string> gpt = TransformerLm(gpt2_tiny()).store().paths();
  std::vector<std::string> want = {
      "embed.table",       "pos_embed.table",     "blocks.0.ln1.scale", "blocks.0.ln1.bias", "blocks.0.attn.wq",
      "blocks.0.attn.wk",  "blocks.0.attn.wv",    "blocks.0.attn.wo",   "blocks.0.attn.bq",  "blocks.0.attn.bk",
      "blocks.0.attn.bv",  "blocks.0.attn.bo",    "blocks.0.ln2.scale", "blocks.0.ln2.bias", "blocks.0.mlp.fc.w",
      "blocks.0.mlp.fc.b", "blocks.0.mlp.proj.w", "blocks.0.mlp.proj.b"};
  ASSERT_EQ(gpt.size(), 2 + 2 * 16 + 2u);
  EXPECT_EQ(std::vector<std::string>(gpt.begin(), gpt.begin() + 18), want);
  EXPECT_EQ(gpt[18], "blocks.1.ln1.scale");
  EXPECT_EQ(gpt.back(), "final_norm.bias");

  std::vector<std::string> llama = TransformerLm(llama_tiny()).store().paths();
  std::vector<std::string> want_llama = {
      "embed.table",      "blocks.0.ln1.scale", "blocks.0.attn.wq",    "blocks.0.attn.wk",  "blocks.0.attn.wv",
      "blocks.0.attn.wo", "blocks.0.ln2.scale", "blocks.0.mlp.gate.w", "blocks.0.mlp.up.w", "blocks.0.mlp.down.w"};
  EXPECT_EQ(std::vector<std::string>(llama.begin(), llama.begin() + 10), want_llama);
  EXPECT_EQ(llama[llama.size() - 2], "final_norm.scale");
  EXPECT_EQ(llama.back(), "head.w");
  TransformerLm lt(llama_tiny());
  EXPECT_EQ(lt.blocks[0].attn.wk.shape(), (Shape{128, 64}));  // 2 kv heads of 32
}

TEST(TransformerLm, InitIsDeterministicAndIndependentOfDepth) {
  TransformerLm a(gpt2_tiny()), b(gpt2_tiny());
  LmConfig deeper = gpt2_tiny();
  deeper.n_layers = 3;
  TransformerLm c(deeper);
  std::vector<Array> pa = a.init(1), pb = b.init(1), pc = c.init(1), pd = a.init(2);
  int wq = a.store().index_of("blocks.1.attn.wq");
  EXPECT_EQ(pa[wq].to_f32(), pb[wq].to_f32());
  EXPECT_EQ(pa[wq].to_f32(), pc[c.store().index_of("blocks.1.attn.wq")].to_f32());
  EXPECT_NE(pa[wq].to_f32(), pd[wq].to_f32());
  EXPECT_NE(pa[wq].to_f32(), pa[a.store().index_of("blocks.0.attn.wq")].to_f32());
}

TEST(TransformerLm, LossAtInitIsNearLogVocab) {
  for (LmConfig c : {gpt2_tiny(), llama_tiny()}) {
    TransformerLm m(c);
    Array tokens = random_tokens({2, 64}, c.vocab_size, 1), targets = random_tokens({2, 64}, c.vocab_size, 2);
    float loss = loss_of(m, m.init(0), tokens, targets);
    EXPECT_NEAR(loss, std::log(double(c.vocab_size)), 0.15) << c.name;
  }
}

TEST(TransformerLm, Bf16ComputeMatchesF32Loss) {
  LmConfig c = gpt2_tiny();
  c.compute_dtype = DType::bf16;
  TransformerLm f32(gpt2_tiny()), bf16(c);
  std::vector<Array> p = f32.init(0);
  Array tokens = random_tokens({2, 32}, c.vocab_size, 3), targets = random_tokens({2, 32}, c.vocab_size, 4);
  EXPECT_NEAR(loss_of(bf16, p, tokens, targets), loss_of(f32, p, tokens, targets), 0.02);
}

LmConfig micro(bool llama) {
  LmConfig c =
      llama ? llama_config("micro_llama", 11, 8, 2, 1, 1, 12, 6) : gpt2_config("micro_gpt", 11, 8, 2, 1, 12, 6);
  c.init_std = 0.5;  // large enough that every path carries a visible gradient
  return c;
}

TEST(TransformerLm, LogitsAreCausal) {
  for (bool llama : {false, true}) {
    TransformerLm m(micro(llama));
    Array t1 = Array::from_i32({1, 2, 3, 4, 5, 6}, {1, 6}), t2 = Array::from_i32({1, 2, 3, 4, 5, 9}, {1, 6});
    auto logits = [&](const Array& t) {
      return run(m, [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{m.logits(b[0])}; }, m.init(0),
                 {t})[0];
    };
    Array a = logits(t1), b = logits(t2);
    ASSERT_EQ(a.shape(), (Shape{1, 6, 11}));
    std::vector<float> av = a.to_f32(), bv = b.to_f32();
    EXPECT_TRUE(testing::all_close(std::vector<float>(av.begin(), av.begin() + 55),
                                   std::vector<float>(bv.begin(), bv.begin() + 55), 1e-5, 1e-5));
    EXPECT_FALSE(testing::all_close(std::vector<float>(av.begin() + 55, av.end()),
                                    std::vector<float>(bv.begin() + 55, bv.end()), 1e-3, 0));
  }
}

TEST(TransformerLm, GradientsMatchFiniteDifferences) {
  for (bool llama : {false, true}) {
    TransformerLm m(micro(llama));
    ParamStore& st = m.store();
    std::vector<Array> in = m.init(7);
    in.push_back(Array::from_i32({3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8}, {2, 6}));
    in.push_back(Array::from_i32({1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9}, {2, 6}));
    const size_t np = st.specs().size();
    TracedFn fn = [&](const std::vector<Tensor>& x) {
      ParamBinding b = st.bind(std::vector<Tensor>(x.begin(), x.begin() + np));
      return std::vector<Tensor>{next_token_loss(m, x[np], x[np + 1])};
    };
    std::vector<int> wrt = {st.index_of("embed.table"), st.index_of("blocks.0.attn.wq"),
                            st.index_of("blocks.0.attn.wv"), st.index_of("final_norm.scale"),
                            st.index_of(llama ? "blocks.0.mlp.gate.w" : "blocks.0.mlp.fc.w")};
    if (llama)
      wrt.push_back(st.index_of("head.w"));
    else
      wrt.push_back(st.index_of("pos_embed.table"));
    EXPECT_TRUE(testing::check_grads(fn, in, wrt)) << m.config().name;
  }
}

TEST(TransformerLm, WeightsAndIgnoredTargets) {
  TransformerLm m(micro(false));
  std::vector<Array> p = m.init(3);
  Array tokens = Array::from_i32({3, 1, 4, 1, 5, 9}, {1, 6});
  Array targets = Array::from_i32({1, 4, 1, 5, 9, 2}, {1, 6});
  Array masked = Array::from_i32({1, 4, 1, -100, -100, -100}, {1, 6});
  Array weights = Array::from_f32({1, 1, 1, 0, 0, 0}, {1, 6});
  float weighted =
      run(m, [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{next_token_loss(m, b[0], b[1], b[2])}; }, p,
          {tokens, targets, weights})[0]
          .to_f32()[0];
  EXPECT_NEAR(weighted, loss_of(m, p, tokens, masked), 1e-5);
  EXPECT_GT(std::fabs(weighted - loss_of(m, p, tokens, targets)), 1e-4);
}

TEST(TransformerLm, ConfigErrorsNameTheFields) {
  auto msg = [](LmConfig c) -> std::string {
    try {
      TransformerLm m(c);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  LmConfig c = gpt2_tiny();
  c.d_model = 130;
  EXPECT_NE(msg(c).find("[LmConfig] gpt2_tiny: d_model (130) must be divisible by n_heads (4)"), std::string::npos)
      << msg(c);
  c = llama_tiny();
  c.n_kv_heads = 3;
  EXPECT_NE(msg(c).find("n_heads (4) must be divisible by n_kv_heads (3)"), std::string::npos) << msg(c);
  c = gpt2_tiny();
  c.n_layers = 0;
  EXPECT_NE(msg(c).find("n_layers must be positive, got 0"), std::string::npos) << msg(c);
  c = llama_tiny();
  c.d_model = 12;
  c.n_heads = 4;
  c.n_kv_heads = 0;
  EXPECT_NE(msg(c).find("even head_dim"), std::string::npos) << msg(c);
}

TEST(TransformerLm, InputErrors) {
  TransformerLm m(micro(false));
  ParamStore& st = m.store();
  std::vector<TensorType> t = st.types();
  const size_t np = t.size();
  auto with = [&](std::vector<TensorType> extra) {
    auto v = t;
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  auto loss = [&](const std::vector<Tensor>& x) {
    ParamBinding b = st.bind(std::vector<Tensor>(x.begin(), x.begin() + np));
    return std::vector<Tensor>{next_token_loss(m, x[np], x[np + 1])};
  };
  EXPECT_NO_THROW(trace(loss, with({{DType::i32, {1, 4}}, {DType::i32, {1, 4}}})));
  EXPECT_TRUE(testing::throws_error(loss, with({{DType::i32, {1, 4}}, {DType::f32, {1, 4}}}),
                                    {"[next_token_loss]", "f32[1,4]"}));
  EXPECT_TRUE(testing::throws_error(loss, with({{DType::i32, {1, 4}}, {DType::i32, {1, 5}}}),
                                    {"[next_token_loss]", "i32[1,5]"}));
  EXPECT_TRUE(testing::throws_error(loss, with({{DType::i32, {1, 7}}, {DType::i32, {1, 7}}}),
                                    {"[TransformerLm]", "sequence length 7 exceeds max_seq_len 6"}));
  EXPECT_TRUE(testing::throws_error(loss, with({{DType::i32, {4}}, {DType::i32, {4}}}),
                                    {"[TransformerLm]", "i32[batch, seq]", "i32[4]"}));
}

}  // namespace
}  // namespace px::nn
