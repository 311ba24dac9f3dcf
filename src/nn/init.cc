// Deterministic param initialization on the host. Each element's value is a pure function of
// (seed, param path, element index): a SplitMix64-style counter-based generator keyed by a
// hash of the seed and the path.
#include <cmath>
#include <cstdio>
#include <cstring>

#include "parallax/nn/module.h"

namespace px::nn {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t path_key(uint64_t seed, const std::string& path) {
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a over the path bytes
  for (unsigned char c : path) h = (h ^ c) * 0x100000001B3ull;
  return mix64(mix64(seed + kGolden) ^ mix64(h));
}

// The counter-th 64 random bits of stream `key`.
inline uint64_t bits(uint64_t key, uint64_t counter) { return mix64(key + (counter + 1) * kGolden); }
inline double unit_open0(uint64_t b) { return static_cast<double>((b >> 11) + 1) * 0x1.0p-53; }  // (0, 1]
inline double unit(uint64_t b) { return static_cast<double>(b >> 11) * 0x1.0p-53; }              // [0, 1)

// Standard normal for element i of stream key (Box-Muller on two counters).
inline double normal(uint64_t key, int64_t i) {
  double u1 = unit_open0(bits(key, 2 * static_cast<uint64_t>(i)));
  double u2 = unit(bits(key, 2 * static_cast<uint64_t>(i) + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Std of a standard normal truncated to [-2, 2].
constexpr double kTruncStd = 0.87962566103423978;

}  // namespace

std::string Init::to_string() const {
  char buf[96];
  switch (kind) {
    case Kind::zeros:
      return "zeros";
    case Kind::ones:
      return "ones";
    case Kind::constant:
      std::snprintf(buf, sizeof buf, "constant(%g)", a);
      break;
    case Kind::normal:
      std::snprintf(buf, sizeof buf, "normal(%g%s)", a, fan_in_scaled ? "/sqrt(fan_in)" : "");
      break;
    case Kind::truncated_normal:
      if (fan_in_scaled)
        std::snprintf(buf, sizeof buf, "lecun_normal(%g)", a);
      else
        std::snprintf(buf, sizeof buf, "truncated_normal(%g)", a);
      break;
    case Kind::uniform:
      std::snprintf(buf, sizeof buf, "uniform(%g, %g%s)", a, b, fan_in_scaled ? ", /sqrt(fan_in)" : "");
      break;
  }
  return buf;
}

int64_t fan_in(const Shape& s) {
  if (s.size() <= 1) return 1;
  int64_t n = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) n *= s[i];
  return std::max<int64_t>(n, 1);
}

void init_range(const ParamSpec& p, uint64_t seed, int64_t begin, int64_t end, float* out) {
  const Init& in = p.init;
  const int64_t n = end - begin;
  if (n <= 0) return;
  const double scale = in.fan_in_scaled ? 1.0 / std::sqrt(static_cast<double>(fan_in(p.type.shape))) : 1.0;
  const uint64_t key = path_key(seed, p.path);
  switch (in.kind) {
    case Init::Kind::zeros:
    case Init::Kind::ones:
    case Init::Kind::constant: {
      float v = in.kind == Init::Kind::zeros ? 0.0f : in.kind == Init::Kind::ones ? 1.0f : static_cast<float>(in.a);
      for (int64_t i = 0; i < n; ++i) out[i] = v;
      return;
    }
    case Init::Kind::normal: {
      const double sd = in.a * scale;
#pragma omp parallel for if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(sd * normal(key, begin + i));
      return;
    }
    case Init::Kind::truncated_normal: {
      const double sd = in.a * scale / kTruncStd;
#pragma omp parallel for if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        // Rejection with a fresh stream per attempt keeps every element independent of the others.
        double z = normal(key, begin + i);
        for (uint64_t k = 1; std::fabs(z) > 2.0; ++k) z = normal(mix64(key + k * 0xD1B54A32D192ED03ull), begin + i);
        out[i] = static_cast<float>(sd * z);
      }
      return;
    }
    case Init::Kind::uniform: {
      const double lo = in.a * scale, hi = in.b * scale;
#pragma omp parallel for if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i)
        out[i] = static_cast<float>(lo + (hi - lo) * unit(bits(key, static_cast<uint64_t>(begin + i))));
      return;
    }
  }
}

namespace {

void check_initializer(const ParamSpec& p) {
  if (!is_float(p.type.dtype) &&
      (p.init.kind != Init::Kind::zeros && p.init.kind != Init::Kind::ones && p.init.kind != Init::Kind::constant))
    throw Error("[nn] param '" + p.path + "' of type " + type_str(p.type) + " needs a constant initializer, not " +
                p.init.to_string());
}

}  // namespace

Array init_array(const ParamSpec& p, uint64_t seed) {
  check_initializer(p);
  Array f(DType::f32, p.type.shape);
  init_range(p, seed, 0, f.numel(), f.data<float>());
  return p.type.dtype == DType::f32 ? f : f.astype(p.type.dtype);
}

void init_box(const ParamSpec& p, uint64_t seed, const std::vector<int64_t>& offsets, Array& out) {
  check_initializer(p);
  const Shape& full = p.type.shape;
  const Shape& box = out.shape();
  const size_t rank = full.size();
  bool fits = out.dtype() == p.type.dtype && offsets.size() == rank && box.size() == rank;
  for (size_t d = 0; fits && d < rank; ++d) fits = offsets[d] >= 0 && offsets[d] + box[d] <= full[d];
  if (!fits)
    throw Error("[nn] init_box: a box of " + type_str(out.type()) + " does not fit in param '" + p.path + "' (" +
                type_str(p.type) + ") at the given offsets");
  Array f(DType::f32, box);
  if (f.numel() > 0) {
    // Runs of consecutive elements: the box's last dims that span the whole param, plus one more.
    size_t k = rank ? rank - 1 : 0;
    int64_t run = rank ? box[k] : 1;
    while (k > 0 && box[k] == full[k]) run *= box[--k];
    std::vector<int64_t> stride(rank, 1);
    for (size_t d = rank; d-- > 1;) stride[d - 1] = stride[d] * full[d];
    std::vector<int64_t> at(k, 0);  // the run's index over the box's dims before k
    float* dst = f.data<float>();
    for (int64_t r = 0, runs = f.numel() / run; r < runs; ++r, dst += run) {
      int64_t begin = rank ? offsets[k] * stride[k] : 0;
      for (size_t d = 0; d < k; ++d) begin += (offsets[d] + at[d]) * stride[d];
      init_range(p, seed, begin, begin + run, dst);
      for (size_t d = k; d-- > 0;) {
        if (++at[d] < box[d]) break;
        at[d] = 0;
      }
    }
  }
  const Array typed = p.type.dtype == DType::f32 ? f : f.astype(p.type.dtype);
  if (out.nbytes()) std::memcpy(out.raw(), typed.raw(), static_cast<size_t>(out.nbytes()));
}

}  // namespace px::nn
