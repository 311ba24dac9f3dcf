// Learning-rate schedules (host and traced values vs their formulas) and global-norm clipping.
#include <cmath>

#include "optim/optim_testing.h"

namespace px::optim {
namespace {

using px::testing::all_close;
using px::testing::eval;
using px::testing::random_array;
using px::testing::throws_error;

// Traced values of s at the given steps, from both an i32 and an f32 step input.
std::vector<double> traced(const Schedule& s, const std::vector<int64_t>& steps, DType dt) {
  auto g = trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{s.lr(in[0])}; }, {{dt, {}}});
  auto exe = Executable::compile(*g);
  std::vector<double> out;
  for (int64_t t : steps) {
    Array a = dt == DType::i32 ? Array::from_i32({static_cast<int32_t>(t)}, {}) : Array::scalar(static_cast<float>(t));
    Array r = exe->run({a})[0];
    EXPECT_EQ(r.type(), (TensorType{DType::f32, {}}));
    out.push_back(r.to_f32()[0]);
  }
  return out;
}

void check(const Schedule& s, const std::vector<int64_t>& steps, const std::function<double(double)>& formula) {
  std::vector<double> ti = traced(s, steps, DType::i32), tf = traced(s, steps, DType::f32);
  for (size_t k = 0; k < steps.size(); ++k) {
    double want = formula(static_cast<double>(steps[k]));
    EXPECT_NEAR(s.at(steps[k]), want, 1e-12 * std::max(1.0, std::fabs(want))) << s.describe() << " step " << steps[k];
    EXPECT_NEAR(ti[k], want, 1e-6 * std::fabs(want) + 1e-12) << s.describe() << " traced i32, step " << steps[k];
    EXPECT_NEAR(tf[k], want, 1e-6 * std::fabs(want) + 1e-12) << s.describe() << " traced f32, step " << steps[k];
  }
}

TEST(Schedule, Constant) {
  check(constant(3e-4), {0, 1, 7, 100000}, [](double) { return 3e-4; });
  Schedule plain = 0.25;  // a number converts to a constant schedule
  check(plain, {1, 5}, [](double) { return 0.25; });
  EXPECT_EQ(plain.describe(), "constant(0.25)");
}

TEST(Schedule, LinearWarmup) {
  check(linear_warmup(1e-3, 10), {0, 1, 5, 9, 10, 11, 1000}, [](double t) { return 1e-3 * std::min(1.0, t / 10); });
  check(linear_warmup(2.0, 0), {1, 2}, [](double) { return 2.0; });
}

TEST(Schedule, WarmupCosine) {
  const double peak = 3e-4, w = 200, total = 10000, fin = 0.1;
  auto formula = [&](double t) {
    if (t < w) return peak * t / w;
    double p = std::min(1.0, (t - w) / (total - w));
    return peak * (fin + (1 - fin) * 0.5 * (1 + std::cos(M_PI * p)));
  };
  check(warmup_cosine(peak, 200, 10000, fin), {1, 100, 199, 200, 201, 2650, 5100, 7000, 9999, 10000, 20000}, formula);
  // Decay to zero, and no warmup.
  check(warmup_cosine(1.0, 0, 8), {0, 1, 2, 4, 6, 7, 8, 9},
        [](double t) { return 0.5 * (1 + std::cos(M_PI * std::min(1.0, t / 8))); });
}

TEST(Schedule, WarmupExponentialWithFloor) {
  const double peak = 1e-2, rate = 0.5, floor = 0.05;
  auto formula = [&](double t) {
    if (t < 4) return peak * t / 4;
    return peak * std::max(floor, std::pow(rate, (t - 4) / 10));
  };
  check(warmup_exponential(peak, 4, 10, rate, floor), {1, 3, 4, 5, 14, 24, 33, 44, 60, 500}, formula);
}

TEST(Schedule, Rsqrt) {
  check(rsqrt(1e-3, 100), {1, 50, 99, 100, 101, 400, 10000},
        [](double t) { return t < 100 ? 1e-3 * t / 100 : 1e-3 * std::sqrt(100 / t); });
  check(rsqrt(0.5, 0), {1, 4, 100}, [](double t) { return 0.5 / std::sqrt(t); });
}

TEST(Schedule, BadArguments) {
  auto fails = [](std::function<void()> f, const std::string& frag) {
    try {
      f();
    } catch (const Error& e) {
      if (std::string(e.what()).find(frag) != std::string::npos) return ::testing::AssertionSuccess();
      return ::testing::AssertionFailure() << e.what();
    }
    return ::testing::AssertionFailure() << "no error";
  };
  EXPECT_TRUE(
      fails([] { warmup_cosine(1, 100, 50); }, "[warmup_cosine] total_steps (50) must exceed warmup_steps (100)"));
  EXPECT_TRUE(fails([] { linear_warmup(1, -1); }, "[linear_warmup] warmup_steps must be >= 0"));
  EXPECT_TRUE(fails([] { warmup_exponential(1, 0, 0, 0.5); }, "[warmup_exponential] decay_steps must be > 0"));
  EXPECT_TRUE(fails([] { constant(NAN); }, "[constant] value must be finite"));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{rsqrt(1.0, 10).lr(in[0])}; },
                           {{DType::bf16, {}}}, {"[rsqrt] step must be a scalar i32 or f32", "bf16[]"}));
}

// ---- clipping ------------------------------------------------------------------------------

double norm_of(const std::vector<Array>& xs) {
  double s = 0;
  for (auto& x : xs)
    for (float v : x.to_f32()) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

std::vector<Array> clip(const std::vector<Array>& gs, double max_norm) {
  return eval(
      [&](const std::vector<Tensor>& in) {
        Clipped c = clip_by_global_norm(in, max_norm);
        std::vector<Tensor> out = c.grads;
        out.push_back(c.norm);
        out.push_back(global_norm(in));
        return out;
      },
      gs);
}

TEST(Clip, ScalesDownOnlyAboveTheThreshold) {
  std::vector<Array> gs = {random_array({3, 4}, DType::f32, 1, -2, 2), random_array({5}, DType::f32, 2, -2, 2),
                           Array::scalar(1.5f), Array::zeros(DType::f32, {0, 3})};
  double n = norm_of(gs);
  for (double max_norm : {0.5 * n, 2.0 * n}) {
    std::vector<Array> out = clip(gs, max_norm);
    ASSERT_EQ(out.size(), gs.size() + 2);
    EXPECT_NEAR(out[gs.size()].to_f32()[0], n, 1e-5 * n);
    EXPECT_NEAR(out[gs.size() + 1].to_f32()[0], n, 1e-5 * n);
    double scale = std::min(1.0, max_norm / n);
    for (size_t k = 0; k < gs.size(); ++k) {
      std::vector<float> want;
      for (float v : gs[k].to_f32()) want.push_back(static_cast<float>(v * scale));
      EXPECT_EQ(out[k].shape(), gs[k].shape());
      EXPECT_TRUE(all_close(out[k].to_f32(), want, 1e-6, 1e-5)) << "grad " << k << " max_norm " << max_norm;
    }
    std::vector<Array> clipped(out.begin(), out.begin() + gs.size());
    EXPECT_NEAR(norm_of(clipped), std::min(n, max_norm), 1e-5 * n);
  }
}

TEST(Clip, ZeroGradsStayZeroAndBf16StaysBf16) {
  std::vector<Array> out = clip({Array::zeros(DType::f32, {4}), Array::from_f32({3, 4}, {2}, DType::bf16)}, 1.0);
  EXPECT_EQ(out[0].to_f32(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(out[1].dtype(), DType::bf16);
  EXPECT_TRUE(all_close(out[1].to_f32(), {0.6f, 0.8f}, 1e-6, 1.0 / 128));
  EXPECT_NEAR(out[2].to_f32()[0], 5.0, 1e-6);
  std::vector<Array> zero = clip({Array::zeros(DType::f32, {3})}, 1.0);
  EXPECT_EQ(zero[0].to_f32(), std::vector<float>(3, 0.0f));
  EXPECT_EQ(zero[1].to_f32()[0], 0.0f);
}

TEST(Clip, NanNormReachesTheGrads) {
  std::vector<Array> out = clip({Array::from_f32({1, NAN}, {2})}, 1.0);
  EXPECT_TRUE(std::isnan(out[1].to_f32()[0]));
  EXPECT_TRUE(std::isnan(out[0].to_f32()[0]));
}

TEST(Clip, BadArguments) {
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return clip_by_global_norm(in, 0.0).grads; },
                           {{DType::f32, {2}}}, {"[clip_by_global_norm] max_norm must be a finite number > 0"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return clip_by_global_norm(in, 1.0).grads; },
                           {{DType::f32, {2}}, {DType::i32, {2}}}, {"[clip_by_global_norm] tensor 1 has type i32[2]"}));
}

}  // namespace
}  // namespace px::optim
