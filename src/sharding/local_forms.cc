// Local forms of nodes whose split factor needs this device's position in the mesh: a lookup in
// a row-split (vocab-parallel) table and its gradient, cross entropy over split classes, and
// random draws of a split shape. Each is written with public ops plus all-reduces, so that the
// sharded program gives the unsharded values up to f32 reduction order. The op families attach
// them to their primitives (SpmdTraits::local_form), which also declare the positional factors.
#include <cmath>

#include "parallax/ops.h"
#include "sharding/spmd_internal.h"

namespace px::spmd {

namespace {

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
Tensor vocab_take(const LocalContext& c, const LocalFormArgs& a, const std::vector<int>& axes) {
  const std::vector<Tensor>& in = a.inputs;
  LocalRows r = local_rows(c, in[1], a.graph.type(a.node.inputs[0]).shape[0], in[0].shape()[0], axes);
  Tensor got = take(in[0], r.rel);
  return where(mask_like(r.inside, got), got, zeros_like(got));
}

// scatter_add(idx, updates) into a row-split result: each device adds the updates that land in
// its block of rows.
Tensor vocab_scatter_add(const LocalContext& c, const LocalFormArgs& a, const std::vector<int>& axes) {
  const std::vector<Tensor>& in = a.inputs;
  const int64_t local = a.want[0].shape[0];
  LocalRows r = local_rows(c, in[0], a.graph.type(a.node.outputs[0]).shape[0], local, axes);
  Tensor upd = where(mask_like(r.inside, in[1]), in[1], zeros_like(in[1]));
  return scatter_add(r.rel, upd, local);
}

// Cross entropy (or its gradient) with the class dim split: the row max and the sum of
// exponentials are all-reduced (max, then sum), and the label's logit comes from the device
// that holds it. Ignored labels give 0 and out-of-range labels NaN, as the unsplit kernel does.
Tensor vocab_cross_entropy(const LocalContext& c, const LocalFormArgs& a, const std::vector<int>& axes, bool grad) {
  const Node& n = a.node;
  const std::vector<Tensor>& in = a.inputs;
  const int64_t classes = a.graph.type(n.inputs[0]).shape.back();
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
Tensor local_draw(const LocalContext& c, const LocalFormArgs& args) {
  const Node& n = args.node;
  const TensorType& want = args.want[0];
  const Shape& global = args.graph.type(n.outputs[0]).shape;
  std::vector<Tensor> starts;
  for (size_t d = 0; d < global.size(); ++d) {
    int f = args.rule.results[0][d];
    const auto& axes = f >= 0 ? args.factor_axes[f] : std::vector<int>{};
    Tensor s = axes.empty() ? i32_scalar(0) : block_start(c, axes, want.shape[d]);
    starts.push_back(reshape(s, {1}));
  }
  Attrs a = n.attrs;
  a.set("shape", std::vector<int64_t>(want.shape.begin(), want.shape.end()));
  a.set("global_shape", std::vector<int64_t>(global.begin(), global.end()));
  return c.local.emit(*n.prim, {args.inputs[0], concat(starts, 0)}, a).at(0);
}

// The mesh axes of the primitive's one positional factor (take, scatter_add, cross entropy).
const std::vector<int>& positional_axes(const LocalFormArgs& a) {
  std::vector<int> fs = positional_factors(*a.node.prim, a.rule, a.node.attrs);
  if (fs.size() != 1)
    throw Error("[partition] internal: the local form of '" + a.node.prim->name + "' expects one positional factor");
  return a.factor_axes[fs[0]];
}

}  // namespace

std::vector<Tensor> take_local_form(const LocalContext& c, const LocalFormArgs& a) {
  return {vocab_take(c, a, positional_axes(a))};
}

std::vector<Tensor> scatter_add_local_form(const LocalContext& c, const LocalFormArgs& a) {
  return {vocab_scatter_add(c, a, positional_axes(a))};
}

std::vector<Tensor> cross_entropy_local_form(const LocalContext& c, const LocalFormArgs& a) {
  return {vocab_cross_entropy(c, a, positional_axes(a), false)};
}

std::vector<Tensor> cross_entropy_grad_local_form(const LocalContext& c, const LocalFormArgs& a) {
  return {vocab_cross_entropy(c, a, positional_axes(a), true)};
}

std::vector<Tensor> draw_local_form(const LocalContext& c, const LocalFormArgs& a) { return {local_draw(c, a)}; }

bool needs_local_form(const Node& n, const ShardingRule& r, const FactorAxes& fa) {
  for (int f : positional_factors(*n.prim, r, n.attrs))
    if (!fa[f].empty()) return true;
  return false;
}

std::vector<Tensor> local_form(const LocalContext& c, const Node& n, const Graph& g, const ShardingRule& r,
                               const FactorAxes& fa, const std::vector<Tensor>& in,
                               const std::vector<TensorType>& want) {
  if (!n.prim->spmd.local_form)
    throw Error("[partition] primitive '" + n.prim->name +
                "' declares positional factors but no local form (SpmdTraits::local_form) to emit its split");
  TraceScope scope(&c.local);
  return n.prim->spmd.local_form(c, LocalFormArgs{n, g, r, fa, in, want});
}

}  // namespace px::spmd
