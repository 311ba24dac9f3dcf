// The machine's compute peak, what MFU (model FLOPs utilization) is taken against: loops of
// independent fused multiply-adds on registers only (no memory traffic: what the cores can compute
// at most), in f32 (AVX2 / AVX-512 FMA) and in bf16 (AVX-512 BF16 dot products, AMX tiles), on a
// thread per core the process may run on. A GEMM runs the same FMAs plus loads, so no kernel of
// the same dtype can beat it.
//
// hardware_peak() measures it once per machine (about two seconds) and keeps it in
// ~/.cache/parallax/fma_peak-<CPU model>-<N>cpus.json ($XDG_CACHE_HOME when set) with the date; a
// later call reads it back. A measurement is a lower bound of the true peak (another process may
// have taken the cores for the whole of it), so a re-measurement keeps the higher of the two, and a
// rate above the peak is the sign to re-measure (pax does so, once a run).
//
//   px::HardwarePeak p = px::hardware_peak();
//   px::Mfu m = px::model_flops_utilization(flops_per_step * steps_per_s, p.flops(px::DType::bf16));
//   // m.fraction in [0, 1]; m.over_peak: the rate exceeded the peak (then the peak was wrong)
#pragma once

#include <cstdint>
#include <string>

#include "parallax/core.h"

namespace px {

// The FMA-loop rates of `threads` threads at once, in GFLOP/s (the best of many short runs);
// `avx2_only`: 256-bit f32 FMAs alone (what an AVX2 CPU would get), no bf16 loop.
struct FmaPeak {
  double f32_gflops = 0;   // the best f32 FMA loop (the widest vectors, or 256-bit where faster)
  double bf16_gflops = 0;  // the best bf16 loop (AVX-512 BF16 dot products, AMX tiles); 0 when none
  std::string isa;         // "avx512" or "avx2", "+bf16" with AVX-512 BF16, "+amx" with AMX-BF16
  std::string bf16_isa;    // which bf16 loop was the fastest: "amx", "avx512_bf16" or ""
};
FmaPeak measure_fma_peak(int threads, bool avx2_only = false);

// The peak of this process's machine: every core it may run on.
struct HardwarePeak {
  double f32_flops = 0;   // FLOP/s of f32 FMAs
  double bf16_flops = 0;  // FLOP/s of bf16 products: the faster of the bf16 units and the f32 FMAs
  std::string isa;        // FmaPeak::isa
  std::string bf16_isa;   // the bf16 units when faster than the f32 FMAs ("amx", "avx512_bf16"), else ""
  std::string cpu;       // the CPU's model name
  int cpus = 0;          // logical CPUs the process may run on (a loop thread on each)
  std::string measured;  // when it was measured, UTC, "YYYY-MM-DD HH:MM"
  std::string cache;     // the file it is kept in ("" when it could not be written)
  bool from_cache = false;

  // The peak for matmuls with `operands` (bf16 and f16: the bf16 rate; else f32).
  double flops(DType operands) const;
  // One line: "2.43 TFLOP/s bf16 (AVX-512 BF16 dot-product loop on 2 CPUs of <model>, measured
  // <date>, cached in <path>)".
  std::string describe(DType operands) const;
};

// The cached peak of this machine, measured now when there is none (or when `remeasure`, or
// PX_RECALIBRATE is set and not 0); a re-measurement keeps the higher figures of the two.
HardwarePeak hardware_peak(bool remeasure = false);
std::string hardware_peak_cache_path();

// MFU: a model FLOP rate against a peak. `fraction` is in [0, 1]: a rate above the peak (which no
// kernel can reach, so the peak or the FLOP count is wrong) gives 1 and `over_peak`. A peak that
// is not a positive number, or a rate that is negative or not finite, is a px::Error.
struct Mfu {
  double fraction = 0;
  bool over_peak = false;
};
Mfu model_flops_utilization(double model_flops_per_s, double peak_flops);

}  // namespace px
