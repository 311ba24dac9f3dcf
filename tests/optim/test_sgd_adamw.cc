// SGD and AdamW against their formulas, evaluated in double precision over several steps.
#include <cmath>

#include "optim/optim_testing.h"

namespace px::optim {
namespace {

using px::testing::all_close;
using px::testing::random_array;
using testing::Stepper;
using testing::to_double;
using testing::to_float;

using Vec = std::vector<double>;

// Grads for step t (1-based) of param k: fixed random values that differ per step.
Array grad_for(const Shape& s, int k, int t) { return random_array(s, DType::f32, 100 + 10 * k + t, -2.0f, 2.0f); }

TEST(Sgd, PlainStepsFollowTheFormula) {
  Array w = random_array({2, 3}, DType::f32, 1);
  Stepper st(sgd({.lr = 0.1}), {w});
  Vec p = to_double(w);
  for (int t = 1; t <= 3; ++t) {
    Array g = grad_for({2, 3}, 0, t);
    Vec gd = to_double(g);
    EXPECT_NEAR(st.step({g}, t), 0.1, 1e-7);
    for (size_t i = 0; i < p.size(); ++i) p[i] -= 0.1 * gd[i];
    EXPECT_TRUE(all_close(st.params()[0].to_f32(), to_float(p), 1e-6, 1e-6)) << "step " << t;
  }
  EXPECT_TRUE(st.state().empty());
}

void check_momentum(bool nesterov) {
  const double lr = 0.05, mu = 0.9, wd = 0.01;
  Array w = random_array({3, 2}, DType::f32, 2), b = random_array({2}, DType::f32, 3);
  // The mask keeps weight decay off rank-1 params (biases).
  Stepper st(sgd({.lr = lr, .momentum = mu, .nesterov = nesterov, .weight_decay = wd, .decay_mask = rank_at_least(2)}),
             {w, b});
  ASSERT_EQ(st.state().size(), 2u);
  std::vector<Vec> p = {to_double(w), to_double(b)}, buf = {Vec(6, 0.0), Vec(2, 0.0)};
  for (int t = 1; t <= 3; ++t) {
    std::vector<Array> gs = {grad_for({3, 2}, 0, t), grad_for({2}, 1, t)};
    st.step(gs, t);
    for (int k = 0; k < 2; ++k) {
      Vec g = to_double(gs[k]);
      for (size_t i = 0; i < g.size(); ++i) {
        double gi = g[i] + (k == 0 ? wd * p[k][i] : 0.0);
        buf[k][i] = mu * buf[k][i] + gi;
        double d = nesterov ? gi + mu * buf[k][i] : buf[k][i];
        p[k][i] -= lr * d;
      }
      EXPECT_TRUE(all_close(st.params()[k].to_f32(), to_float(p[k]), 1e-6, 1e-5)) << "param " << k << " step " << t;
      EXPECT_TRUE(all_close(st.state()[k].to_f32(), to_float(buf[k]), 1e-6, 1e-5)) << "buffer " << k << " step " << t;
    }
  }
}
TEST(Sgd, MomentumWeightDecayAndMask) { check_momentum(false); }
TEST(Sgd, Nesterov) { check_momentum(true); }

TEST(Sgd, FollowsItsSchedule) {
  Array w = random_array({4}, DType::f32, 4);
  Stepper st(sgd({.lr = linear_warmup(0.3, 3)}), {w}, {}, DType::f32);
  Vec p = to_double(w);
  for (int t = 1; t <= 4; ++t) {
    Array g = grad_for({4}, 0, t);
    double lr = 0.3 * std::min(1.0, t / 3.0);
    EXPECT_NEAR(st.step({g}, t), lr, 1e-7);
    Vec gd = to_double(g);
    for (size_t i = 0; i < p.size(); ++i) p[i] -= lr * gd[i];
    EXPECT_TRUE(all_close(st.params()[0].to_f32(), to_float(p), 1e-6, 1e-5)) << "step " << t;
  }
}

// Reference AdamW: decoupled weight decay scaled by lr, bias-corrected moments.
struct AdamRef {
  double lr, b1, b2, eps, wd;
  void step(Vec& p, Vec& m, Vec& v, const Vec& g, int t, bool decay) const {
    for (size_t i = 0; i < p.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      double mh = m[i] / (1 - std::pow(b1, t)), vh = v[i] / (1 - std::pow(b2, t));
      p[i] = p[i] - lr * (mh / (std::sqrt(vh) + eps) + (decay ? wd * p[i] : 0.0));
    }
  }
};

TEST(AdamW, ThreeStepsWithMaskedDecay) {
  AdamRef ref{1e-2, 0.9, 0.999, 1e-8, 0.1};
  Array w = random_array({2, 3}, DType::f32, 5), b = random_array({3}, DType::f32, 6);
  std::vector<std::string> paths = {"layer.w", "layer.b"};
  Stepper st(adamw({.lr = ref.lr,
                    .beta1 = ref.b1,
                    .beta2 = ref.b2,
                    .eps = ref.eps,
                    .weight_decay = ref.wd,
                    .decay_mask = exclude_paths({"*.b"})}),
             {w, b}, paths);
  ASSERT_EQ(st.state().size(), 4u);
  std::vector<Vec> p = {to_double(w), to_double(b)};
  std::vector<Vec> m = {Vec(6), Vec(3)}, v = {Vec(6), Vec(3)};
  for (int t = 1; t <= 3; ++t) {
    std::vector<Array> gs = {grad_for({2, 3}, 0, t), grad_for({3}, 1, t)};
    st.step(gs, t);
    for (int k = 0; k < 2; ++k) {
      ref.step(p[k], m[k], v[k], to_double(gs[k]), t, /*decay=*/k == 0);
      EXPECT_TRUE(all_close(st.params()[k].to_f32(), to_float(p[k]), 1e-6, 1e-5)) << "param " << k << " step " << t;
      EXPECT_TRUE(all_close(st.state()[2 * k].to_f32(), to_float(m[k]), 1e-6, 1e-5)) << "m " << k << " step " << t;
      EXPECT_TRUE(all_close(st.state()[2 * k + 1].to_f32(), to_float(v[k]), 1e-7, 1e-5)) << "v " << k << " step " << t;
    }
  }
}

TEST(AdamW, BiasCorrectionIsAccurateEarlyAndLate) {
  // Small gradients and late steps stress 1 - beta^t; lr follows a schedule.
  AdamRef ref{0.0, 0.9, 0.999, 1e-8, 0.0};
  Schedule lr = warmup_cosine(1e-3, 2, 50);
  Array w = random_array({5}, DType::f32, 7);
  Stepper st(adam({.lr = lr}), {w});
  Vec p = to_double(w), m(5), v(5);
  for (int t : {1, 2, 3, 40}) {
    Array g = random_array({5}, DType::f32, 20 + t, -1e-3f, 1e-3f);
    EXPECT_NEAR(st.step({g}, t), lr.at(t), 1e-9);
    ref.lr = lr.at(t);
    ref.step(p, m, v, to_double(g), t, false);
    EXPECT_TRUE(all_close(st.params()[0].to_f32(), to_float(p), 1e-7, 1e-5)) << "step " << t;
  }
}

TEST(AdamW, Bf16ParamsKeepF32State) {
  AdamRef ref{1e-2, 0.9, 0.99, 1e-8, 0.0};
  Array w = random_array({4, 4}, DType::bf16, 8);
  auto opt = adamw({.lr = ref.lr, .beta1 = ref.b1, .beta2 = ref.b2, .weight_decay = 0.0});
  auto types = opt->state_types({w.type()});
  ASSERT_EQ(types.size(), 2u);
  EXPECT_EQ(types[0], (TensorType{DType::f32, {4, 4}}));
  Stepper st(opt, {w});
  Vec p = to_double(w), m(16), v(16);
  Array g = grad_for({4, 4}, 0, 1);
  st.step({g}, 1);
  ref.step(p, m, v, to_double(g), 1, false);
  EXPECT_EQ(st.params()[0].dtype(), DType::bf16);
  // One bf16 rounding of the result: relative error <= 2^-8.
  EXPECT_TRUE(all_close(st.params()[0].to_f32(), to_float(p), 1e-6, 1.0 / 256));
  EXPECT_TRUE(all_close(st.state()[0].to_f32(), to_float(m), 1e-6, 1e-5));
}

TEST(Optimizer, StateSlotsDescribeTheState) {
  std::vector<TensorType> params = {{DType::f32, {4, 6}}, {DType::bf16, {6}}};
  auto slots = adamw()->state_slots(params);
  ASSERT_EQ(slots.size(), 4u);
  EXPECT_EQ(slots[1].param, 0);
  EXPECT_EQ(slots[1].name, "v");
  EXPECT_EQ(slots[3].param, 1);
  EXPECT_EQ(slots[3].type, (TensorType{DType::f32, {6}}));
  EXPECT_TRUE(sgd()->state_slots(params).empty());
  EXPECT_EQ(sgd({.momentum = 0.5})->state_slots(params).size(), 2u);
  std::vector<Array> init = adamw()->init_state({Array::zeros(DType::f32, {4, 6}), Array::zeros(DType::bf16, {6})});
  ASSERT_EQ(init.size(), 4u);
  EXPECT_EQ(init[2].type(), (TensorType{DType::f32, {6}}));
  EXPECT_EQ(init[0].to_f32(), std::vector<float>(24, 0.0f));
  EXPECT_DOUBLE_EQ(adamw({.lr = rsqrt(1.0, 4)})->lr_at(16), 0.5);
}

TEST(Optimizer, ParamFilters) {
  TensorType mat{DType::f32, {2, 2}}, vec{DType::f32, {2}};
  EXPECT_TRUE(all_params()("x", vec));
  EXPECT_TRUE(rank_at_least(2)("x", mat));
  EXPECT_FALSE(rank_at_least(2)("x", vec));
  ParamFilter f = exclude_paths({"*.b", "*norm*", "embed.table"});
  EXPECT_FALSE(f("blocks.0.mlp.b", vec));
  EXPECT_TRUE(f("blocks.0.mlp.bb", vec));
  EXPECT_FALSE(f("blocks.1.ln_norm.scale", vec));
  EXPECT_FALSE(f("embed.table", mat));
  EXPECT_TRUE(f("embed.table2", mat));
  EXPECT_TRUE(f("", mat));
}

TEST(Optimizer, BadArgumentsGiveClearErrors) {
  using px::testing::throws_error;
  auto opt = adamw();
  TensorType w{DType::f32, {2, 3}}, s{DType::i32, {}};
  auto with = [&](std::function<void(const std::vector<Tensor>&)> f) {
    return [f](const std::vector<Tensor>& in) {
      f(in);
      return std::vector<Tensor>{in[0]};
    };
  };
  // in: param, grad, m, v, step
  std::vector<TensorType> ok = {w, w, w, w, s};
  EXPECT_TRUE(throws_error(with([&](auto& in) {
                             opt->apply({in[0]}, {}, {in[2], in[3]}, in[4]);
                           }),
                           ok, {"[adamw]", "1 params but 0 grads"}));
  EXPECT_TRUE(throws_error(with([&](auto& in) { opt->apply({in[0]}, {in[1]}, {in[2]}, in[4]); }), ok,
                           {"[adamw]", "1 state tensors", "need 2"}));
  EXPECT_TRUE(throws_error(with([&](auto& in) {
                             opt->apply({in[0]}, {in[1]}, {in[2], in[3]}, in[4], {"a", "b"});
                           }),
                           ok, {"[adamw]", "2 paths"}));
  EXPECT_TRUE(throws_error(with([&](auto& in) {
                             opt->apply({in[0]}, {in[1]}, {in[2], in[3]}, in[4]);
                           }),
                           {w, {DType::f32, {3, 2}}, w, w, s}, {"[adamw]", "grad of param 0", "f32[3,2]", "f32[2,3]"}));
  EXPECT_TRUE(throws_error(with([&](auto& in) {
                             opt->apply({in[0]}, {in[1]}, {in[2], in[3]}, in[4], {"blk.w"});
                           }),
                           {w, w, w, {DType::f32, {3}}, s},
                           {"[adamw]", "state 1", "'v' of param 0 ('blk.w')", "f32[3]"}));
  EXPECT_TRUE(throws_error(with([&](auto& in) {
                             opt->apply({in[0]}, {in[1]}, {in[2], in[3]}, in[4]);
                           }),
                           {w, w, w, w, {DType::f32, {2}}}, {"[adamw]", "step must be a scalar i32 or f32", "f32[2]"}));
  EXPECT_TRUE(throws_error(with([&](auto& in) { opt->apply({in[0]}, {in[1]}, {}, in[2]); }),
                           {{DType::i32, {2}}, {DType::f32, {2}}, s}, {"[adamw]", "param 0 has type i32[2]"}));
  auto bad_option = [](std::function<void()> f, const std::string& frag) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what()).find(frag) != std::string::npos;
    }
    return false;
  };
  EXPECT_TRUE(bad_option([] { adamw({.beta2 = 1.0}); }, "[adamw] beta1 and beta2 must be in [0, 1)"));
  EXPECT_TRUE(bad_option([] { sgd({.momentum = -1}); }, "[sgd] momentum must be"));
  EXPECT_TRUE(bad_option([] { sgd({.nesterov = true}); }, "[sgd] nesterov needs momentum"));
}

}  // namespace
}  // namespace px::optim
