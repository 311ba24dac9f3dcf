// CPU kernels of the nn family: fused row kernels for softmax, log_softmax, layer_norm, rms_norm
// (and their gradients) and softmax cross entropy (f32 math whatever the storage dtype), and
// elementwise block functions for gelu, gelu_grad and silu that the fused-loop engine chains.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>

#include "backend/cpu/kernel.h"
#include "backend/cpu/vmath.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kParallelMin = 16384;  // elements below which a kernel stays single-threaded

using vecmath::exp_shift_sum;
using vecmath::row_max;
using vecmath::row_sum;

float load_one(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default:
      return 0.0f;
  }
}
void store_one(void* p, DType t, int64_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(v);
      break;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(v);
      break;
    default:
      break;
  }
}

// f32 rows in the kernel's scratch (planned with the program's buffers; the kernel finds it after
// its results): `shared` floats the threads share, then a part per thread on cache lines of its own.
struct Rows {
  int threads = 1;
  int64_t shared = 0, per_thread = 0;  // floats
  Rows(int64_t shared_floats, int64_t floats_per_thread)
      : threads(num_threads()),
        shared((shared_floats + 15) / 16 * 16),
        per_thread(floats_per_thread > 0 ? (floats_per_thread + 15) / 16 * 16 + 16 : 0) {}
  int64_t bytes() const { return (shared + threads * per_thread) * static_cast<int64_t>(sizeof(float)); }
  // The kernel's scratch (null when it needs none).
  float* base(void* const* out, size_t results) const { return bytes() > 0 ? scratch_of(out, results) : nullptr; }
  // A thread of parallel_rows' team takes its own part. Run serially (parallel_rows opens no
  // region) from a thread of an outer team, a device's thread, the number may pass the team size
  // this was sized for: such a call is the only one on this scratch at that time, so it takes the
  // first part.
  float* mine(float* base) const {
    const int t = omp_get_thread_num();
    return base + shared + static_cast<int64_t>(t < threads ? t : 0) * per_thread;
  }
};

// ---- softmax / log_softmax -----------------------------------------------------------------

void softmax_row(const float* x, float* y, int64_t n, bool log) {
  if (n == 0) return;
  float m = row_max(x, n);
  if (log) {
    float lse = m + std::log(exp_shift_sum(x, m, nullptr, n));
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] - lse;
  } else {
    float inv = 1.0f / exp_shift_sum(x, m, y, n);
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
  }
}

// Per thread: a line in f32 and its result, unless the line is contiguous f32.
Rows softmax_rows(const KernelSpec& spec, bool = false) {
  const TensorType& t = spec.in[0];
  const int axis = static_cast<int>(spec.attrs.i("axis"));
  int64_t inner = 1;
  for (int d = axis + 1; d < t.rank(); ++d) inner *= t.shape[d];
  const bool direct = t.dtype == DType::f32 && inner == 1;
  return Rows(0, direct ? 0 : 2 * t.shape[axis]);
}

Kernel softmax_kernel(const KernelSpec& spec, bool log) {
  const TensorType& t = spec.in[0];
  const int axis = static_cast<int>(spec.attrs.i("axis"));
  int64_t outer = 1, n = t.shape[axis], inner = 1;
  for (int d = 0; d < axis; ++d) outer *= t.shape[d];
  for (int d = axis + 1; d < t.rank(); ++d) inner *= t.shape[d];
  const DType dt = t.dtype;
  const bool direct = dt == DType::f32 && inner == 1;
  const Rows rows = softmax_rows(spec);
  const int nt = rows.threads;
  const int64_t total = t.numel();
  const size_t results = spec.out.size();
  return [=](const void* const* in, void* const* out) {
    float* scratch = rows.base(out, results);
    const int64_t lines = outer * inner;
    parallel_rows(lines, nt, total > kParallelMin, [&](int64_t line) {
      const int64_t o = line / inner, j = line % inner;
      const int64_t base = o * n * inner + j;
      if (direct) {
        softmax_row(static_cast<const float*>(in[0]) + base, static_cast<float*>(out[0]) + base, n, log);
        return;
      }
      float* xs = rows.mine(scratch);
      float* ys = xs + n;
      if (inner == 1) {
        load_f32(in[0], dt, base, xs, n);
        softmax_row(xs, ys, n, log);
        store_f32(ys, out[0], dt, base, n);
      } else {
        for (int64_t i = 0; i < n; ++i) xs[i] = load_one(in[0], dt, base + i * inner);
        softmax_row(xs, ys, n, log);
        for (int64_t i = 0; i < n; ++i) store_one(out[0], dt, base + i * inner, ys[i]);
      }
    });
  };
}

// ---- layer_norm / rms_norm -----------------------------------------------------------------

// Shared: gamma and beta in f32 (16-bit params); per thread: x and y staged in f32 where either is
// stored narrower.
Rows norm_rows(const KernelSpec& spec, bool = false) {
  const DType dt = spec.in[0].dtype, odt = spec.out[0].dtype;
  const int64_t d = spec.in[0].shape.back();
  return Rows(dt == DType::f32 ? 0 : 2 * d, dt != DType::f32 || odt != DType::f32 ? 2 * d : 0);
}

Kernel norm_kernel(const KernelSpec& spec, bool rms) {
  const TensorType& t = spec.in[0];
  const int64_t d = t.shape.back();
  const int64_t rows = d == 0 ? numel(Shape(t.shape.begin(), t.shape.end() - 1)) : t.numel() / d;
  const DType dt = t.dtype, odt = spec.out[0].dtype;
  const bool has_beta = spec.in.size() > 2;
  const float eps = static_cast<float>(spec.attrs.f("eps"));
  // Rows of other types go through f32 scratch: x loaded, y stored (also y alone for an f32 x).
  const bool staged = dt != DType::f32 || odt != DType::f32;
  const Rows scratch = norm_rows(spec);
  const int nt = scratch.threads;
  const size_t results = spec.out.size();
  return [=](const void* const* in, void* const* out) {
    float* base = scratch.base(out, results);
    const float* gamma = static_cast<const float*>(in[1]);
    const float* beta = has_beta ? static_cast<const float*>(in[2]) : nullptr;
    if (dt != DType::f32) {  // gamma and beta in f32, shared
      load_f32(in[1], dt, 0, base, d);
      gamma = base;
      if (has_beta) {
        load_f32(in[2], dt, 0, base + d, d);
        beta = base + d;
      }
    }
    float* mean_out = rms ? nullptr : static_cast<float*>(out[1]);
    float* rstd_out = static_cast<float*>(out[rms ? 1 : 2]);
    parallel_rows(rows, nt, rows * d > kParallelMin, [&](int64_t r) {
      float* s = staged ? scratch.mine(base) : nullptr;
      if (dt != DType::f32) load_f32(in[0], dt, r * d, s, d);
      const float* x = dt == DType::f32 ? static_cast<const float*>(in[0]) + r * d : s;
      float* y = staged ? s + d : static_cast<float*>(out[0]) + r * d;
      const float inv_d = d > 0 ? 1.0f / static_cast<float>(d) : 0.0f;
      float mean = 0, var = 0;
      if (rms) {
        for (int64_t i = 0; i < d; ++i) y[i] = x[i] * x[i];
        var = row_sum(y, d) * inv_d;
      } else {
        mean = row_sum(x, d) * inv_d;
        for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - mean) * (x[i] - mean);
        var = row_sum(y, d) * inv_d;
      }
      const float rstd = 1.0f / std::sqrt(var + eps);
      if (beta) {
        for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - mean) * rstd * gamma[i] + beta[i];
      } else {
        for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - mean) * rstd * gamma[i];
      }
      if (staged) store_f32(y, out[0], odt, r * d, d);
      if (mean_out) mean_out[r] = mean;
      rstd_out[r] = rstd;
    });
  };
}

// ---- layer_norm_grad / rms_norm_grad -------------------------------------------------------

// One pass per row (in L1): g = dy gamma and xhat = (x - mean) rstd, the row sums of g and g xhat,
// then dx = rstd (g - sum(g) / D - xhat sum(g xhat) / D) (rms: no sum(g) term) and dy xhat.
// Shared: gamma in f32 (16-bit gamma); per thread: x and dy as f32 where they are stored narrower.
Rows norm_grad_rows(const KernelSpec& spec, bool = false) {
  const DType dt = spec.in[0].dtype, gdt = spec.in[1].dtype, ydt = spec.in.back().dtype;
  const int64_t d = spec.in[0].shape.back();
  return Rows(gdt == DType::f32 ? 0 : d, dt != DType::f32 || ydt != DType::f32 ? 2 * d : 0);
}

Kernel norm_grad_kernel(const KernelSpec& spec, bool rms) {
  const TensorType& t = spec.in[0];
  const int64_t d = t.shape.back();
  const int64_t rows = d == 0 ? numel(Shape(t.shape.begin(), t.shape.end() - 1)) : t.numel() / d;
  const DType dt = t.dtype, gdt = spec.in[1].dtype, ydt = spec.in.back().dtype;
  const Rows scratch = norm_grad_rows(spec);
  const int nt = scratch.threads;
  const size_t results = spec.out.size();
  return [=](const void* const* in, void* const* out) {
    float* base = scratch.base(out, results);
    const float* gamma = static_cast<const float*>(in[1]);
    if (gdt != DType::f32) {  // gamma in f32, shared
      load_f32(in[1], gdt, 0, base, d);
      gamma = base;
    }
    const float* mean_in = rms ? nullptr : static_cast<const float*>(in[2]);
    const float* rstd_in = static_cast<const float*>(in[rms ? 2 : 3]);
    const void* dy_in = in[rms ? 3 : 4];
    const float inv_d = d > 0 ? 1.0f / static_cast<float>(d) : 0.0f;
    parallel_rows(rows, nt, rows * d > kParallelMin, [&](int64_t r) {
      float* s = base ? scratch.mine(base) : nullptr;
      const float* x = static_cast<const float*>(in[0]) + r * d;
      const float* dy = static_cast<const float*>(dy_in) + r * d;
      if (dt != DType::f32) {
        load_f32(in[0], dt, r * d, s, d);
        x = s;
      }
      if (ydt != DType::f32) {
        load_f32(dy_in, ydt, r * d, s + d, d);
        dy = s + d;
      }
      const float mean = rms ? 0.0f : mean_in[r], rstd = rstd_in[r];
      float* dx = static_cast<float*>(out[0]) + r * d;
      float* dyx = static_cast<float*>(out[1]) + r * d;
      vecmath::V sg = vecmath::splat(0.0f), sgx = vecmath::splat(0.0f);
      int64_t i = 0;
      for (; i + vecmath::kLanes <= d; i += vecmath::kLanes) {
        const vecmath::V xh = (vecmath::load(x + i) - mean) * rstd;
        const vecmath::V yv = vecmath::load(dy + i), g = yv * vecmath::load(gamma + i);
        sg += g;
        sgx = vecmath::fmadd(g, xh, sgx);
        vecmath::store(dyx + i, yv * xh);
      }
      float sum_g = 0, sum_gx = 0;
      for (int l = 0; l < vecmath::kLanes; ++l) sum_g += sg[l], sum_gx += sgx[l];
      for (; i < d; ++i) {
        const float xh = (x[i] - mean) * rstd, g = dy[i] * gamma[i];
        sum_g += g;
        sum_gx += g * xh;
        dyx[i] = dy[i] * xh;
      }
      const float mg = rms ? 0.0f : sum_g * inv_d, mgx = sum_gx * inv_d;
      for (i = 0; i < d; ++i) {
        const float xh = (x[i] - mean) * rstd;
        dx[i] = rstd * (dy[i] * gamma[i] - mg - xh * mgx);
      }
    });
  };
}

// ---- softmax cross entropy -----------------------------------------------------------------

// Per thread: the row in f32 when the logits are narrower, the gradient row when it is stored narrower.
Rows ce_rows(const KernelSpec& spec, bool grad) {
  const int64_t v = spec.in[0].shape.back();
  const DType dt = spec.in[0].dtype, odt = grad ? spec.out[0].dtype : DType::f32;
  return Rows(0, (dt == DType::f32 ? 0 : v) + (odt == DType::f32 ? 0 : v));
}

Kernel ce_kernel(const KernelSpec& spec, bool grad) {
  const TensorType& t = spec.in[0];
  const int64_t v = t.shape.back();
  const int64_t rows = spec.in[1].numel();
  const DType dt = t.dtype, odt = grad ? spec.out[0].dtype : DType::f32;
  const int64_t ignore = spec.attrs.i("ignore_index");
  const int64_t x_room = dt == DType::f32 ? 0 : v;
  const Rows scratch = ce_rows(spec, grad);
  const int nt = scratch.threads;
  const size_t results = spec.out.size();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // A large bf16 gradient (a language model's logits) streams past the cache, as fused loops do.
  const bool stream = odt == DType::bf16 && rows * v >= (2 << 20);
  return [=](const void* const* in, void* const* out) {
    float* base = scratch.base(out, results);
    const int32_t* labels = static_cast<const int32_t*>(in[1]);
    const float* ct = grad ? static_cast<const float*>(in[2]) : nullptr;
    parallel_rows(rows, nt, rows * v > kParallelMin, [&](int64_t r) {
      const int64_t label = labels[r];
      const bool ignored = label == ignore;
      const bool bad = !ignored && (label < 0 || label >= v);  // surfaces as NaN, never a crash
      const float* x;
      float* s = base ? scratch.mine(base) : nullptr;
      if (dt == DType::f32) {
        x = static_cast<const float*>(in[0]) + r * v;
      } else {
        load_f32(in[0], dt, r * v, s, v);
        x = s;
      }
      if (!grad) {
        float loss = 0.0f;
        if (bad) {
          loss = nan;
        } else if (!ignored) {
          float m = row_max(x, v);
          loss = m + std::log(exp_shift_sum(x, m, nullptr, v)) - x[label];
        }
        static_cast<float*>(out[0])[r] = loss;
        return;
      }
      float* y = odt == DType::f32 ? static_cast<float*>(out[0]) + r * v : s + x_room;
      const float c = ignored ? 0.0f : ct[r];
      if (bad) {
        for (int64_t i = 0; i < v; ++i) y[i] = nan;
      } else if (c == 0.0f) {
        for (int64_t i = 0; i < v; ++i) y[i] = 0.0f;
      } else {
        float m = row_max(x, v);
        float scale = c / exp_shift_sum(x, m, y, v);
        for (int64_t i = 0; i < v; ++i) y[i] *= scale;
        y[label] -= c;
      }
      if (stream) {
        stream_bf16(y, static_cast<uint16_t*>(out[0]) + r * v, v);
        _mm_sfence();  // the row is visible to other threads after this
      } else if (odt != DType::f32) {
        store_f32(y, out[0], odt, r * v, v);
      }
    });
  };
}

// ---- elementwise: gelu, gelu_grad, silu ----------------------------------------------------

constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kA = 0.044715f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;

// On vmath.h's vectors (the fused loops' width): the erf form through its accurate normal CDF.
using vecmath::V;

// gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x sigmoid(2u), which does not cancel for negative x (vmath's
// sigmoid: no overflow in either tail, one fast division).
void gelu_f32(const float* const* in, float* out, int64_t n, const float* params) {
  if (params[0] != 0.0f) {
    vecmath::map(in[0], out, n, [](V x) { return x * vecmath::sigmoid(2.0f * kC * (x + kA * x * x * x)); });
  } else {
    vecmath::map(in[0], out, n, [](V x) { return x * vecmath::phi(x); });
  }
}

// d/dx x sigmoid(z), z = 2u: s + x s (1 - s) z' with e = exp(-|z|) <= 1, r = 1 / (1 + e):
// s and 1 - s are r and e r (which one is which by the sign of z), so s (1 - s) = e r^2. Where e
// is 0 (|z| > 104) the second term is 0, also where x^3 overflows (0 times inf would be NaN).
void gelu_grad_f32(const float* const* in, float* out, int64_t n, const float* params) {
  if (params[0] != 0.0f) {
    vecmath::map(in[0], out, n, [](V x) {
      V z = 2.0f * kC * (x + kA * x * x * x);
      V e = vecmath::exp(-vecmath::vabs(z));
      V r = vecmath::div(vecmath::splat(1.0f), 1.0f + e);
      V er = e * r;
      V s = vecmath::select(vecmath::ge(z, 0.0f), r, er);
      V tail = x * (er * r) * (2.0f * kC) * (1.0f + 3.0f * kA * x * x);
      return s + vecmath::select(vecmath::gt(er, vecmath::splat(0.0f)), tail, vecmath::splat(0.0f));
    });
  } else {
    vecmath::map(in[0], out, n, [](V x) { return vecmath::phi(x) + x * kInvSqrt2Pi * vecmath::exp(-0.5f * x * x); });
  }
}

void silu_f32(const float* const* in, float* out, int64_t n, const float*) {
  vecmath::map(in[0], out, n, [](V x) { return x * vecmath::sigmoid(x); });
}

std::vector<float> gelu_params(const Attrs& a) { return {a.s("approximate") == "tanh" ? 1.0f : 0.0f}; }

// A kernel pair (the flag false for `off`, true for `on`) with its scratch rows.
void register_pair(const Primitive* off, const Primitive* on, Kernel (*f)(const KernelSpec&, bool),
                   Rows (*rows)(const KernelSpec&, bool)) {
  for (bool flag : {false, true})
    register_kernel(
        flag ? on : off, [f, flag](const KernelSpec& s) { return f(s, flag); },
        [rows, flag](const KernelSpec& s) { return rows(s, flag).bytes(); });
}

}  // namespace

void register_attention_kernels();  // nn_attention.cc
void register_linear_ce_kernels();  // nn_linear_ce.cc

void register_nn_kernels() {
  register_attention_kernels();
  register_linear_ce_kernels();
  register_pair(prims::softmax(), prims::log_softmax(), softmax_kernel, softmax_rows);
  register_pair(prims::layer_norm(), prims::rms_norm(), norm_kernel, norm_rows);
  register_pair(prims::layer_norm_grad(), prims::rms_norm_grad(), norm_grad_kernel, norm_grad_rows);
  register_pair(prims::softmax_cross_entropy(), prims::softmax_cross_entropy_grad(), ce_kernel, ce_rows);
  register_eltwise(prims::gelu(), EltwiseKernel{gelu_f32, nullptr, gelu_params});
  register_eltwise(prims::gelu_grad(), EltwiseKernel{gelu_grad_f32, nullptr, gelu_params});
  register_eltwise(prims::silu(), EltwiseKernel{silu_f32, nullptr, nullptr});
}

}  // namespace px::cpu
