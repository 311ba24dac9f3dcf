// CPU kernels of the shape family. Every kernel is a strided copy: dims are canonicalized at
// compile time (size-1 dims dropped, dims contiguous on both sides merged), so that the run loop
// copies long rows with memcpy; transposes that move the innermost dim use cache-sized tiles.
#include <omp.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstring>

#include "backend/cpu/kernel.h"
#include "backend/cpu/loops.h"
#include "core/box.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

using Ints = std::vector<int64_t>;
constexpr int kMaxRank = 16;
constexpr int64_t kMinBytesPerThread = 64 << 10;

Ints row_major_strides(const Shape& s) {
  Ints st(s.size(), 1);
  for (int d = static_cast<int>(s.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * s[d + 1];
  return st;
}

// Runs f(begin, end) over [0, n) split into contiguous ranges, one per thread, when the total
// work (bytes moved) makes threads worth waking.
template <class F>
void parallel_ranges(int64_t n, int64_t bytes_total, F&& f) {
  cpu::parallel_ranges(n, bytes_total, kMinBytesPerThread, f);
}

void parallel_memcpy(void* dst, const void* src, int64_t bytes) {
  constexpr int64_t kChunk = 1 << 18;
  int64_t n = (bytes + kChunk - 1) / kChunk;
  parallel_ranges(n, bytes, [&](int64_t b, int64_t e) {
    int64_t lo = b * kChunk, hi = std::min(bytes, e * kChunk);
    std::memcpy(static_cast<std::byte*>(dst) + lo, static_cast<const std::byte*>(src) + lo,
                static_cast<size_t>(hi - lo));
  });
}

// ---- strided copy engine ----------------------------------------------------------------------

// Copies dst[dst_off + sum(i*dst_st)] = src[src_off + sum(i*src_st)] over the index space `size`.
struct CopyPlan {
  int rank = 0;  // canonical dims; the last is the inner row
  int64_t size[kMaxRank] = {}, sst[kMaxRank] = {}, dstr[kMaxRank] = {};
  int64_t src_off = 0, dst_off = 0, rows = 0, inner = 0, esize = 0;
  bool memcpy_rows = false;
};

CopyPlan make_copy_plan(const Shape& size, const Ints& sst, const Ints& dst, int64_t src_off, int64_t dst_off,
                        int64_t esize) {
  CopyPlan p;
  p.src_off = src_off;
  p.dst_off = dst_off;
  p.esize = esize;
  if (numel(size) == 0) return p;  // rows = 0: nothing to copy
  Ints s, a, b;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 1) continue;
    if (!s.empty() && a.back() == sst[d] * size[d] && b.back() == dst[d] * size[d]) {
      s.back() *= size[d];
      a.back() = sst[d];
      b.back() = dst[d];
      continue;
    }
    s.push_back(size[d]);
    a.push_back(sst[d]);
    b.push_back(dst[d]);
  }
  if (s.empty()) s = {1}, a = {1}, b = {1};
  if (s.size() > static_cast<size_t>(kMaxRank))
    throw Error("[cpu] copy of rank " + std::to_string(s.size()) + " exceeds the kernel limit of " +
                std::to_string(kMaxRank) + " non-mergeable dims");
  p.rank = static_cast<int>(s.size());
  for (int d = 0; d < p.rank; ++d) p.size[d] = s[d], p.sst[d] = a[d], p.dstr[d] = b[d];
  p.inner = s.back();
  p.rows = numel(s) / p.inner;
  p.memcpy_rows = a.back() == 1 && b.back() == 1;
  return p;
}

template <class T>
void copy_rows(const CopyPlan& p, const T* src, T* dst, int64_t r0, int64_t r1) {
  int64_t idx[kMaxRank];
  int64_t so = p.src_off, dof = p.dst_off, rem = r0;
  for (int d = p.rank - 2; d >= 0; --d) {
    idx[d] = rem % p.size[d];
    rem /= p.size[d];
    so += idx[d] * p.sst[d];
    dof += idx[d] * p.dstr[d];
  }
  const int64_t n = p.inner, is = p.sst[p.rank - 1], ds = p.dstr[p.rank - 1];
  for (int64_t r = r0; r < r1; ++r) {
    if (p.memcpy_rows) {
      std::memcpy(dst + dof, src + so, static_cast<size_t>(n) * sizeof(T));
    } else {
      const T* s = src + so;
      T* d = dst + dof;
      for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * is];
    }
    for (int d = p.rank - 2; d >= 0; --d) {
      so += p.sst[d];
      dof += p.dstr[d];
      if (++idx[d] < p.size[d]) break;
      so -= p.size[d] * p.sst[d];
      dof -= p.size[d] * p.dstr[d];
      idx[d] = 0;
    }
  }
}

void run_copy(const CopyPlan& p, const void* src, void* dst) {
  int64_t bytes = p.rows * p.inner * p.esize;
  parallel_ranges(p.rows, bytes, [&](int64_t b, int64_t e) {
    switch (p.esize) {
      case 1:
        copy_rows(p, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), b, e);
        break;
      case 2:
        copy_rows(p, static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst), b, e);
        break;
      default:
        copy_rows(p, static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst), b, e);
        break;
    }
  });
}

// ---- transpose --------------------------------------------------------------------------------

// A transpose whose innermost output dim is not the innermost input dim: tiles over (a, b),
// where a is the input dim that becomes innermost in the output and b the input's innermost.
struct TilePlan {
  int64_t A = 0, B = 0, in_sa = 0, out_sb = 0, batch = 0;
  int nb = 0;
  int64_t bsize[kMaxRank] = {}, bin[kMaxRank] = {}, bout[kMaxRank] = {};
};

// In-register transposes of 8x8 blocks: src rows are `ss` elements apart, dst rows `ds`.
#if defined(__AVX2__)
inline void tr8x8(const uint32_t* src, int64_t ss, uint32_t* dst, int64_t ds) {
  const float* s = reinterpret_cast<const float*>(src);
  float* d = reinterpret_cast<float*>(dst);
  __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ss), r2 = _mm256_loadu_ps(s + 2 * ss),
         r3 = _mm256_loadu_ps(s + 3 * ss), r4 = _mm256_loadu_ps(s + 4 * ss), r5 = _mm256_loadu_ps(s + 5 * ss),
         r6 = _mm256_loadu_ps(s + 6 * ss), r7 = _mm256_loadu_ps(s + 7 * ss);
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
         t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
         t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
         u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
         u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
         u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
  _mm256_storeu_ps(d + ds, _mm256_permute2f128_ps(u1, u5, 0x20));
  _mm256_storeu_ps(d + 2 * ds, _mm256_permute2f128_ps(u2, u6, 0x20));
  _mm256_storeu_ps(d + 3 * ds, _mm256_permute2f128_ps(u3, u7, 0x20));
  _mm256_storeu_ps(d + 4 * ds, _mm256_permute2f128_ps(u0, u4, 0x31));
  _mm256_storeu_ps(d + 5 * ds, _mm256_permute2f128_ps(u1, u5, 0x31));
  _mm256_storeu_ps(d + 6 * ds, _mm256_permute2f128_ps(u2, u6, 0x31));
  _mm256_storeu_ps(d + 7 * ds, _mm256_permute2f128_ps(u3, u7, 0x31));
}
constexpr bool kHasTr32 = true;
#else
inline void tr8x8(const uint32_t*, int64_t, uint32_t*, int64_t) {}
constexpr bool kHasTr32 = false;
#endif

#if defined(__SSE2__)
inline void tr8x8(const uint16_t* s, int64_t ss, uint16_t* d, int64_t ds) {
  auto ld = [&](int i) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * ss)); };
  __m128i r0 = ld(0), r1 = ld(1), r2 = ld(2), r3 = ld(3), r4 = ld(4), r5 = ld(5), r6 = ld(6), r7 = ld(7);
  __m128i t0 = _mm_unpacklo_epi16(r0, r1), t1 = _mm_unpackhi_epi16(r0, r1), t2 = _mm_unpacklo_epi16(r2, r3),
          t3 = _mm_unpackhi_epi16(r2, r3), t4 = _mm_unpacklo_epi16(r4, r5), t5 = _mm_unpackhi_epi16(r4, r5),
          t6 = _mm_unpacklo_epi16(r6, r7), t7 = _mm_unpackhi_epi16(r6, r7);
  __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2), u2 = _mm_unpacklo_epi32(t1, t3),
          u3 = _mm_unpackhi_epi32(t1, t3), u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6),
          u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
  auto st = [&](int i, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i * ds), v); };
  st(0, _mm_unpacklo_epi64(u0, u4));
  st(1, _mm_unpackhi_epi64(u0, u4));
  st(2, _mm_unpacklo_epi64(u1, u5));
  st(3, _mm_unpackhi_epi64(u1, u5));
  st(4, _mm_unpacklo_epi64(u2, u6));
  st(5, _mm_unpackhi_epi64(u2, u6));
  st(6, _mm_unpacklo_epi64(u3, u7));
  st(7, _mm_unpackhi_epi64(u3, u7));
}
constexpr bool kHasTr16 = true;
#else
inline void tr8x8(const uint16_t*, int64_t, uint16_t*, int64_t) {}
constexpr bool kHasTr16 = false;
#endif

inline void tr8x8(const uint8_t*, int64_t, uint8_t*, int64_t) {}

template <class T>
constexpr bool has_tr8x8() {
  if constexpr (sizeof(T) == 4)
    return kHasTr32;
  else if constexpr (sizeof(T) == 2)
    return kHasTr16;
  else
    return false;
}

// One tile: dst[c * ds + a] = src[a * ss + c] for a < na, c < nc.
template <class T>
inline void tile(const T* src, int64_t ss, T* dst, int64_t ds, int64_t na, int64_t nc) {
  int64_t a8 = 0, c8 = 0;
  if constexpr (has_tr8x8<T>()) {
    a8 = na / 8 * 8;
    c8 = nc / 8 * 8;
    for (int64_t a = 0; a < a8; a += 8)
      for (int64_t c = 0; c < c8; c += 8) tr8x8(src + a * ss + c, ss, dst + c * ds + a, ds);
  }
  // Edges (or everything, without a register kernel).
  for (int64_t c = 0; c < nc; ++c) {
    T* d = dst + c * ds;
    const T* s = src + c;
    for (int64_t a = c < c8 ? a8 : 0; a < na; ++a) d[a] = s[a * ss];
  }
}

// Blocks of kB x kB elements (L2-sized, and few enough pages for the TLB) are the parallel work
// items; each is swept in tiles of kT x kT whose cache lines are used whole.
template <class T>
void run_tiles(const TilePlan& p, const T* in, T* out) {
  constexpr int64_t kT = 64 / sizeof(T) * 2;
  constexpr int64_t kB = 128;
  const int64_t ta = (p.A + kB - 1) / kB, tb = (p.B + kB - 1) / kB;
  const int64_t items = p.batch * ta * tb;
  parallel_ranges(items, p.batch * p.A * p.B * static_cast<int64_t>(sizeof(T)), [&](int64_t b0, int64_t b1) {
    for (int64_t it = b0; it < b1; ++it) {
      int64_t bi = it / (ta * tb), rem = it % (ta * tb);
      int64_t a0 = rem / tb * kB, c0 = rem % tb * kB;
      int64_t ioff = 0, ooff = 0;
      for (int d = p.nb - 1; d >= 0; --d) {
        int64_t i = bi % p.bsize[d];
        bi /= p.bsize[d];
        ioff += i * p.bin[d];
        ooff += i * p.bout[d];
      }
      const int64_t a1 = std::min(a0 + kB, p.A), c1 = std::min(c0 + kB, p.B);
      for (int64_t a = a0; a < a1; a += kT)
        for (int64_t c = c0; c < c1; c += kT)
          tile(in + ioff + a * p.in_sa + c, p.in_sa, out + ooff + c * p.out_sb + a, p.out_sb, std::min(kT, a1 - a),
               std::min(kT, c1 - c));
    }
  });
}

Kernel make_transpose(const KernelSpec& spec) {
  const TensorType& t = spec.in[0];
  const Ints& perm = spec.attrs.ints("perm");
  int64_t esize = dtype_size(t.dtype);
  // Canonical form: drop size-1 dims, then merge output-adjacent dims that are input-adjacent.
  Ints keep;  // input dims kept
  for (int d = 0; d < t.rank(); ++d)
    if (t.shape[d] != 1) keep.push_back(d);
  Ints newid(t.rank(), -1);
  for (size_t k = 0; k < keep.size(); ++k) newid[keep[k]] = static_cast<int64_t>(k);
  Ints p;
  for (int64_t q : perm)
    if (newid[q] >= 0) p.push_back(newid[q]);
  Shape s;
  for (int64_t d : keep) s.push_back(t.shape[d]);
  // Group runs of consecutive input dims that appear in order in the output.
  std::vector<Ints> groups;  // in output order, each a run of input dims
  for (int64_t q : p) {
    if (!groups.empty() && groups.back().back() + 1 == q)
      groups.back().push_back(q);
    else
      groups.push_back({q});
  }
  // Order groups by their first input dim to get merged input dims.
  std::vector<int> by_in(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) by_in[g] = static_cast<int>(g);
  std::sort(by_in.begin(), by_in.end(), [&](int x, int y) { return groups[x][0] < groups[y][0]; });
  std::vector<int> in_pos(groups.size());  // group (output order) -> merged input dim
  Shape ms(groups.size());
  for (size_t k = 0; k < by_in.size(); ++k) {
    in_pos[by_in[k]] = static_cast<int>(k);
    int64_t sz = 1;
    for (int64_t d : groups[by_in[k]]) sz *= s[d];
    ms[k] = sz;
  }
  int r = static_cast<int>(groups.size());
  if (r > kMaxRank) throw Error("[transpose] rank " + std::to_string(r) + " exceeds the kernel limit");
  Ints in_st = row_major_strides(ms);
  Shape out_s(r);
  for (int i = 0; i < r; ++i) out_s[i] = ms[in_pos[i]];
  Ints out_st = row_major_strides(out_s);
  int64_t count = t.numel();

  if (r <= 1 || in_pos[r - 1] == r - 1) {
    // The innermost input dim stays innermost: long row copies.
    Ints sst(r);
    for (int i = 0; i < r; ++i) sst[i] = in_st[in_pos[i]];
    CopyPlan cp = r == 0 ? make_copy_plan({}, {}, {}, 0, 0, esize) : make_copy_plan(out_s, sst, out_st, 0, 0, esize);
    if (count == 0) cp.rows = 0;
    return [cp](const void* const* in, void* const* out) { run_copy(cp, in[0], out[0]); };
  }
  TilePlan tp;
  int a = in_pos[r - 1];  // merged input dim that becomes innermost in the output
  int q = 0;              // output position of the innermost input dim
  for (int i = 0; i < r; ++i)
    if (in_pos[i] == r - 1) q = i;
  tp.A = ms[a];
  tp.B = ms[r - 1];
  tp.in_sa = in_st[a];
  tp.out_sb = out_st[q];
  tp.batch = 1;
  for (int i = 0; i < r; ++i) {
    if (i == q || i == r - 1) continue;
    tp.bsize[tp.nb] = out_s[i];
    tp.bin[tp.nb] = in_st[in_pos[i]];
    tp.bout[tp.nb] = out_st[i];
    tp.batch *= out_s[i];
    ++tp.nb;
  }
  if (count == 0) tp.batch = 0;
  return [tp, esize](const void* const* in, void* const* out) {
    switch (esize) {
      case 1:
        run_tiles(tp, static_cast<const uint8_t*>(in[0]), static_cast<uint8_t*>(out[0]));
        break;
      case 2:
        run_tiles(tp, static_cast<const uint16_t*>(in[0]), static_cast<uint16_t*>(out[0]));
        break;
      default:
        run_tiles(tp, static_cast<const uint32_t*>(in[0]), static_cast<uint32_t*>(out[0]));
        break;
    }
  };
}

// ---- slice, pad, concat -----------------------------------------------------------------------

Ints ints_or(const Attrs& a, const std::string& k, size_t n, int64_t dflt) {
  return a.has(k) ? a.ints(k) : Ints(n, dflt);
}

Kernel make_slice(const KernelSpec& spec) {
  const TensorType& t = spec.in[0];
  const Ints& starts = spec.attrs.ints("starts");
  Ints strides = ints_or(spec.attrs, "strides", t.shape.size(), 1);
  Ints in_st = row_major_strides(t.shape);
  Ints sst(t.shape.size());
  int64_t off = 0;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    sst[d] = in_st[d] * strides[d];
    off += starts[d] * in_st[d];
  }
  const Shape& os = spec.out[0].shape;
  CopyPlan cp = make_copy_plan(os, sst, row_major_strides(os), off, 0, dtype_size(t.dtype));
  return [cp](const void* const* in, void* const* out) { run_copy(cp, in[0], out[0]); };
}

template <class T>
void fill(T* dst, int64_t n, T v) {
  parallel_ranges(n, n * static_cast<int64_t>(sizeof(T)),
                  [&](int64_t b, int64_t e) { std::fill(dst + b, dst + e, v); });
}

void fill_bytes(void* dst, int64_t n, int64_t esize, uint32_t bits) {
  switch (esize) {
    case 1:
      fill(static_cast<uint8_t*>(dst), n, static_cast<uint8_t>(bits));
      break;
    case 2:
      fill(static_cast<uint16_t*>(dst), n, static_cast<uint16_t>(bits));
      break;
    default:
      fill(static_cast<uint32_t*>(dst), n, bits);
      break;
  }
}

Kernel make_pad(const KernelSpec& spec) {
  const TensorType& t = spec.in[0];
  const Shape& os = spec.out[0].shape;
  const Ints& lo = spec.attrs.ints("lo");
  Ints interior = ints_or(spec.attrs, "interior", t.shape.size(), 0);
  Ints out_st = row_major_strides(os);
  Ints dst(t.shape.size());
  int64_t off = 0;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    dst[d] = out_st[d] * (interior[d] + 1);
    off += lo[d] * out_st[d];
  }
  int64_t esize = dtype_size(t.dtype);
  CopyPlan cp = make_copy_plan(t.shape, row_major_strides(t.shape), dst, 0, off, esize);
  uint32_t bits = element_bits(spec.attrs.f("value", 0.0), t.dtype);
  int64_t out_n = spec.out[0].numel();
  bool needs_fill = out_n > t.numel();
  return [cp, bits, out_n, esize, needs_fill](const void* const* in, void* const* out) {
    if (needs_fill) fill_bytes(out[0], out_n, esize, bits);
    run_copy(cp, in[0], out[0]);
  };
}

// Each operand is a block of `outer` rows; row pieces go side by side in the result.
Kernel make_concat(const KernelSpec& spec) {
  int64_t axis = spec.attrs.i("axis");
  const Shape& os = spec.out[0].shape;
  int64_t esize = dtype_size(spec.out[0].dtype);
  int64_t outer = 1, inner = esize;
  for (int64_t d = 0; d < axis; ++d) outer *= os[d];
  for (size_t d = axis + 1; d < os.size(); ++d) inner *= os[d];
  std::vector<int64_t> piece, offset;
  int64_t row = 0;
  for (auto& t : spec.in) {
    piece.push_back(t.shape[axis] * inner);
    offset.push_back(row);
    row += piece.back();
  }
  int64_t k = static_cast<int64_t>(spec.in.size());
  int64_t total = spec.out[0].nbytes();
  return [=](const void* const* in, void* const* out) {
    if (total == 0) return;
    std::byte* o = static_cast<std::byte*>(out[0]);
    parallel_ranges(outer * k, total, [&](int64_t b, int64_t e) {
      for (int64_t it = b; it < e; ++it) {
        int64_t r = it / k, j = it % k;
        if (piece[j] == 0) continue;
        std::memcpy(o + r * row + offset[j], static_cast<const std::byte*>(in[j]) + r * piece[j],
                    static_cast<size_t>(piece[j]));
      }
    });
  };
}

}  // namespace

void register_shape_kernels() {
  register_kernel(prims::reshape(), [](const KernelSpec& spec) -> Kernel {
    int64_t bytes = spec.out[0].nbytes();
    return [bytes](const void* const* in, void* const* out) {
      if (bytes) parallel_memcpy(out[0], in[0], bytes);
    };
  });
  register_kernel(prims::transpose(), make_transpose);
  register_kernel(prims::slice(), make_slice);
  register_kernel(prims::pad(), make_pad);
  register_kernel(prims::concat(), make_concat);
  // The SPMD partitioner's local primitives (src/sharding/prims.cc): a layout constraint is a copy
  // (or nothing, in place); local_slice keeps this device's block along `dim`, the block's number
  // read from the device coordinates (operand 1) over the mesh axes `axis_ids`.
  register_late_kernel(prims::sharding_constraint_if_registered, [](const KernelSpec& s) -> Kernel {
    const int64_t bytes = s.out[0].nbytes();
    return [bytes](const void* const* in, void* const* out) {
      if (bytes && in[0] != out[0]) std::memcpy(out[0], in[0], static_cast<size_t>(bytes));
    };
  });
  register_late_kernel(prims::local_slice_if_registered, [](const KernelSpec& s) -> Kernel {
    const Shape in_shape = s.in[0].shape, out_shape = s.out[0].shape;
    const int dim = static_cast<int>(s.attrs.i("dim"));
    const std::vector<int64_t> axis_ids = s.attrs.ints("axis_ids"), mesh = s.attrs.ints("mesh");
    const int64_t elem = dtype_size(s.in[0].dtype);
    std::vector<int64_t> src_off(in_shape.size(), 0), dst_off(in_shape.size(), 0);
    return [=](const void* const* in, void* const* out) mutable {
      const int32_t* coords = static_cast<const int32_t*>(in[1]);
      int64_t k = 0;
      for (int64_t a : axis_ids) k = k * mesh[a] + coords[a];
      src_off[dim] = k * out_shape[dim];
      copy_box(in[0], in_shape, src_off.data(), out[0], out_shape, dst_off.data(), out_shape, elem);
    };
  });
}

}  // namespace px::cpu
