// Reverse-mode autodiff: fan-out accumulation, multiple outputs, integer and unreachable inputs,
// the function transforms, graph-level gradients and second-order derivatives.
#include <cmath>

#include "ir/private_prims.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::eval;
using testing::random_array;

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

using testing::error_of;

std::vector<float> map(const std::vector<float>& a, const std::function<float(float)>& f) {
  std::vector<float> r(a.size());
  for (size_t i = 0; i < a.size(); ++i) r[i] = f(a[i]);
  return r;
}

TEST(Autodiff, FanOutAccumulatesEveryUse) {
  // L = sum(x * x + tanh(x) * y + x): x is used four times.
  Array x = random_array({2, 5}, DType::f32, 1), y = random_array({2, 5}, DType::f32, 2);
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        const Tensor &x = in[0], &y = in[1];
        Tensor l = sum(x * x + tanh(x) * y + x);
        std::vector<Tensor> d = gradients(l, {x, y});
        return std::vector<Tensor>{l, d[0], d[1]};
      },
      {x, y});
  std::vector<float> xs = x.to_f32(), ys = y.to_f32(), dx(10), dy(10);
  for (int i = 0; i < 10; ++i) {
    float t = std::tanh(xs[i]);
    dx[i] = 2 * xs[i] + (1 - t * t) * ys[i] + 1;
    dy[i] = t;
  }
  EXPECT_EQ(out[1].shape(), (Shape{2, 5}));
  EXPECT_TRUE(all_close(out[1].to_f32(), dx, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(out[2].to_f32(), dy, 1e-6, 1e-6));
}

TEST(Autodiff, SeveralOutputsWithCotangents) {
  Array x = random_array({4}, DType::f32, 3), c1 = random_array({4}, DType::f32, 4),
        c2 = random_array({4}, DType::f32, 5);
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        Tensor y1 = in[0] * 2.0, y2 = exp(in[0]);
        return gradients({y1, y2}, {in[0]}, {in[1], in[2]});
      },
      {x, c1, c2});
  std::vector<float> xs = x.to_f32(), a = c1.to_f32(), b = c2.to_f32(), want(4);
  for (int i = 0; i < 4; ++i) want[i] = 2 * a[i] + std::exp(xs[i]) * b[i];
  EXPECT_TRUE(all_close(out[0].to_f32(), want));
}

TEST(Autodiff, MultiOutputNodeWithOneUsedOutput) {
  testprims::register_test_prims();
  Array x = random_array({6}, DType::f32, 6);
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        std::vector<Tensor> s = testprims::split2(in[0]);  // (x, 2x)
        Tensor only_second = sum(s[1] * s[1]);             // 4 x^2 -> 8x
        Tensor both = sum(s[0] + s[1] * 3.0);              // 7x    -> 7
        return std::vector<Tensor>{gradients(only_second, {in[0]})[0], gradients(both, {in[0]})[0]};
      },
      {x});
  EXPECT_TRUE(all_close(out[0].to_f32(), map(x.to_f32(), [](float v) { return 8 * v; })));
  EXPECT_TRUE(all_close(out[1].to_f32(), std::vector<float>(6, 7.0f)));
}

TEST(Autodiff, IntegerInputsGetUndefinedGradients) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor l = sum(cast(in[0], DType::f32) * in[1]);
        std::vector<Tensor> d = gradients(l, {in[0], in[1]});
        EXPECT_FALSE(d[0].defined());
        EXPECT_TRUE(d[1].defined());
        return std::vector<Tensor>{d[1]};
      },
      {{DType::i32, {3}}, f32({3})});
  auto out = Executable::compile(*g)->run({Array::from_i32({1, -2, 5}, {3}), random_array({3})});
  EXPECT_EQ(out[0].to_f32(), (std::vector<float>{1, -2, 5}));
}

TEST(Autodiff, UnreachableFloatInputsGetZeros) {
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        Tensor l = sum(in[0] * 3.0);
        std::vector<Tensor> d = gradients(l, {in[0], in[1], in[2]});
        return std::vector<Tensor>{d[1], d[2]};
      },
      {random_array({2}), random_array({3, 2}), random_array({4}, DType::bf16)});
  EXPECT_EQ(out[0].shape(), (Shape{3, 2}));
  EXPECT_EQ(out[0].to_f32(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(out[1].dtype(), DType::bf16);
  EXPECT_EQ(out[1].to_f32(), std::vector<float>(4, 0.0f));
}

TEST(Autodiff, StopGradientBlocksTheFlow) {
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        Tensor l = sum(in[0] * stop_gradient(in[0]));  // d/dx = stop(x)
        return gradients(l, {in[0]});
      },
      {Array::from_f32({1, 2, 3}, {3})});
  EXPECT_EQ(out[0].to_f32(), (std::vector<float>{1, 2, 3}));
}

TEST(Autodiff, GradientWithRespectToAnIntermediate) {
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        Tensor h = in[0] * 2.0;
        Tensor l = sum(h * h);
        std::vector<Tensor> d = gradients(l, {h, in[0]});  // dL/dh = 2h, dL/dx = 8x
        return d;
      },
      {Array::from_f32({1, -1}, {2})});
  EXPECT_EQ(out[0].to_f32(), (std::vector<float>{4, -4}));
  EXPECT_EQ(out[1].to_f32(), (std::vector<float>{8, -8}));
}

TEST(Autodiff, ClearErrors) {
  testprims::register_test_prims();  // CTest runs each test in its own process
  std::string msg = error_of(
      [] { trace([](const std::vector<Tensor>& in) { return gradients(tanh(in[0]), {in[0]}); }, {f32({3})}); });
  EXPECT_NE(msg.find("[gradients] output 0 has shape [3]; pass a cotangent for non-scalar outputs"), std::string::npos)
      << msg;
  msg = error_of([] {
    trace([](const std::vector<Tensor>& in) { return gradients({in[0] * 2.0}, {in[0]}, {in[1]}); },
          {f32({3}), f32({4})});
  });
  EXPECT_NE(msg.find("[gradients] cotangent 0 has type f32[4]; output 0 has type f32[3]"), std::string::npos) << msg;
  msg = error_of([] {
    trace([](const std::vector<Tensor>& in) { return gradients({in[0]}, {in[0]}, {in[0], in[0]}); }, {f32({})});
  });
  EXPECT_NE(msg.find("[gradients] got 2 cotangents for 1 outputs"), std::string::npos) << msg;
  msg = error_of([] {
    trace(
        [](const std::vector<Tensor>& in) {
          return value_and_grad([](const std::vector<Tensor>& a) { return std::vector<Tensor>{sum(a[0])}; }, {3})(in);
        },
        {f32({2})});
  });
  EXPECT_NE(msg.find("[value_and_grad] argnum 3 out of range for 1 arguments"), std::string::npos) << msg;
  // Gradients through a primitive without a vjp rule name it.
  msg = error_of([] {
    trace([](const std::vector<Tensor>& in) { return gradients(sum(testprims::effect(in[0])), {in[0]}); }, {f32({2})});
  });
  EXPECT_NE(msg.find("primitive 'test_effect' is not differentiable"), std::string::npos) << msg;
}

TEST(Autodiff, ValueAndGradAndGrad) {
  TensorFn f = [](const std::vector<Tensor>& a) {
    Tensor l = sum(a[0] * a[0] * a[1]);
    return std::vector<Tensor>{l, a[0] + a[1]};  // an auxiliary output rides along
  };
  Array x = Array::from_f32({1, 2}, {2}), y = Array::from_f32({3, -1}, {2});
  auto vg = eval([&](const std::vector<Tensor>& in) { return value_and_grad(f, {0, 1})(in); }, {x, y});
  ASSERT_EQ(vg.size(), 4u);
  EXPECT_EQ(vg[0].to_f32(), (std::vector<float>{3 - 4}));
  EXPECT_EQ(vg[1].to_f32(), (std::vector<float>{4, 1}));
  EXPECT_EQ(vg[2].to_f32(), (std::vector<float>{6, -4}));  // 2 x y
  EXPECT_EQ(vg[3].to_f32(), (std::vector<float>{1, 4}));   // x^2
  auto g = eval([&](const std::vector<Tensor>& in) { return grad(f, {1})(in); }, {x, y});
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].to_f32(), (std::vector<float>{1, 4}));
}

TEST(Autodiff, Vjp) {
  Array x = random_array({3}, DType::f32, 9), ct = random_array({3}, DType::f32, 10);
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        auto [ys, back] = vjp([](const std::vector<Tensor>& a) { return std::vector<Tensor>{sigmoid(a[0])}; }, {in[0]});
        std::vector<Tensor> d = back({in[1]});
        return std::vector<Tensor>{ys[0], d[0]};
      },
      {x, ct});
  std::vector<float> xs = x.to_f32(), c = ct.to_f32(), want(3);
  for (int i = 0; i < 3; ++i) {
    float s = 1 / (1 + std::exp(-xs[i]));
    want[i] = s * (1 - s) * c[i];
  }
  EXPECT_TRUE(all_close(out[1].to_f32(), want));
}

TEST(Autodiff, CallInlinesAGraphAndKeepsTags) {
  auto inner = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{exp(in[0]) * in[1]}; },
                     {f32({2}), f32({2})});
  inner->mutable_nodes()[0].name = "the_exp";
  auto outer = trace(
      [&](const std::vector<Tensor>& in) {
        std::vector<Tensor> r = call(*inner, {in[0], in[0] + 1.0});
        return std::vector<Tensor>{r[0]};
      },
      {f32({2})});
  EXPECT_NE(outer->to_string().find("# the_exp"), std::string::npos) << outer->to_string();
  auto out = Executable::compile(*outer)->run({Array::from_f32({0, 1}, {2})});
  EXPECT_TRUE(all_close(out[0].to_f32(), {1.0f, std::exp(1.0f) * 2}));
  std::string msg =
      error_of([&] { trace([&](const std::vector<Tensor>& in) { return call(*inner, {in[0]}); }, {f32({2})}); });
  EXPECT_NE(msg.find("[call] graph takes 2 arguments, got 1"), std::string::npos) << msg;
  msg = error_of([&] {
    trace([&](const std::vector<Tensor>& in) { return call(*inner, {in[0], in[0]}); }, {f32({3})});
  });
  EXPECT_NE(msg.find("[call] argument 0 has type f32[3], expected f32[2]"), std::string::npos) << msg;
}

TEST(Autodiff, GradGraph) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{sum(in[0] * in[1]), in[1] * 2.0};
      },
      {f32({3}), f32({3})}, {"x", "w"});
  auto gg = grad_graph(*g, {1, 0});
  EXPECT_EQ(gg->input_names(), (std::vector<std::string>{"x", "w"}));
  ASSERT_EQ(gg->outputs().size(), 4u);
  Array x = Array::from_f32({1, 2, 3}, {3}), w = Array::from_f32({4, 5, 6}, {3});
  auto out = Executable::compile(*gg)->run({x, w});
  EXPECT_EQ(out[0].to_f32(), (std::vector<float>{32}));
  EXPECT_EQ(out[2].to_f32(), x.to_f32());  // d/dw
  EXPECT_EQ(out[3].to_f32(), w.to_f32());  // d/dx
  EXPECT_NE(
      error_of([&] { grad_graph(*g, {0}, 1); }).find("[grad_graph] output 1 has type f32[3]; only a float scalar"),
      std::string::npos);
  EXPECT_NE(error_of([&] { grad_graph(*g, {0}, 2); }).find("[grad_graph] output 2 does not exist"), std::string::npos);
  EXPECT_NE(error_of([&] { grad_graph(*g, {5}); }).find("[grad_graph] input 5 does not exist"), std::string::npos);
  auto gi = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(cast(in[0], DType::f32))}; },
                  {{DType::i32, {2}}});
  EXPECT_NE(error_of([&] { grad_graph(*gi, {0}); }).find("integer input"), std::string::npos);
}

TEST(Autodiff, SecondOrderMatchesAnalytic) {
  // f(x) = sum(x^3 + tanh(x)): f' = 3x^2 + (1 - t^2), f'' = 6x - 2 t (1 - t^2).
  Array x = random_array({7}, DType::f32, 11, -1.5f, 1.5f);
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        TensorFn f = [](const std::vector<Tensor>& a) {
          return std::vector<Tensor>{sum(a[0] * a[0] * a[0] + tanh(a[0]))};
        };
        TensorFn df = grad(f);
        // d/dx sum(f'(x)) is the diagonal of the Hessian here (f is separable).
        TensorFn d2f = grad([df](const std::vector<Tensor>& a) { return std::vector<Tensor>{sum(df(a)[0])}; });
        return std::vector<Tensor>{df(in)[0], d2f(in)[0]};
      },
      {x});
  std::vector<float> xs = x.to_f32();
  EXPECT_TRUE(all_close(out[0].to_f32(),
                        map(xs,
                            [](float v) {
                              float t = std::tanh(v);
                              return 3 * v * v + 1 - t * t;
                            }),
                        1e-5, 1e-5));
  EXPECT_TRUE(all_close(out[1].to_f32(),
                        map(xs,
                            [](float v) {
                              float t = std::tanh(v);
                              return 6 * v - 2 * t * (1 - t * t);
                            }),
                        1e-4, 1e-4));
}

TEST(Autodiff, HessianVectorProductOfAMatmulLoss) {
  // L(w) = 0.5 * sum((x w)^2): grad = x^T x w, Hessian-vector product H v = x^T x v.
  Array x = random_array({5, 3}, DType::f32, 12), w = random_array({3, 2}, DType::f32, 13),
        v = random_array({3, 2}, DType::f32, 14);
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        const Tensor &x = in[0], &w = in[1], &v = in[2];
        Tensor y = matmul(x, w);
        Tensor l = sum(y * y) * 0.5;
        Tensor gw = gradients(l, {w})[0];
        Tensor hv = gradients(sum(gw * v), {w})[0];
        return std::vector<Tensor>{gw, hv};
      },
      {x, w, v});
  std::vector<float> X = x.to_f32(), W = w.to_f32(), V = v.to_f32(), gram(9, 0), g(6, 0), hv(6, 0);
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 3; ++j)
      for (int r = 0; r < 5; ++r) gram[i * 3 + j] += X[r * 3 + i] * X[r * 3 + j];
  for (int i = 0; i < 3; ++i)
    for (int c = 0; c < 2; ++c)
      for (int j = 0; j < 3; ++j) {
        g[i * 2 + c] += gram[i * 3 + j] * W[j * 2 + c];
        hv[i * 2 + c] += gram[i * 3 + j] * V[j * 2 + c];
      }
  EXPECT_TRUE(all_close(out[0].to_f32(), g, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(out[1].to_f32(), hv, 1e-4, 1e-4));
}

TEST(Autodiff, FiniteDifferencesOnAComposite) {
  EXPECT_TRUE(testing::check_grads(
      [](const std::vector<Tensor>& in) {
        Tensor h = tanh(matmul(in[0], in[1]));
        // h is used three times; the row sum broadcasts back over h.
        return std::vector<Tensor>{h * sigmoid(h) + sum(h, {1}, true)};
      },
      {random_array({3, 4}, DType::f32, 15), random_array({4, 5}, DType::f32, 16)}));
}

}  // namespace
}  // namespace px
