// Gradients of gradients through the elementwise family: the autodiff of each first derivative
// is checked against central finite differences of that first derivative.
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::check_grads;
using testing::eval;
using testing::random_array;

using Unary = std::function<Tensor(const Tensor&)>;
using Binary = std::function<Tensor(const Tensor&, const Tensor&)>;

// x -> d/dx sum(f(x)): for an elementwise f, that is f'(x) element by element.
TracedFn first_derivative(Unary f) {
  return [f](const std::vector<Tensor>& in) { return gradients(sum(f(in[0])), {in[0]}); };
}

// (x, y) -> d/dx or d/dy of sum(f(x, y)).
TracedFn partial(Binary f, int wrt) {
  return [f, wrt](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{gradients(sum(f(in[0], in[1])), {in[0], in[1]})[wrt]};
  };
}

struct UnaryCase {
  const char* name;
  Unary f;
  float lo, hi;
  std::function<double(double)> second;  // f''(x), checked directly as well
};

TEST(SecondOrder, UnaryFunctions) {
  std::vector<UnaryCase> cases = {
      {"tanh", [](const Tensor& x) { return tanh(x); }, -2, 2,
       [](double x) { double t = std::tanh(x); return -2 * t * (1 - t * t); }},
      {"exp", [](const Tensor& x) { return exp(x); }, -2, 2, [](double x) { return std::exp(x); }},
      {"log", [](const Tensor& x) { return log(x); }, 0.5f, 3, [](double x) { return -1 / (x * x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 0.5f, 3, [](double x) { return -0.25 * std::pow(x, -1.5); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 0.5f, 3, [](double x) { return 0.75 * std::pow(x, -2.5); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, -3, 3,
       [](double x) { double s = 1 / (1 + std::exp(-x)); return s * (1 - s) * (1 - 2 * s); }},
      {"square", [](const Tensor& x) { return square(x); }, -2, 2, [](double) { return 2.0; }},
      {"neg", [](const Tensor& x) { return -x * x; }, -2, 2, [](double) { return -2.0; }},
      {"abs", [](const Tensor& x) { return abs(x) * x; }, 0.2f, 2, [](double) { return 2.0; }},
      {"cube", [](const Tensor& x) { return x * x * x; }, -2, 2, [](double x) { return 6 * x; }},
      {"x/(1+x^2)", [](const Tensor& x) { return x / (square(x) + 1.0); }, -2, 2,
       [](double x) { return 2 * x * (x * x - 3) / std::pow(1 + x * x, 3); }},
  };
  for (const UnaryCase& c : cases) {
    SCOPED_TRACE(c.name);
    Array x = random_array({2, 5}, DType::f32, 31, c.lo, c.hi);
    EXPECT_TRUE(check_grads(first_derivative(c.f), {x}));
    // d2/dx2 through gradients of gradients, against the closed form.
    Array d2 = eval(
        [&](const std::vector<Tensor>& in) {
          Tensor d1 = gradients(sum(c.f(in[0])), {in[0]})[0];
          return gradients(sum(d1), {in[0]});
        },
        {x})[0];
    std::vector<float> xv = x.to_f32(), want;
    for (float v : xv) want.push_back(static_cast<float>(c.second(v)));
    EXPECT_TRUE(all_close(d2.to_f32(), want, 1e-4, 1e-4));
  }
}

TEST(SecondOrder, BinaryFunctions) {
  std::vector<std::pair<const char*, Binary>> cases = {
      {"x*y", [](const Tensor& x, const Tensor& y) { return x * y * x; }},
      {"x/y", [](const Tensor& x, const Tensor& y) { return x / y; }},
      {"pow", [](const Tensor& x, const Tensor& y) { return pow(x, y); }},
      {"x-y", [](const Tensor& x, const Tensor& y) { return square(x - y); }},
      {"max", [](const Tensor& x, const Tensor& y) { return maximum(x, y) * x; }},
      {"min", [](const Tensor& x, const Tensor& y) { return minimum(x, y) * y; }},
      {"where", [](const Tensor& x, const Tensor& y) { return where(greater(x, y), x * x, y * x); }},
      {"exp(x*y)", [](const Tensor& x, const Tensor& y) { return exp(x * y * 0.25) + tanh(y / x); }},
  };
  // Positive, well-separated operands: away from pow's and division's poles and max/min ties.
  Array x = Array::from_f32({0.6f, 1.3f, 2.1f, 0.9f, 1.7f, 2.6f}, {2, 3});
  Array y = Array::from_f32({1.1f, 0.7f, 1.5f, 2.3f, 0.8f, 1.9f}, {2, 3});
  for (auto& [name, f] : cases)
    for (int wrt : {0, 1}) {
      SCOPED_TRACE(std::string(name) + " d/d" + (wrt ? "y" : "x"));
      EXPECT_TRUE(check_grads(partial(f, wrt), {x, y}));
    }
}

TEST(SecondOrder, ThroughBroadcasting) {
  // [3,1] * [1,4] needs broadcast_in_dim's vjp (a sum) to be differentiable again.
  Array a = random_array({3, 1}, DType::f32, 5, 0.5f, 2), b = random_array({1, 4}, DType::f32, 6, 0.5f, 2);
  Binary f = [](const Tensor& x, const Tensor& y) { return exp(x * y) / (x + y * 2.0); };
  EXPECT_TRUE(check_grads(partial(f, 0), {a, b}));
  EXPECT_TRUE(check_grads(partial(f, 1), {a, b}));
  Array s = random_array({}, DType::f32, 7, 0.5f, 2), m = random_array({2, 3}, DType::f32, 8, 0.5f, 2);
  EXPECT_TRUE(check_grads(partial([](const Tensor& x, const Tensor& y) { return sigmoid(x * y) * y; }, 1), {m, s}));
}

TEST(SecondOrder, CastTagAndStopGradient) {
  Array x = random_array({4}, DType::f32, 9, -1, 1);
  EXPECT_TRUE(check_grads(first_derivative([](const Tensor& t) { return tag(tanh(t), "h") * t; }), {x}));
  auto r = eval(
      [](const std::vector<Tensor>& in) {
        const Tensor& t = in[0];
        // d2/dx2 sum(bf16(x^3)) = 6x: the cotangent is cast back and forth on the way.
        Tensor c1 = gradients(sum(cast(cast(t * t * t, DType::bf16), DType::f32)), {t})[0];
        // stop_gradient holds in the second derivative too: d2/dx2 (x^2 * sg(x)) = 2 sg(x).
        Tensor s1 = gradients(sum(square(t) * stop_gradient(t)), {t})[0];
        return std::vector<Tensor>{gradients(sum(c1), {t})[0], gradients(sum(s1), {t})[0]};
      },
      {x});
  std::vector<float> xv = x.to_f32(), six, two;
  for (float v : xv) {
    six.push_back(6 * v);
    two.push_back(2 * v);
  }
  EXPECT_TRUE(all_close(r[0].to_f32(), six, 1e-2, 1e-2));
  EXPECT_TRUE(all_close(r[1].to_f32(), two));
}

TEST(SecondOrder, ThirdDerivativeOfTanh) {
  // d3/dx3 tanh = -2 (1 - t^2)(1 - 3 t^2), by differentiating three times.
  Array x = random_array({6}, DType::f32, 3, -2, 2);
  Array d3 = eval(
      [](const std::vector<Tensor>& in) {
        Tensor d = tanh(in[0]);
        for (int k = 0; k < 3; ++k) d = gradients(sum(d), {in[0]})[0];
        return std::vector<Tensor>{d};
      },
      {x})[0];
  std::vector<float> xv = x.to_f32(), want;
  for (float v : xv) {
    double t = std::tanh(v);
    want.push_back(static_cast<float>(-2 * (1 - t * t) * (1 - 3 * t * t)));
  }
  EXPECT_TRUE(all_close(d3.to_f32(), want, 1e-4, 1e-4));
}

}  // namespace
}  // namespace px
