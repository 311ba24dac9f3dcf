// The machine's limits, measured in the same run as a benchmark: the FMA peak (loops of
// independent fused multiply-adds on registers only, so no memory traffic: what the cores can
// compute at most) in f32 and in bf16 (AVX-512 BF16 dot products and AMX tile products, where the
// CPU has them), from src/runtime/fma_peak.h (the loops pax's MFU uses, described there); the best
// GEMM rate on large squares (oneDNN sgemm, and its bf16 matmul); and the oneDNN sgemm rate on the
// matmul shapes of a bench-gpt training step.
#pragma once

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "runtime/fma_peak.h"

namespace px::bench {

// The FMA-loop peak on `threads` threads (each on its own core when OMP_PROC_BIND allows): the
// library's (src/runtime/fma_peak.h, what pax's MFU is taken against), measured now.
using FmaPeak = px::FmaPeak;
inline FmaPeak fma_peak(int threads = omp_get_max_threads()) { return px::measure_fma_peak(threads); }

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
