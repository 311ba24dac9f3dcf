// Reference kernels of the rng family (src/ops/rng.cc) on Philox-4x32-10 (Salmon et al.,
// "Parallel random numbers: as easy as 1, 2, 3", SC'11). A key is i32[2] = (k0, k1).
//
//  - Element with global flat index i (row-major in global_shape, the draw's own shape unless the
//    draw is a block of a larger one placed at `offset` or at the i32[rank] origin operand) takes
//    lane i % 4 of the Philox block for counter (i / 4 low word, i / 4 high word, 0, 0).
//  - random_uniform: u = (bits >> 8) 2^-24 in [0, 1), then lo + (hi - lo) u with lo, hi and
//    hi - lo as f32, the multiply-add rounded once to f32 (as the CPU backend's build computes it:
//    its compiler fuses it), then rounded to the result dtype and kept in [lo, hi) there (a value
//    that rounds onto hi, or below lo, becomes the nearest representable value inside).
//  - random_normal: Box-Muller on lanes (0, 1) and (2, 3): u1 = ((bits0 >> 8) + 1) 2^-24 in (0, 1],
//    u2 = (bits1 >> 8) 2^-24, r = sqrt(-2 ln u1), z = (r cos(2 pi u2), r sin(2 pi u2)), 2 pi u2 an
//    f32 product.
//  - fold_in(key, data): the first two words of the block for counter (data low word, data high
//    word, 0, 0xF01D1), a counter no draw uses.
// The bits are those of the definition exactly; the float steps are computed in double (each f32
// operation of the definition rounded to f32), so values agree closely with other backends.
#include <cmath>
#include <cstdint>
#include <vector>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

namespace {

struct Block {
  uint32_t w[4];
};

Block philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  const uint64_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  const uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // the key schedule: bump by the Weyl constants before each later round
      k0 += kWeyl0;
      k1 += kWeyl1;
    }
    const uint64_t prod0 = kMul0 * c0, prod1 = kMul1 * c2;
    const uint32_t hi0 = static_cast<uint32_t>(prod0 >> 32), lo0 = static_cast<uint32_t>(prod0);
    const uint32_t hi1 = static_cast<uint32_t>(prod1 >> 32), lo1 = static_cast<uint32_t>(prod1);
    const uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
  }
  return {{c0, c1, c2, c3}};
}

Block block_at(uint64_t counter, uint32_t k0, uint32_t k1) {
  return philox4x32_10(static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0, k0, k1);
}

double f32(double x) { return static_cast<double>(static_cast<float>(x)); }
double unit(uint32_t bits) { return static_cast<double>(bits >> 8) / 16777216.0; }  // [0, 1), exact in f32

// x rounded to dtype t (as a double).
double round_to(DType t, double x) {
  uint32_t buf = 0;
  store(&buf, t, 0, x);
  return load(&buf, t, 0);
}

// The value of a 16-bit dtype next to r (a value of that dtype), up or down.
double step16(DType t, double r, bool up) {
  uint16_t b = 0;
  store(&b, t, 0, r);
  if (r == 0.0)
    b = up ? 0x0001 : 0x8001;  // the smallest subnormals
  else
    b = static_cast<uint16_t>((r > 0) == up ? b + 1 : b - 1);  // sign-magnitude: away from or toward 0
  return load(&b, t, 0);
}

// Maps local element index to global flat index for a draw that may be a block of a larger one.
struct Geometry {
  std::vector<int64_t> shape, offset, gstrides;
};

Geometry geometry_of(const Spec& s) {
  Geometry g;
  g.shape = s.out.at(0).shape;
  const std::vector<int64_t> global = s.attrs.has("global_shape") ? s.attrs.ints("global_shape") : g.shape;
  g.offset = s.attrs.has("offset") ? s.attrs.ints("offset") : std::vector<int64_t>(g.shape.size(), 0);
  g.gstrides = strides_of(global);
  return g;
}

// Calls f(local index, global index) for every element, with the block's origin `offset`.
template <class F>
void for_each_element(const Geometry& g, const std::vector<int64_t>& offset, F f) {
  const int rank = static_cast<int>(g.shape.size());
  int64_t n = 1;
  for (int64_t d : g.shape) n *= d;
  std::vector<int64_t> idx(rank, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t gi = 0;
    for (int d = 0; d < rank; ++d) gi += (idx[d] + offset[d]) * g.gstrides[d];
    f(i, static_cast<uint64_t>(gi));
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < g.shape[d]) break;
      idx[d] = 0;
    }
  }
}

// The block's origin: the attr (or zeros), or the origin operand when there is one.
std::vector<int64_t> origin(const Geometry& g, bool operand, const void* const* in) {
  std::vector<int64_t> off = g.offset;
  if (operand)
    for (size_t d = 0; d < off.size(); ++d) off[d] = static_cast<int64_t>(load(in[1], DType::i32, d));
  return off;
}

Kernel make_uniform(const Spec& s) {
  const Geometry geom = geometry_of(s);
  const bool operand = s.in.size() == 2;
  const DType dt = s.out.at(0).dtype;
  const double lo = f32(s.attrs.f("lo")), hi = f32(s.attrs.f("hi")), width = f32(hi - lo);
  // The largest value below hi and the smallest at or above lo, in the result dtype.
  double top = round_to(dt, hi), bottom = round_to(dt, lo);
  if (top >= hi)
    top = dt == DType::f32 ? static_cast<double>(std::nextafter(static_cast<float>(hi), -INFINITY))
                           : step16(dt, top, false);
  if (bottom < lo) bottom = step16(dt, bottom, true);
  return [=](const void* const* in, void* const* out) {
    const int32_t* key = static_cast<const int32_t*>(in[0]);
    const uint32_t k0 = static_cast<uint32_t>(key[0]), k1 = static_cast<uint32_t>(key[1]);
    for_each_element(geom, origin(geom, operand, in), [&](int64_t i, uint64_t gi) {
      const Block b = block_at(gi >> 2, k0, k1);
      // lo + width u rounded once to f32 (a fused multiply-add), then to the result dtype.
      const float u = static_cast<float>(unit(b.w[gi & 3]));
      double v = round_to(dt, std::fma(static_cast<float>(width), u, static_cast<float>(lo)));
      if (v >= hi)
        v = top;
      else if (v < lo)
        v = bottom;
      store(out[0], dt, i, v);
    });
  };
}

Kernel make_normal(const Spec& s) {
  const Geometry geom = geometry_of(s);
  const bool operand = s.in.size() == 2;
  const DType dt = s.out.at(0).dtype;
  const double two_pi = f32(6.28318530717958647692);
  return [=](const void* const* in, void* const* out) {
    const int32_t* key = static_cast<const int32_t*>(in[0]);
    const uint32_t k0 = static_cast<uint32_t>(key[0]), k1 = static_cast<uint32_t>(key[1]);
    for_each_element(geom, origin(geom, operand, in), [&](int64_t i, uint64_t gi) {
      const Block b = block_at(gi >> 2, k0, k1);
      const int lane = static_cast<int>(gi & 3), pair = lane / 2;
      const double u1 = (static_cast<double>(b.w[2 * pair] >> 8) + 1.0) / 16777216.0;  // (0, 1]
      const double u2 = unit(b.w[2 * pair + 1]);
      const double r = std::sqrt(-2.0 * std::log(u1));
      const double angle = f32(two_pi * u2);
      store(out[0], dt, i, lane % 2 == 0 ? r * std::cos(angle) : r * std::sin(angle));
    });
  };
}

Kernel make_fold_in(const Spec& s) {
  const uint64_t data = static_cast<uint64_t>(s.attrs.i("data"));
  return [data](const void* const* in, void* const* out) {
    const int32_t* key = static_cast<const int32_t*>(in[0]);
    const Block b = philox4x32_10(static_cast<uint32_t>(data), static_cast<uint32_t>(data >> 32), 0, 0xF01D1u,
                                  static_cast<uint32_t>(key[0]), static_cast<uint32_t>(key[1]));
    int32_t* k = static_cast<int32_t*>(out[0]);
    k[0] = static_cast<int32_t>(b.w[0]);
    k[1] = static_cast<int32_t>(b.w[1]);
  };
}

}  // namespace

void register_rng_kernels() {
  register_kernels({{prims::random_uniform(), make_uniform},
                    {prims::random_normal(), make_normal},
                    {prims::fold_in(), make_fold_in}});
}

}  // namespace px::ref
