// The FMA-loop peak (fma_peak.h): the loops, their timing, the per-machine cache and MFU.
#include "runtime/fma_peak.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fmt/format.h>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "core/env.h"

// The loops are what is measured: optimized (unrolled into registers) in every build, a Debug one
// too, where they would otherwise go through memory.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
// GCC 12's _mm512_reduce_add_ps reads an undefined vector on purpose (its upper half is discarded).
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace px {

namespace {


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
bool amx_bf16_usable() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
  if (!amx_bf16 || !amx_tile) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

__attribute__((target("amx-tile,amx-bf16"))) float dp_bf16_amx(int64_t iters) {
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

// The CPU time this thread has run: what the cores did while they ran it, whoever else had them
// meanwhile.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Best GFLOP/s of `loop` (flops_per_iter FLOPs an iteration) on `threads` threads at once, summed
// over the threads: each doubles its iteration count until one run takes at least 5 ms of its CPU
// time, then keeps its best of 20 runs. Timed in each thread's CPU time, not wall time: on a shared
// machine other processes preempt the threads (a neighbour's load moves the wall-clock rate 2x
// within minutes), and the peak is what the cores do when they run. A thread whose core the OS
// shares with another of the team counts less CPU time, not more, so the sum stays the cores'.
template <class Loop>
double best_gflops(Loop loop, double flops_per_iter, int threads, int64_t first_iters = 1 << 12) {
  std::vector<double> best(static_cast<size_t>(threads), 0.0);
#pragma omp parallel num_threads(threads)
  {
    volatile float sink = 0;
    auto run = [&](int64_t iters) {
      const double t0 = thread_cpu_seconds();
      const float r = loop(iters);
      if (r == 12345.f) sink = r;
      return std::max(thread_cpu_seconds() - t0, 1e-9);
    };
    int64_t iters = first_iters;
    while (run(iters) < 0.005 && iters < (int64_t{1} << 34)) iters *= 2;
    double b = 0;
    for (int rep = 0; rep < 20; ++rep) b = std::max(b, flops_per_iter * static_cast<double>(iters) / run(iters) / 1e9);
    best[static_cast<size_t>(omp_get_thread_num())] = b;
  }
  double sum = 0;
  for (double b : best) sum += b;  // the threads OpenMP gave (a thread it did not give adds 0)
  return sum;
}

// The f32 FMA-loop peak with 256-bit vectors only (what an AVX2 CPU would get).
double fma_peak_avx2(int threads) {
  return std::max(best_gflops(fma_avx2<12>, 2.0 * 8 * 12, threads), best_gflops(fma_avx2<14>, 2.0 * 8 * 14, threads));
}


// The CPU's model name (the brand string of cpuid leaves 0x80000002-4), spaces trimmed.
std::string cpu_model() {
  unsigned regs[12] = {};
  unsigned a, b, c, d;
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004)
    for (unsigned leaf = 0; leaf < 3; ++leaf) __get_cpuid(0x80000002 + leaf, &regs[4 * leaf], &regs[4 * leaf + 1],
                                                          &regs[4 * leaf + 2], &regs[4 * leaf + 3]);
  std::string s(reinterpret_cast<const char*>(regs), sizeof regs);
  s = s.substr(0, s.find('\0'));
  std::string out;
  for (char ch : s)
    if (ch != ' ' || (!out.empty() && out.back() != ' ')) out += ch;
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out.empty() ? "unknown CPU" : out;
}

// The logical CPUs this process may run on.
int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&t, &utc);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M", &utc);
  return when;
}

HardwarePeak measure(const std::string& cpu, int cpus) {
  const FmaPeak f = measure_fma_peak(cpus);
  HardwarePeak p;
  p.f32_flops = f.f32_gflops * 1e9;
  // bf16 products run on the bf16 units or, converted, on the f32 FMAs: the faster of the two (some
  // cores' AVX-512 BF16 dot products issue at half the FMA rate).
  p.bf16_flops = std::max(f.bf16_gflops, f.f32_gflops) * 1e9;
  p.isa = f.isa;
  p.bf16_isa = f.bf16_gflops > f.f32_gflops ? f.bf16_isa : "";
  p.cpu = cpu;
  p.cpus = cpus;
  p.measured = utc_now();
  return p;
}

// The cached peak of this CPU model and CPU count; nullopt when there is none or it is unreadable.
std::optional<HardwarePeak> read_cached(const std::string& path, const std::string& cpu, int cpus) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    HardwarePeak p;
    p.cpu = j.at("cpu").get<std::string>();
    p.cpus = j.at("cpus").get<int>();
    p.f32_flops = j.at("f32_flops").get<double>();
    p.bf16_flops = j.at("bf16_flops").get<double>();
    p.isa = j.at("isa").get<std::string>();
    p.bf16_isa = j.at("bf16_isa").get<std::string>();
    p.measured = j.at("measured").get<std::string>();
    if (p.cpu != cpu || p.cpus != cpus || !(p.f32_flops > 0) || !(p.bf16_flops > 0)) return std::nullopt;
    return p;
  } catch (const std::exception&) {
    return std::nullopt;  // measured again and overwritten
  }
}

// Written whole under another name, then renamed: processes measuring at once leave one whole file.
bool write_cache(const std::string& path, const HardwarePeak& p) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out << nlohmann::json{{"cpu", p.cpu},
                          {"cpus", p.cpus},
                          {"f32_flops", p.f32_flops},
                          {"bf16_flops", p.bf16_flops},
                          {"isa", p.isa},
                          {"bf16_isa", p.bf16_isa},
                          {"measured", p.measured},
                          {"how", "px::hardware_peak(): FMA loops on registers, a thread per CPU; delete this "
                                  "file or set PX_RECALIBRATE=1 to measure again"}}
               .dump(2)
        << "\n";
    if (!out) {
      std::filesystem::remove(tmp, ec);
      return false;
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return !ec;
}

}  // namespace

FmaPeak measure_fma_peak(int threads, bool avx2_only) {
  FmaPeak p;
  threads = std::max(1, threads);
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p.f32_gflops = fma_peak_avx2(threads);
    p.isa = "avx2";
  }
  if (avx2_only) return p;
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

double HardwarePeak::flops(DType operands) const {
  return operands == DType::bf16 || operands == DType::f16 ? bf16_flops : f32_flops;
}

std::string HardwarePeak::describe(DType operands) const {
  const bool half = operands == DType::bf16 || operands == DType::f16;
  std::string loop;
  if (!half)
    loop = isa.rfind("avx512", 0) == 0 ? "AVX-512 FMA loop" : isa.rfind("avx2", 0) == 0 ? "AVX2 FMA loop" : "FMA loop";
  else if (bf16_isa == "amx")
    loop = "AMX-BF16 tile loop";
  else if (bf16_isa == "avx512_bf16")
    loop = "AVX-512 BF16 dot-product loop";
  else
    loop = std::string("f32 FMA loop (bf16 runs on the f32 FMAs; ") +
           (isa.find("+bf16") != std::string::npos || isa.find("+amx") != std::string::npos
                ? "the bf16 units are slower here)"
                : "no bf16 units)");
  return fmt::format("{:.3g} TFLOP/s {} ({} on {} CPU{} of {}, measured {} UTC{})", flops(operands) / 1e12,
                     half ? "bf16" : "f32", loop, cpus, cpus == 1 ? "" : "s", cpu, measured,
                     cache.empty() ? "" : (from_cache ? ", cached in " : ", kept in ") + cache);
}

std::string hardware_peak_cache_path() {
  const std::string cache = user_cache_dir();
  const std::filesystem::path base = cache.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(cache);
  std::string model;
  for (char ch : cpu_model()) model += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return (base / "parallax" / ("fma_peak-" + model + "-" + std::to_string(usable_cpus()) + "cpus.json")).string();
}

HardwarePeak hardware_peak(bool remeasure) {
  remeasure = remeasure || recalibrate_requested();
  const std::string cpu = cpu_model(), path = hardware_peak_cache_path();
  const int cpus = usable_cpus();
  std::optional<HardwarePeak> cached = read_cached(path, cpu, cpus);
  if (cached && !remeasure) {
    cached->cache = path;
    cached->from_cache = true;
    return *cached;
  }
  HardwarePeak p = measure(cpu, cpus);
  if (cached) {  // each figure is a lower bound of the peak: the higher one is the better
    if (cached->f32_flops > p.f32_flops) p.f32_flops = cached->f32_flops;
    if (cached->bf16_flops > p.bf16_flops) p.bf16_flops = cached->bf16_flops;
  }
  if (write_cache(path, p)) p.cache = path;
  return p;
}

Mfu model_flops_utilization(double model_flops_per_s, double peak_flops) {
  if (!(peak_flops > 0) || !std::isfinite(peak_flops))
    throw Error(fmt::format("[mfu] the peak is {} FLOP/s; it must be a positive number (px::hardware_peak() "
                            "measures this machine's)",
                            peak_flops));
  if (!(model_flops_per_s >= 0) || !std::isfinite(model_flops_per_s))
    throw Error(fmt::format("[mfu] the model FLOP rate is {} FLOP/s; it must be a finite number >= 0",
                            model_flops_per_s));
  const double f = model_flops_per_s / peak_flops;
  return f > 1 ? Mfu{1.0, true} : Mfu{f, false};
}

}  // namespace px

