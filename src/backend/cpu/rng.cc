// CPU kernels of the rng family on Philox-4x32-10 (Salmon et al., "Parallel random numbers:
// as easy as 1, 2, 3", SC'11). Element i of a draw takes lane i % 4 of the block for counter
// i / 4 under the key, so any slice of a draw can be computed on its own.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "backend/cpu/kernel.h"
#include "ops/prims.h"

namespace px::cpu {

struct Philox {
  uint32_t v[4];
};

// Philox-4x32 with 10 rounds: each round multiplies two counter words by fixed odd constants,
// mixes the high halves with the other words and the round key, then bumps the key by the
// Weyl constants.
Philox philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

namespace {

constexpr int kMaxRank = 16;
constexpr float kTwoPi = 6.28318530717958647692f;

// A draw's global geometry: local element (row, col) maps to a global flat index.
struct DrawGeom {
  int rank = 0;
  int64_t local[kMaxRank], offset[kMaxRank], gstride[kMaxRank];
  int64_t count = 0, inner = 1;
};

DrawGeom make_geom(const KernelSpec& spec) {
  DrawGeom g;
  const Shape& shape = spec.out[0].shape;
  if (shape.size() > kMaxRank) throw Error("[random] the CPU kernel supports ranks up to " + std::to_string(kMaxRank));
  g.rank = static_cast<int>(shape.size());
  Shape global = spec.attrs.has("global_shape") ? Shape(spec.attrs.ints("global_shape")) : shape;
  std::vector<int64_t> off =
      spec.attrs.has("offset") ? spec.attrs.ints("offset") : std::vector<int64_t>(shape.size(), 0);
  int64_t s = 1;
  for (int d = g.rank - 1; d >= 0; --d) {
    g.local[d] = shape[d];
    g.offset[d] = off[d];
    g.gstride[d] = s;
    s *= global[d];
  }
  g.count = spec.out[0].numel();
  g.inner = g.rank ? shape.back() : 1;
  return g;
}

// Global flat index of the first element of local row `row` (all dims but the last).
int64_t row_start(const DrawGeom& g, int64_t row) {
  if (g.rank == 0) return 0;
  int64_t idx = g.offset[g.rank - 1] * g.gstride[g.rank - 1];
  for (int d = g.rank - 2; d >= 0; --d) {
    idx += (row % g.local[d] + g.offset[d]) * g.gstride[d];
    row /= g.local[d];
  }
  return idx;
}

inline float to_unit(uint32_t x) { return static_cast<float>(x >> 8) * (1.0f / 16777216.0f); }  // [0, 1)

// Runs fill(first_global_index, count, f32 dst) over contiguous runs, in parallel row blocks,
// then converts to the result dtype.
constexpr int64_t kBlock = 1024;

// A 16-bit draw's scratch: an f32 block per thread.
int64_t draw_scratch(const KernelSpec& spec) {
  if (spec.out[0].dtype == DType::f32 || spec.out[0].numel() == 0) return 0;
  return num_threads() * kBlock * static_cast<int64_t>(sizeof(float));
}

template <class Fill>
Kernel draw_kernel(const KernelSpec& spec, Fill fill) {
  const DrawGeom geom = make_geom(spec);
  DType dt = spec.out[0].dtype;
  if (geom.count == 0) return [](const void* const*, void* const*) {};
  const int64_t rows = geom.count / geom.inner;
  const int nt = num_threads();
  const bool origin_operand = spec.in.size() == 2;
  return [=](const void* const* in, void* const* out) {
    float* scratch = dt == DType::f32 ? nullptr : scratch_of(out, 1);
    DrawGeom g = geom;
    if (origin_operand)  // the block's offset, known at run time (a sharded draw)
      for (int d = 0; d < g.rank; ++d) g.offset[d] = static_cast<const int32_t*>(in[1])[d];
    const int32_t* key = static_cast<const int32_t*>(in[0]);
    const uint32_t k0 = static_cast<uint32_t>(key[0]), k1 = static_cast<uint32_t>(key[1]);
    const int64_t chunks_per_row = (g.inner + kBlock - 1) / kBlock;
    const int64_t work = rows * chunks_per_row;
#pragma omp parallel for num_threads(nt) schedule(static) if (g.count > 8192)
    for (int64_t w = 0; w < work; ++w) {
      const int64_t row = w / chunks_per_row, c0 = (w % chunks_per_row) * kBlock;
      const int64_t len = std::min(kBlock, g.inner - c0);
      const int64_t local = row * g.inner + c0;
      float* dst = dt == DType::f32 ? static_cast<float*>(out[0]) + local
                                    : scratch + static_cast<size_t>(omp_get_thread_num()) * kBlock;
      fill(row_start(g, row) + c0, len, k0, k1, dst);
      if (dt != DType::f32) store_f32(dst, out[0], dt, local, len);
    }
  };
}

float round_to(DType t, float v) {
  if (t == DType::bf16) return bf16_to_f32(f32_to_bf16(v));
  if (t == DType::f16) return f16_to_f32(f32_to_f16(v));
  return v;
}

// The neighbour of a 16-bit value `r` one step up or down (sign-magnitude bit patterns).
float step16(DType t, float r, bool up) {
  uint16_t b = t == DType::bf16 ? f32_to_bf16(r) : f32_to_f16(r);
  if (r == 0.0f)
    b = up ? 0x0001 : 0x8001;
  else
    b = static_cast<uint16_t>((r > 0) == up ? b + 1 : b - 1);
  return t == DType::bf16 ? bf16_to_f32(b) : f16_to_f32(b);
}

// Uniform draws land in [lo, hi) in the result dtype too: values that round onto hi (or
// below lo) in a 16-bit dtype are moved to the nearest representable value inside.
Kernel uniform_kernel(const KernelSpec& spec) {
  const float lo = static_cast<float>(spec.attrs.f("lo")), hi = static_cast<float>(spec.attrs.f("hi"));
  const DType dt = spec.out[0].dtype;
  float top = round_to(dt, hi), bottom = round_to(dt, lo);
  if (top >= hi) top = dt == DType::f32 ? std::nextafter(hi, lo) : step16(dt, top, false);
  if (bottom < lo) bottom = step16(dt, bottom, true);
  return draw_kernel(spec, [lo, hi, top, bottom, dt](int64_t first, int64_t n, uint32_t k0, uint32_t k1, float* dst) {
    int64_t i = 0;
    while (i < n) {
      const uint64_t idx = static_cast<uint64_t>(first + i);
      const uint64_t block = idx >> 2;
      Philox r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0, k0, k1);
      for (int lane = static_cast<int>(idx & 3); lane < 4 && i < n; ++lane, ++i) {
        // One rounding, whatever the compiler contracts (the ref backend's and the device's formula).
        float v = round_to(dt, std::fma(hi - lo, to_unit(r.v[lane]), lo));
        dst[i] = v >= hi ? top : v < lo ? bottom : v;
      }
    }
  });
}

// Box-Muller: lanes (0,1) and (2,3) of a block form the two normals of one pair of uniforms.
Kernel normal_kernel(const KernelSpec& spec) {
  return draw_kernel(spec, [](int64_t first, int64_t n, uint32_t k0, uint32_t k1, float* dst) {
    int64_t i = 0;
    while (i < n) {
      const uint64_t idx = static_cast<uint64_t>(first + i);
      const uint64_t block = idx >> 2;
      Philox r = philox4x32_10(static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0, k0, k1);
      float z[4];
      for (int p = 0; p < 2; ++p) {
        float u1 = (static_cast<float>(r.v[2 * p] >> 8) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
        float u2 = to_unit(r.v[2 * p + 1]);
        float rad = std::sqrt(-2.0f * std::log(u1));
        z[2 * p] = rad * std::cos(kTwoPi * u2);
        z[2 * p + 1] = rad * std::sin(kTwoPi * u2);
      }
      for (int lane = static_cast<int>(idx & 3); lane < 4 && i < n; ++lane, ++i) dst[i] = z[lane];
    }
  });
}

// A new key from (key, data): a Philox block on a counter that no draw uses (word 3 is set).
Kernel fold_in_kernel(const KernelSpec& spec) {
  const uint64_t data = static_cast<uint64_t>(spec.attrs.i("data"));
  return [data](const void* const* in, void* const* out) {
    const int32_t* key = static_cast<const int32_t*>(in[0]);
    Philox r = philox4x32_10(static_cast<uint32_t>(data), static_cast<uint32_t>(data >> 32), 0, 0xF01D1u,
                             static_cast<uint32_t>(key[0]), static_cast<uint32_t>(key[1]));
    int32_t* k = static_cast<int32_t*>(out[0]);
    k[0] = static_cast<int32_t>(r.v[0]);
    k[1] = static_cast<int32_t>(r.v[1]);
  };
}

}  // namespace

void register_rng_kernels() {
  register_kernel(prims::random_uniform(), uniform_kernel, draw_scratch);
  register_kernel(prims::random_normal(), normal_kernel, draw_scratch);
  register_kernel(prims::fold_in(), fold_in_kernel);
}

}  // namespace px::cpu
