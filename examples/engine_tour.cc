// A tour of the engine: trace a small MLP classifier into a graph, differentiate it, compile it
// once, and run a few steps of gradient descent on the compiled executable.
//   ./examples/engine_tour
#include <cstdio>
#include <iostream>
#include <random>

#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"

namespace {

constexpr int64_t kBatch = 16, kIn = 8, kHidden = 32, kClasses = 4;

// params = {w1, b1, w2, b2}; returns the mean cross-entropy of the 2-layer tanh MLP.
px::Tensor mlp_loss(const std::vector<px::Tensor>& params, const px::Tensor& x, const px::Tensor& labels) {
  px::Tensor h = px::tanh(px::matmul(x, params[0]) + params[1]);
  px::Tensor logits = px::matmul(h, params[2]) + params[3];
  return px::cross_entropy_loss(logits, labels);
}

px::Array random_normal(const px::Shape& shape, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(px::numel(shape)));
  for (float& e : v) e = normal(rng);
  return px::Array::from_f32(v, shape);
}

}  // namespace

int main() {
  std::vector<px::TensorType> types = {
      {px::DType::f32, {kIn, kHidden}}, {px::DType::f32, {kHidden}},  {px::DType::f32, {kHidden, kClasses}},
      {px::DType::f32, {kClasses}},     {px::DType::f32, {kBatch, kIn}}, {px::DType::i32, {kBatch}}};
  std::vector<std::string> names = {"w1", "b1", "w2", "b2", "x", "labels"};

  // 1. Tracing turns C++ code on symbolic Tensors into a graph: shapes are checked as it runs.
  auto forward = px::trace(
      [](const std::vector<px::Tensor>& in) {
        return std::vector<px::Tensor>{mlp_loss({in[0], in[1], in[2], in[3]}, in[4], in[5])};
      },
      types, names);
  std::cout << "== forward graph ==\n" << forward->to_string() << "\n";

  // 2. Gradients are more nodes in the same graph, built from each primitive's vjp rule.
  auto train = px::trace(
      [](const std::vector<px::Tensor>& in) {
        std::vector<px::Tensor> params(in.begin(), in.begin() + 4);
        px::Tensor loss = mlp_loss(params, in[4], in[5]);
        std::vector<px::Tensor> out = px::gradients(loss, params);
        out.insert(out.begin(), loss);
        return out;  // loss, dw1, db1, dw2, db2
      },
      types, names);
  std::cout << "== loss and gradients: " << train->nodes().size() << " nodes ==\n";

  // 3. Compiling fixes the schedule, fuses elementwise chains and plans every buffer, so the
  //    memory a step needs is known before it runs.
  auto exe = px::Executable::compile(*train);
  std::cout << exe->summary() << "peak working memory: " << exe->peak_bytes() << " bytes\n\n";

  // 4. Run: the labels are a fixed function of x (the sign pattern of two features), so plain
  //    gradient descent on the compiled step drives the loss down.
  std::mt19937 rng(0);
  std::vector<px::Array> args = {random_normal({kIn, kHidden}, 0.5f, rng), px::Array::zeros(px::DType::f32, {kHidden}),
                                 random_normal({kHidden, kClasses}, 0.5f, rng),
                                 px::Array::zeros(px::DType::f32, {kClasses}), random_normal({kBatch, kIn}, 1.0f, rng),
                                 px::Array()};
  std::vector<int32_t> labels(kBatch);
  const float* x = args[4].data<float>();
  for (int64_t i = 0; i < kBatch; ++i) labels[i] = (x[i * kIn] > 0 ? 1 : 0) + (x[i * kIn + 1] > 0 ? 2 : 0);
  args[5] = px::Array::from_i32(labels, {kBatch});

  const float lr = 0.5f;
  std::vector<px::Array> out;
  for (int step = 0; step <= 60; ++step) {
    out = exe->run(args);
    if (step % 10 == 0) std::printf("step %2d  loss %.4f\n", step, out[0].to_f32()[0]);
    for (int p = 0; p < 4; ++p) {
      float* w = args[p].data<float>();
      const float* g = out[p + 1].data<float>();
      for (int64_t i = 0; i < args[p].numel(); ++i) w[i] -= lr * g[i];
    }
  }
  std::printf("gradient of b2 at the last step: [");
  for (float g : out[4].to_f32()) std::printf(" %.4f", g);
  std::printf(" ]\n");
  return 0;
}
