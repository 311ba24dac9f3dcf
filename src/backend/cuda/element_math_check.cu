// The shared element math (src/backend/element_math.h) compiled by nvcc for the host and for the
// device (sm_80, sm_90), as the CI build compiles it: every function is called from a kernel and
// from a host function, so a construct that either side of nvcc rejects fails the build. The
// kernels the backend runs are generated and compiled by NVRTC (codegen.cc, nvrtc.cc); this object
// is linked into nothing.
#include "backend/element_math.h"

namespace px::em {

PX_HD inline float every_function(float x, float y, int i, unsigned long long k) {
  float r = add(x, y) + sub(x, y) + mul(x, y) + div(x, y) + pow(x, y) + maximum(x, y) + minimum(x, y);
  r += neg(x) + abs(x) + sqrt(x) + rsqrt(x) + exp(x) + log(x) + tanh(x) + sigmoid(x) + erf(x) + erfc(x) + phi(x);
  r += gelu(x, true) + gelu(x, false) + gelu_grad(x, true) + gelu_grad(x, false) + silu(x);
  r += bf16_to_f32(f32_to_bf16(x)) + f16_to_f32(f32_to_f16(y)) + round_bf16(x) + round_f16(y);
  r += static_cast<float>(f32_to_i32(x) + iadd(i, i) + isub(i, 1) + imul(i, i) + idiv(i, 3) + ineg(i) + iabs(i) +
                          imaximum(i, 0) + iminimum(i, 0)) + (f32_to_bool(y) ? 1.0f : 0.0f);
  const AdamW a = adamw(x, y, x, y, 0.9f, 0.1f, 0.999f, 0.001f, 1e-8f, 1e-3f, 1.0f, true, 0.01f);
  r += a.p + a.m + a.v;
  const UniformBounds b = uniform_bounds(kBF16, 0.0f, 1.0f);
  r += uniform_in_range(uniform(k, 1u, 2u, 0.0f, 1.0f), kBF16, 0.0f, 1.0f, b) + normal(k, 3u, 4u);
  return r + static_cast<float>(fold_in(5u, 6u, k).w[0]);
}

}  // namespace px::em

__global__ void px_element_math_check(float* out, const float* x, const float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = px::em::every_function(x[i], y[i], i, static_cast<unsigned long long>(i));
}

float px_element_math_check_host(float x, float y) { return px::em::every_function(x, y, 7, 9ull); }
