// Traces a small function, differentiates it, compiles and runs it with parallax::core only.
#include <cmath>
#include <cstdio>
#include <vector>

#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"

int main() {
  // f(x, w) = sum(tanh(x @ w)); df/dw = x^T (1 - tanh(x @ w)^2).
  const int m = 2, k = 3, n = 2;
  auto g = px::trace(
      [](const std::vector<px::Tensor>& in) {
        px::Tensor y = px::sum(px::tanh(px::matmul(in[0], in[1])));
        return std::vector<px::Tensor>{y, px::gradients(y, {in[1]})[0]};
      },
      {{px::DType::f32, {m, k}}, {px::DType::f32, {k, n}}});
  auto exe = px::Executable::compile(*g);
  std::vector<float> x = {0.5f, -1.0f, 0.25f, 1.5f, 0.0f, -0.75f};
  std::vector<float> w = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f};
  std::vector<px::Array> out = exe->run({px::Array::from_f32(x, {m, k}), px::Array::from_f32(w, {k, n})});

  double f = 0;
  std::vector<double> dw(k * n, 0.0);
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double z = 0;
      for (int p = 0; p < k; ++p) z += x[i * k + p] * w[p * n + j];
      const double t = std::tanh(z);
      f += t;
      for (int p = 0; p < k; ++p) dw[p * n + j] += x[i * k + p] * (1 - t * t);
    }
  const float got = out[0].to_f32()[0];
  bool ok = std::fabs(got - f) < 1e-5;
  std::vector<float> gw = out[1].to_f32();
  for (int i = 0; i < k * n; ++i) ok = ok && std::fabs(gw[i] - dw[i]) < 1e-5;
  std::printf("core consumer: f = %.6f (expected %.6f), df/dw[0] = %.6f (expected %.6f): %s\n", got, f, gw[0], dw[0],
              ok ? "OK" : "WRONG");
  return ok ? 0 : 1;
}
