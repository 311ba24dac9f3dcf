// Traces, differentiates, compiles and runs a small graph through the installed package, and runs
// two cases of the installed backend conformance suite on the cpu backend.
#include <cmath>
#include <cstdio>

#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"
#include "parallax/testing/conformance.h"

int main() {
  // f(x) = sum(tanh(x) * 2), df/dx = 2 * (1 - tanh(x)^2).
  auto g = px::trace(
      [](const std::vector<px::Tensor>& in) {
        px::Tensor y = px::sum(px::tanh(in[0]) * 2.0);
        return std::vector<px::Tensor>{y, px::gradients(y, {in[0]})[0]};
      },
      {{px::DType::f32, {2, 3}}});
  auto exe = px::Executable::compile(*g);
  std::vector<float> xs = {-1.0f, -0.5f, 0.0f, 0.25f, 0.5f, 1.0f};
  std::vector<px::Array> out = exe->run({px::Array::from_f32(xs, {2, 3})});

  double want = 0;
  for (float x : xs) want += 2 * std::tanh(x);
  bool ok = std::fabs(out[0].to_f32()[0] - want) < 1e-4;
  std::vector<float> dx = out[1].to_f32();
  for (size_t i = 0; i < xs.size(); ++i) {
    double t = std::tanh(xs[i]);
    ok = ok && std::fabs(dx[i] - 2 * (1 - t * t)) < 1e-4;
  }
  std::printf("consumer: f = %.6f (expected %.6f), %d steps: %s\n", out[0].to_f32()[0], want, exe->num_steps(),
              ok ? "OK" : "WRONG");

  px::conformance::Options cases;
  cases.filter = [](const px::conformance::Case& c) { return c.name == "tanh" || c.name == "dot_general"; };
  const px::conformance::Report r = px::conformance::check_backend("cpu", cases);
  for (const std::string& f : r.failures) std::printf("consumer: conformance: %s\n", f.c_str());
  std::printf("consumer: conformance of cpu against ref: %d passed, %zu failed\n", r.passed, r.failures.size());
  ok = ok && r.ok() && r.passed > 0;
  return ok ? 0 : 1;
}
