// Primitives of the index family: take (row gather, e.g. embedding lookup), scatter_add (its
// gradient) and one_hot. Out-of-range indices are clamped to [0, rows - 1] by take and
// scatter_add alike, so that scatter_add stays the exact vjp of take; one_hot gives a zero row.
#include "ir/primitive.h"
#include "parallax/ops.h"
#include "ops/local_form.h"

namespace px {

namespace {

using Kind = ShardingRule::Kind;

void expect_indices(const char* op, const TensorType& t) {
  if (t.dtype != DType::i32)
    throw Error(std::string("[") + op + "] indices must be i32, got " + type_str(t) +
                (is_float(t.dtype) ? "; cast them to i32 first" : ""));
}

int add_factor(ShardingRule& r, int64_t size, Kind k) {
  if (size == 1) return -1;
  r.factor_sizes.push_back(size);
  r.factor_kinds.push_back(k);
  return static_cast<int>(r.factor_sizes.size()) - 1;
}

// ---- take -------------------------------------------------------------------------------------

std::vector<TensorType> take_infer(const std::vector<TensorType>& in, const Attrs&) {
  if (in.size() != 2) throw Error("[take] expects 2 operands (table, indices), got " + std::to_string(in.size()));
  const TensorType& table = in[0];
  expect_indices("take", in[1]);
  if (table.rank() < 1) throw Error("[take] the table must have rank >= 1, got " + type_str(table));
  Shape s = in[1].shape;
  s.insert(s.end(), table.shape.begin() + 1, table.shape.end());
  if (table.shape[0] == 0 && numel(s) > 0)
    throw Error("[take] the table " + type_str(table) + " has no rows to take from (indices " + type_str(in[1]) + ")");
  return {{table.dtype, s}};
}

// Index dims and row dims are parallel; the gathered dim must be whole.
ShardingRule take_rule(const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
  ShardingRule r;
  std::vector<int> ft{add_factor(r, in[0].shape[0], Kind::whole)}, fi, fo;
  for (int64_t d : in[1].shape) fi.push_back(add_factor(r, d, Kind::parallel));
  fo = fi;
  for (int d = 1; d < in[0].rank(); ++d) {
    ft.push_back(add_factor(r, in[0].shape[d], Kind::parallel));
    fo.push_back(ft.back());
  }
  r.operands = {ft, fi};
  r.results = {fo};
  return r;
}

Cost take_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  Cost c;  // reads only the rows it gathers
  c.bytes_read = static_cast<double>(in[1].nbytes() + out[0].nbytes());
  c.bytes_written = static_cast<double>(out[0].nbytes());
  return c;
}

// ---- scatter_add ------------------------------------------------------------------------------

std::vector<TensorType> scatter_add_infer(const std::vector<TensorType>& in, const Attrs& a) {
  if (in.size() != 2)
    throw Error("[scatter_add] expects 2 operands (indices, updates), got " + std::to_string(in.size()));
  const TensorType& idx = in[0];
  const TensorType& upd = in[1];
  expect_indices("scatter_add", idx);
  if (upd.dtype == DType::boolean) throw Error("[scatter_add] updates must be float or i32, got " + type_str(upd));
  int64_t rows = a.i("num_rows");
  if (rows < 0) throw Error("[scatter_add] num_rows " + std::to_string(rows) + " must be non-negative");
  bool prefix = upd.rank() >= idx.rank();
  for (int d = 0; prefix && d < idx.rank(); ++d) prefix = upd.shape[d] == idx.shape[d];
  if (!prefix)
    throw Error("[scatter_add] updates " + type_str(upd) + " must have the indices' shape " + shape_str(idx.shape) +
                " as leading dims");
  if (rows == 0 && upd.numel() > 0)
    throw Error("[scatter_add] num_rows is 0 but there are " + std::to_string(idx.numel()) + " indices to add at");
  Shape s{rows};
  s.insert(s.end(), upd.shape.begin() + idx.rank(), upd.shape.end());
  return {{upd.dtype, s}};
}

// Sharding the index dims leaves partial sums of the result (reduction factors).
ShardingRule scatter_add_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  ShardingRule r;
  std::vector<int> fi, fu, fo{add_factor(r, out[0].shape[0], Kind::whole)};
  for (int64_t d : in[0].shape) fi.push_back(add_factor(r, d, Kind::reduction));
  fu = fi;
  for (int d = in[0].rank(); d < in[1].rank(); ++d) {
    fu.push_back(add_factor(r, in[1].shape[d], Kind::parallel));
    fo.push_back(fu.back());
  }
  r.operands = {fi, fu};
  r.results = {fo};
  return r;
}

Cost scatter_add_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  Cost c;
  c.flops = static_cast<double>(in[1].numel());
  c.bytes_read = static_cast<double>(in[0].nbytes() + in[1].nbytes());
  c.bytes_written = static_cast<double>(out[0].nbytes());
  return c;
}

// ---- one_hot ----------------------------------------------------------------------------------

std::vector<TensorType> one_hot_infer(const std::vector<TensorType>& in, const Attrs& a) {
  if (in.size() != 1) throw Error("[one_hot] expects 1 operand (indices), got " + std::to_string(in.size()));
  expect_indices("one_hot", in[0]);
  int64_t depth = a.i("depth");
  if (depth < 0) throw Error("[one_hot] depth " + std::to_string(depth) + " must be non-negative");
  Shape s = in[0].shape;
  s.push_back(depth);
  return {{a.dtype("dtype"), s}};
}

// The depth dim is whole: a shard of it would need its offset to compare against.
ShardingRule one_hot_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  ShardingRule r;
  std::vector<int> fi;
  for (int64_t d : in[0].shape) fi.push_back(add_factor(r, d, Kind::parallel));
  std::vector<int> fo = fi;
  fo.push_back(add_factor(r, out[0].shape.back(), Kind::whole));
  r.operands = {fi};
  r.results = {fo};
  return r;
}

}  // namespace

Tensor take(const Tensor& table, const Tensor& indices) { return emit1("take", {table, indices}); }

Tensor scatter_add(const Tensor& indices, const Tensor& updates, int64_t num_rows) {
  return emit1("scatter_add", {indices, updates}, Attrs{{"num_rows", num_rows}});
}

Tensor one_hot(const Tensor& indices, int64_t depth, DType dtype) {
  return emit1("one_hot", {indices}, Attrs{{"depth", depth}, {"dtype", dtype}});
}

namespace {

// take(table, idx) with the table's rows split: each device gathers the rows it holds and zeros
// the rest, so the result is a partial sum over the split axes.
std::vector<Tensor> take_local_form(const spmd::LocalContext& c, const LocalFormArgs& a) {
  const std::vector<Tensor>& in = a.inputs;
  local_form::LocalRows r = local_form::local_rows(c, in[1], a.graph.type(a.node.inputs[0]).shape[0],
                                                   in[0].shape()[0], local_form::positional_axes(a));
  Tensor got = take(in[0], r.rel);
  return {where(local_form::mask_like(r.inside, got), got, zeros_like(got))};
}

// scatter_add(idx, updates) into a row-split result: each device adds the updates that land in
// its block of rows.
std::vector<Tensor> scatter_add_local_form(const spmd::LocalContext& c, const LocalFormArgs& a) {
  const std::vector<Tensor>& in = a.inputs;
  const int64_t local = a.want[0].shape[0];
  local_form::LocalRows r = local_form::local_rows(c, in[0], a.graph.type(a.node.outputs[0]).shape[0], local,
                                                   local_form::positional_axes(a));
  Tensor upd = where(local_form::mask_like(r.inside, in[1]), in[1], zeros_like(in[1]));
  return {scatter_add(r.rel, upd, local)};
}

}  // namespace

void register_index_primitives() {
  // A row-split table (vocab-parallel embedding): each device looks up the rows it holds and
  // zeros the others, leaving partial sums. The rows yield their mesh axis to the indices' batch
  // dims, so that data-parallel lookups stay local.
  Primitive take_p{"take", {}, take_infer,
                   [](const VjpArgs& v) -> std::vector<Tensor> {
                     const Tensor& ct = v.cotangents[0];
                     if (!ct.defined()) return {Tensor(), Tensor()};
                     return {scatter_add(v.inputs[1], ct, v.inputs[0].shape()[0]), Tensor()};
                   },
                   take_rule, take_cost};
  take_p.spmd.partial = PartialReduce::sum;
  take_p.spmd.positional = {[](const ShardingRule& r, const Attrs&) {
                              return r.operands.at(0).empty() ? std::vector<int>{} : std::vector<int>{r.operands[0][0]};
                            },
                            ShardingRule::Kind::reduction, true};
  take_p.spmd.local_form = take_local_form;
  register_primitive(std::move(take_p));

  // Split update rows leave partial sums; a row-split result keeps the updates landing in its rows.
  Primitive scatter_p{"scatter_add", {{"num_rows", AttrKind::integer}}, scatter_add_infer,
                      [](const VjpArgs& v) -> std::vector<Tensor> {
                        const Tensor& ct = v.cotangents[0];
                        if (!ct.defined()) return {Tensor(), Tensor()};
                        return {Tensor(), take(ct, v.inputs[0])};
                      },
                      scatter_add_rule, scatter_add_cost};
  scatter_p.spmd.partial = PartialReduce::sum;
  scatter_p.spmd.positional = {
      [](const ShardingRule& r, const Attrs&) {
        return r.results.at(0).empty() ? std::vector<int>{} : std::vector<int>{r.results[0][0]};
      },
      ShardingRule::Kind::parallel, true};
  scatter_p.spmd.local_form = scatter_add_local_form;
  register_primitive(std::move(scatter_p));

  register_primitive({"one_hot", {{"depth", AttrKind::integer}, {"dtype", AttrKind::dtype}}, one_hot_infer, nullptr,
                      one_hot_rule, nullptr});
}

}  // namespace px
