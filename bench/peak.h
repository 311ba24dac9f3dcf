// The machine's limits, measured in the same run as a benchmark: the FMA peak (a loop of
// independent fused multiply-adds on registers only, so no memory traffic: what the cores can
// compute at most) in f32 and, where the CPU has AVX-512 BF16, in bf16 dot products; and the
// oneDNN sgemm rate on the matmul shapes of a bench-gpt training step.
#pragma once

#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace px::bench {

namespace peak_detail {

// Each loop keeps `kAcc` independent accumulators in registers (enough to cover the FMA latency on
// both FMA pipes) and returns their sum, so the compiler cannot drop the work.
constexpr int kAcc = 12;

__attribute__((target("avx2,fma"))) inline float fma_avx2(int64_t iters) {
  __m256 acc[kAcc];
  for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_set1_ps(1.0f + 1e-3f * static_cast<float>(k));
  const __m256 b = _mm256_set1_ps(0.9999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kAcc; ++k) acc[k] = _mm256_fmadd_ps(acc[k], b, c);
  __m256 s = acc[0];
  for (int k = 1; k < kAcc; ++k) s = _mm256_add_ps(s, acc[k]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

__attribute__((target("avx512f"))) inline float fma_avx512(int64_t iters) {
  __m512 acc[2 * kAcc];
  for (int k = 0; k < 2 * kAcc; ++k) acc[k] = _mm512_set1_ps(1.0f + 1e-3f * static_cast<float>(k));
  const __m512 b = _mm512_set1_ps(0.9999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 2 * kAcc; ++k) acc[k] = _mm512_fmadd_ps(acc[k], b, c);
  __m512 s = acc[0];
  for (int k = 1; k < 2 * kAcc; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}

// vdpbf16ps: per f32 lane, two bf16 products added to the accumulator (4 FLOPs).
__attribute__((target("avx512f,avx512bf16"))) inline float dp_bf16_avx512(int64_t iters) {
  __m512 acc[2 * kAcc];
  for (int k = 0; k < 2 * kAcc; ++k) acc[k] = _mm512_set1_ps(static_cast<float>(k));
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(1e-3f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-4f), _mm512_set1_ps(1e-4f));
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < 2 * kAcc; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  __m512 s = acc[0];
  for (int k = 1; k < 2 * kAcc; ++k) s = _mm512_add_ps(s, acc[k]);
  return _mm512_reduce_add_ps(s);
}

// Best GFLOP/s of `loop` (flops_per_iter FLOPs an iteration) on `threads` threads at once, with
// the iteration count doubled until one run takes at least 50 ms, then the best of 5 runs.
template <class Loop>
double best_gflops(Loop loop, double flops_per_iter, int threads) {
  volatile float sink = 0;
  auto run = [&](int64_t iters) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const float r = loop(iters);
      if (r == 12345.f) sink = r;
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  int64_t iters = 1 << 16;
  while (run(iters) < 0.05 && iters < (int64_t{1} << 34)) iters *= 2;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) best = std::max(best, flops_per_iter * iters * threads / run(iters) / 1e9);
  return best;
}

}  // namespace peak_detail

struct FmaPeak {
  double f32_gflops = 0;   // the widest f32 FMA the CPU has
  double bf16_gflops = 0;  // AVX-512 BF16 dot products; 0 when the CPU has none
  std::string isa;         // "avx512" or "avx2"; "+bf16" when bf16 was measured
};

// The FMA-loop peak on `threads` threads (each on its own core when OMP_PROC_BIND allows).
inline FmaPeak fma_peak(int threads = omp_get_max_threads()) {
  using namespace peak_detail;
  FmaPeak p;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p.f32_gflops = best_gflops(fma_avx2, 2.0 * 8 * kAcc, threads);
    p.isa = "avx2";
  }
  if (__builtin_cpu_supports("avx512f")) {
    // On some cores (AMD Zen 4) a 512-bit FMA takes two 256-bit pipes: keep the faster.
    const double w = best_gflops(fma_avx512, 2.0 * 16 * 2 * kAcc, threads);
    if (w > p.f32_gflops) p.f32_gflops = w;
    p.isa = "avx512";
    if (__builtin_cpu_supports("avx512bf16")) {
      p.bf16_gflops = best_gflops(dp_bf16_avx512, 4.0 * 16 * 2 * kAcc, threads);
      p.isa += "+bf16";
    }
  }
  return p;
}

// The oneDNN sgemm rate on the matmuls of one layer and the head, given as (in, out) per linear
// (forward, and the two backward products of each: input and weight gradients), T tokens: total
// FLOPs over total time, the best of 3 rounds. The ceiling the step's matmuls could reach through
// this library.
inline double gemm_step_shapes_gflops(int64_t tokens, const std::vector<std::pair<int64_t, int64_t>>& shapes) {
  struct Linear {
    int64_t in, out;
  };
  std::vector<Linear> linears;
  for (const auto& [in, out] : shapes) linears.push_back({in, out});
  std::vector<float> a, b, c;
  auto gemm = [&](char ta, char tb, int64_t m, int64_t n, int64_t k) {
    a.assign(static_cast<size_t>(m * k), 0.5f);
    b.assign(static_cast<size_t>(k * n), 0.25f);
    c.resize(static_cast<size_t>(m * n));
    const int64_t lda = ta == 'N' ? k : m, ldb = tb == 'N' ? n : k;
    const auto t0 = std::chrono::steady_clock::now();
    dnnl_sgemm(ta, tb, m, n, k, 1.f, a.data(), lda, b.data(), ldb, 0.f, c.data(), n);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  double best = 0;
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
