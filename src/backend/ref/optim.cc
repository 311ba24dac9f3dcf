// Reference kernel of the optim family: adamw_update(p, g, m, v, step_size, inv_sqrt_bc2[, decay])
// -> (p', m', v'), attrs beta1, beta2, eps and decay (src/ops/optim.cc). The primitive is defined
// to round as the f32 elementwise chain it replaces, so each step below is one f32 operation in
// that order:
//   m' = m b1 + g (1 - b1);  v' = v b2 + g^2 (1 - b2)
//   p' = p - (m' step_size) / (sqrt(v') inv_sqrt_bc2 + eps) - p decay
// with p and g widened to f32, the attrs taken as f32 constants (1 - b computed in double first),
// and p' rounded to p's dtype at the end. Each operation is done in double and rounded to f32 at
// once (f32 below): double holds the exact product of two f32 values, and a double result of +, -,
// *, / or sqrt on f32 values rounds to the same f32 as the f32 operation would, so this is the f32
// chain without any chance of a fused multiply-add. Outputs may alias inputs (the primitive is
// in place): element i of every operand is read before element i of a result is written.
#include <cmath>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

namespace {

double f32(double x) { return static_cast<double>(static_cast<float>(x)); }

Kernel make_adamw(const Spec& s) {
  const DType pt = s.in.at(0).dtype, gt = s.in.at(1).dtype, ot = s.out.at(0).dtype;
  const int64_t n = s.in[0].numel();
  const bool decay = s.attrs.i("decay") != 0;
  const double b1 = f32(s.attrs.f("beta1")), c1 = f32(1.0 - s.attrs.f("beta1"));
  const double b2 = f32(s.attrs.f("beta2")), c2 = f32(1.0 - s.attrs.f("beta2"));
  const double eps = f32(s.attrs.f("eps"));
  return [=](const void* const* in, void* const* out) {
    const double step = load(in[4], DType::f32, 0), inv_sqrt_bc2 = load(in[5], DType::f32, 0);
    const double wd = decay ? load(in[6], DType::f32, 0) : 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double p = f32(load(in[0], pt, i)), g = f32(load(in[1], gt, i));
      const double m = load(in[2], DType::f32, i), v = load(in[3], DType::f32, i);
      const double m1 = f32(f32(m * b1) + f32(g * c1));
      const double v1 = f32(f32(v * b2) + f32(f32(g * g) * c2));
      const double denom = f32(f32(f32(std::sqrt(v1)) * inv_sqrt_bc2) + eps);
      double p1 = f32(p - f32(f32(m1 * step) / denom));
      if (decay) p1 = f32(p1 - f32(p * wd));
      store(out[1], DType::f32, i, m1);
      store(out[2], DType::f32, i, v1);
      store(out[0], ot, i, p1);
    }
  };
}

}  // namespace

void register_optim_kernels() { register_kernel(prims::adamw_update(), make_adamw); }

}  // namespace px::ref
