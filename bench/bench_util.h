// Small helpers shared by the benchmarks: timing, one-line JSON records, flags, and running a
// traced function through a compiled Executable without allocating per call.
#pragma once

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "parallax/runtime.h"

namespace px::bench {

// Flags: --min_time=SECONDS (time spent per measurement, default 0.3), --quick (fewer sizes),
// --only=NAME (op_bench: that case alone, to profile or dump it; the others ignore it).
struct Flags {
  double min_time = 0.3;
  bool quick = false;
  std::string only;
};
inline Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--min_time=", 0) == 0) {
      f.min_time = std::stod(a.substr(11));
    } else if (a == "--quick") {
      f.quick = true;
    } else if (a.rfind("--only=", 0) == 0) {
      f.only = a.substr(7);
    } else {
      std::fprintf(stderr, "unknown flag %s (flags: --min_time=SECONDS --quick --only=NAME)\n", a.c_str());
      std::exit(2);
    }
  }
  return f;
}

// Median seconds per call of fn, after one warm-up call, over at least 3 calls and min_time.
inline double time_it(const std::function<void()>& fn, double min_time) {
  using clock = std::chrono::steady_clock;
  fn();
  std::vector<double> samples;
  auto start = clock::now();
  while (samples.size() < 3 || std::chrono::duration<double>(clock::now() - start).count() < min_time) {
    auto t0 = clock::now();
    fn();
    samples.push_back(std::chrono::duration<double>(clock::now() - t0).count());
    if (samples.size() >= 1000) break;
  }
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

// One JSON object on one line: Json().s("bench", "gemm").n("ms", 1.5).print().
class Json {
 public:
  Json& s(const std::string& k, const std::string& v) { return raw(k, "\"" + v + "\""); }
  Json& n(const std::string& k, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return raw(k, buf);
  }
  Json& i(const std::string& k, int64_t v) { return raw(k, std::to_string(v)); }
  Json& b(const std::string& k, bool v) { return raw(k, v ? "true" : "false"); }
  Json& raw(const std::string& k, const std::string& v) {
    os_ << (first_ ? "{" : ", ") << "\"" << k << "\": " << v;
    first_ = false;
    return *this;
  }
  void print() {
    std::printf("%s}\n", os_.str().c_str());
    std::fflush(stdout);
  }

 private:
  std::ostringstream os_;
  bool first_ = true;
};

inline Array random_array(const Shape& shape, DType dtype, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (auto& x : v) x = u(rng);
  return Array::from_f32(v, shape, dtype);
}

// A compiled graph plus preallocated outputs, so that timing measures only the kernels.
struct Compiled {
  std::unique_ptr<Graph> graph;
  std::unique_ptr<Executable> exe;
  std::vector<Array> inputs, outputs;
  void run() { exe->run_into(inputs, outputs); }
};
inline Compiled compile_fn(const TracedFn& fn, std::vector<Array> inputs, const CompileOptions& opt = {}) {
  Compiled c;
  std::vector<TensorType> types;
  for (auto& a : inputs) types.push_back(a.type());
  c.graph = trace(fn, types);
  c.exe = Executable::compile(*c.graph, opt);
  c.inputs = std::move(inputs);
  c.outputs = c.exe->run(c.inputs);
  return c;
}

inline int threads() { return omp_get_max_threads(); }

// Seconds to copy `bytes` bytes with all threads (reading and writing them once, memcpy in 64
// chunks). Copying as many bytes as an op moves is its roofline, in cache or in memory alike.
inline double copy_seconds(int64_t bytes, double min_time) {
  std::vector<char> src(static_cast<size_t>(bytes), 1), dst(static_cast<size_t>(bytes));
  const int64_t chunks = 64, chunk = (bytes + chunks - 1) / chunks;
  return time_it(
      [&] {
#pragma omp parallel for schedule(static)
        for (int64_t c = 0; c < chunks; ++c) {
          int64_t off = c * chunk, len = std::min(chunk, bytes - off);
          if (len > 0) std::memcpy(dst.data() + off, src.data() + off, static_cast<size_t>(len));
        }
      },
      min_time);
}

}  // namespace px::bench
