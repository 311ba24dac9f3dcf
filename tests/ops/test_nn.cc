// nn primitives: softmax, log_softmax, logsumexp, layer_norm, rms_norm, gelu, silu and softmax
// cross entropy against double-precision references (several shapes and dtypes, empty and
// size-1 dims, non-last axes), gradients (also second order) and bad-input errors.
#include <cmath>
#include <limits>

#include "ir/primitive.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::check_grads;
using testing::eval;
using testing::eval1;
using testing::random_array;
using testing::throws_error;

double rtol_of(DType d) { return d == DType::bf16 ? 1e-2 : d == DType::f16 ? 2e-3 : 1e-5; }
double atol_of(DType d) { return d == DType::bf16 ? 1e-2 : d == DType::f16 ? 2e-3 : 1e-6; }

TracedFn unary(std::function<Tensor(const Tensor&)> f) {
  return [f](const std::vector<Tensor>& in) { return std::vector<Tensor>{f(in[0])}; };
}

// Reference softmax / log_softmax along `axis` of a row-major array.
std::vector<float> ref_softmax(const std::vector<float>& x, const Shape& s, int axis, bool log) {
  int64_t outer = 1, n = s[axis], inner = 1;
  for (int d = 0; d < axis; ++d) outer *= s[d];
  for (size_t d = axis + 1; d < s.size(); ++d) inner *= s[d];
  std::vector<float> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < inner; ++j) {
      auto at = [&](int64_t i) { return o * n * inner + i * inner + j; };
      double m = -INFINITY, sum = 0;
      for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(x[at(i)]));
      for (int64_t i = 0; i < n; ++i) sum += std::exp(x[at(i)] - m);
      for (int64_t i = 0; i < n; ++i)
        y[at(i)] = static_cast<float>(log ? x[at(i)] - m - std::log(sum) : std::exp(x[at(i)] - m) / sum);
    }
  return y;
}

TEST(Softmax, MatchesReferenceOnEveryAxisAndDtype) {
  const std::vector<Shape> shapes = {{7, 13}, {5}, {3, 4, 5}, {1, 1}, {0, 5}, {4, 0}, {2, 300}};
  for (const Shape& s : shapes)
    for (int axis = 0; axis < static_cast<int>(s.size()); ++axis)
      for (DType dt : {DType::f32, DType::bf16, DType::f16})
        for (bool log : {false, true}) {
          Array x = random_array(s, dt, 3, -4, 4);
          Array y = eval1(unary([&](const Tensor& t) { return log ? log_softmax(t, axis) : softmax(t, axis); }), {x});
          EXPECT_EQ(y.type(), x.type());
          EXPECT_TRUE(all_close(y.to_f32(), ref_softmax(x.to_f32(), s, axis, log), atol_of(dt), rtol_of(dt)))
              << (log ? "log_softmax " : "softmax ") << type_str(x.type()) << " axis " << axis;
        }
}

TEST(Softmax, IsStableForHugeAndMaskedValues) {
  const float inf = std::numeric_limits<float>::infinity();
  Array x = Array::from_f32({1000, 999, -1000, -inf, 0, -inf, 3, 88.5f}, {2, 4});
  Array y = eval1(unary([](const Tensor& t) { return softmax(t); }), {x});
  EXPECT_TRUE(all_close(y.to_f32(), ref_softmax(x.to_f32(), {2, 4}, 1, false), 1e-6, 1e-5));
  EXPECT_EQ(y.to_f32()[3], 0.0f);  // a masked (-inf) entry gets exactly zero
  Array ly = eval1(unary([](const Tensor& t) { return log_softmax(t); }), {x});
  EXPECT_TRUE(all_close(ly.to_f32(), ref_softmax(x.to_f32(), {2, 4}, 1, true), 1e-4, 1e-5));
  Array lse = eval1(unary([](const Tensor& t) { return logsumexp(t, -1); }), {x});
  EXPECT_NEAR(lse.to_f32()[0], 1000 + std::log1p(std::exp(-1.0)), 1e-3);
}

TEST(Softmax, NonContiguousInputAndNegativeAxis) {
  Array x = random_array({5, 6}, DType::f32, 4, -3, 3);
  Array y = eval1(unary([](const Tensor& t) { return softmax(transpose(t, {1, 0}), -2); }), {x});
  // softmax over dim 0 of x^T = over dim 1 of x, transposed.
  std::vector<float> r = ref_softmax(x.to_f32(), {5, 6}, 1, false), want(30);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 6; ++j) want[j * 5 + i] = r[i * 6 + j];
  EXPECT_TRUE(all_close(y.to_f32(), want, 1e-6, 1e-5));
}

TEST(Logsumexp, MatchesReferenceWithKeepdimsAndInfiniteRows) {
  const float inf = std::numeric_limits<float>::infinity();
  Array x = Array::from_f32({1, 2, 3, -inf, -inf, -inf, 50, -50, 0}, {3, 3});
  Array k = eval1(unary([](const Tensor& t) { return logsumexp(t, 1, true); }), {x});
  EXPECT_EQ(k.shape(), (Shape{3, 1}));
  auto v = k.to_f32();
  EXPECT_NEAR(v[0], std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)), 1e-5);
  EXPECT_EQ(v[1], -inf);
  EXPECT_NEAR(v[2], 50.0, 1e-5);
  Array c = eval1(unary([](const Tensor& t) { return logsumexp(t, 0); }), {random_array({4, 3}, DType::f32, 5)});
  EXPECT_EQ(c.shape(), (Shape{3}));
  Array in = random_array({4, 3}, DType::f32, 5);
  auto xv = in.to_f32();
  for (int j = 0; j < 3; ++j) {
    double s = 0;
    for (int i = 0; i < 4; ++i) s += std::exp(xv[i * 3 + j]);
    EXPECT_NEAR(c.to_f32()[j], std::log(s), 1e-5);
  }
}

std::vector<float> ref_norm(const std::vector<float>& x, const Shape& s, const std::vector<float>& g,
                            const std::vector<float>* b, double eps, bool rms) {
  int64_t d = s.back(), rows = d ? static_cast<int64_t>(x.size()) / d : 0;
  std::vector<float> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mean += x[r * d + i];
    mean = rms ? 0 : mean / d;
    for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
    double rstd = 1 / std::sqrt(var / d + eps);
    for (int64_t i = 0; i < d; ++i)
      y[r * d + i] = static_cast<float>((x[r * d + i] - mean) * rstd * g[i] + (b ? (*b)[i] : 0.0));
  }
  return y;
}

TEST(Norms, LayerNormAndRmsNormMatchReference) {
  for (const Shape& s : std::vector<Shape>{{4, 16}, {2, 3, 7}, {5}, {1, 1}, {0, 8}, {3, 1000}})
    for (DType dt : {DType::f32, DType::bf16})
      for (int variant = 0; variant < 3; ++variant) {  // layer_norm with beta, without, rms_norm
        int64_t d = s.back();
        Array x = random_array(s, dt, 6, -2, 3), g = random_array({d}, dt, 7, 0.5f, 1.5f),
              b = random_array({d}, dt, 8);
        std::vector<Array> ins{x, g};
        if (variant == 0) ins.push_back(b);
        Array y = eval1(
            [&](const std::vector<Tensor>& in) {
              if (variant == 2) return std::vector<Tensor>{rms_norm(in[0], in[1], 1e-6)};
              return std::vector<Tensor>{layer_norm(in[0], in[1], variant == 0 ? in[2] : Tensor(), 1e-5)};
            },
            ins);
        std::vector<float> bv = b.to_f32();
        auto want = ref_norm(x.to_f32(), s, g.to_f32(), variant == 0 ? &bv : nullptr, variant == 2 ? 1e-6 : 1e-5,
                             variant == 2);
        EXPECT_EQ(y.type(), x.type());
        EXPECT_TRUE(all_close(y.to_f32(), want, dt == DType::bf16 ? 3e-2 : 1e-5, rtol_of(dt)))
            << type_str(x.type()) << " variant " << variant;
      }
}

TEST(Norms, StatisticsOutputsAreF32MeanAndRstd) {
  Array x = random_array({3, 10}, DType::bf16, 9, -1, 2), g = random_array({10}, DType::bf16, 10);
  auto out = eval([](const std::vector<Tensor>& in) { return emit("layer_norm", {in[0], in[1]}, Attrs{{"eps", 1e-5}}); },
                  {x, g});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[1].type(), (TensorType{DType::f32, {3}}));
  auto xv = x.to_f32();
  for (int r = 0; r < 3; ++r) {
    double m = 0, v = 0;
    for (int i = 0; i < 10; ++i) m += xv[r * 10 + i] / 10.0;
    for (int i = 0; i < 10; ++i) v += (xv[r * 10 + i] - m) * (xv[r * 10 + i] - m) / 10.0;
    EXPECT_NEAR(out[1].to_f32()[r], m, 1e-5);
    EXPECT_NEAR(out[2].to_f32()[r], 1 / std::sqrt(v + 1e-5), 1e-4);
  }
}

double gelu_ref(double x, bool t) {
  if (t) return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

TEST(Activations, GeluAndSiluMatchReferenceFusedAndUnfused) {
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (const Shape& s : std::vector<Shape>{{1000}, {7, 13}, {}, {0, 3}}) {
      Array x = random_array(s, dt, 11, -8, 8);
      auto xv = x.to_f32();
      for (int k = 0; k < 3; ++k) {
        auto f = unary([k](const Tensor& t) { return k == 2 ? silu(t) : gelu(t, k == 0); });
        std::vector<float> want;
        for (float v : xv) want.push_back(static_cast<float>(k == 2 ? v / (1 + std::exp(-v)) : gelu_ref(v, k == 0)));
        Array fused = eval1(f, {x}), unfused = eval1(f, {x}, CompileOptions{.fuse_elementwise = false});
        EXPECT_TRUE(all_close(fused.to_f32(), want, atol_of(dt) + 1e-6, rtol_of(dt))) << type_str(x.type()) << " " << k;
        EXPECT_TRUE(all_close(unfused.to_f32(), fused.to_f32(), 0, 0));
      }
    }
  // Extremes: no NaN, saturation to x and 0.
  Array x = Array::from_f32({-100, -30, -1e-4f, 0, 1e-4f, 30, 100}, {7});
  for (bool t : {true, false}) {
    auto y = eval1(unary([t](const Tensor& v) { return gelu(v, t); }), {x}).to_f32();
    std::vector<float> want;
    for (float v : x.to_f32()) want.push_back(static_cast<float>(gelu_ref(v, t)));
    EXPECT_TRUE(all_close(y, want, 1e-6, 1e-5));
  }
  auto y = eval1(unary([](const Tensor& v) { return silu(v); }), {x}).to_f32();
  EXPECT_NEAR(y[0], 0.0f, 1e-6);
  EXPECT_NEAR(y[6], 100.0f, 1e-4);
}

TEST(Activations, GeluFusesWithNeighbours) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{gelu(in[0] * 2.0) + 1.0}; },
                 {{DType::f32, {64}}});
  auto exe = Executable::compile(*g);
  EXPECT_EQ(exe->num_fused_groups(), 1);
}

TEST(Gradients, SoftmaxFamilyNormsAndActivations) {
  Array x = random_array({3, 5}, DType::f32, 12, -2, 2);
  EXPECT_TRUE(check_grads(unary([](const Tensor& t) { return softmax(t); }), {x}));
  EXPECT_TRUE(check_grads(unary([](const Tensor& t) { return softmax(t, 0); }), {x}));
  EXPECT_TRUE(check_grads(unary([](const Tensor& t) { return log_softmax(t); }), {x}));
  EXPECT_TRUE(check_grads(unary([](const Tensor& t) { return log_softmax(t, 0); }), {x}));
  EXPECT_TRUE(check_grads(unary([](const Tensor& t) { return logsumexp(t, 1); }), {x}));
  Array g = random_array({5}, DType::f32, 13, 0.5f, 1.5f), b = random_array({5}, DType::f32, 14);
  EXPECT_TRUE(check_grads(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{layer_norm(in[0], in[1], in[2])}; }, {x, g, b}));
  EXPECT_TRUE(check_grads(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{layer_norm(in[0], in[1], Tensor())}; }, {x, g}));
  EXPECT_TRUE(check_grads([](const std::vector<Tensor>& in) { return std::vector<Tensor>{rms_norm(in[0], in[1])}; },
                          {x, g}));
  Array x1 = random_array({5}, DType::f32, 15);  // rank 1: gamma's gradient needs no reduction
  EXPECT_TRUE(check_grads([](const std::vector<Tensor>& in) { return std::vector<Tensor>{rms_norm(in[0], in[1])}; },
                          {x1, g}));
  Array xa = random_array({4, 6}, DType::f32, 16, -3, 3);
  EXPECT_TRUE(check_grads(unary([](const Tensor& t) { return gelu(t, true); }), {xa}));
  EXPECT_TRUE(check_grads(unary([](const Tensor& t) { return gelu(t, false); }), {xa}));
  EXPECT_TRUE(check_grads(unary([](const Tensor& t) { return silu(t); }), {xa}));
}

TEST(Gradients, NormStatisticsOutputs) {
  Array x = random_array({3, 6}, DType::f32, 17, -2, 2), g = random_array({6}, DType::f32, 18, 0.5f, 1.5f);
  for (const char* prim : {"layer_norm", "rms_norm"}) {
    std::string p = prim;
    // Objective mixes y with the statistics so every output gets a cotangent.
    EXPECT_TRUE(check_grads(
        [p](const std::vector<Tensor>& in) {
          auto o = emit(p, {in[0], in[1]}, Attrs{{"eps", 1e-5}});
          Tensor s = expand_dims(o.back(), -1);
          if (o.size() == 3) s = s + expand_dims(o[1] * 3.0, -1);
          return std::vector<Tensor>{o[0] + s};
        },
        {x, g}))
        << prim;
  }
}

// The norms' backward primitives read a 16-bit cotangent as f32: the same bits as with the
// cotangent widened first (so a bf16 step's widening cast need not be stored).
TEST(Gradients, NormBackwardReadsANarrowCotangentAsF32) {
  Array x = random_array({6, 40}, DType::f32, 20, -2, 2), g = random_array({40}, DType::f32, 21, 0.5f, 1.5f),
        dy = random_array({6, 40}, DType::bf16, 22);
  for (bool rms : {false, true}) {
    auto grads = [rms](const std::vector<Tensor>& in, bool widen) {
      auto o = emit(rms ? "rms_norm" : "layer_norm", {in[0], in[1]}, Attrs{{"eps", 1e-5}});
      std::vector<Tensor> args{in[0], in[1]};
      args.insert(args.end(), o.begin() + 1, o.end());
      args.push_back(widen ? cast(in[2], DType::f32) : in[2]);
      return emit(rms ? "rms_norm_grad" : "layer_norm_grad", args);
    };
    auto narrow = eval([&](const std::vector<Tensor>& in) { return grads(in, false); }, {x, g, dy});
    auto wide = eval([&](const std::vector<Tensor>& in) { return grads(in, true); }, {x, g, dy});
    ASSERT_EQ(narrow.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(narrow[i].dtype(), DType::f32);
      EXPECT_EQ(narrow[i].to_f32(), wide[i].to_f32()) << (rms ? "rms_norm_grad" : "layer_norm_grad") << " " << i;
    }
  }
  TensorType xt{DType::f32, {2, 4}}, gt{DType::f32, {4}}, st{DType::f32, {2}};
  auto bad = [](const std::vector<Tensor>& in) { return emit("layer_norm_grad", in); };
  EXPECT_TRUE(throws_error(bad, {xt, gt, st, st, {DType::f32, {2, 5}}}, {"[layer_norm_grad] dy must have x's shape"}));
  EXPECT_TRUE(throws_error(bad, {xt, gt, st, {DType::f32, {4}}, xt}, {"[layer_norm_grad] statistic 1 must be f32[2]"}));
  EXPECT_TRUE(throws_error(bad, {xt, gt, st, xt}, {"[layer_norm_grad] takes x, gamma, mean, rstd and dy"}));
  // A second derivative through a norm is refused, naming the primitive.
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>& in) {
        Tensor dx = gradients(sum(layer_norm(in[0], in[1], Tensor()) * in[0]), {in[0]})[0];
        return gradients(sum(dx * dx), {in[0]});
      },
      {xt, gt}, {"'layer_norm_grad' is not differentiable"}));
}

// A 16-bit head's logits reach the loss and its gradient as they are: the compiler drops the
// widening cast in front of them (Primitive::widens_operands), so no f32 copy of the logits is
// written, and the loss and the gradient equal, to the bit, the program compiled without the pass.
TEST(Gradients, CrossEntropyReadsNarrowLogits) {
  std::vector<Array> in = {random_array({6, 37}, DType::bf16, 23, -4, 4), Array::from_i32({0, 36, 5, -100, 17, 2}, {6})};
  auto exe = testing::compile_keeping_bits(
      [](const std::vector<Tensor>& x) {
        Tensor loss = sum(softmax_cross_entropy(cast(x[0], DType::f32), x[1]));
        return std::vector<Tensor>{loss, gradients(loss, {x[0]})[0]};
      },
      in);
  const Graph& cg = exe->graph();
  int losses = 0;
  for (const Node& n : cg.nodes()) {
    if (n.prim->name.rfind("softmax_cross_entropy", 0) == 0) {
      ++losses;
      EXPECT_EQ(cg.type(n.inputs[0]).dtype, DType::bf16) << cg.to_string();
    }
    EXPECT_FALSE(n.prim->name == "cast" && cg.type(n.outputs[0]).dtype == DType::f32) << cg.to_string();
  }
  EXPECT_EQ(losses, 2);
}

TEST(Gradients, SecondOrderThroughGeluSiluAndCrossEntropy) {
  Array x = random_array({2, 5}, DType::f32, 19, -2, 2);
  for (int k = 0; k < 3; ++k)
    EXPECT_TRUE(check_grads(
        [k](const std::vector<Tensor>& in) {
          Tensor y = k == 2 ? silu(in[0]) : gelu(in[0], k == 0);
          return std::vector<Tensor>{gradients(sum(y * y), {in[0]})[0]};
        },
        {x}))
        << k;
  Array labels = Array::from_i32({1, -100}, {2});
  EXPECT_TRUE(check_grads(
      [](const std::vector<Tensor>& in) {
        Tensor l = softmax_cross_entropy(in[0] * in[0], in[1]);
        return std::vector<Tensor>{gradients(sum(l * l), {in[0]})[0]};
      },
      {x, labels}));
}

// -log softmax(x)[label] per row in double.
std::vector<float> ref_ce(const std::vector<float>& x, const std::vector<int32_t>& labels, int64_t v, int64_t ignore) {
  std::vector<float> out;
  for (size_t r = 0; r < labels.size(); ++r) {
    if (labels[r] == ignore) {
      out.push_back(0);
      continue;
    }
    double m = -INFINITY, s = 0;
    for (int64_t i = 0; i < v; ++i) m = std::max(m, static_cast<double>(x[r * v + i]));
    for (int64_t i = 0; i < v; ++i) s += std::exp(x[r * v + i] - m);
    out.push_back(static_cast<float>(m + std::log(s) - x[r * v + labels[r]]));
  }
  return out;
}

TEST(CrossEntropy, PerPositionLossMatchesReference) {
  for (DType dt : {DType::f32, DType::bf16}) {
    Array logits = random_array({2, 3, 37}, dt, 20, -5, 5);
    Array labels = Array::from_i32({0, 36, -100, 5, 17, 2}, {2, 3});
    Array loss = eval1(
        [](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax_cross_entropy(in[0], in[1])}; },
        {logits, labels});
    EXPECT_EQ(loss.type(), (TensorType{DType::f32, {2, 3}}));
    EXPECT_TRUE(all_close(loss.to_f32(), ref_ce(logits.to_f32(), labels.to_i32(), 37, -100), 1e-5, 1e-5));
    EXPECT_EQ(loss.to_f32()[2], 0.0f);
  }
  // A custom ignore index, a label out of range (NaN, never a crash) and empty batches.
  Array logits = random_array({3, 4}, DType::f32, 21);
  Array labels = Array::from_i32({7, 3, 4}, {3});
  auto l = eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax_cross_entropy(in[0], in[1], 7)}; },
                 {logits, labels})
               .to_f32();
  EXPECT_EQ(l[0], 0.0f);
  EXPECT_NEAR(l[1], ref_ce(logits.to_f32(), {0, 3, 0}, 4, -1)[1], 1e-5);
  EXPECT_TRUE(std::isnan(l[2]));
  Array e = eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax_cross_entropy(in[0], in[1])}; },
                  {Array::zeros(DType::f32, {0, 5}), Array::from_i32({}, {0})});
  EXPECT_EQ(e.shape(), (Shape{0}));
}

TEST(CrossEntropy, LossMeanWithWeightsAndIgnoredPositions) {
  Array logits = random_array({4, 6}, DType::f32, 22, -3, 3);
  Array labels = Array::from_i32({1, -100, 5, 0}, {4});
  Array w = Array::from_f32({0.5f, 2.0f, 1.0f, 0.0f}, {4});
  auto per = ref_ce(logits.to_f32(), labels.to_i32(), 6, -100);
  Array plain = eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cross_entropy_loss(in[0], in[1])}; },
                      {logits, labels});
  EXPECT_NEAR(plain.to_f32()[0], (per[0] + per[2] + per[3]) / 3, 1e-5);
  Array weighted = eval1(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{cross_entropy_loss(in[0], in[1], in[2])}; },
      {logits, labels, w});
  EXPECT_NEAR(weighted.to_f32()[0], (0.5 * per[0] + per[2]) / 1.5, 1e-5);
  // All positions ignored: the denominator is clamped to 1, the loss is 0.
  Array none = eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cross_entropy_loss(in[0], in[1])}; },
                     {logits, Array::from_i32({-100, -100, -100, -100}, {4})});
  EXPECT_EQ(none.to_f32()[0], 0.0f);
}

TEST(CrossEntropy, GradientsWithIgnoreIndexAndWeights) {
  Array logits = random_array({4, 5}, DType::f32, 23, -2, 2);
  Array labels = Array::from_i32({1, -100, 4, 0}, {4});
  Array w = Array::from_f32({0.5f, 2.0f, 1.0f, 3.0f}, {4});
  EXPECT_TRUE(check_grads(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax_cross_entropy(in[0], in[1])}; },
      {logits, labels}));
  EXPECT_TRUE(check_grads(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{cross_entropy_loss(in[0], in[1], in[2])}; },
      {logits, labels, w}));
  // The ignored row gets an exactly zero gradient.
  auto d = eval1(
      [](const std::vector<Tensor>& in) { return gradients(cross_entropy_loss(in[0], in[1]), {in[0]}); },
      {logits, labels});
  for (int i = 5; i < 10; ++i) EXPECT_EQ(d.to_f32()[i], 0.0f);
  // bf16 logits: gradient matches the f32 one within bf16 rounding.
  Array l16 = logits.astype(DType::bf16);
  auto g16 = eval1([](const std::vector<Tensor>& in) { return gradients(cross_entropy_loss(in[0], in[1]), {in[0]}); },
                   {l16, labels});
  auto g32 = eval1([](const std::vector<Tensor>& in) { return gradients(cross_entropy_loss(in[0], in[1]), {in[0]}); },
                   {l16.astype(DType::f32), labels});
  EXPECT_EQ(g16.dtype(), DType::bf16);
  EXPECT_TRUE(all_close(g16.to_f32(), g32.to_f32(), 2e-3, 1e-2));
}

TEST(NnRules, ShardingRulesKeepNormalizedAxesWhole) {
  auto rule = [](const TracedFn& f, const std::vector<TensorType>& types) {
    auto g = trace(f, types);
    const Node& n = g->nodes().back();
    std::vector<TensorType> in, out;
    for (int v : n.inputs) in.push_back(g->type(v));
    for (int v : n.outputs) out.push_back(g->type(v));
    return sharding_of(*n.prim, in, out, n.attrs).to_string();
  };
  EXPECT_EQ(rule(unary([](const Tensor& t) { return softmax(t, 1); }), {{DType::f32, {2, 3, 4}}}),
            "abc->abc {b: whole}");
  EXPECT_EQ(rule([](const std::vector<Tensor>& in) { return std::vector<Tensor>{layer_norm(in[0], in[1], in[2])}; },
                 {{DType::f32, {2, 3, 4}}, {DType::f32, {4}}, {DType::f32, {4}}}),
            "abc,c,c->abc,ab,ab {c: whole}");
  EXPECT_EQ(rule([](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax_cross_entropy(in[0], in[1])}; },
                 {{DType::f32, {2, 3, 9}}, {DType::i32, {2, 3}}}),
            "abc,ab->ab {c: whole}");
  EXPECT_EQ(rule(unary([](const Tensor& t) { return gelu(t); }), {{DType::f32, {2, 3}}}), "ab->ab");
}

TEST(NnErrors, BadShapesAndDtypes) {
  TensorType x{DType::f32, {2, 4}};
  EXPECT_TRUE(throws_error(unary([](const Tensor& t) { return softmax(t, 2); }), {x}, {"[softmax]", "axis 2"}));
  EXPECT_TRUE(throws_error(unary([](const Tensor& t) { return log_softmax(t); }), {{DType::i32, {3}}},
                           {"[log_softmax]", "floating point", "i32[3]"}));
  EXPECT_TRUE(throws_error(unary([](const Tensor& t) { return gelu(t); }), {{DType::i32, {3}}}, {"[gelu]", "i32[3]"}));
  EXPECT_TRUE(throws_error(unary([](const Tensor& t) { return silu(t); }), {{DType::boolean, {3}}}, {"[silu]"}));
  auto ln = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{layer_norm(in[0], in[1], Tensor())}; };
  EXPECT_TRUE(throws_error(ln, {x, {DType::f32, {5}}}, {"[layer_norm] gamma must have shape [4]", "f32[2,4]", "f32[5]"}));
  EXPECT_TRUE(throws_error(ln, {x, {DType::bf16, {4}}}, {"[layer_norm] gamma dtype bf16"}));
  EXPECT_TRUE(throws_error(ln, {{DType::f32, {}}, {DType::f32, {1}}}, {"[layer_norm]", "rank >= 1"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{rms_norm(in[0], in[1])}; },
                           {x, {DType::f32, {4, 1}}}, {"[rms_norm] gamma must have shape [4]"}));
  auto ce = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax_cross_entropy(in[0], in[1])}; };
  EXPECT_TRUE(throws_error(ce, {x, {DType::f32, {2}}}, {"[softmax_cross_entropy] labels must be i32"}));
  EXPECT_TRUE(throws_error(ce, {x, {DType::i32, {3}}}, {"[softmax_cross_entropy]", "leading shape [2]"}));
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{cross_entropy_loss(in[0], in[1], in[2])}; },
      {x, {DType::i32, {2}}, {DType::f32, {3}}}, {"[cross_entropy_loss] weights"}));
}

}  // namespace
}  // namespace px
