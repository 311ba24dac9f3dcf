// CPU kernels of the optim family: AdamW's whole update in one pass over each param's memory.
// This file is compiled with -ffp-contract=off (CMakeLists.txt): no multiply-add is fused, so the
// update rounds exactly as the elementwise chain it replaces did, and a param's elements update
// alike whichever lanes or tail of a loop (and whichever device's shard) they fall in.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/kernel.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

constexpr int64_t kBlock = 2048;           // elements converted at a time when p or g is not f32
constexpr int64_t kParallelMin = 1 << 15;  // elements below which the update stays on one thread

struct AdamConsts {
  float b1, c1, b2, c2, eps;  // beta1, 1 - beta1, beta2, 1 - beta2, eps: as f32 constants
  float step, inv_sqrt_bc2, decay;
};

// One block in f32. po may be p, mo m and vo v: element i is read before it is written.
template <bool kDecay>
void adamw_block(const float* p, const float* g, const float* m, const float* v, float* po, float* mo, float* vo,
                 int64_t n, const AdamConsts& c) {
  // Outputs alias inputs only element for element, which carries nothing from one i to the next.
#pragma GCC ivdep
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i], pi = p[i];
    const float mi = m[i] * c.b1 + gi * c.c1;
    const float vi = v[i] * c.b2 + (gi * gi) * c.c2;
    float np = pi - (mi * c.step) / (std::sqrt(vi) * c.inv_sqrt_bc2 + c.eps);
    if constexpr (kDecay) np = np - pi * c.decay;
    mo[i] = mi;
    vo[i] = vi;
    po[i] = np;
  }
}

Kernel make_adamw(const KernelSpec& s) {
  const DType pt = s.in[0].dtype, gt = s.in[1].dtype;
  const int64_t count = s.in[0].numel();
  const bool decay = s.attrs.i("decay") != 0;
  AdamConsts base{};
  base.b1 = static_cast<float>(s.attrs.f("beta1"));
  base.c1 = static_cast<float>(1.0 - s.attrs.f("beta1"));
  base.b2 = static_cast<float>(s.attrs.f("beta2"));
  base.c2 = static_cast<float>(1.0 - s.attrs.f("beta2"));
  base.eps = static_cast<float>(s.attrs.f("eps"));
  const int threads = num_threads();
  return [=](const void* const* in, void* const* out) {
    AdamConsts c = base;
    c.step = *static_cast<const float*>(in[4]);
    c.inv_sqrt_bc2 = *static_cast<const float*>(in[5]);
    c.decay = decay ? *static_cast<const float*>(in[6]) : 0.0f;
    const float* m = static_cast<const float*>(in[2]);
    const float* v = static_cast<const float*>(in[3]);
    float* mo = static_cast<float*>(out[1]);
    float* vo = static_cast<float*>(out[2]);
    const int64_t blocks = (count + kBlock - 1) / kBlock;
    parallel_rows(blocks, threads, count >= kParallelMin, [&](int64_t b) {
      const int64_t off = b * kBlock, n = std::min(kBlock, count - off);
      // p and g in f32: read in place when they are f32, else converted into these buffers.
      float pbuf[kBlock], gbuf[kBlock], obuf[kBlock];
      const float* p = static_cast<const float*>(in[0]) + off;
      const float* g = static_cast<const float*>(in[1]) + off;
      float* po = static_cast<float*>(out[0]) + off;
      if (pt != DType::f32) {
        load_f32(in[0], pt, off, pbuf, n);
        p = pbuf;
        po = obuf;
      }
      if (gt != DType::f32) {
        load_f32(in[1], gt, off, gbuf, n);
        g = gbuf;
      }
      if (decay)
        adamw_block<true>(p, g, m + off, v + off, po, mo + off, vo + off, n, c);
      else
        adamw_block<false>(p, g, m + off, v + off, po, mo + off, vo + off, n, c);
      if (pt != DType::f32) store_f32(obuf, out[0], pt, off, n);
    });
  };
}

}  // namespace

void register_optim_kernels() { register_kernel(prims::adamw_update(), make_adamw); }

}  // namespace px::cpu
