// Scopes, param paths, bindings and deterministic initialization.
#include <cmath>

#include "parallax/nn.h"
#include "testing.h"

namespace px::nn {
namespace {

struct Stats {
  double mean = 0, std = 0, min = 1e30, max = -1e30;
};
Stats stats(const std::vector<float>& v) {
  Stats s;
  for (float x : v) {
    s.mean += x;
    s.min = std::min<double>(s.min, x);
    s.max = std::max<double>(s.max, x);
  }
  s.mean /= v.size();
  for (float x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / v.size());
  return s;
}

TEST(Scope, PathsAreDottedAndStable) {
  Scope root;
  Scope attn = root.sub("blocks").sub(3).sub("attn");
  EXPECT_EQ(attn.path(), "blocks.3.attn");
  Param wq = attn.param("wq", {DType::f32, {4, 4}}, Init::zeros());
  EXPECT_EQ(wq.path(), "blocks.3.attn.wq");
  Linear fc(root.sub("fc"), 3, 5);
  EXPECT_EQ(fc.w.path(), "fc.w");
  EXPECT_EQ(fc.b.path(), "fc.b");
  EXPECT_EQ(fc.w.shape(), (Shape{3, 5}));
  EXPECT_EQ(root.store().paths(), (std::vector<std::string>{"blocks.3.attn.wq", "fc.w", "fc.b"}));
  EXPECT_EQ(root.store().param_count(), 16 + 15 + 5);
}

TEST(Scope, RejectsDuplicateAndBadNames) {
  Scope root;
  Linear a(root.sub("fc"), 2, 2);
  try {
    Linear b(root.sub("fc"), 2, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc.w' declared twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(root.sub("a.b"), Error);
  EXPECT_THROW(root.sub(""), Error);
  EXPECT_THROW(root.param("x.y", {DType::f32, {1}}, Init::zeros()), Error);
  EXPECT_THROW(Linear(root.sub("zero"), 0, 3), Error);
}

TEST(Module, ParamsListsOnlyItsSubtree) {
  Scope root;
  Linear l1(root.sub("blocks").sub(1), 2, 2);
  Linear l10(root.sub("blocks").sub(10), 2, 2, {.bias = false});
  std::vector<Param> p = l1.params();
  ASSERT_EQ(p.size(), 2u);  // "blocks.10.w" is not under "blocks.1"
  EXPECT_EQ(p[0].path(), "blocks.1.w");
  EXPECT_EQ(l10.param_count(), 4);
  Module whole(root);
  EXPECT_EQ(whole.param_count(), 10);
}

TEST(Binding, UnboundParamErrorNamesIt) {
  Scope root;
  Linear fc(root.sub("fc"), 2, 3);
  try {
    fc.w.value();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fc.w'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bind"), std::string::npos) << e.what();
  }
  Param undefined;
  EXPECT_THROW(undefined.value(), Error);
}

TEST(Binding, TraceWithParamsMakesNamedInputsInOrder) {
  Scope root;
  Linear a(root.sub("a"), 2, 3);
  Param s = root.param("s", {DType::f32, {}}, Init::ones());
  auto g = trace_with_params(root.store(),
                             [&](const std::vector<Tensor>& batch) {
                               return std::vector<Tensor>{a.b, s, batch[0]};
                             },
                             {{DType::i32, {4}}}, {"tokens"});
  EXPECT_EQ(g->input_names(), (std::vector<std::string>{"a.w", "a.b", "s", "tokens"}));
  EXPECT_EQ(g->type(g->inputs()[0]), (TensorType{DType::f32, {2, 3}}));
  EXPECT_EQ(g->outputs()[0], g->inputs()[1]);
  EXPECT_EQ(g->outputs()[1], g->inputs()[2]);
  EXPECT_FALSE(root.store().bound());  // the binding ends with the trace
}

TEST(Binding, NestsAndChecksTypes) {
  Scope root;
  Param p = root.param("p", {DType::f32, {2}}, Init::zeros());
  Graph g1, g2;
  {
    ParamBinding b1 = root.store().bind(g1);
    EXPECT_EQ(p.value().graph(), &g1);
    {
      ParamBinding b2 = root.store().bind(g2);
      EXPECT_EQ(p.value().graph(), &g2);
    }
    EXPECT_EQ(p.value().graph(), &g1);
    EXPECT_EQ(g1.input_names(), (std::vector<std::string>{"p"}));
  }
  EXPECT_THROW(p.value(), Error);
  Graph g3;
  Tensor wrong = g3.input({DType::f32, {3}});
  try {
    root.store().bind({wrong});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'p' is f32[2] but is bound to a f32[3]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(root.store().bind(std::vector<Tensor>{}), Error);
}

TEST(Init, SameSeedSameValuesOtherSeedDiffers) {
  Scope root;
  Linear fc(root.sub("fc"), 16, 8);
  std::vector<Array> a = root.store().init(7), b = root.store().init(7), c = root.store().init(8);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].to_f32(), b[0].to_f32());
  EXPECT_NE(a[0].to_f32(), c[0].to_f32());
  EXPECT_EQ(a[1].to_f32(), std::vector<float>(8, 0.0f));  // bias: zeros
}

TEST(Init, ValueDependsOnlyOnPathNotOnOtherParams) {
  Scope s1;
  Linear x(s1.sub("x"), 5, 5);
  Linear y(s1.sub("y"), 7, 3);
  Scope s2;
  Linear y2(s2.sub("y"), 7, 3);  // declared first, no "x" at all
  Linear z(s2.sub("z"), 9, 9);
  std::vector<Array> i1 = s1.store().init(3), i2 = s2.store().init(3);
  EXPECT_EQ(i1[2].to_f32(), i2[0].to_f32());
  // Different paths with the same shape and init give different values.
  Scope s3;
  Linear a(s3.sub("a"), 7, 3), b(s3.sub("b"), 7, 3);
  std::vector<Array> i3 = s3.store().init(3);
  EXPECT_NE(i3[0].to_f32(), i3[2].to_f32());
}

TEST(Init, RangeMatchesSliceOfWhole) {
  for (Init init : {Init::normal(0.5), Init::truncated_normal(1.0), Init::uniform(-2, 3)}) {
    ParamSpec p{"blocks.0.w", {DType::f32, {33, 17}}, init};
    std::vector<float> whole = init_array(p, 11).to_f32();
    std::vector<float> part(100);
    init_range(p, 11, 250, 350, part.data());
    EXPECT_EQ(part, std::vector<float>(whole.begin() + 250, whole.begin() + 350)) << init.to_string();
  }
}

TEST(Init, Distributions) {
  const Shape big{256, 256};
  Stats n = stats(init_array({"n", {DType::f32, big}, Init::normal(0.02)}, 1).to_f32());
  EXPECT_NEAR(n.mean, 0.0, 0.001);
  EXPECT_NEAR(n.std, 0.02, 0.0005);
  EXPECT_GT(n.max, 0.07);  // tails exist (3.5 sigma within 65k samples)

  Stats t = stats(init_array({"t", {DType::f32, big}, Init::truncated_normal(1.0)}, 1).to_f32());
  EXPECT_NEAR(t.std, 1.0, 0.02);
  double bound = 2.0 / 0.87962566103423978;  // truncated at 2 std of the underlying normal
  EXPECT_LE(t.max, bound);
  EXPECT_GE(t.min, -bound);

  Stats u = stats(init_array({"u", {DType::f32, big}, Init::uniform(-1, 3)}, 1).to_f32());
  EXPECT_NEAR(u.mean, 1.0, 0.02);
  EXPECT_GE(u.min, -1.0);
  EXPECT_LT(u.max, 3.0);

  Stats l = stats(init_array({"l", {DType::f32, {64, 1024}}, Init::lecun_normal()}, 1).to_f32());
  EXPECT_NEAR(l.std, 1.0 / 8.0, 0.003);  // fan_in 64
  EXPECT_EQ(fan_in({4, 5, 6}), 20);
  EXPECT_EQ(fan_in({6}), 1);

  EXPECT_EQ(init_array({"o", {DType::f32, {3}}, Init::ones()}, 1).to_f32(), std::vector<float>(3, 1.0f));
  EXPECT_EQ(init_array({"c", {DType::f32, {2}}, Init::constant(2.5)}, 1).to_f32(), std::vector<float>(2, 2.5f));
}

TEST(Init, DtypesAndErrors) {
  Array h = init_array({"h", {DType::bf16, {8}}, Init::normal(1.0)}, 1);
  EXPECT_EQ(h.dtype(), DType::bf16);
  Array f = init_array({"h", {DType::f32, {8}}, Init::normal(1.0)}, 1);
  EXPECT_TRUE(testing::all_close(h.to_f32(), f.to_f32(), 0, 1e-2));
  EXPECT_EQ(init_array({"i", {DType::i32, {2}}, Init::zeros()}, 1).to_i32(), (std::vector<int32_t>{0, 0}));
  EXPECT_THROW(init_array({"i", {DType::i32, {2}}, Init::normal(1.0)}, 1), Error);
  EXPECT_EQ(init_array({"e", {DType::f32, {0, 3}}, Init::normal(1.0)}, 1).numel(), 0);
}

TEST(ParamStore, TableListsEveryParam) {
  Scope root;
  Linear fc(root.sub("fc"), 4, 3);
  std::string t = root.store().table();
  EXPECT_NE(t.find("fc.w"), std::string::npos);
  EXPECT_NE(t.find("[4,3]"), std::string::npos);
  EXPECT_NE(t.find("lecun_normal(1)"), std::string::npos);
  EXPECT_NE(t.find("total: 15 params in 2 tensors, 60 bytes"), std::string::npos) << t;
}

}  // namespace
}  // namespace px::nn
