// CPU kernels of the reduce family. Dims are canonicalized at compile time (size-1 dims dropped,
// neighbours of the same kind merged), giving two loops: the innermost dim reduced (row
// reductions over contiguous memory) or kept (column sums: vectors of C outputs accumulated
// row by row). Float sums add blocks of 512 elements in 32 f32 lanes, then blocks in f64, so
// that long sums stay accurate. Work splits into chunks fixed by the shapes alone, never by the
// thread count, so results are bitwise reproducible on any machine.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "backend/cpu/kernel.h"
#include "backend/cpu/loops.h"
#include "backend/cpu/reduce_feed.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

constexpr int kMaxRank = 16;
constexpr int64_t kSeg = 512;             // elements per row block
constexpr int64_t kColBlock = 2048;       // output columns per work item: long contiguous row reads
constexpr int64_t kFlushRows = 64;        // rows summed in f32 before folding into f64
constexpr int64_t kChunkElems = 1 << 15;  // reduction elements per chunk when outputs are few
constexpr int64_t kFewUnits = 64;         // below this many work units, split the reduction too
constexpr int64_t kFedCols = 512;         // columns of a fed reduction computed at a time

// f(tid, b, e) over parts of [0, n), on at most `max_threads` threads (0: the machine's); tid is
// the part's thread, 0 when one part runs on the calling thread. With `fence`, each thread ends
// with a store fence (a fed operand's loop may write its results with streaming stores).
template <class F>
void parallel_items(int64_t n, int64_t work_total, int max_threads, bool fence, F&& f) {
  if (n <= 0) return;
  int64_t chunks = std::min<int64_t>({num_threads(), n, std::max<int64_t>(1, work_total >> 14)});
  if (max_threads > 0) chunks = std::min<int64_t>(chunks, max_threads);
  if (chunks <= 1) {
    f(0, int64_t{0}, n);
    if (fence) _mm_sfence();
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(chunks))
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) f(static_cast<int>(t), b, e);
    if (fence) _mm_sfence();
  }
}

// ---- element sources ----------------------------------------------------------------------------

enum class Src { f32, bf16, f16, i32, fed };  // fed: a ReduceFeed computes the elements

// The element type the operators read: bf16 is widened in registers, f16 through a buffer.
template <Src S>
struct SrcType {
  using T = float;
};
template <>
struct SrcType<Src::bf16> {
  using T = uint16_t;
};
template <>
struct SrcType<Src::i32> {
  using T = int32_t;
};

inline float cv(float x) { return x; }
inline float cv(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }
inline int32_t cv(int32_t x) { return x; }

// Returns n elements at `off`; only f16 is converted (into buf), and fed elements are computed
// there by thread tid.
template <Src S>
inline const typename SrcType<S>::T* load(const void* base, int64_t off, int64_t n, typename SrcType<S>::T* buf,
                                          int tid) {
  using T = typename SrcType<S>::T;
  if constexpr (S == Src::f16) {
    load_f32(base, DType::f16, off, buf, n);
    return buf;
  } else if constexpr (S == Src::fed) {
    const ReduceFeed* feed = static_cast<const ReduceFeed*>(base);
    feed->fill(feed->ctx, tid, off, n, buf);
    return buf;
  } else {
    return static_cast<const T*>(base) + off;
  }
}

// ---- reduction operators --------------------------------------------------------------------------

// row(): reduce <= kSeg contiguous elements. col(): blk[c] (+)= x[c]. Blk values fold into Acc.
struct SumF {
  using T = float;
  using Blk = float;
  using Acc = double;
  static Acc id() { return 0.0; }
  static Blk blk_id() { return 0.0f; }
  static Acc merge(Acc a, Acc b) { return a + b; }
  template <class E>
  static Acc row(const E* x, int64_t n) {
    if (n < 32) {  // short rows: one vector of lanes, a short dependency chain
      float lane[8] = {}, t = 0.0f;
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) lane[j] += cv(x[i + j]);
      for (; i < n; ++i) t += cv(x[i]);
      return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) + t;
    }
    float lane[32] = {};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int j = 0; j < 32; ++j) lane[j] += cv(x[i + j]);
    for (int j = 0; i < n; ++i, ++j) lane[j] += cv(x[i]);
    for (int w = 16; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
    return lane[0];
  }
  template <class E>
  static void col(float* blk, const E* x, int64_t n) {
    for (int64_t c = 0; c < n; ++c) blk[c] += cv(x[c]);
  }
  template <class E>
  static void col4(float* blk, const E* a, const E* b, const E* c, const E* d, int64_t n) {
    for (int64_t i = 0; i < n; ++i) blk[i] += (cv(a[i]) + cv(b[i])) + (cv(c[i]) + cv(d[i]));
  }
  static float out(Acc a) { return static_cast<float>(a); }
};

inline float fmax_nan(float a, float x) { return (x > a || x != x) ? x : a; }

struct MaxF {
  using T = float;
  using Blk = float;
  using Acc = float;
  static Acc id() { return -std::numeric_limits<float>::infinity(); }
  static Blk blk_id() { return id(); }
  static Acc merge(Acc a, Acc b) { return fmax_nan(a, b); }
  template <class E>
  static Acc row(const E* x, int64_t n) {
    if (n < 32) {
      float m = id();
      for (int64_t i = 0; i < n; ++i) m = fmax_nan(m, cv(x[i]));
      return m;
    }
    float lane[32];
    for (float& l : lane) l = id();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      for (int j = 0; j < 32; ++j) lane[j] = fmax_nan(lane[j], cv(x[i + j]));
    for (int j = 0; i < n; ++i, ++j) lane[j] = fmax_nan(lane[j], cv(x[i]));
    for (int w = 16; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) lane[j] = fmax_nan(lane[j], lane[j + w]);
    return lane[0];
  }
  template <class E>
  static void col(float* blk, const E* x, int64_t n) {
    for (int64_t c = 0; c < n; ++c) blk[c] = fmax_nan(blk[c], cv(x[c]));
  }
  template <class E>
  static void col4(float* blk, const E* a, const E* b, const E* c, const E* d, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
      blk[i] = fmax_nan(blk[i], fmax_nan(fmax_nan(cv(a[i]), cv(b[i])), fmax_nan(cv(c[i]), cv(d[i]))));
  }
  static float out(Acc a) { return a; }
};

// i32 sums are exact: they accumulate in i64 and wrap to i32 only at the end.
struct SumI {
  using T = int32_t;
  using Blk = int64_t;
  using Acc = int64_t;
  static Acc id() { return 0; }
  static Blk blk_id() { return 0; }
  static Acc merge(Acc a, Acc b) { return a + b; }
  static Acc row(const int32_t* x, int64_t n) {
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += x[i];
    return s;
  }
  static void col(int64_t* blk, const int32_t* x, int64_t n) {
    for (int64_t c = 0; c < n; ++c) blk[c] += x[c];
  }
  static void col4(int64_t* blk, const int32_t* a, const int32_t* b, const int32_t* c, const int32_t* d, int64_t n) {
    for (int64_t i = 0; i < n; ++i) blk[i] += (static_cast<int64_t>(a[i]) + b[i]) + (static_cast<int64_t>(c[i]) + d[i]);
  }
  static int32_t out(Acc a) { return static_cast<int32_t>(static_cast<uint32_t>(a)); }
};

struct MaxI {
  using T = int32_t;
  using Blk = int32_t;
  using Acc = int32_t;
  static Acc id() { return std::numeric_limits<int32_t>::min(); }
  static Blk blk_id() { return id(); }
  static Acc merge(Acc a, Acc b) { return std::max(a, b); }
  static Acc row(const int32_t* x, int64_t n) {
    int32_t m = id();
    for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
    return m;
  }
  static void col(int32_t* blk, const int32_t* x, int64_t n) {
    for (int64_t c = 0; c < n; ++c) blk[c] = std::max(blk[c], x[c]);
  }
  static void col4(int32_t* blk, const int32_t* a, const int32_t* b, const int32_t* c, const int32_t* d, int64_t n) {
    for (int64_t i = 0; i < n; ++i) blk[i] = std::max(blk[i], std::max(std::max(a[i], b[i]), std::max(c[i], d[i])));
  }
  static int32_t out(Acc a) { return a; }
};

// Writes one accumulated value into the result buffer of dtype d.
template <class Op>
inline void store(typename Op::Acc a, void* out, DType d, int64_t i) {
  auto v = Op::out(a);
  switch (d) {
    case DType::f32:
      static_cast<float*>(out)[i] = static_cast<float>(v);
      break;
    case DType::bf16:
      static_cast<uint16_t*>(out)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case DType::f16:
      static_cast<uint16_t*>(out)[i] = f32_to_f16(static_cast<float>(v));
      break;
    case DType::i32:
      static_cast<int32_t*>(out)[i] = static_cast<int32_t>(v);
      break;
    case DType::boolean:
      break;
  }
}

// Writes n values (accumulators or f32 blocks) into the result, converting to dtype d.
template <class Op, class V>
void store_n(const V* v, void* out, DType d, int64_t o, int64_t n) {
  using Acc = typename Op::Acc;
  switch (d) {
    case DType::f32: {
      float* p = static_cast<float*>(out) + o;
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(Op::out(static_cast<Acc>(v[i])));
      break;
    }
    case DType::i32: {
      int32_t* p = static_cast<int32_t*>(out) + o;
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<int32_t>(Op::out(static_cast<Acc>(v[i])));
      break;
    }
    default:
      for (int64_t i = 0; i < n; ++i) store<Op>(static_cast<Acc>(v[i]), out, d, o + i);
  }
}

// ---- plan ------------------------------------------------------------------------------------------

struct Plan {
  bool inner_reduced = false;  // the innermost canonical dim is reduced (row reduction)
  int64_t units = 0;           // outputs (row case) or output rows of `len` columns (column case)
  int64_t len = 1;             // contiguous reduced length (row case) or kept columns (column case)
  int nk = 0, nr = 0;          // kept / reduced dims other than the innermost
  int64_t ksize[kMaxRank] = {}, kstride[kMaxRank] = {}, rsize[kMaxRank] = {}, rstride[kMaxRank] = {};
  int64_t m = 1;                 // product of rsize
  int64_t parts = 1, chunk = 0;  // reduction split: chunk elements (row case) or rows (column case)
  int64_t ncb = 1;               // column blocks (column case)
  int64_t out_n = 0, in_n = 0;
  bool copy_only = false;  // nothing is reduced (only size-1 dims)
  int threads = 0;         // at most this many threads (0: the machine's)
  bool fence = false;      // each thread fences its stores when done (parallel_items)
};

// Offset of kept-dims index u in the input.
inline int64_t kept_offset(const Plan& p, int64_t u) {
  int64_t off = 0;
  for (int d = p.nk - 1; d >= 0; --d) {
    off += (u % p.ksize[d]) * p.kstride[d];
    u /= p.ksize[d];
  }
  return off;
}

// Walks an index space (the reduced or the kept dims) in row-major order, tracking the offset.
struct Walker {
  int n;
  const int64_t* size;
  const int64_t* stride;
  int64_t idx[kMaxRank];
  int64_t off = 0;
  Walker(int nd, const int64_t* sz, const int64_t* st, int64_t start) : n(nd), size(sz), stride(st) {
    for (int d = n - 1; d >= 0; --d) {
      idx[d] = start % size[d];
      start /= size[d];
      off += idx[d] * stride[d];
    }
  }
  void next() {
    for (int d = n - 1; d >= 0; --d) {
      off += stride[d];
      if (++idx[d] < size[d]) return;
      off -= size[d] * stride[d];
      idx[d] = 0;
    }
  }
};
inline Walker reduced_walker(const Plan& p, int64_t start) { return Walker(p.nr, p.rsize, p.rstride, start); }
inline Walker kept_walker(const Plan& p, int64_t start) { return Walker(p.nk, p.ksize, p.kstride, start); }

Plan make_plan(const TensorType& t, const std::vector<int64_t>& axes, int64_t out_n) {
  Plan p;
  p.out_n = out_n;
  p.in_n = t.numel();
  if (p.in_n == 0 || p.out_n == 0) return p;  // handled without a plan
  std::vector<int64_t> size, stride;
  std::vector<char> red;
  std::vector<int64_t> st(t.shape.size(), 1);
  for (int d = t.rank() - 2; d >= 0; --d) st[d] = st[d + 1] * t.shape[d + 1];
  for (int d = 0; d < t.rank(); ++d) {
    if (t.shape[d] == 1) continue;
    char r = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!size.empty() && red.back() == r) {
      size.back() *= t.shape[d];
      stride.back() = st[d];
      continue;
    }
    size.push_back(t.shape[d]);
    stride.push_back(st[d]);
    red.push_back(r);
  }
  if (std::find(red.begin(), red.end(), 1) == red.end()) {
    p.copy_only = true;
    return p;
  }
  if (size.size() > static_cast<size_t>(kMaxRank)) throw Error("[reduce] too many alternating reduced/kept dims");
  int last = static_cast<int>(size.size()) - 1;
  p.inner_reduced = red[last];
  p.len = size[last];
  for (int d = 0; d < last; ++d) {
    if (red[d]) {
      p.rsize[p.nr] = size[d], p.rstride[p.nr] = stride[d], ++p.nr;
      p.m *= size[d];
    } else {
      p.ksize[p.nk] = size[d], p.kstride[p.nk] = stride[d], ++p.nk;
    }
  }
  if (p.inner_reduced) {
    p.units = out_n;
    int64_t work = p.m * p.len;
    p.chunk = work;
    if (p.units < kFewUnits && work > 2 * kChunkElems) {
      p.chunk = kChunkElems;
      p.parts = (work + kChunkElems - 1) / kChunkElems;
    }
  } else {
    p.units = out_n / p.len;
    p.ncb = (p.len + kColBlock - 1) / kColBlock;
    p.chunk = p.m;
    int64_t width = std::min(p.len, kColBlock);
    int64_t rows = std::max<int64_t>(kFlushRows, kChunkElems / width);
    if (p.units * p.ncb < kFewUnits && p.m > 2 * rows) {
      p.chunk = rows;
      p.parts = (p.m + rows - 1) / rows;
    }
  }
  return p;
}

// ---- the kernel ------------------------------------------------------------------------------------

// Combines the per-unit partial results of a split inner reduction, in a fixed order.
template <class Op>
void combine_unit_partials(const Plan& p, const typename Op::Acc* partial, void* y, DType out_t) {
  using Acc = typename Op::Acc;
  parallel_items(p.units, p.units * p.parts, p.threads, p.fence, [&](int, int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      Acc a = Op::id();
      for (int64_t part = 0; part < p.parts; ++part) a = Op::merge(a, partial[u * p.parts + part]);
      store<Op>(a, y, out_t, u);
    }
  });
}

// Combines the per-output partial results of a split column reduction, in a fixed order.
template <class Op>
void combine_output_partials(const Plan& p, const typename Op::Acc* partial, void* y, DType out_t) {
  using Acc = typename Op::Acc;
  parallel_items(p.out_n, p.out_n * p.parts, p.threads, p.fence, [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      Acc a = Op::id();
      for (int64_t part = 0; part < p.parts; ++part) a = Op::merge(a, partial[part * p.out_n + i]);
      store<Op>(a, y, out_t, i);
    }
  });
}

// The reduced dims include the innermost one: each output reduces contiguous rows.
template <class Op, Src S>
Kernel make_inner_kernel(const Plan& p, DType out_t) {
  using T = typename SrcType<S>::T;
  using Acc = typename Op::Acc;
  return [p, out_t](const void* const* in, void* const* out) {
    const void* x = in[0];
    void* y = out[0];
    Acc* partial = p.parts > 1 ? scratch_of<Acc>(out, 1) : nullptr;
    // Reduces the flattened range [j, j1) of the m * len elements of the unit at `base`.
    auto reduce_range = [&](int64_t base, int64_t j, int64_t j1, T* buf, int tid) {
      Walker od = reduced_walker(p, j / p.len);
      int64_t l = j % p.len;
      Acc a = Op::id();
      while (j < j1) {
        int64_t n = std::min(p.len - l, j1 - j);
        for (int64_t q = 0; q < n; q += kSeg) {
          int64_t k = std::min(kSeg, n - q);
          a = Op::merge(a, Op::row(load<S>(x, base + od.off + l + q, k, buf, tid), k));
        }
        j += n;
        l = 0;
        od.next();
      }
      return a;
    };
    if (p.parts == 1) {
      // One item per output; the kept index is walked, not divided out, so short rows stay cheap.
      parallel_items(p.units, p.in_n, p.threads, p.fence, [&](int tid, int64_t b, int64_t e) {
        T buf[kSeg];
        Walker kw = kept_walker(p, b);
        bool simple = p.nr == 0 && p.len <= kSeg;
        if constexpr (S == Src::fed) {
          // Short rows one after the other in memory: computed kSeg / len rows at a time.
          if (simple && 2 * p.len <= kSeg && (p.nk == 0 || (p.nk == 1 && p.kstride[0] == p.len))) {
            for (int64_t u = b; u < e;) {
              const int64_t rows = std::min(kSeg / p.len, e - u);
              const T* r = load<S>(x, u * p.len, rows * p.len, buf, tid);
              for (int64_t i = 0; i < rows; ++i, ++u) store<Op>(Op::merge(Op::id(), Op::row(r + i * p.len, p.len)), y, out_t, u);
            }
            return;
          }
        }
        for (int64_t u = b; u < e; ++u, kw.next()) {
          Acc a = simple ? Op::merge(Op::id(), Op::row(load<S>(x, kw.off, p.len, buf, tid), p.len))
                         : reduce_range(kw.off, 0, p.m * p.len, buf, tid);
          store<Op>(a, y, out_t, u);
        }
      });
      return;
    }
    parallel_items(p.units * p.parts, p.in_n, p.threads, p.fence, [&](int tid, int64_t b, int64_t e) {
      T buf[kSeg];
      for (int64_t it = b; it < e; ++it) {
        int64_t u = it / p.parts, part = it % p.parts;
        int64_t j = part * p.chunk;
        partial[it] = reduce_range(kept_offset(p, u), j, std::min(p.m * p.len, j + p.chunk), buf, tid);
      }
    });
    combine_unit_partials<Op>(p, partial, y, out_t);
  };
}

// The innermost dim is kept: blocks of kColBlock columns are reduced down the rows.
template <class Op, Src S>
Kernel make_column_kernel(const Plan& p, DType out_t) {
  using T = typename SrcType<S>::T;
  using Acc = typename Op::Acc;
  using Blk = typename Op::Blk;
  return [p, out_t](const void* const* in, void* const* out) {
    const void* x = in[0];
    void* y = out[0];
    Acc* partial = p.parts > 1 ? scratch_of<Acc>(out, 1) : nullptr;
    int64_t items = p.units * p.ncb * p.parts;
    // Fed narrow rows one after the other in memory are computed many rows at a time.
    const bool batched = S == Src::fed && p.len < kSeg && p.nr == 1 && p.rstride[0] == p.len;
    constexpr int64_t kSub = S == Src::fed ? kFedCols : kColBlock;
    parallel_items(items, p.in_n, p.threads, p.fence, [&](int tid, int64_t b, int64_t e) {
      T buf[4 * kColBlock];
      Blk blk[kColBlock];
      Acc acc[kColBlock];
      for (int64_t it = b; it < e; ++it) {
        int64_t part = it % p.parts, rest = it / p.parts;
        int64_t cb = rest % p.ncb, u = rest / p.ncb;
        int64_t c0 = cb * kColBlock, cols = std::min(kColBlock, p.len - c0);
        int64_t m0 = part * p.chunk, m1 = std::min(p.m, m0 + p.chunk);
        // Fed columns go kFedCols at a time: the rows computed for them and the chain's tiles
        // stay in L1. Each column still sums its rows in the same order.
        for (int64_t sb = 0; sb < cols; sb += kSub) {
          const int64_t w = std::min(kSub, cols - sb);
          int64_t base = kept_offset(p, u) + c0 + sb;
          int64_t o = u * p.len + c0 + sb;
          Walker od = reduced_walker(p, m0);
          // Batched: rows [lo, hi) are in buf; batches are whole groups of 4 rows from m0, as the
          // loops below read them, so no refill overwrites rows still to be read.
          int64_t next = m0, lo = m0, hi = m0;
          // The rows in order (buf + k * kColBlock holds a row read into a buffer).
          auto row = [&](int k) -> const T* {
            const T* r;
            if (batched) {
              if (next == hi) {
                lo = next;
                hi = std::min(m1, next + 4 * kColBlock / w / 4 * 4);  // whole col4 groups of 4 rows
                load<S>(x, base + od.off, (hi - lo) * w, buf, tid);
              }
              r = buf + (next - lo) * w;
            } else {
              r = load<S>(x, base + od.off, w, buf + k * kColBlock, tid);
              // A fed row's operands come in short runs a row apart, which the hardware
              // prefetchers do not run ahead of: ask for the row 8 ahead (one reduced dim).
              if constexpr (S == Src::fed)
                if (p.nr == 1 && next + 8 < m1) {
                  const ReduceFeed* feed = static_cast<const ReduceFeed*>(x);
                  feed->prefetch(feed->ctx, base + od.off + 8 * p.rstride[0], w);
                }
            }
            ++next;
            od.next();
            return r;
          };
          for (int64_t c = 0; c < w; ++c) blk[c] = Op::blk_id();
          if (m1 - m0 <= kFlushRows) {
            // One window: blk holds the whole result, no f64 stage.
            int64_t m = m0;
            for (; m + 4 <= m1; m += 4) {
              const T* xs[4];
              for (int k = 0; k < 4; ++k) xs[k] = row(k);
              Op::col4(blk, xs[0], xs[1], xs[2], xs[3], w);
            }
            for (; m < m1; ++m) Op::col(blk, row(0), w);
            if (p.parts == 1) {
              store_n<Op>(blk, y, out_t, o, w);
            } else {
              Acc* dst = partial + part * p.out_n + o;
              for (int64_t c = 0; c < w; ++c) dst[c] = static_cast<Acc>(blk[c]);
            }
            continue;
          }
          for (int64_t c = 0; c < w; ++c) acc[c] = Op::id();
          for (int64_t m = m0; m < m1;) {
            // Up to kFlushRows rows into blk, four at a time (fewer passes over blk), then fold into acc.
            int64_t n = std::min(kFlushRows, m1 - m), r = 0;
            for (; r + 4 <= n; r += 4) {
              const T* xs[4];
              for (int k = 0; k < 4; ++k) xs[k] = row(k);
              Op::col4(blk, xs[0], xs[1], xs[2], xs[3], w);
            }
            for (; r < n; ++r) Op::col(blk, row(0), w);
            for (int64_t c = 0; c < w; ++c) acc[c] = Op::merge(acc[c], blk[c]), blk[c] = Op::blk_id();
            m += n;
          }
          if (p.parts == 1) {
            store_n<Op>(acc, y, out_t, o, w);
          } else {
            Acc* dst = partial + part * p.out_n + o;
            for (int64_t c = 0; c < w; ++c) dst[c] = acc[c];
          }
        }
      }
    });
    if (p.parts > 1) combine_output_partials<Op>(p, partial, y, out_t);
  };
}

// A split reduction's partial results (in the kernel's scratch), combined in a fixed order.
template <class Op>
int64_t partial_bytes(const Plan& p) {
  if (p.out_n == 0 || p.copy_only || p.in_n == 0 || p.parts <= 1) return 0;
  return p.parts * (p.inner_reduced ? p.units : p.out_n) * static_cast<int64_t>(sizeof(typename Op::Acc));
}

template <class Op, Src S>
Kernel make_reduce_kernel(const Plan& p, DType out_t) {
  if (p.inner_reduced) return make_inner_kernel<Op, S>(p, out_t);
  return make_column_kernel<Op, S>(p, out_t);
}

template <class Op, Src S>
Kernel make_for(const KernelSpec& spec, const Plan& p) {
  DType out_t = spec.out[0].dtype;
  if (p.out_n == 0) return [](const void* const*, void* const*) {};
  if (p.copy_only) {
    int64_t bytes = spec.out[0].nbytes();
    return [bytes](const void* const* in, void* const* out) { std::memcpy(out[0], in[0], static_cast<size_t>(bytes)); };
  }
  if (p.in_n == 0) {  // reducing an empty dim gives the identity
    int64_t n = p.out_n;
    return [n, out_t](const void* const*, void* const* out) {
      for (int64_t i = 0; i < n; ++i) store<Op>(Op::id(), out[0], out_t, i);
    };
  }
  return make_reduce_kernel<Op, S>(p, out_t);
}

template <class FOp, class IOp>
Kernel make_reduce(const KernelSpec& spec) {
  const TensorType& t = spec.in[0];
  Plan p = make_plan(t, spec.attrs.ints("axes"), spec.out[0].numel());
  switch (t.dtype) {
    case DType::f32:
      return make_for<FOp, Src::f32>(spec, p);
    case DType::bf16:
      return make_for<FOp, Src::bf16>(spec, p);
    case DType::f16:
      return make_for<FOp, Src::f16>(spec, p);
    case DType::i32:
      return make_for<IOp, Src::i32>(spec, p);
    default:
      throw Error("[reduce] no CPU kernel for " + type_str(t));
  }
}

template <class FOp, class IOp>
int64_t reduce_scratch(const KernelSpec& spec) {
  const TensorType& t = spec.in[0];
  const Plan p = make_plan(t, spec.attrs.ints("axes"), spec.out[0].numel());
  return t.dtype == DType::i32 ? partial_bytes<IOp>(p) : partial_bytes<FOp>(p);
}

}  // namespace

void register_reduce_kernels() {
  register_kernel(prims::reduce_sum(), make_reduce<SumF, SumI>, reduce_scratch<SumF, SumI>);
  register_kernel(prims::reduce_max(), make_reduce<MaxF, MaxI>, reduce_scratch<MaxF, MaxI>);
}

}  // namespace px::cpu

namespace px::cpu {

namespace {
Plan fed_plan(const Primitive* prim, const KernelSpec& spec) {
  if (prim != prims::reduce_sum() && prim != prims::reduce_max())
    throw InternalError("[reduce] no fed kernel for '" + prim->name + "'");
  if (!is_float(spec.in[0].dtype)) throw InternalError("[reduce] a fed reduction of " + type_str(spec.in[0]));
  Plan p = make_plan(spec.in[0], spec.attrs.ints("axes"), spec.out[0].numel());
  if (p.copy_only) throw InternalError("[reduce] a fed reduction that reduces nothing");
  return p;
}
}  // namespace

Kernel make_fed_reduce_kernel(const Primitive* prim, const KernelSpec& spec, int threads, bool fence) {
  Plan p = fed_plan(prim, spec);
  p.threads = std::max(threads, 1);
  p.fence = fence;
  return prim == prims::reduce_sum() ? make_for<SumF, Src::fed>(spec, p) : make_for<MaxF, Src::fed>(spec, p);
}

int64_t fed_reduce_scratch_bytes(const Primitive* prim, const KernelSpec& spec) {
  const Plan p = fed_plan(prim, spec);
  return prim == prims::reduce_sum() ? partial_bytes<SumF>(p) : partial_bytes<MaxF>(p);
}

}  // namespace px::cpu
