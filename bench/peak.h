// The machine's limits, measured in the same run as a benchmark: the FMA peak (loops of
// independent fused multiply-adds on registers only, so no memory traffic: what the cores can
// compute at most) in f32 and in bf16 (AVX-512 BF16 dot products and AMX tile products, where the
// CPU has them); the best GEMM rate on large squares (oneDNN sgemm, and its bf16 matmul); and the
// oneDNN sgemm rate on the matmul shapes of a bench-gpt training step.
//
// The FMA peak is an upper bound for every kernel of the same dtype: a GEMM runs the same FMAs
// plus loads. Each loop keeps enough independent accumulators to cover the FMA latency on every
// pipe (a 4-cycle FMA on 2 pipes needs 8 in flight; the loops keep 12 to 24), fully unrolled so
// that they live in registers, and both vector widths are tried (some cores split a 512-bit FMA
// into two 256-bit halves, others have a third 256-bit pipe): the best figure is the peak.
#pragma once

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

namespace px::bench {

namespace peak_detail {

// acc[k] = acc[k] * b + c on `kAcc` independent vectors, `iters` times; returns their sum so that
// the compiler cannot drop the work. The loop over k is fully unrolled (the array then lives in
// registers: 24 + 2 of the 32 zmm registers, 14 + 2 of the 16 ymm ones).
template <int kAcc>
__attribute__((target("avx2,fma"))) float fma_avx2(int64_t iters) {
  __m256 acc[kAcc];
#pragma GCC unroll 32
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_set1_ps(1.0f + 1e-3f * static_cast<float>(k));
  const __m256 b = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 32
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_fmadd_ps(acc[k], b, c);
  }
  __m256 s = acc[0];
#pragma GCC unroll 32
  for (int k = 1; k < kAcc; ++k) s = _mm256_add_ps(s, acc[k]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

template <int kAcc>
__attribute__((target("avx512f"))) float fma_avx512(int64_t iters) {
  __m512 acc[kAcc];
#pragma GCC unroll 32
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_set1_ps(1.0f + 1e-3f * static_cast<float>(k));
  const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 32
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_fmadd_ps(acc[k], b, c);
  }
  __m512 s = acc[0];
#pragma GCC unroll 32
  for (int k = 1; k < kAcc; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}

// vdpbf16ps: per f32 lane, two bf16 products added to the accumulator (4 FLOPs).
template <int kAcc>
__attribute__((target("avx512f,avx512bf16"))) float dp_bf16_avx512(int64_t iters) {
  __m512 acc[kAcc];
#pragma GCC unroll 32
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 32
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  }
  __m512 s = acc[0];
#pragma GCC unroll 32
  for (int k = 1; k < kAcc; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}

// AMX (Intel since Sapphire Rapids): tdpbf16ps multiplies a 16x32 bf16 tile by a 32x16 one into a
// 16x16 f32 tile, 16 * 16 * 32 * 2 FLOPs. Four accumulator tiles fed by two A and two B tiles (the
// 2x2 blocking GEMM kernels use) keep the tile unit busy across the instruction's latency.
constexpr double kAmxFlopsPerIter = 4.0 * 16 * 16 * 32 * 2;

// Whether this CPU has AMX-BF16 and the OS lets this process use the tile registers (Linux asks
// for the permission once per process: arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)).
inline bool amx_bf16_usable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

__attribute__((target("amx-tile,amx-bf16"))) inline float dp_bf16_amx(int64_t iters) {
  struct alignas(64) TileConfig {
    uint8_t palette = 1, start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;  // 16 f32 or 32 bf16 per row
    cfg.rows[t] = 16;
  }
  alignas(64) static thread_local uint16_t ab[16 * 32];
  alignas(64) static thread_local float cbuf[16 * 16];
  std::fill(ab, ab + 16 * 32, uint16_t{0x3a83});  // bf16 1e-3
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ab, 64);
  _tile_loadd(5, ab, 64);
  _tile_loadd(6, ab, 64);
  _tile_loadd(7, ab, 64);
  for (int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float s = 0;
  _tile_stored(0, cbuf, 64);
  s += cbuf[0];
  _tile_stored(3, cbuf, 64);
  s += cbuf[255];
  _tile_release();
  return s;
}

// Best GFLOP/s of `loop` (flops_per_iter FLOPs an iteration) on `threads` threads at once, with
// the iteration count doubled until one run takes at least 5 ms, then the best of 40 runs. Short
// runs, many of them: on a shared machine other processes preempt the threads, and the peak is
// what the cores do when they run; a short GEMM (a 512^3 sgemm takes 1-2 ms) can land in such a
// window, so the loop must look for them too.
template <class Loop>
double best_gflops(Loop loop, double flops_per_iter, int threads, int64_t first_iters = 1 << 12) {
  volatile float sink = 0;
  int team = threads;  // the threads OpenMP actually gave: each runs the whole loop
  auto run = [&](int64_t iters) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const float r = loop(iters);
      if (r == 12345.f) sink = r;
      if (omp_get_thread_num() == 0) team = omp_get_num_threads();
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  int64_t iters = first_iters;
  while (run(iters) < 0.005 && iters < (int64_t{1} << 34)) iters *= 2;
  double best = 0;
  for (int rep = 0; rep < 40; ++rep) {
    const double s = run(iters);
    best = std::max(best, flops_per_iter * static_cast<double>(iters) * team / s / 1e9);
  }
  return best;
}

// The f32 FMA-loop peak with 256-bit vectors only (what an AVX2 CPU would get).
inline double fma_peak_avx2(int threads) {
  return std::max(best_gflops(fma_avx2<12>, 2.0 * 8 * 12, threads), best_gflops(fma_avx2<14>, 2.0 * 8 * 14, threads));
}

}  // namespace peak_detail

struct FmaPeak {
  double f32_gflops = 0;   // the best f32 FMA loop (the widest vectors, or 256-bit where faster)
  double bf16_gflops = 0;  // the best bf16 loop (AVX-512 BF16 dot products, AMX tiles); 0 when none
  std::string isa;         // "avx512" or "avx2", "+bf16" with AVX-512 BF16, "+amx" with AMX-BF16
  std::string bf16_isa;    // which bf16 loop was the fastest: "amx", "avx512_bf16" or ""
};

// The FMA-loop peak on `threads` threads (each on its own core when OMP_PROC_BIND allows).
inline FmaPeak fma_peak(int threads = omp_get_max_threads()) {
  using namespace peak_detail;
  FmaPeak p;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p.f32_gflops = fma_peak_avx2(threads);
    p.isa = "avx2";
  }
  if (__builtin_cpu_supports("avx512f")) {
    // On some cores (AMD Zen 4) a 512-bit FMA takes two 256-bit pipes: keep the faster.
    for (double w :
         {best_gflops(fma_avx512<16>, 2.0 * 16 * 16, threads), best_gflops(fma_avx512<24>, 2.0 * 16 * 24, threads)})
      p.f32_gflops = std::max(p.f32_gflops, w);
    p.isa = "avx512";
    if (__builtin_cpu_supports("avx512bf16")) {
      p.bf16_gflops = std::max(best_gflops(dp_bf16_avx512<16>, 4.0 * 16 * 16, threads),
                               best_gflops(dp_bf16_avx512<24>, 4.0 * 16 * 24, threads));
      p.bf16_isa = "avx512_bf16";
      p.isa += "+bf16";
    }
  }
  if (amx_bf16_usable()) {
    const double amx = best_gflops(dp_bf16_amx, kAmxFlopsPerIter, threads, 1 << 6);
    if (amx > p.bf16_gflops) {
      p.bf16_gflops = amx;
      p.bf16_isa = "amx";
    }
    p.isa += "+amx";
  }
  return p;
}

// The best GEMM rate on square sizes `sizes` (the best of `reps` timed calls each, after a
// warm-up call): f32 through oneDNN's sgemm (what the CPU backend calls), bf16 (bf16 operands and
// result, f32 accumulation) through oneDNN's matmul primitive, which uses AMX or AVX-512 BF16
// where the CPU has them. 0 when oneDNN has no bf16 matmul on this CPU.
inline double gemm_square_gflops(bool bf16, const std::vector<int64_t>& sizes, int reps = 3) {
  double best = 0;
  for (int64_t n : sizes) {
    const double flops = 2.0 * static_cast<double>(n) * n * n;
    if (!bf16) {
      std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a.size(), 0.25f), c(a.size());
      for (int rep = 0; rep <= reps; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        dnnl_sgemm('N', 'N', n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep > 0) best = std::max(best, flops / s / 1e9);
      }
      continue;
    }
    using dnnl::memory;
    static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
    dnnl::stream strm(eng);
    memory::desc md({n, n}, memory::data_type::bf16, memory::format_tag::ab);
    dnnl::matmul::primitive_desc pd;
    try {
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(md, md, md), eng);
    } catch (const dnnl::error&) {
      return 0;
    }
    memory a(md, eng), b(md, eng), c(md, eng);
    const size_t count = static_cast<size_t>(n * n);
    std::fill_n(static_cast<uint16_t*>(a.get_data_handle()), count, uint16_t{0x3f00});  // 0.5
    std::fill_n(static_cast<uint16_t*>(b.get_data_handle()), count, uint16_t{0x3e80});  // 0.25
    dnnl::matmul mm(pd);
    for (int rep = 0; rep <= reps; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      mm.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
      strm.wait();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) best = std::max(best, flops / s / 1e9);
    }
  }
  return best;
}

// The oneDNN rate on the matmuls of one layer and the head, given as (in, out) per linear
// (forward, and the two backward products of each: input and weight gradients), T tokens: total
// FLOPs over total time, the best of 3 rounds. The ceiling the step's matmuls could reach through
// this library: f32 through sgemm; bf16 through the bf16 matmul primitive with the step's operand
// layouts and bf16 results, 0 where oneDNN has none.
inline double gemm_step_shapes_gflops(int64_t tokens, const std::vector<std::pair<int64_t, int64_t>>& shapes,
                                      bool bf16 = false) {
  struct Linear {
    int64_t in, out;
  };
  std::vector<Linear> linears;
  for (const auto& [in, out] : shapes) linears.push_back({in, out});
  std::vector<float> a, b, c;
  using dnnl::memory;
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  auto gemm_bf16 = [&](char ta, char tb, int64_t m, int64_t n, int64_t k, memory::data_type dst) {
    const memory::desc ad({m, k}, memory::data_type::bf16, ta == 'N' ? memory::format_tag::ab : memory::format_tag::ba);
    const memory::desc bd({k, n}, memory::data_type::bf16, tb == 'N' ? memory::format_tag::ab : memory::format_tag::ba);
    const memory::desc cd({m, n}, dst, memory::format_tag::ab);
    dnnl::matmul mm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(ad, bd, cd), eng));
    memory am(ad, eng), bm(bd, eng), cm(cd, eng);
    std::fill_n(static_cast<uint16_t*>(am.get_data_handle()), m * k, uint16_t{0x3f00});  // 0.5
    std::fill_n(static_cast<uint16_t*>(bm.get_data_handle()), k * n, uint16_t{0x3e80});  // 0.25
    std::memset(cm.get_data_handle(), 0, cd.get_size());  // the result's pages mapped before timing
    const auto t0 = std::chrono::steady_clock::now();
    mm.execute(strm, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    strm.wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto gemm = [&](char ta, char tb, int64_t m, int64_t n, int64_t k) {
    if (bf16) return gemm_bf16(ta, tb, m, n, k, memory::data_type::bf16);
    a.assign(static_cast<size_t>(m * k), 0.5f);
    b.assign(static_cast<size_t>(k * n), 0.25f);
    c.resize(static_cast<size_t>(m * n));
    const int64_t lda = ta == 'N' ? k : m, ldb = tb == 'N' ? n : k;
    const auto t0 = std::chrono::steady_clock::now();
    dnnl_sgemm(ta, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), n);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double best = 0;
  if (bf16) {
    try {
      gemm('N', 'N', 16, 16, 16);
    } catch (const dnnl::error&) {
      return 0;
    }
  }
  for (int round = 0; round < 4; ++round) {
    double flops = 0, seconds = 0;
    for (const Linear& l : linears) {
      seconds += gemm('N', 'N', tokens, l.out, l.in);  // y = x w
      seconds += gemm('N', 'T', tokens, l.in, l.out);  // dx = dy w^T
      seconds += gemm('T', 'N', l.in, l.out, tokens);  // dw = x^T dy
      flops += 3 * 2.0 * tokens * l.in * l.out;
    }
    if (round > 0) best = std::max(best, flops / seconds / 1e9);  // round 0 warms up
  }
  return best;
}

}  // namespace px::bench
