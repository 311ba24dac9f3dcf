// Primitives of the reduce family: reduce_sum and reduce_max over a sorted list of axes (the
// reduced dims are dropped), and the public sum / max / mean with keepdims.
#include <algorithm>

#include "ir/primitive.h"
#include "parallax/ops.h"

namespace px {

namespace {

using Ints = std::vector<int64_t>;

// Validates and normalizes axes; empty means every axis. Returns them sorted.
Ints normalize_axes(const char* op, const Ints& axes, const TensorType& t) {
  Ints out;
  if (axes.empty()) {
    for (int d = 0; d < t.rank(); ++d) out.push_back(d);
    return out;
  }
  for (int64_t a : axes) {
    if (a < -t.rank() || a >= t.rank())
      throw Error(std::string("[") + op + "] axis " + std::to_string(a) + " is out of range for " + type_str(t) +
                  " (valid: " + std::to_string(-t.rank()) + ".." + std::to_string(t.rank() - 1) + ")");
    int64_t n = a < 0 ? a + t.rank() : a;
    if (std::find(out.begin(), out.end(), n) != out.end())
      throw Error(std::string("[") + op + "] axes " + shape_str(axes) + " name dim " + std::to_string(n) + " of " +
                  type_str(t) + " twice");
    out.push_back(n);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The primitive's own check: axes must already be sorted, unique and in range. The result has the
// operand's dtype, or reduce_sum's `out_dtype` (a float type, for a float operand: where a 16-bit
// value is widened to f32 only to be summed, compile sums the 16-bit value and writes the f32 sum,
// runtime/autocast.cc).
std::vector<TensorType> reduce_infer(const char* op, const std::vector<TensorType>& in, const Attrs& a) {
  if (in.size() != 1) throw Error(std::string("[") + op + "] expects 1 operand, got " + std::to_string(in.size()));
  const TensorType& t = in[0];
  if (t.dtype == DType::boolean)
    throw Error(std::string("[") + op + "] does not take bool operands (" + type_str(t) +
                "); cast to i32 or f32 first");
  const Ints& axes = a.ints("axes");
  std::vector<char> reduced(t.shape.size(), 0);
  for (size_t k = 0; k < axes.size(); ++k) {
    if (axes[k] < 0 || axes[k] >= t.rank() || (k > 0 && axes[k] <= axes[k - 1]))
      throw Error(std::string("[") + op + "] axes " + shape_str(axes) + " must be sorted, unique dims of " +
                  type_str(t));
    reduced[axes[k]] = 1;
  }
  Shape s;
  for (size_t d = 0; d < t.shape.size(); ++d)
    if (!reduced[d]) s.push_back(t.shape[d]);
  DType out = t.dtype;
  if (a.has("out_dtype")) {
    out = a.dtype("out_dtype");
    if (!is_float(out))
      throw Error(std::string("[") + op + "] out_dtype must be f32, bf16 or f16, got " + dtype_name(out));
    if (!is_float(t.dtype))
      throw Error(std::string("[") + op + "] out_dtype needs a float operand, got " + type_str(t) + "; cast it first");
  }
  return {{out, s}};
}

ShardingRule reduce_rule(const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
  ShardingRule r;
  const Ints& axes = a.ints("axes");
  std::vector<int> fi, fo;
  for (size_t d = 0; d < in[0].shape.size(); ++d) {
    int64_t size = in[0].shape[d];
    bool red = std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) != axes.end();
    int f = -1;
    if (size != 1) {
      f = static_cast<int>(r.factor_sizes.size());
      r.factor_sizes.push_back(size);
      r.factor_kinds.push_back(red ? ShardingRule::Kind::reduction : ShardingRule::Kind::parallel);
    }
    fi.push_back(f);
    if (!red) fo.push_back(f);
  }
  r.operands = {fi};
  r.results = {fo};
  return r;
}

Cost reduce_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  Cost c;
  c.flops = static_cast<double>(in[0].numel());
  c.bytes_read = static_cast<double>(in[0].nbytes());
  c.bytes_written = static_cast<double>(out[0].nbytes());
  return c;
}

// The kept dims of an operand of rank r, i.e. where each result dim sits in the operand.
Ints kept_dims(int rank, const Ints& axes) {
  Ints kept;
  for (int d = 0; d < rank; ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) kept.push_back(d);
  return kept;
}

Shape keepdims_shape(const Shape& s, const Ints& axes) {
  Shape k = s;
  for (int64_t a : axes) k[a] = 1;
  return k;
}

Tensor reduce(const char* prim, const char* op, const Tensor& x, const Ints& axes, bool keepdims) {
  Ints ax = normalize_axes(op, axes, x.type());
  Tensor y = ax.empty() ? x : emit1(prim, {x}, Attrs{{"axes", ax}});
  return keepdims ? reshape(y, keepdims_shape(x.shape(), ax)) : y;
}

}  // namespace

Tensor sum(const Tensor& x, const Ints& axes, bool keepdims) { return reduce("reduce_sum", "sum", x, axes, keepdims); }

Tensor max(const Tensor& x, const Ints& axes, bool keepdims) { return reduce("reduce_max", "max", x, axes, keepdims); }

Tensor mean(const Tensor& x, const Ints& axes, bool keepdims) {
  if (!is_float(x.dtype()))
    throw Error("[mean] needs a float operand, got " + type_str(x.type()) + "; cast it to f32 first");
  Ints ax = normalize_axes("mean", axes, x.type());
  int64_t count = 1;
  for (int64_t a : ax) count *= x.shape()[a];
  Tensor s = sum(x, ax, keepdims);
  // An empty reduction divides 0 by 0, giving NaN as numpy does.
  return count == 1 ? s : s / static_cast<double>(count);
}

void register_reduce_primitives() {
  // A split reduced dim leaves partial sums (partial maxima) that an all-reduce combines. Reductions
  // mix a row's features, so a TP column split does not carry through them.
  Primitive sum_p{"reduce_sum",
                  {{"axes", AttrKind::ints}, {"out_dtype", AttrKind::dtype, false}},
                  [](const std::vector<TensorType>& in, const Attrs& a) { return reduce_infer("reduce_sum", in, a); },
                  [](const VjpArgs& v) -> std::vector<Tensor> {
                    const Tensor& ct = v.cotangents[0];
                    if (!ct.defined()) return {Tensor()};
                    const Tensor& x = v.inputs[0];
                    Tensor g = broadcast_in_dim(ct, x.shape(), kept_dims(x.rank(), v.attrs.ints("axes")));
                    return {g.dtype() == x.dtype() ? g : cast(g, x.dtype())};
                  },
                  reduce_rule, reduce_cost};
  sum_p.widens_operands = 1u;  // the kernels sum a 16-bit operand's widened values
  sum_p.spmd.partial = PartialReduce::sum;
  sum_p.spmd.linear = kLinearJointly;
  sum_p.tp.mixes_features = true;
  register_primitive(std::move(sum_p));

  // The cotangent goes to the positions that equal the max, split evenly among ties.
  Primitive max_p{"reduce_max",
                  {{"axes", AttrKind::ints}},
                  [](const std::vector<TensorType>& in, const Attrs& a) { return reduce_infer("reduce_max", in, a); },
                  [](const VjpArgs& v) -> std::vector<Tensor> {
                    const Tensor& ct = v.cotangents[0];
                    if (!ct.defined()) return {Tensor()};
                    const Tensor& x = v.inputs[0];
                    const Ints& axes = v.attrs.ints("axes");
                    Ints kept = kept_dims(x.rank(), axes);
                    Tensor y = broadcast_in_dim(v.outputs[0], x.shape(), kept);
                    Tensor hit = cast(equal(x, y), x.dtype());
                    Tensor count = emit1("reduce_sum", {hit}, Attrs{{"axes", axes}});
                    Tensor share = ct / count;
                    return {hit * broadcast_in_dim(share, x.shape(), kept)};
                  },
                  reduce_rule, reduce_cost};
  max_p.spmd.partial = PartialReduce::max;
  max_p.tp.mixes_features = true;
  register_primitive(std::move(max_p));
}

}  // namespace px
