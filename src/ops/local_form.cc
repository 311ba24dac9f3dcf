// Helpers for the primitives' local forms (local_form.h).
#include "ops/local_form.h"

#include <algorithm>

#include "parallax/ops.h"

namespace px::local_form {

Tensor i32_scalar(int64_t v) { return full({}, static_cast<double>(v), DType::i32); }

Tensor block_start(const spmd::LocalContext& c, const std::vector<int>& axes, int64_t block) {
  Tensor k = i32_scalar(0);
  for (int a : axes)
    k = k * static_cast<double>(c.axis_sizes.at(a)) + reshape(slice_axis(c.coords, 0, a, a + 1), {});
  return k * static_cast<double>(block);
}

Tensor mask_like(const Tensor& mask, const Tensor& like) {
  std::vector<int64_t> dims(static_cast<size_t>(mask.rank()));
  for (int d = 0; d < mask.rank(); ++d) dims[d] = d;
  return broadcast_in_dim(mask, like.shape(), dims);
}

LocalRows local_rows(const spmd::LocalContext& c, const Tensor& idx, int64_t rows, int64_t local_rows,
                     const std::vector<int>& axes) {
  Tensor clamped = minimum(maximum(idx, i32_scalar(0)), i32_scalar(std::max<int64_t>(rows - 1, 0)));
  Tensor rel = clamped - block_start(c, axes, local_rows);
  Tensor inside = logical_and(greater_equal(rel, i32_scalar(0)), less(rel, i32_scalar(local_rows)));
  return {where(inside, rel, zeros_like(rel)), inside};
}

const std::vector<int>& positional_axes(const LocalFormArgs& a) {
  std::vector<int> fs = positional_factors(*a.node.prim, a.rule, a.node.attrs);
  if (fs.size() != 1)
    throw Error("[partition] internal: the local form of '" + a.node.prim->name + "' expects one positional factor");
  return a.factor_axes[fs[0]];
}

}  // namespace px::local_form
