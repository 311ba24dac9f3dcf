// Reference kernels of the elementwise family: the same-shaped elementwise ops (arithmetic,
// transcendentals, comparisons, logical ops, select, cast, the identities stop_gradient and tag)
// and the constants (constant, full, iota). broadcast_in_dim lives in shape.cc.
//
// Float results are computed in double and rounded once by ref::store. When every operand and
// the result are i32 or bool, the op runs on integers instead, exactly: add, sub, mul, neg and abs
// wrap (two's complement), div truncates with x / 0 == 0 and INT_MIN / -1 == INT_MIN.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

namespace {

using F1 = double (*)(double);
using F2 = double (*)(double, double);
using I1 = int64_t (*)(int64_t);
using I2 = int64_t (*)(int64_t, int64_t);

bool int_like(DType d) { return d == DType::i32 || d == DType::boolean; }

// Integer element i of an i32 or bool buffer, and a store of an integer result (bool: != 0).
int64_t load_int(const void* p, DType t, int64_t i) {
  if (t == DType::i32) return static_cast<const int32_t*>(p)[i];
  return static_cast<const uint8_t*>(p)[i] != 0;
}
void store_int(void* p, DType t, int64_t i, int64_t v) {
  if (t == DType::i32)
    static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);  // callers pass values in the i32 range
  else
    static_cast<uint8_t*>(p)[i] = v != 0;
}

// i32 arithmetic that wraps: computed in 64 bits, reduced modulo 2^32.
int64_t wrap32(int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(v))); }

// ---- the scalar functions ---------------------------------------------------------------------

double f_add(double a, double b) { return a + b; }
double f_sub(double a, double b) { return a - b; }
double f_mul(double a, double b) { return a * b; }
double f_div(double a, double b) { return a / b; }
double f_pow(double a, double b) { return std::pow(a, b); }
// NaN in either operand propagates; on ties the second operand is returned.
double f_max(double a, double b) { return (a > b || std::isnan(a)) ? a : b; }
double f_min(double a, double b) { return (a < b || std::isnan(a)) ? a : b; }

double f_neg(double a) { return -a; }
double f_abs(double a) { return std::fabs(a); }
double f_exp(double a) { return std::exp(a); }
double f_log(double a) { return std::log(a); }
double f_tanh(double a) { return std::tanh(a); }
double f_sqrt(double a) { return std::sqrt(a); }
double f_rsqrt(double a) { return 1.0 / std::sqrt(a); }
double f_sigmoid(double a) { return 1.0 / (1.0 + std::exp(-a)); }

int64_t i_add(int64_t a, int64_t b) { return wrap32(a + b); }
int64_t i_sub(int64_t a, int64_t b) { return wrap32(a - b); }
int64_t i_mul(int64_t a, int64_t b) { return wrap32(a * b); }  // |a*b| <= 2^62: no overflow
int64_t i_div(int64_t a, int64_t b) { return b == 0 ? 0 : wrap32(a / b); }
int64_t i_max(int64_t a, int64_t b) { return a > b ? a : b; }
int64_t i_min(int64_t a, int64_t b) { return a < b ? a : b; }

int64_t i_neg(int64_t a) { return wrap32(-a); }
int64_t i_abs(int64_t a) { return wrap32(a < 0 ? -a : a); }

// Comparisons and logical ops: 0 or 1, the same on doubles and on integers (each lambda serves as
// an F1/F2 and as an I1/I2).
constexpr auto c_eq = [](auto a, auto b) -> decltype(a) { return a == b; };
constexpr auto c_ne = [](auto a, auto b) -> decltype(a) { return a != b; };
constexpr auto c_lt = [](auto a, auto b) -> decltype(a) { return a < b; };
constexpr auto c_le = [](auto a, auto b) -> decltype(a) { return a <= b; };
constexpr auto c_gt = [](auto a, auto b) -> decltype(a) { return a > b; };
constexpr auto c_ge = [](auto a, auto b) -> decltype(a) { return a >= b; };
constexpr auto c_and = [](auto a, auto b) -> decltype(a) { return a != 0 && b != 0; };
constexpr auto c_or = [](auto a, auto b) -> decltype(a) { return a != 0 || b != 0; };
constexpr auto c_not = [](auto a) -> decltype(a) { return a == 0; };

// ---- kernel factories -------------------------------------------------------------------------

// A unary op: the integer function when the operand and result are i32/bool and one is given.
Factory unary(F1 f, I1 fi) {
  return [f, fi](const Spec& s) -> Kernel {
    DType ta = s.in.at(0).dtype, to = s.out.at(0).dtype;
    int64_t n = s.out.at(0).numel();
    if (fi && int_like(ta) && int_like(to))
      return [=](const void* const* in, void* const* out) {
        for (int64_t i = 0; i < n; ++i) store_int(out[0], to, i, fi(load_int(in[0], ta, i)));
      };
    return [=](const void* const* in, void* const* out) {
      for (int64_t i = 0; i < n; ++i) store(out[0], to, i, f(load(in[0], ta, i)));
    };
  };
}

Factory binary(F2 f, I2 fi) {
  return [f, fi](const Spec& s) -> Kernel {
    DType ta = s.in.at(0).dtype, tb = s.in.at(1).dtype, to = s.out.at(0).dtype;
    int64_t n = s.out.at(0).numel();
    if (fi && int_like(ta) && int_like(tb) && int_like(to))
      return [=](const void* const* in, void* const* out) {
        for (int64_t i = 0; i < n; ++i) store_int(out[0], to, i, fi(load_int(in[0], ta, i), load_int(in[1], tb, i)));
      };
    return [=](const void* const* in, void* const* out) {
      for (int64_t i = 0; i < n; ++i) store(out[0], to, i, f(load(in[0], ta, i), load(in[1], tb, i)));
    };
  };
}

// An identity: the operand's bytes, unchanged.
Kernel make_copy(const Spec& s) {
  size_t bytes = static_cast<size_t>(s.out.at(0).nbytes());
  return [bytes](const void* const* in, void* const* out) {
    if (bytes && in[0] != out[0]) std::memcpy(out[0], in[0], bytes);
  };
}

// select(c, a, b): a where c, else b; the chosen element's bytes are copied as they are.
Kernel make_select(const Spec& s) {
  int64_t n = s.out.at(0).numel();
  size_t es = static_cast<size_t>(dtype_size(s.out.at(0).dtype));
  return [n, es](const void* const* in, void* const* out) {
    const uint8_t* c = static_cast<const uint8_t*>(in[0]);
    const std::byte* a = static_cast<const std::byte*>(in[1]);
    const std::byte* b = static_cast<const std::byte*>(in[2]);
    std::byte* o = static_cast<std::byte*>(out[0]);
    for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * es, (c[i] ? a : b) + i * es, es);
  };
}

// cast: the value rounded to the target dtype. To i32: truncation toward zero, saturating, NaN
// gives 0. To bool: != 0 (NaN is true). Between i32 and bool: exact.
Kernel make_cast(const Spec& s) {
  DType ta = s.in.at(0).dtype, to = s.out.at(0).dtype;
  int64_t n = s.out.at(0).numel();
  if (int_like(ta) && int_like(to))
    return [=](const void* const* in, void* const* out) {
      for (int64_t i = 0; i < n; ++i) store_int(out[0], to, i, load_int(in[0], ta, i));
    };
  return [=](const void* const* in, void* const* out) {
    for (int64_t i = 0; i < n; ++i) store(out[0], to, i, load(in[0], ta, i));
  };
}

// full: every element is the attribute `value` in the result dtype (i32 saturates, NaN gives 0).
Kernel make_full(const Spec& s) {
  const TensorType& t = s.out.at(0);
  auto one = std::make_shared<std::vector<std::byte>>(static_cast<size_t>(dtype_size(t.dtype)));
  store(one->data(), t.dtype, 0, s.attrs.f("value"));
  int64_t n = t.numel();
  return [one, n](const void* const*, void* const* out) {
    size_t es = one->size();
    std::byte* o = static_cast<std::byte*>(out[0]);
    for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * es, one->data(), es);
  };
}

// constant: the bytes of the Array attribute `value`.
Kernel make_constant(const Spec& s) {
  auto value = std::make_shared<Array>(s.attrs.array("value"));
  if (value->type() != s.out.at(0))
    throw InternalError("[ref] constant: the value " + type_str(value->type()) + " does not match the result " +
                        type_str(s.out.at(0)));
  return [value](const void* const*, void* const* out) {
    if (value->nbytes()) std::memcpy(out[0], value->raw(), static_cast<size_t>(value->nbytes()));
  };
}

// iota: every element is its index along `axis`, in the result dtype.
Kernel make_iota(const Spec& s) {
  const TensorType& t = s.out.at(0);
  int64_t axis = s.attrs.i("axis");
  if (axis < 0 || axis >= t.rank())
    throw InternalError("[ref] iota: axis " + std::to_string(axis) + " is out of range for " + type_str(t));
  int64_t len = t.shape[axis], inner = strides_of(t.shape)[axis], n = t.numel();
  DType d = t.dtype;
  return [=](const void* const*, void* const* out) {
    for (int64_t i = 0; i < n; ++i) store(out[0], d, i, static_cast<double>((i / inner) % len));
  };
}

}  // namespace

void register_elementwise_kernels() {
  register_kernel(prims::add(), binary(f_add, i_add));
  register_kernel(prims::sub(), binary(f_sub, i_sub));
  register_kernel(prims::mul(), binary(f_mul, i_mul));
  register_kernel(prims::div(), binary(f_div, i_div));
  register_kernel(prims::pow(), binary(f_pow, nullptr));
  register_kernel(prims::maximum(), binary(f_max, i_max));
  register_kernel(prims::minimum(), binary(f_min, i_min));
  register_kernel(prims::eq(), binary(c_eq, c_eq));
  register_kernel(prims::ne(), binary(c_ne, c_ne));
  register_kernel(prims::lt(), binary(c_lt, c_lt));
  register_kernel(prims::le(), binary(c_le, c_le));
  register_kernel(prims::gt(), binary(c_gt, c_gt));
  register_kernel(prims::ge(), binary(c_ge, c_ge));
  register_kernel(prims::logical_and(), binary(c_and, c_and));
  register_kernel(prims::logical_or(), binary(c_or, c_or));

  register_kernel(prims::neg(), unary(f_neg, i_neg));
  register_kernel(prims::abs(), unary(f_abs, i_abs));
  register_kernel(prims::logical_not(), unary(c_not, c_not));
  register_kernel(prims::exp(), unary(f_exp, nullptr));
  register_kernel(prims::log(), unary(f_log, nullptr));
  register_kernel(prims::tanh(), unary(f_tanh, nullptr));
  register_kernel(prims::sqrt(), unary(f_sqrt, nullptr));
  register_kernel(prims::rsqrt(), unary(f_rsqrt, nullptr));
  register_kernel(prims::sigmoid(), unary(f_sigmoid, nullptr));

  register_kernel(prims::stop_gradient(), make_copy);
  register_kernel(prims::tag(), make_copy);
  register_kernel(prims::select(), make_select);
  register_kernel(prims::cast(), make_cast);

  register_kernel(prims::full(), make_full);
  register_kernel(prims::constant(), make_constant);
  register_kernel(prims::iota(), make_iota);
}

}  // namespace px::ref
