#include "parallax/core.h"

#include <algorithm>

#include <fmt/format.h>

#include <cstdlib>
#include <sstream>

#include "core/enum_names.h"

namespace px {

int64_t dtype_size(DType d) {
  switch (d) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::f16: return 2;
    case DType::i32: return 4;
    case DType::boolean: return 1;
  }
  return 0;
}

namespace {
constexpr const char* kDTypeNames[] = {"f32", "bf16", "f16", "i32", "bool"};
static_assert(std::size(kDTypeNames) == static_cast<size_t>(DType::boolean) + 1);
}  // namespace

const char* dtype_name(DType d) { return enum_name(d, kDTypeNames); }

DType dtype_from_name(const std::string& n) {
  if (auto d = enum_from_name<DType>(n, kDTypeNames)) return *d;
  throw Error("unknown dtype '" + n + "'; use one of f32, bf16, f16, i32, bool");
}

InternalError::InternalError(const std::string& what)
    : Error(fmt::format("{} (this is a bug in parallax: please report it with this message and the "
                        "program that triggered it)",
                        what)) {}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t d : s) {
    if (d < 0) throw UserError(fmt::format("[shape] {} has a negative dim; dims are >= 0", shape_str(s)));
    overflow = overflow || __builtin_mul_overflow(n, d, &n);
  }
  // A zero dim makes the count 0 even when the other dims overflow.
  if (overflow && std::find(s.begin(), s.end(), 0) == s.end())
    throw UserError(fmt::format("[shape] {} has more than 2^63 elements; use smaller dims", shape_str(s)));
  return overflow ? 0 : n;
}

int64_t checked_nbytes(int64_t count, DType d, const std::string& what) {
  int64_t bytes = 0;
  if (count < 0 || __builtin_mul_overflow(count, dtype_size(d), &bytes))
    throw UserError(fmt::format("[shape] {} needs more than 2^63 bytes; use smaller dims", what));
  return bytes;
}

int64_t TensorType::nbytes() const {
  // The type's text only when it is needed: nbytes runs in planning loops.
  int64_t count = numel(), bytes = 0;
  if (__builtin_mul_overflow(count, dtype_size(dtype), &bytes)) return checked_nbytes(count, dtype, type_str(*this));
  return bytes;
}

bool glob_match(const std::string& p, const std::string& t) {
  // Iterative matcher with one backtrack point, the last '*': linear in practice, never exponential.
  size_t i = 0, j = 0, star = std::string::npos, mark = 0;
  while (j < t.size()) {
    if (i < p.size() && (p[i] == '?' || p[i] == t[j]) && p[i] != '*') {
      ++i;
      ++j;
    } else if (i < p.size() && p[i] == '*') {
      star = i++;
      mark = j;
    } else if (star != std::string::npos) {
      i = star + 1;
      j = ++mark;
    } else {
      return false;
    }
  }
  while (i < p.size() && p[i] == '*') ++i;
  return i == p.size();
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << "]";
  return os.str();
}

std::string type_str(const TensorType& t) { return std::string(dtype_name(t.dtype)) + shape_str(t.shape); }

int normalize_axis(int64_t axis, int rank, const char* op) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank)
    throw Error(std::string("[") + op + "] axis " + std::to_string(axis) + " is out of range for rank " +
                std::to_string(rank) + " (valid: " + std::to_string(-rank) + ".." + std::to_string(rank - 1) + ")");
  return static_cast<int>(a);
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (absx < 0x38800000u) {  // subnormal or zero in f16
    float af;
    std::memcpy(&af, &absx, 4);
    // Scale so the f16 subnormal unit (2^-24) becomes 1 and round to nearest even.
    float scaled = af * 16777216.0f;
    uint32_t r = static_cast<uint32_t>(scaled);
    float frac = scaled - static_cast<float>(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t exp = ((absx >> 23) - 112u) << 10;
  uint32_t mant = (absx >> 13) & 0x3ffu;
  uint32_t h = exp | mant;
  uint32_t rest = absx & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

Array::Array(DType dtype, Shape shape, Placement where) : type_{dtype, std::move(shape)}, where_(where) {
  for (int64_t d : type_.shape)
    if (d < 0) throw UserError("[Array] negative dimension in shape " + shape_str(type_.shape));
  const int64_t bytes = type_.nbytes();
  void* p = nullptr;
  try {
    p = allocate_bytes(where, bytes);
  } catch (const Error&) {
    throw UserError(fmt::format("[Array] out of memory allocating {} ({} bytes) on {}; use smaller shapes",
                                type_str(type_), bytes, where.to_string()));
  }
  data_ = std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                     [where, bytes](std::byte* q) { free_bytes(where, q, bytes); });
}

namespace {
// The deleter of adopted memory: lets go of the owner (which frees the memory, or not) and marks
// the buffer as foreign; copies of the Array share it with the buffer.
struct Foreign {
  std::shared_ptr<void> owner;
  bool read_only = false;
  void operator()(std::byte*) { owner.reset(); }
};
}  // namespace

Array Array::adopt(void* data, TensorType type, std::shared_ptr<void> owner, bool read_only) {
  const int64_t bytes = type.nbytes();  // checks the shape
  if (bytes == 0) return Array(type.dtype, type.shape);
  if (!data) throw UserError("[Array::adopt] null data for " + type_str(type));
  if (!adoptable(data, type.dtype))
    throw UserError(fmt::format("[Array::adopt] the memory at {} is not aligned to {} bytes ({}'s element size); "
                                "copy it into an Array of its own (Array(type) and memcpy)",
                                data, dtype_size(type.dtype), dtype_name(type.dtype)));
  Array a;
  a.type_ = std::move(type);
  a.data_ = std::shared_ptr<std::byte>(static_cast<std::byte*>(data), Foreign{std::move(owner), read_only});
  return a;
}

bool Array::adopted() const { return std::get_deleter<Foreign>(data_) != nullptr; }

bool Array::read_only() const {
  const Foreign* f = std::get_deleter<Foreign>(data_);
  return f && f->read_only;
}

Array Array::zeros(DType dtype, const Shape& shape) {
  Array a(dtype, shape);
  std::memset(a.raw(), 0, static_cast<size_t>(a.nbytes()));
  return a;
}

Array Array::from_f32(const std::vector<float>& v, const Shape& shape, DType dtype) {
  if (static_cast<int64_t>(v.size()) != px::numel(shape))
    throw Error("[Array::from_f32] " + std::to_string(v.size()) + " values do not fill shape " + shape_str(shape));
  Array a(dtype, shape);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dtype) {
      case DType::f32: a.data<float>()[i] = v[i]; break;
      case DType::bf16: a.data<uint16_t>()[i] = f32_to_bf16(v[i]); break;
      case DType::f16: a.data<uint16_t>()[i] = f32_to_f16(v[i]); break;
      case DType::i32: a.data<int32_t>()[i] = static_cast<int32_t>(v[i]); break;
      case DType::boolean: a.data<uint8_t>()[i] = v[i] != 0.0f; break;
    }
  }
  return a;
}

Array Array::from_i32(const std::vector<int32_t>& v, const Shape& shape) {
  if (static_cast<int64_t>(v.size()) != px::numel(shape))
    throw Error("[Array::from_i32] " + std::to_string(v.size()) + " values do not fill shape " + shape_str(shape));
  Array a(DType::i32, shape);
  if (!v.empty()) std::memcpy(a.raw(), v.data(), v.size() * 4);
  return a;
}

std::vector<float> Array::to_f32() const {
  if (!host_visible(where_)) return on_host().to_f32();
  std::vector<float> out(static_cast<size_t>(numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (dtype()) {
      case DType::f32: out[i] = data<float>()[i]; break;
      case DType::bf16: out[i] = bf16_to_f32(data<uint16_t>()[i]); break;
      case DType::f16: out[i] = f16_to_f32(data<uint16_t>()[i]); break;
      case DType::i32: out[i] = static_cast<float>(data<int32_t>()[i]); break;
      case DType::boolean: out[i] = data<uint8_t>()[i] ? 1.0f : 0.0f; break;
    }
  }
  return out;
}

std::vector<int32_t> Array::to_i32() const {
  if (!host_visible(where_)) return on_host().to_i32();
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  if (dtype() == DType::i32) {
    if (!out.empty()) std::memcpy(out.data(), raw(), out.size() * 4);
  } else if (dtype() == DType::boolean) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = data<uint8_t>()[i];
  } else {
    throw Error(std::string("[Array::to_i32] array has dtype ") + dtype_name(dtype()) + "; use to_f32()");
  }
  return out;
}

Array Array::astype(DType d) const {
  if (d == dtype()) return clone();
  if (dtype() == DType::i32 && d != DType::boolean) {
    std::vector<int32_t> v = to_i32();
    return from_f32(std::vector<float>(v.begin(), v.end()), shape(), d);
  }
  return from_f32(to_f32(), shape(), d);
}

Array Array::clone() const {
  Array a(dtype(), shape(), where_);
  copy_bytes(where_, a.raw(), where_, raw(), nbytes());
  return a;
}

Array Array::to(const Placement& p) const {
  if (p == where_) return *this;
  Array a(dtype(), shape(), p);
  copy_bytes(p, a.raw(), where_, raw(), nbytes());
  return a;
}

Array Array::on_host() const { return host_visible(where_) ? *this : to(Placement{}); }

Array Array::reshape(const Shape& s) const {
  if (px::numel(s) != numel())
    throw UserError("[Array::reshape] cannot reshape " + type_str(type_) + " to " + shape_str(s));
  Array a = *this;
  a.type_.shape = s;
  return a;
}

}  // namespace px
