// Reference kernels of the reduce family: reduce_sum and reduce_max over the sorted, unique dims
// `axes`; the result keeps the other dims in order. Float sums accumulate in double and round
// once; i32 sums are exact modulo 2^32 (they wrap). reduce_max propagates NaN. Reducing over an
// empty dim gives the identity: 0 for sums, -inf (float) or INT32_MIN (i32) for max.
#include <cmath>
#include <cstdint>
#include <limits>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

namespace {

using Ints = std::vector<int64_t>;

// For every operand dim, the result stride it advances (0 for a reduced dim).
struct Plan {
  Ints shape;   // the operand's shape
  Ints out_st;  // per operand dim
  int64_t in_n = 0, out_n = 0;
  DType in_t = DType::f32, out_t = DType::f32;

  // Calls f(operand element, result element) for every operand element in row-major order.
  template <class F>
  void each(F&& f) const {
    if (in_n == 0) return;
    const int r = static_cast<int>(shape.size());
    Ints idx(shape.size(), 0);
    int64_t o = 0;
    for (int64_t i = 0; i < in_n; ++i) {
      f(i, o);
      for (int ax = r - 1; ax >= 0; --ax) {
        ++idx[ax];
        o += out_st[ax];
        if (idx[ax] < shape[ax]) break;
        o -= out_st[ax] * shape[ax];
        idx[ax] = 0;
      }
    }
  }
};

Plan make_plan(const Spec& s) {
  const TensorType& x = s.in.at(0);
  const Ints& axes = s.attrs.ints("axes");
  std::vector<char> reduced(x.shape.size(), 0);
  for (int64_t a : axes) {
    if (a < 0 || a >= x.rank()) throw InternalError("[ref] reduce: axis out of range for " + type_str(x));
    reduced[a] = 1;
  }
  Plan p;
  p.shape = x.shape;
  Ints kept;
  for (size_t d = 0; d < x.shape.size(); ++d)
    if (!reduced[d]) kept.push_back(x.shape[d]);
  if (kept != s.out.at(0).shape)
    throw InternalError("[ref] reduce of " + type_str(x) + " over its axes does not give " + type_str(s.out[0]));
  Ints ks = strides_of(kept);
  p.out_st.assign(x.shape.size(), 0);
  for (size_t d = 0, k = 0; d < x.shape.size(); ++d)
    if (!reduced[d]) p.out_st[d] = ks[k++];
  p.in_n = x.numel();
  p.out_n = s.out[0].numel();
  p.in_t = x.dtype;
  p.out_t = s.out[0].dtype;
  return p;
}

Kernel make_sum(const Spec& s) {
  Plan p = make_plan(s);
  if (p.in_t == DType::i32)
    return [p](const void* const* in, void* const* out) {
      std::vector<uint32_t> acc(static_cast<size_t>(p.out_n), 0u);  // unsigned: wraps, never overflows
      const int32_t* x = static_cast<const int32_t*>(in[0]);
      p.each([&](int64_t i, int64_t o) { acc[o] += static_cast<uint32_t>(x[i]); });
      int32_t* y = static_cast<int32_t*>(out[0]);
      for (int64_t o = 0; o < p.out_n; ++o) y[o] = static_cast<int32_t>(acc[o]);
    };
  return [p](const void* const* in, void* const* out) {
    std::vector<double> acc(static_cast<size_t>(p.out_n), 0.0);
    p.each([&](int64_t i, int64_t o) { acc[o] += load(in[0], p.in_t, i); });
    for (int64_t o = 0; o < p.out_n; ++o) store(out[0], p.out_t, o, acc[o]);
  };
}

Kernel make_max(const Spec& s) {
  Plan p = make_plan(s);
  if (p.in_t == DType::i32)
    return [p](const void* const* in, void* const* out) {
      int32_t* y = static_cast<int32_t*>(out[0]);
      for (int64_t o = 0; o < p.out_n; ++o) y[o] = std::numeric_limits<int32_t>::min();
      const int32_t* x = static_cast<const int32_t*>(in[0]);
      p.each([&](int64_t i, int64_t o) {
        if (x[i] > y[o]) y[o] = x[i];
      });
    };
  return [p](const void* const* in, void* const* out) {
    std::vector<double> acc(static_cast<size_t>(p.out_n), -std::numeric_limits<double>::infinity());
    p.each([&](int64_t i, int64_t o) {
      double v = load(in[0], p.in_t, i);
      if (v > acc[o] || std::isnan(v)) acc[o] = v;  // once NaN, nothing compares greater
    });
    for (int64_t o = 0; o < p.out_n; ++o) store(out[0], p.out_t, o, acc[o]);
  };
}

}  // namespace

void register_reduce_kernels() {
  register_kernel(prims::reduce_sum(), make_sum);
  register_kernel(prims::reduce_max(), make_max);
}

}  // namespace px::ref
