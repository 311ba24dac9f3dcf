// A candidate in bench/gemm_candidates: Parallax's own f32 GEMM, written to see whether an own
// microkernel beats the libraries on the step's shapes (it did not: see bench/README.md, so the
// CPU backend keeps oneDNN's sgemm). Both operands are packed into cache-sized panels (a
// transposed operand costs nothing extra: the packing reads it in whichever order it is stored),
// then a register-tile microkernel (AVX-512: 14 rows x 32 columns, AVX2 + FMA: 6 x 16) runs over
// the panels. Row-major, BLAS-like arguments.
//
// The loop nest follows the usual layered scheme: for each depth block of kKC, op(A) is packed
// into panels of MR rows ([kc][MR], the panel a microkernel keeps in L1 and broadcasts from) and,
// for each column block of nc, op(B) into panels of NR columns ([kc][NR], the block kept in L2 and
// streamed as vectors). Each MR x NR tile of C lives in registers for the whole depth block.
// Edges are zero-padded in the panels and written through a small scratch tile, so the
// microkernels only know one shape.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

namespace px::bench::own_gemm {

// Which microkernel: the widest the CPU has, or a narrower one (--isa=avx2 measures what a CPU
// without AVX-512 would get).
enum class GemmIsa { best, avx512, avx2 };

namespace detail {

inline constexpr int64_t kKC = 256;        // depth of a packed block
inline constexpr int64_t kMaxRows = 3072;  // rows of op(A) packed at once (bounds the A buffer)

// Packs rows [i0, i0 + mc) and depth [p0, p0 + kc) of op(A) into panels of MR rows, [kc][MR]
// each (panel q at dst + q * MR * kc), zero-padded past mc. Reads follow memory: a stored row is
// read front to back (or the MR rows of a panel side by side), never one element per cache line.
template <int MR>
inline void pack_a(char ta, const float* a, int64_t lda, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* dst) {
  const int64_t panels = (mc + MR - 1) / MR;
  if (ta == 'N') {  // A(i, p) = a[i * lda + p]: the panel's MR rows are read side by side
    for (int64_t q = 0; q < panels; ++q) {
      const int rows = static_cast<int>(std::min<int64_t>(MR, mc - q * MR));
      const float* s[MR];
      for (int r = 0; r < MR; ++r) s[r] = a + (i0 + q * MR + std::min(r, rows - 1)) * lda + p0;
      float* d = dst + q * MR * kc;
      for (int64_t p = 0; p < kc; ++p)
        for (int r = 0; r < MR; ++r) d[p * MR + r] = r < rows ? s[r][p] : 0.0f;
    }
  } else {  // A(i, p) = a[p * lda + i]: each stored row spreads over every panel
    for (int64_t p = 0; p < kc; ++p) {
      const float* s = a + (p0 + p) * lda + i0;
      for (int64_t q = 0; q < panels; ++q) {
        const int rows = static_cast<int>(std::min<int64_t>(MR, mc - q * MR));
        float* d = dst + q * MR * kc + p * MR;
        std::memcpy(d, s + q * MR, static_cast<size_t>(rows) * sizeof(float));
        for (int r = rows; r < MR; ++r) d[r] = 0.0f;
      }
    }
  }
}

// Packs columns [j0, j0 + nc) and depth [p0, p0 + kc) of op(B) into panels of NR columns,
// [kc][NR] each (panel q at dst + q * NR * kc), zero-padded past nc.
template <int NR>
inline void pack_b(char tb, const float* b, int64_t ldb, int64_t j0, int64_t nc, int64_t p0, int64_t kc, float* dst) {
  const int64_t panels = (nc + NR - 1) / NR;
  if (tb == 'N') {  // B(p, j) = b[p * ldb + j]: each stored row spreads over every panel
    for (int64_t p = 0; p < kc; ++p) {
      const float* s = b + (p0 + p) * ldb + j0;
      for (int64_t q = 0; q < panels; ++q) {
        const int cols = static_cast<int>(std::min<int64_t>(NR, nc - q * NR));
        float* d = dst + q * NR * kc + p * NR;
        std::memcpy(d, s + q * NR, static_cast<size_t>(cols) * sizeof(float));
        for (int c = cols; c < NR; ++c) d[c] = 0.0f;
      }
    }
  } else {  // B(p, j) = b[j * ldb + p]: the panel's NR stored rows are read side by side
    for (int64_t q = 0; q < panels; ++q) {
      const int cols = static_cast<int>(std::min<int64_t>(NR, nc - q * NR));
      const float* s[NR];
      for (int c = 0; c < NR; ++c) s[c] = b + (j0 + q * NR + std::min(c, cols - 1)) * ldb + p0;
      float* d = dst + q * NR * kc;
      for (int64_t p = 0; p < kc; ++p)
        for (int c = 0; c < NR; ++c) d[p * NR + c] = c < cols ? s[c][p] : 0.0f;
    }
  }
}

// C tile (MR x NR, row stride ldc) = alpha * (A panel x B panel) + beta * C tile.
__attribute__((target("avx512f"))) inline void kernel_avx512(int64_t kc, const float* __restrict A,
                                                             const float* __restrict B, float* C, int64_t ldc,
                                                             float alpha, float beta) {
  constexpr int MR = 14;
  __m512 c0[MR], c1[MR];
#pragma GCC unroll 14
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm512_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m512 b0 = _mm512_load_ps(B), b1 = _mm512_load_ps(B + 16);
#pragma GCC unroll 14
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(A[r]);
      c0[r] = _mm512_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm512_fmadd_ps(av, b1, c1[r]);
    }
    A += MR;
    B += 32;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 14
  for (int r = 0; r < MR; ++r) {
    float* cr = C + r * ldc;
    __m512 x0 = _mm512_mul_ps(va, c0[r]), x1 = _mm512_mul_ps(va, c1[r]);
    if (beta != 0.0f) {
      x0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr), x0);
      x1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(cr + 16), x1);
    }
    _mm512_storeu_ps(cr, x0);
    _mm512_storeu_ps(cr + 16, x1);
  }
}

__attribute__((target("avx2,fma"))) inline void kernel_avx2(int64_t kc, const float* __restrict A,
                                                            const float* __restrict B, float* C, int64_t ldc,
                                                            float alpha, float beta) {
  constexpr int MR = 6;
  __m256 c0[MR], c1[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_ps();
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_load_ps(B), b1 = _mm256_load_ps(B + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(A + r);
      c0[r] = _mm256_fmadd_ps(av, b0, c0[r]);
      c1[r] = _mm256_fmadd_ps(av, b1, c1[r]);
    }
    A += MR;
    B += 16;
  }
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    float* cr = C + r * ldc;
    __m256 x0 = _mm256_mul_ps(va, c0[r]), x1 = _mm256_mul_ps(va, c1[r]);
    if (beta != 0.0f) {
      x0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr), x0);
      x1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(cr + 8), x1);
    }
    _mm256_storeu_ps(cr, x0);
    _mm256_storeu_ps(cr + 8, x1);
  }
}

using KernelFn = void (*)(int64_t, const float*, const float*, float*, int64_t, float, float);

// 64-byte aligned scratch that grows and is kept by the thread that owns it.
struct Scratch {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> data;
  size_t size = 0;
  float* get(size_t n) {
    if (n > size) {
      const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
      data.reset(static_cast<float*>(std::aligned_alloc(64, bytes)));
      size = data ? n : 0;
    }
    return data.get();
  }
};

// One thread's share: C[i0.., j0..] over rows [i0, i0 + m) and columns [j0, j0 + n), with its own
// packed panels, so threads never wait for each other.
template <int MR, int NR, int64_t NC>
bool run_part(KernelFn kernel, char ta, char tb, int64_t i_begin, int64_t m, int64_t j_begin, int64_t n, int64_t k,
              float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc) {
  // Full-size panels, allocated once per thread: a later call never allocates (steps run
  // allocation-free), whatever shapes reach which thread. Pages are touched only as used.
  thread_local Scratch a_buf, b_buf;
  float* ap = a_buf.get(static_cast<size_t>((kMaxRows + MR) * kKC));
  float* bp = b_buf.get(static_cast<size_t>((NC + NR) * kKC));
  if (ap == nullptr || bp == nullptr) return false;
  alignas(64) float tile[MR * NR];
  for (int64_t i0 = i_begin; i0 < i_begin + m; i0 += kMaxRows) {
    const int64_t mc = std::min(kMaxRows, i_begin + m - i0), a_panels = (mc + MR - 1) / MR;
    for (int64_t p0 = 0; p0 < k; p0 += kKC) {
      const int64_t kc = std::min(kKC, k - p0);
      const float beta_block = p0 == 0 ? beta : 1.0f;
      pack_a<MR>(ta, a, lda, i0, mc, p0, kc, ap);
      for (int64_t j0 = j_begin; j0 < j_begin + n; j0 += NC) {
        const int64_t nc = std::min(NC, j_begin + n - j0), b_panels = (nc + NR - 1) / NR;
        pack_b<NR>(tb, b, ldb, j0, nc, p0, kc, bp);
        // A panel by A panel (kept in L1) over the B block (kept in L2).
        for (int64_t qa = 0; qa < a_panels; ++qa) {
          const int64_t r0 = qa * MR;
          const int rows = static_cast<int>(std::min<int64_t>(MR, mc - r0));
          const float* at = ap + qa * MR * kc;
          for (int64_t qb = 0; qb < b_panels; ++qb) {
            const int64_t c0 = qb * NR;
            const int cols = static_cast<int>(std::min<int64_t>(NR, nc - c0));
            float* ct = c + (i0 + r0) * ldc + j0 + c0;
            const float* bt = bp + qb * NR * kc;
            if (rows == MR && cols == NR) {
              kernel(kc, at, bt, ct, ldc, alpha, beta_block);
            } else {  // an edge tile: through the scratch tile, then only its valid part
              kernel(kc, at, bt, tile, NR, alpha, 0.0f);
              for (int r = 0; r < rows; ++r)
                for (int col = 0; col < cols; ++col) {
                  float& dst = ct[r * ldc + col];
                  dst = beta_block == 0.0f ? tile[r * NR + col] : tile[r * NR + col] + beta_block * dst;
                }
            }
          }
        }
      }
    }
  }
  return true;
}

// Splits C into `threads` independent parts along its longer side (in whole tiles) and runs one
// per thread: each packs what its part reads, so no thread waits for another (a preempted thread
// delays only its own part, which matters on a busy machine).
template <int MR, int NR, int64_t NC>
bool run(KernelFn kernel, char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
         const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads) {
  const bool by_rows = m / MR >= n / NR;
  const int64_t unit = by_rows ? MR : NR, extent = by_rows ? m : n;
  const int64_t units = (extent + unit - 1) / unit;
  const int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, units)));
  int failed = 0;
#pragma omp parallel num_threads(parts) if (parts > 1) reduction(+ : failed)
  {
    const int t = parts > 1 ? omp_get_thread_num() : 0;
    const int nt = parts > 1 ? omp_get_num_threads() : 1;
    const int64_t u0 = units * t / nt, u1 = units * (t + 1) / nt;
    const int64_t begin = u0 * unit, end = std::min(extent, u1 * unit);
    if (end > begin) {
      const bool ok =
          by_rows
              ? run_part<MR, NR, NC>(kernel, ta, tb, begin, end - begin, 0, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
              : run_part<MR, NR, NC>(kernel, ta, tb, 0, m, begin, end - begin, k, alpha, a, lda, b, ldb, beta, c, ldc);
      failed += ok ? 0 : 1;
    }
  }
  return failed == 0;
}

enum class Isa { none, avx2, avx512 };

inline Isa detect() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
    return Isa::none;
  }();
  return isa;
}

}  // namespace detail

// The microkernel GemmIsa::best picks on this CPU: "avx512", "avx2" or "none".
inline const char* gemm_f32_isa() {
  using namespace detail;
  switch (detect()) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    default:
      return "none";
  }
}

// C[m,n] = alpha op(A) op(B) + beta C, all row-major; op transposes when its flag is 'T', so
// op(A) is m x k and op(B) is k x n. beta == 0 never reads C. Inside an OpenMP parallel region it
// runs on the calling thread alone; outside, on `threads` threads (0: omp_get_max_threads()),
// each computing its own part of C, so no thread waits for another. Each element of C is summed
// over k in the same order whatever the thread count. Returns false, doing nothing, when the CPU
// lacks the ISA asked for or scratch memory could not be had.
inline bool gemm_f32(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int threads = 0,
                     GemmIsa want = GemmIsa::best) {
  using namespace detail;
  const Isa best = detect();
  Isa isa = best;
  if (want == GemmIsa::avx512) isa = best == Isa::avx512 ? Isa::avx512 : Isa::none;
  if (want == GemmIsa::avx2) isa = best == Isa::none ? Isa::none : Isa::avx2;
  if (isa == Isa::none) return false;
  ta = ta == 'T' || ta == 't' ? 'T' : 'N';
  tb = tb == 'T' || tb == 't' ? 'T' : 'N';
  if (m <= 0 || n <= 0) return true;
  if (k <= 0 || alpha == 0.0f) {  // C = beta C
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return true;
  }
  if (threads <= 0) threads = omp_get_max_threads();
  if (omp_in_parallel()) threads = 1;
  if (isa == Isa::avx512)
    return run<14, 32, 512>(kernel_avx512, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads);
  return run<6, 16, 256>(kernel_avx2, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, threads);
}

}  // namespace px::bench::own_gemm
