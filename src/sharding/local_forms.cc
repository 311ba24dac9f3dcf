// Local forms of nodes whose split factor needs this device's position in the mesh: a lookup in
// a row-split (vocab-parallel) table and its gradient, cross entropy over split classes, and
// random draws of a split shape. Each is written with public ops plus all-reduces, so that the
// sharded program gives the unsharded values up to f32 reduction order.
#include <cmath>

#include "parallax/ops.h"
#include "sharding/spmd_internal.h"

namespace px::spmd {

namespace {

bool is_draw(const std::string& name) { return name == "random_uniform" || name == "random_normal"; }
bool is_ce(const std::string& name) { return name == "softmax_cross_entropy" || name == "softmax_cross_entropy_grad"; }

Tensor i32_scalar(int64_t v) { return full({}, static_cast<double>(v), DType::i32); }

// This device's index in its group over `axes` (first axis major), from the coordinates input.
Tensor group_index(const LocalContext& c, const std::vector<int>& axes) {
  Tensor k = i32_scalar(0);
  for (int a : axes)
    k = k * static_cast<double>(c.mesh.axes()[a].size) + reshape(slice_axis(c.coords, 0, a, a + 1), {});
  return k;
}

// The first global index of this device's block of `block` elements along a dim split over axes.
Tensor block_start(const LocalContext& c, const std::vector<int>& axes, int64_t block) {
  return group_index(c, axes) * static_cast<double>(block);
}

// Broadcasts a mask over the leading dims of `like` (the mask's dims come first).
Tensor mask_like(const Tensor& mask, const Tensor& like) {
  std::vector<int64_t> dims(static_cast<size_t>(mask.rank()));
  for (int d = 0; d < mask.rank(); ++d) dims[d] = d;
  return broadcast_in_dim(mask, like.shape(), dims);
}

// Global row indices clamped like take / scatter_add do, then made relative to this device's
// block of `local_rows`; `inside` says which fall in the block (the others read row 0).
struct LocalRows {
  Tensor rel, inside;
};
LocalRows local_rows(const LocalContext& c, const Tensor& idx, int64_t rows, int64_t local_rows,
                     const std::vector<int>& axes) {
  Tensor clamped = minimum(maximum(idx, i32_scalar(0)), i32_scalar(std::max<int64_t>(rows - 1, 0)));
  Tensor rel = clamped - block_start(c, axes, local_rows);
  Tensor inside = logical_and(greater_equal(rel, i32_scalar(0)), less(rel, i32_scalar(local_rows)));
  return {where(inside, rel, zeros_like(rel)), inside};
}

// take(table, idx) with the table's rows split: each device gathers the rows it holds and zeros
// the rest, so the result is a partial sum over the split axes.
Tensor vocab_take(const LocalContext& c, const Node& n, const Graph& g, const std::vector<Tensor>& in,
                  const std::vector<int>& axes) {
  LocalRows r = local_rows(c, in[1], g.type(n.inputs[0]).shape[0], in[0].shape()[0], axes);
  Tensor got = take(in[0], r.rel);
  return where(mask_like(r.inside, got), got, zeros_like(got));
}

// scatter_add(idx, updates) into a row-split result: each device adds the updates that land in
// its block of rows.
Tensor vocab_scatter_add(const LocalContext& c, const Node& n, const Graph& g, const std::vector<Tensor>& in,
                         const TensorType& want, const std::vector<int>& axes) {
  LocalRows r = local_rows(c, in[0], g.type(n.outputs[0]).shape[0], want.shape[0], axes);
  Tensor upd = where(mask_like(r.inside, in[1]), in[1], zeros_like(in[1]));
  return scatter_add(r.rel, upd, want.shape[0]);
}

// Cross entropy (or its gradient) with the class dim split: the row max and the sum of
// exponentials are all-reduced (max, then sum), and the label's logit comes from the device
// that holds it. Ignored labels give 0 and out-of-range labels NaN, as the unsplit kernel does.
Tensor vocab_cross_entropy(const LocalContext& c, const Node& n, const Graph& g, const std::vector<Tensor>& in,
                           const std::vector<int>& axes) {
  const bool grad = n.prim->name == "softmax_cross_entropy_grad";
  const int64_t classes = g.type(n.inputs[0]).shape.back();
  Tensor x = in[0].dtype() == DType::f32 ? in[0] : cast(in[0], DType::f32);
  const int64_t last = x.rank() - 1, local_classes = x.shape().back();
  const Tensor& labels = in[1];
  Tensor m = c.all_reduce(max(x, {last}), axes, "max");
  Tensor ex = exp(x - expand_dims(m, -1));
  Tensor rel = labels - block_start(c, axes, local_classes);
  Tensor hit = equal(iota(x.shape(), static_cast<int>(last), DType::i32), expand_dims(rel, -1));
  Tensor ignored = equal(labels, i32_scalar(n.attrs.i("ignore_index")));
  Tensor bad = logical_and(logical_not(ignored),
                           logical_or(less(labels, i32_scalar(0)), greater_equal(labels, i32_scalar(classes))));
  if (!grad) {
    // One all-reduce for both sums: [..., 2] = (sum of exponentials, the label's logit).
    Tensor xt = sum(where(hit, x, zeros_like(x)), {last});
    Tensor both = c.all_reduce(concat({expand_dims(sum(ex, {last}), -1), expand_dims(xt, -1)}, -1), axes, "sum");
    Tensor e = squeeze(slice_axis(both, last, 0, 1), last), t = squeeze(slice_axis(both, last, 1, 2), last);
    Tensor loss = m + log(e) - t;
    loss = where(ignored, zeros_like(loss), loss);
    return where(bad, full_like(loss, NAN), loss);
  }
  Tensor e = c.all_reduce(sum(ex, {last}), axes, "sum");
  Tensor ct = where(ignored, zeros_like(in[2]), in[2]);
  Tensor y = ex * expand_dims(ct / e, -1);
  y = where(hit, y - expand_dims(ct, -1), y);
  y = where(mask_like(bad, y), full_like(y, NAN), y);
  return in[0].dtype() == DType::f32 ? y : cast(y, in[0].dtype());
}

// A random draw of this device's block: the global shape and the block's origin (per dim, the
// start of its block) let the kernel compute the same values as the unsplit draw.
Tensor local_draw(const LocalContext& c, const Node& n, const Graph& g, const ShardingRule& rule, const FactorAxes& fa,
                  const std::vector<Tensor>& in, const TensorType& want) {
  const Shape& global = g.type(n.outputs[0]).shape;
  std::vector<Tensor> starts;
  for (size_t d = 0; d < global.size(); ++d) {
    int f = rule.results[0][d];
    Tensor s = f >= 0 && !fa[f].empty() ? block_start(c, fa[f], want.shape[d]) : i32_scalar(0);
    starts.push_back(reshape(s, {1}));
  }
  Attrs a = n.attrs;
  a.set("shape", std::vector<int64_t>(want.shape.begin(), want.shape.end()));
  a.set("global_shape", std::vector<int64_t>(global.begin(), global.end()));
  return c.local.emit(*n.prim, {in[0], concat(starts, 0)}, a).at(0);
}

}  // namespace

int positional_factor(const Node& n, const ShardingRule& r) {
  const std::string& name = n.prim->name;
  if (name == "take" && !r.operands[0].empty()) return r.operands[0][0];
  if (name == "scatter_add" && !r.results[0].empty()) return r.results[0][0];
  if (is_ce(name) && !r.operands[0].empty()) return r.operands[0].back();
  return -1;
}

bool needs_local_form(const Node& n, const ShardingRule& r, const FactorAxes& fa) {
  if (is_draw(n.prim->name)) {
    for (int f : r.results[0])
      if (f >= 0 && !fa[f].empty()) return true;
    return false;
  }
  int f = positional_factor(n, r);
  return f >= 0 && !fa[f].empty();
}

std::vector<Tensor> local_form(const LocalContext& c, const Node& n, const Graph& g, const ShardingRule& r,
                               const FactorAxes& fa, const std::vector<Tensor>& in,
                               const std::vector<TensorType>& want) {
  TraceScope scope(&c.local);
  const std::string& name = n.prim->name;
  if (is_draw(name)) return {local_draw(c, n, g, r, fa, in, want[0])};
  const std::vector<int>& axes = fa[positional_factor(n, r)];
  if (name == "take") return {vocab_take(c, n, g, in, axes)};
  if (name == "scatter_add") return {vocab_scatter_add(c, n, g, in, want[0], axes)};
  return {vocab_cross_entropy(c, n, g, in, axes)};
}

}  // namespace px::spmd
