// Whole training steps: loss, gradients, clipping and the optimizer traced into one graph.
#include <cmath>

#include "optim/optim_testing.h"

namespace px::optim {
namespace {

using px::testing::random_array;

// Fits y = x w_true + b_true with a linear model; returns the losses of `steps` steps.
std::vector<float> train(const OptimizerPtr& opt, int steps, double clip = 0.0) {
  const int64_t n = 16, d = 3;
  Array x = random_array({n, d}, DType::f32, 1);
  std::vector<float> xv = x.to_f32(), yv(n);
  const float w_true[d] = {1.5f, -2.0f, 0.5f};
  for (int64_t i = 0; i < n; ++i) {
    yv[i] = 0.3f;
    for (int64_t j = 0; j < d; ++j) yv[i] += xv[i * d + j] * w_true[j];
  }
  Array y = Array::from_f32(yv, {n, 1});
  std::vector<Array> params = {Array::zeros(DType::f32, {d, 1}), Array::zeros(DType::f32, {1})};
  std::vector<Array> state = opt->init_state(params);
  const size_t ns = state.size();

  std::vector<TensorType> types = {params[0].type(), params[1].type()};
  for (auto& s : state) types.push_back(s.type());
  types.push_back(x.type());
  types.push_back(y.type());
  types.push_back({DType::i32, {}});
  auto g = trace(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> p = {in[0], in[1]}, s(in.begin() + 2, in.begin() + 2 + ns);
        Tensor xs = in[2 + ns], ys = in[3 + ns], step = in[4 + ns];
        Tensor loss = mean(square(matmul(xs, p[0]) + p[1] - ys));
        std::vector<Tensor> grads = gradients(loss, p);
        if (clip > 0) grads = clip_by_global_norm(grads, clip).grads;
        Update u = opt->apply(p, grads, s, step, {"lin.w", "lin.b"});
        std::vector<Tensor> out = {loss};
        out.insert(out.end(), u.params.begin(), u.params.end());
        out.insert(out.end(), u.state.begin(), u.state.end());
        return out;
      },
      types);
  auto exe = Executable::compile(*g);
  std::vector<float> losses;
  for (int t = 1; t <= steps; ++t) {
    std::vector<Array> in = params;
    in.insert(in.end(), state.begin(), state.end());
    in.push_back(x);
    in.push_back(y);
    in.push_back(Array::from_i32({t}, {}));
    std::vector<Array> out = exe->run(in);
    losses.push_back(out[0].to_f32()[0]);
    params = {out[1], out[2]};
    state.assign(out.begin() + 3, out.end());
  }
  return losses;
}

void expect_converges(const std::vector<float>& losses, double factor) {
  ASSERT_FALSE(losses.empty());
  for (float l : losses) ASSERT_TRUE(std::isfinite(l));
  EXPECT_LT(losses.back(), losses.front() * factor) << "first " << losses.front() << ", last " << losses.back();
}

TEST(TrainLoop, SgdMomentumConverges) { expect_converges(train(sgd({.lr = 0.05, .momentum = 0.9}), 150), 1e-3); }
TEST(TrainLoop, AdamWWithClippingConverges) {
  expect_converges(
      train(adamw({.lr = warmup_cosine(0.1, 5, 200), .weight_decay = 1e-4, .decay_mask = exclude_paths({"*.b"})}), 200,
            /*clip=*/1.0),
      1e-3);
}
TEST(TrainLoop, AdafactorConverges) {
  expect_converges(train(adafactor({.lr = 0.1, .relative_step = false, .scale_parameter = false}), 200), 1e-2);
}

}  // namespace
}  // namespace px::optim
