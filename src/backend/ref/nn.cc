// Reference kernels of the nn family: softmax, log_softmax, layer_norm, rms_norm (and their
// gradients), softmax_cross_entropy and linear_cross_entropy (and their gradients), gelu (and its
// gradient) and silu, written from their definitions in src/ops/ in double. Attention lives in
// attention.cc.
//
// Conventions shared with the primitives' definitions:
//  - layer_norm returns (y, mean, rstd) and rms_norm (y, rstd); the statistics are f32 over the
//    leading dims, the variance is the biased one (divided by D), rstd = 1 / sqrt(var + eps).
//  - softmax_cross_entropy gives 0 for a row whose label is ignore_index and NaN for a label out
//    of [0, V); its gradient is (softmax - onehot) * ct, 0 on ignored rows (and where ct is 0),
//    NaN on rows with a bad label, in the logits' dtype or the attr out_dtype.
//  - gelu's attr approximate is "erf" (exact, x Phi(x)) or "tanh"
//    (0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

void register_attention_kernels();  // attention.cc

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluCubic = 0.044715;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)
constexpr double kInvSqrt2 = 0.70710678118654752440;

// ---- softmax / log_softmax -----------------------------------------------------------------

// Normalizes along `axis`: the tensor is [outer, n, inner] around it.
Kernel make_softmax(const Spec& s, bool log) {
  const TensorType& t = s.in.at(0);
  const int axis = static_cast<int>(s.attrs.i("axis"));
  int64_t outer = 1, inner = 1;
  const int64_t n = t.shape.at(axis);
  for (int d = 0; d < axis; ++d) outer *= t.shape[d];
  for (int d = axis + 1; d < t.rank(); ++d) inner *= t.shape[d];
  const DType dt = t.dtype, odt = s.out.at(0).dtype;
  return [=](const void* const* in, void* const* out) {
    std::vector<double> x(static_cast<size_t>(n));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < inner; ++j) {
        const int64_t base = o * n * inner + j;
        double m = -INFINITY;
        for (int64_t i = 0; i < n; ++i) {
          x[i] = load(in[0], dt, base + i * inner);
          m = std::max(m, x[i]);
        }
        double sum = 0;
        for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - m);
        for (int64_t i = 0; i < n; ++i) {
          const double y = log ? x[i] - (m + std::log(sum)) : std::exp(x[i] - m) / sum;
          store(out[0], odt, base + i * inner, y);
        }
      }
  };
}

// ---- layer_norm / rms_norm -----------------------------------------------------------------

Kernel make_norm(const Spec& s, bool rms) {
  const TensorType& t = s.in.at(0);
  const int64_t d = t.shape.back();
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.rank(); ++i) rows *= t.shape[i];
  const DType dt = t.dtype, gdt = s.in.at(1).dtype, odt = s.out.at(0).dtype;
  const bool has_beta = s.in.size() > 2;
  const DType bdt = has_beta ? s.in[2].dtype : gdt;
  const double eps = s.attrs.f("eps");
  return [=](const void* const* in, void* const* out) {
    std::vector<double> x(static_cast<size_t>(d));
    void* mean_out = rms ? nullptr : out[1];
    void* rstd_out = out[rms ? 1 : 2];
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < d; ++i) x[i] = load(in[0], dt, r * d + i);
      double mean = 0;
      if (!rms) {
        for (int64_t i = 0; i < d; ++i) mean += x[i];
        mean = d > 0 ? mean / static_cast<double>(d) : 0.0;
      }
      double var = 0;
      for (int64_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
      var = d > 0 ? var / static_cast<double>(d) : 0.0;
      const double rstd = 1.0 / std::sqrt(var + eps);
      for (int64_t i = 0; i < d; ++i) {
        double y = (x[i] - mean) * rstd * load(in[1], gdt, i);
        if (has_beta) y += load(in[2], bdt, i);
        store(out[0], odt, r * d + i, y);
      }
      if (mean_out) store(mean_out, DType::f32, r, mean);
      store(rstd_out, DType::f32, r, rstd);
    }
  };
}

// ---- layer_norm_grad / rms_norm_grad -------------------------------------------------------

// Per row, from the definition: xhat = (x - mean) rstd, g = dy gamma,
// dx = rstd (g - mean(g) - xhat mean(g xhat)) (rms: mean 0 and no mean(g) term), and dy xhat.
Kernel make_norm_grad(const Spec& s, bool rms) {
  const TensorType& t = s.in.at(0);
  const int64_t d = t.shape.back();
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.rank(); ++i) rows *= t.shape[i];
  const DType dt = t.dtype, gdt = s.in.at(1).dtype, ydt = s.in.back().dtype;
  return [=](const void* const* in, void* const* out) {
    std::vector<double> xh(static_cast<size_t>(d)), g(static_cast<size_t>(d));
    const void* dy = in[rms ? 3 : 4];
    for (int64_t r = 0; r < rows; ++r) {
      const double mean = rms ? 0.0 : load(in[2], DType::f32, r), rstd = load(in[rms ? 2 : 3], DType::f32, r);
      double mg = 0, mgx = 0;
      for (int64_t i = 0; i < d; ++i) {
        const double y = load(dy, ydt, r * d + i);
        xh[i] = (load(in[0], dt, r * d + i) - mean) * rstd;
        g[i] = y * load(in[1], gdt, i);
        mg += g[i];
        mgx += g[i] * xh[i];
        store(out[1], DType::f32, r * d + i, y * xh[i]);
      }
      mg = rms || d == 0 ? 0.0 : mg / static_cast<double>(d);
      mgx = d > 0 ? mgx / static_cast<double>(d) : 0.0;
      for (int64_t i = 0; i < d; ++i) store(out[0], DType::f32, r * d + i, rstd * (g[i] - mg - xh[i] * mgx));
    }
  };
}

// ---- softmax cross entropy -----------------------------------------------------------------

Kernel make_ce(const Spec& s, bool grad) {
  const TensorType& t = s.in.at(0);
  const int64_t v = t.shape.back();
  const int64_t rows = s.in.at(1).numel();
  const DType dt = t.dtype, odt = s.out.at(0).dtype;
  const int64_t ignore = s.attrs.i("ignore_index");
  return [=](const void* const* in, void* const* out) {
    std::vector<double> x(static_cast<size_t>(v));
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t label = static_cast<int64_t>(load(in[1], DType::i32, r));
      const bool ignored = label == ignore;
      const bool bad = !ignored && (label < 0 || label >= v);
      double m = -INFINITY;
      for (int64_t i = 0; i < v; ++i) {
        x[i] = load(in[0], dt, r * v + i);
        m = std::max(m, x[i]);
      }
      double sum = 0;
      for (int64_t i = 0; i < v; ++i) sum += std::exp(x[i] - m);
      if (!grad) {
        const double loss = bad ? kNaN : ignored ? 0.0 : m + std::log(sum) - x[label];
        store(out[0], odt, r, loss);
        continue;
      }
      const double c = ignored ? 0.0 : load(in[2], DType::f32, r);
      for (int64_t i = 0; i < v; ++i) {
        double g;
        if (bad)
          g = kNaN;
        else if (c == 0.0)
          g = 0.0;
        else
          g = (std::exp(x[i] - m) / sum - (i == label ? 1.0 : 0.0)) * c;
        store(out[0], odt, r * v + i, g);
      }
    }
  };
}

// ---- linear cross entropy ------------------------------------------------------------------

// From the definition: logits = h w^T (vocab_axis 0, w [v, d]) or h w (1, w [d, v]) in double,
// then the loss and logsumexp of softmax_cross_entropy per row; the gradient is
// dh = g w and dw = g^T h with g = ct (softmax - onehot) (0 on ignored rows, NaN on bad labels).
// The gradient recomputes each row's logsumexp in double rather than reading the saved f32 one.
Kernel make_linear_ce(const Spec& s, bool grad) {
  const int64_t d = s.in.at(0).shape.back(), rows = s.in.at(2).numel();
  const int vocab_axis = static_cast<int>(s.attrs.i("vocab_axis"));
  const int64_t v = s.in.at(1).shape[vocab_axis];
  const DType dt = s.in[0].dtype, wdt = s.in[1].dtype;
  const int64_t ignore = s.attrs.i("ignore_index");
  return [=](const void* const* in, void* const* out) {
    auto w_at = [&](int64_t c, int64_t k) { return load(in[1], wdt, vocab_axis == 0 ? c * d + k : k * v + c); };
    std::vector<double> x(static_cast<size_t>(v)), dh(static_cast<size_t>(rows * d), 0.0),
        dw(static_cast<size_t>(grad ? v * d : 0), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      double m = -INFINITY;
      for (int64_t c = 0; c < v; ++c) {
        double acc = 0;
        for (int64_t k = 0; k < d; ++k) acc += load(in[0], dt, r * d + k) * w_at(c, k);
        x[c] = acc;
        m = std::max(m, acc);
      }
      double sum = 0;
      for (int64_t c = 0; c < v; ++c) sum += std::exp(x[c] - m);
      const double lse = m + std::log(sum);
      const int64_t label = static_cast<int64_t>(load(in[2], DType::i32, r));
      const bool ignored = label == ignore, bad = !ignored && (label < 0 || label >= v);
      if (!grad) {
        store(out[0], DType::f32, r, bad ? kNaN : ignored ? 0.0 : lse - x[label]);
        store(out[1], DType::f32, r, lse);
        continue;
      }
      const double ct = ignored ? 0.0 : load(in[4], DType::f32, r);
      for (int64_t c = 0; c < v; ++c) {
        const double g = bad ? kNaN : ct == 0.0 ? 0.0 : (std::exp(x[c] - lse) - (c == label ? 1.0 : 0.0)) * ct;
        for (int64_t k = 0; k < d; ++k) {
          dh[r * d + k] += g * w_at(c, k);
          dw[vocab_axis == 0 ? c * d + k : k * v + c] += g * load(in[0], dt, r * d + k);
        }
      }
    }
    if (!grad) return;
    for (int64_t i = 0; i < rows * d; ++i) store(out[0], dt, i, dh[i]);
    for (int64_t i = 0; i < v * d; ++i) store(out[1], wdt, i, dw[i]);
  };
}

// ---- gelu / gelu_grad / silu ---------------------------------------------------------------

bool gelu_tanh(const Attrs& a) {
  return a.has("approximate") && a.s("approximate") == "tanh";  // the default is the exact (erf) form
}

// 0.5 (1 + tanh(u)) is written as sigmoid(2u), which does not cancel for negative x.
double sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }
double gelu_u(double x) { return kSqrt2OverPi * (x + kGeluCubic * x * x * x); }

double gelu(double x, bool tanh_form) {
  if (tanh_form) return x * sigmoid(2.0 * gelu_u(x));
  return 0.5 * x * std::erfc(-x * kInvSqrt2);  // x Phi(x)
}

// d/dx of the above: tanh form s + x 2 s (1 - s) u' with s = sigmoid(2u); erf form Phi(x) + x phi(x).
double gelu_grad(double x, bool tanh_form) {
  if (tanh_form) {
    const double u = gelu_u(x), s = sigmoid(2.0 * u), s1 = sigmoid(-2.0 * u);
    const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * x * x);
    return s + x * 2.0 * s * s1 * du;
  }
  return 0.5 * std::erfc(-x * kInvSqrt2) + x * kInvSqrt2Pi * std::exp(-0.5 * x * x);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

template <class F>
Kernel make_unary(const Spec& s, F f) {
  const DType dt = s.in.at(0).dtype, odt = s.out.at(0).dtype;
  const int64_t n = s.in[0].numel();
  return [=](const void* const* in, void* const* out) {
    for (int64_t i = 0; i < n; ++i) store(out[0], odt, i, f(load(in[0], dt, i)));
  };
}

}  // namespace

void register_nn_kernels() {
  register_attention_kernels();
  register_kernel_pair(prims::softmax(), prims::log_softmax(), make_softmax);
  register_kernel_pair(prims::layer_norm(), prims::rms_norm(), make_norm);
  register_kernel_pair(prims::layer_norm_grad(), prims::rms_norm_grad(), make_norm_grad);
  register_kernel_pair(prims::softmax_cross_entropy(), prims::softmax_cross_entropy_grad(), make_ce);
  register_kernel_pair(prims::linear_cross_entropy(), prims::linear_cross_entropy_grad(), make_linear_ce);
  register_kernel(prims::gelu(), [](const Spec& s) {
    const bool t = gelu_tanh(s.attrs);
    return make_unary(s, [t](double x) { return gelu(x, t); });
  });
  register_kernel(prims::gelu_grad(), [](const Spec& s) {
    const bool t = gelu_tanh(s.attrs);
    return make_unary(s, [t](double x) { return gelu_grad(x, t); });
  });
  register_kernel(prims::silu(), [](const Spec& s) { return make_unary(s, silu); });
}

}  // namespace px::ref
