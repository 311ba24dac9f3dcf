// The optimizer family: whole update rules as one primitive each, so that the update of a param
// is one pass over its memory (read p, g and the state once, write them once) instead of a
// chain of elementwise ops split into several loops.
#include <cmath>

#include "ir/primitive.h"
#include "parallax/ops.h"

namespace px {

namespace {

// adamw_update(p, g, m, v, step_size, inv_sqrt_bc2[, decay]) -> (p', m', v'), attrs beta1, beta2,
// eps and `decay` (1: a seventh operand, lr * weight_decay, is subtracted times p). In f32, in
// this order (what the elementwise chain of px::optim::adamw computed, to the bit):
//   m' = m b1 + g (1 - b1);  v' = v b2 + g^2 (1 - b2)
//   p' = p - (m' step_size) / (sqrt(v') inv_sqrt_bc2 + eps) - p decay
std::vector<TensorType> infer_adamw(const std::vector<TensorType>& in, const Attrs& a) {
  const bool decay = a.i("decay") != 0;
  const size_t want = decay ? 7 : 6;
  if (in.size() != want)
    throw Error("[adamw_update] expects " + std::to_string(want) + " operands (p, g, m, v, step_size, inv_sqrt_bc2" +
                (decay ? ", decay" : "") + "), got " + std::to_string(in.size()));
  const TensorType& p = in[0];
  if (!is_float(p.dtype) || !is_float(in[1].dtype))
    throw Error("[adamw_update] p and g must be float, got " + type_str(p) + " and " + type_str(in[1]));
  if (in[1].shape != p.shape)
    throw Error("[adamw_update] g has type " + type_str(in[1]) + " but p has type " + type_str(p) +
                " (want the same shape)");
  for (int k : {2, 3})
    if (in[k] != TensorType{DType::f32, p.shape})
      throw Error(std::string("[adamw_update] ") + (k == 2 ? "m" : "v") + " has type " + type_str(in[k]) + ", want " +
                  type_str(TensorType{DType::f32, p.shape}));
  for (size_t k = 4; k < in.size(); ++k)
    if (in[k] != TensorType{DType::f32, {}})
      throw Error("[adamw_update] operand " + std::to_string(k) + " has type " + type_str(in[k]) +
                  ", want a f32 scalar (f32[])");
  for (const char* b : {"beta1", "beta2"})
    if (!(a.f(b) >= 0 && a.f(b) < 1)) throw Error(std::string("[adamw_update] ") + b + " must be in [0, 1)");
  if (!(a.f("eps") >= 0) || !std::isfinite(a.f("eps"))) throw Error("[adamw_update] eps must be a finite number >= 0");
  return {p, {DType::f32, p.shape}, {DType::f32, p.shape}};
}

// Every dim of p, g, m, v and the results is one parallel factor; the scalars have no dims.
ShardingRule adamw_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  ShardingRule r;
  std::vector<int> f;
  for (size_t d = 0; d < in[0].shape.size(); ++d) {
    f.push_back(static_cast<int>(d));
    r.factor_sizes.push_back(in[0].shape[d]);
    r.factor_kinds.push_back(ShardingRule::Kind::parallel);
  }
  for (size_t k = 0; k < in.size(); ++k) r.operands.push_back(k < 4 ? f : std::vector<int>{});
  for (size_t k = 0; k < out.size(); ++k) r.results.push_back(f);
  return r;
}

Cost adamw_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  Cost c;
  const double n = static_cast<double>(in[0].numel());
  c.flops = 14 * n;  // 6 for the moments, sqrt, 2 for the denominator, 3 for the step, 2 for the decay
  for (const auto& t : in) c.bytes_read += static_cast<double>(t.nbytes());
  for (const auto& t : out) c.bytes_written += static_cast<double>(t.nbytes());
  return c;
}

// The elementwise chain that computes the same bits (what px::optim::adamw emitted before).
std::vector<Tensor> adamw_decompose(const std::vector<Tensor>& x, const Attrs& a) {
  const double b1 = a.f("beta1"), b2 = a.f("beta2"), eps = a.f("eps");
  auto f32 = [](const Tensor& t) { return t.dtype() == DType::f32 ? t : cast(t, DType::f32); };
  Tensor p = f32(x[0]), g = f32(x[1]);
  Tensor m = x[2] * b1 + g * (1.0 - b1);
  Tensor v = x[3] * b2 + square(g) * (1.0 - b2);
  Tensor np = p - m * x[4] / (sqrt(v) * x[5] + eps);
  if (a.i("decay") != 0) np = np - p * x[6];
  return {np.dtype() == x[0].dtype() ? np : cast(np, x[0].dtype()), m, v};
}

}  // namespace

void register_optim_primitives() {
  Primitive p;
  p.name = "adamw_update";
  p.attrs = {{"beta1", AttrKind::number},
             {"beta2", AttrKind::number},
             {"eps", AttrKind::number},
             {"decay", AttrKind::integer}};
  p.infer = infer_adamw;
  p.sharding = adamw_rule;
  p.cost = adamw_cost;
  p.in_place = true;  // element i of every operand is read before element i of a result is written
  p.widens_operands = 1u << 1;  // g: the kernels load it in its own dtype (infer_adamw takes any float)
  p.decompose = adamw_decompose;
  register_primitive(std::move(p));
}

}  // namespace px
