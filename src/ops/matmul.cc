// Primitives of the matmul family: dot_general (XLA-style contraction with batch dims) and the
// public dot_general / matmul ops built on it.
#include <algorithm>
#include <numeric>

#include "ir/primitive.h"
#include "parallax/ops.h"

namespace px {

namespace {

constexpr const char* kDot = "dot_general";

std::string dims_str(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + ")";
}

// The dims of a rank-r operand that are neither batch nor contracting, ascending.
std::vector<int64_t> free_dims(int rank, const std::vector<int64_t>& batch, const std::vector<int64_t>& contract) {
  std::vector<int64_t> f;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(batch.begin(), batch.end(), d) == batch.end() &&
        std::find(contract.begin(), contract.end(), d) == contract.end())
      f.push_back(d);
  return f;
}

void check_side(const char* side, const TensorType& t, const std::vector<int64_t>& batch,
                const std::vector<int64_t>& contract) {
  std::vector<char> seen(t.rank(), 0);
  for (const auto* list : {&batch, &contract})
    for (int64_t d : *list) {
      if (d < 0 || d >= t.rank())
        throw Error(std::string("[dot_general] ") + side + " dim " + std::to_string(d) + " is out of range for " +
                    side + " " + type_str(t));
      if (seen[d]++)
        throw Error(std::string("[dot_general] ") + side + " dim " + std::to_string(d) +
                    " is listed twice among batch " + dims_str(batch) + " and contracting " + dims_str(contract) +
                    " dims of " + side + " " + type_str(t));
    }
}

struct DotAttrs {
  std::vector<int64_t> lc, rc, lb, rb;
};
DotAttrs dot_attrs(const Attrs& a) {
  return {a.ints("lhs_contract"), a.ints("rhs_contract"), a.ints("lhs_batch"), a.ints("rhs_batch")};
}

std::vector<TensorType> infer_dot(const std::vector<TensorType>& in, const Attrs& attrs) {
  if (in.size() != 2) throw Error("[dot_general] takes 2 operands, got " + std::to_string(in.size()));
  const TensorType &l = in[0], &r = in[1];
  DotAttrs d = dot_attrs(attrs);
  if (!is_float(l.dtype) || !is_float(r.dtype))
    throw Error("[dot_general] operands must be floating point, got lhs " + type_str(l) + " and rhs " + type_str(r));
  if (l.dtype != r.dtype)
    throw Error("[dot_general] operand dtypes differ: lhs " + type_str(l) + ", rhs " + type_str(r) +
                "; cast one of them first");
  if (d.lb.size() != d.rb.size())
    throw Error("[dot_general] lhs has " + std::to_string(d.lb.size()) + " batch dims " + dims_str(d.lb) +
                " but rhs has " + std::to_string(d.rb.size()) + " " + dims_str(d.rb));
  if (d.lc.size() != d.rc.size())
    throw Error("[dot_general] lhs has " + std::to_string(d.lc.size()) + " contracting dims " + dims_str(d.lc) +
                " but rhs has " + std::to_string(d.rc.size()) + " " + dims_str(d.rc));
  check_side("lhs", l, d.lb, d.lc);
  check_side("rhs", r, d.rb, d.rc);
  for (size_t i = 0; i < d.lc.size(); ++i)
    if (l.shape[d.lc[i]] != r.shape[d.rc[i]])
      throw Error("[dot_general] contracting dims disagree: lhs " + type_str(l) + " dim " + std::to_string(d.lc[i]) +
                  " has " + std::to_string(l.shape[d.lc[i]]) + ", rhs " + type_str(r) + " dim " +
                  std::to_string(d.rc[i]) + " has " + std::to_string(r.shape[d.rc[i]]));
  for (size_t i = 0; i < d.lb.size(); ++i)
    if (l.shape[d.lb[i]] != r.shape[d.rb[i]])
      throw Error("[dot_general] batch dims disagree: lhs " + type_str(l) + " dim " + std::to_string(d.lb[i]) +
                  " has " + std::to_string(l.shape[d.lb[i]]) + ", rhs " + type_str(r) + " dim " +
                  std::to_string(d.rb[i]) + " has " + std::to_string(r.shape[d.rb[i]]));
  DType out = attrs.has("dtype") ? attrs.dtype("dtype") : l.dtype;
  if (!is_float(out)) throw Error(std::string("[dot_general] result dtype must be floating point, got ") + dtype_name(out));
  TensorType t{out, {}};
  for (int64_t b : d.lb) t.shape.push_back(l.shape[b]);
  for (int64_t f : free_dims(l.rank(), d.lb, d.lc)) t.shape.push_back(l.shape[f]);
  for (int64_t f : free_dims(r.rank(), d.rb, d.rc)) t.shape.push_back(r.shape[f]);
  return {t};
}

// batch and free dims are parallel, contracting dims leave partial sums; size-1 dims take no part.
ShardingRule dot_sharding(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& attrs) {
  DotAttrs d = dot_attrs(attrs);
  const TensorType &l = in[0], &r = in[1];
  ShardingRule rule;
  rule.operands = {std::vector<int>(l.rank(), -1), std::vector<int>(r.rank(), -1)};
  rule.results = {std::vector<int>(out[0].rank(), -1)};
  auto factor = [&](int64_t size, ShardingRule::Kind kind) {
    if (size == 1) return -1;
    rule.factor_sizes.push_back(size);
    rule.factor_kinds.push_back(kind);
    return static_cast<int>(rule.factor_sizes.size()) - 1;
  };
  size_t o = 0;
  for (size_t i = 0; i < d.lb.size(); ++i) {
    int f = factor(l.shape[d.lb[i]], ShardingRule::Kind::parallel);
    rule.operands[0][d.lb[i]] = rule.operands[1][d.rb[i]] = rule.results[0][o++] = f;
  }
  for (int64_t fd : free_dims(l.rank(), d.lb, d.lc))
    rule.operands[0][fd] = rule.results[0][o++] = factor(l.shape[fd], ShardingRule::Kind::parallel);
  for (int64_t fd : free_dims(r.rank(), d.rb, d.rc))
    rule.operands[1][fd] = rule.results[0][o++] = factor(r.shape[fd], ShardingRule::Kind::parallel);
  for (size_t i = 0; i < d.lc.size(); ++i)
    rule.operands[0][d.lc[i]] = rule.operands[1][d.rc[i]] = factor(l.shape[d.lc[i]], ShardingRule::Kind::reduction);
  return rule;
}

Cost dot_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& attrs) {
  DotAttrs d = dot_attrs(attrs);
  double k = 1;
  for (int64_t c : d.lc) k *= static_cast<double>(in[0].shape[c]);
  Cost c = default_cost(in, out);
  c.flops = 2.0 * static_cast<double>(out[0].numel()) * k;
  c.matmul_flops = c.flops;
  return c;
}

Attrs make_dot_attrs(const DotDims& d, DType out) {
  return Attrs{{"lhs_contract", d.lhs_contract},
               {"rhs_contract", d.rhs_contract},
               {"lhs_batch", d.lhs_batch},
               {"rhs_batch", d.rhs_batch},
               {"dtype", out}};
}

// Permutation that moves the dims of an operand, listed in `order` as they appear in a
// dot_general result, back to the operand's own order (identity perms are skipped).
Tensor to_operand_layout(const Tensor& t, const std::vector<int64_t>& order) {
  std::vector<int64_t> perm(order.size());
  for (size_t pos = 0; pos < order.size(); ++pos) perm[order[pos]] = static_cast<int64_t>(pos);
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  return identity ? t : transpose(t, perm);
}

std::vector<Tensor> dot_vjp(const VjpArgs& a) {
  DotAttrs d = dot_attrs(a.attrs);
  const Tensor &x = a.inputs[0], &y = a.inputs[1];
  Tensor ct = a.cotangents[0];
  if (!ct.defined()) return {Tensor(), Tensor()};
  if (ct.dtype() != x.dtype()) ct = cast(ct, x.dtype());
  const int64_t nb = static_cast<int64_t>(d.lb.size());
  std::vector<int64_t> lf = free_dims(x.rank(), d.lb, d.lc), rf = free_dims(y.rank(), d.rb, d.rc);
  std::vector<int64_t> ct_batch(nb), ct_lf(lf.size()), ct_rf(rf.size());
  std::iota(ct_batch.begin(), ct_batch.end(), 0);
  std::iota(ct_lf.begin(), ct_lf.end(), nb);
  std::iota(ct_rf.begin(), ct_rf.end(), nb + static_cast<int64_t>(lf.size()));

  // The x contracting dims paired with y's contracting dims in ascending y order, and vice versa.
  auto paired = [](const std::vector<int64_t>& own, const std::vector<int64_t>& other) {
    std::vector<int64_t> sorted = other, r;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t o : sorted) r.push_back(own[std::find(other.begin(), other.end(), o) - other.begin()]);
    return r;
  };
  auto cat = [](std::vector<int64_t> a, const std::vector<int64_t>& b, const std::vector<int64_t>& c) {
    a.insert(a.end(), b.begin(), b.end());
    a.insert(a.end(), c.begin(), c.end());
    return a;
  };
  auto is_identity = [](const std::vector<int64_t>& v) {
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] != static_cast<int64_t>(i)) return false;
    return true;
  };
  const std::vector<int64_t> xc_by_y = paired(d.lc, d.rc), yc_by_x = paired(d.rc, d.lc);

  // dx contracts ct with y over y's free dims. ct . y yields [batch, x free, x contracting];
  // y . ct yields [batch, x contracting, x free]: pick the one already in x's layout.
  Tensor dx;
  std::vector<int64_t> x_order = cat(d.lb, lf, xc_by_y);
  if (!is_identity(x_order) && is_identity(cat(d.lb, xc_by_y, lf))) {
    x_order = cat(d.lb, xc_by_y, lf);
    dx = dot_general(y, ct, DotDims{rf, ct_rf, d.rb, ct_batch}, x.dtype());
  } else {
    dx = dot_general(ct, y, DotDims{ct_rf, rf, ct_batch, d.rb}, x.dtype());
  }
  // dy contracts x with ct over x's free dims, likewise in either order.
  Tensor dy;
  std::vector<int64_t> y_order = cat(d.rb, yc_by_x, rf);
  if (!is_identity(y_order) && is_identity(cat(d.rb, rf, yc_by_x))) {
    y_order = cat(d.rb, rf, yc_by_x);
    dy = dot_general(ct, x, DotDims{ct_lf, lf, ct_batch, d.lb}, y.dtype());
  } else {
    dy = dot_general(x, ct, DotDims{lf, ct_lf, d.lb, ct_batch}, y.dtype());
  }

  return {to_operand_layout(dx, x_order), to_operand_layout(dy, y_order)};
}

}  // namespace

Tensor dot_general(const Tensor& a, const Tensor& b, const DotDims& dims, std::optional<DType> out_dtype) {
  if (!a.defined() || !b.defined()) throw Error("[dot_general] operand is an undefined tensor");
  auto norm = [](const std::vector<int64_t>& v, int rank) {
    std::vector<int64_t> r;
    for (int64_t x : v) r.push_back(x < 0 ? x + rank : x);
    return r;
  };
  DotDims d{norm(dims.lhs_contract, a.rank()), norm(dims.rhs_contract, b.rank()), norm(dims.lhs_batch, a.rank()),
            norm(dims.rhs_batch, b.rank())};
  return emit1(kDot, {a, b}, make_dot_attrs(d, out_dtype.value_or(a.dtype())));
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) throw Error("[matmul] operand is an undefined tensor");
  if (a.rank() < 2 || b.rank() < 2)
    throw Error("[matmul] operands need rank >= 2 (a[..., m, k] @ b[..., k, n]), got " + type_str(a.type()) +
                " and " + type_str(b.type()));
  const int ra = a.rank(), rb = b.rank();
  if (a.shape()[ra - 1] != b.shape()[rb - 2])
    throw Error("[matmul] contracting dims disagree: lhs " + type_str(a.type()) + " dim " + std::to_string(ra - 1) +
                " has " + std::to_string(a.shape()[ra - 1]) + ", rhs " + type_str(b.type()) + " dim " +
                std::to_string(rb - 2) + " has " + std::to_string(b.shape()[rb - 2]));
  if (a.dtype() != b.dtype())
    throw Error("[matmul] operand dtypes differ: " + type_str(a.type()) + " and " + type_str(b.type()));
  if (rb == 2) return dot_general(a, b, DotDims{{ra - 1}, {0}, {}, {}});  // shared weight: leading dims fold into m
  if (ra == 2) {
    // a[m,k] @ b[..., k, n]: contract, then move m behind the batch dims.
    Tensor r = dot_general(a, b, DotDims{{1}, {rb - 2}, {}, {}});  // [m, ..., n]
    std::vector<int64_t> perm;
    for (int i = 1; i < rb - 1; ++i) perm.push_back(i);
    perm.push_back(0);
    perm.push_back(rb - 1);
    return transpose(r, perm);
  }
  // Numpy broadcasting of the batch dims.
  const Shape as = a.shape(), bs = b.shape();  // shape() returns a copy: iterate one object
  Shape ba(as.begin(), as.end() - 2), bb(bs.begin(), bs.end() - 2);
  size_t nb = std::max(ba.size(), bb.size());
  Shape batch(nb);
  for (size_t i = 0; i < nb; ++i) {
    int64_t x = i < nb - ba.size() ? 1 : ba[i - (nb - ba.size())];
    int64_t y = i < nb - bb.size() ? 1 : bb[i - (nb - bb.size())];
    if (x != y && x != 1 && y != 1)
      throw Error("[matmul] batch dims do not broadcast: " + type_str(a.type()) + " and " + type_str(b.type()));
    batch[i] = std::max(x, y);
  }
  auto widen = [&](const Tensor& t) {
    Shape s = batch;
    s.push_back(t.shape()[t.rank() - 2]);
    s.push_back(t.shape()[t.rank() - 1]);
    return s == t.shape() ? t : broadcast_to(t, s);
  };
  Tensor aa = widen(a), bbt = widen(b);
  const int64_t n = static_cast<int64_t>(nb);
  std::vector<int64_t> bd(nb);
  std::iota(bd.begin(), bd.end(), 0);
  return dot_general(aa, bbt, DotDims{{n + 1}, {n}, bd, bd});
}

void register_matmul_primitives() {
  Primitive p;
  p.name = kDot;
  p.attrs = {{"lhs_contract", AttrKind::ints},
             {"rhs_contract", AttrKind::ints},
             {"lhs_batch", AttrKind::ints},
             {"rhs_batch", AttrKind::ints},
             {"dtype", AttrKind::dtype, false}};  // the result's dtype; default: the operands'
  p.infer = infer_dot;
  p.vjp = dot_vjp;
  p.sharding = dot_sharding;
  p.cost = dot_cost;
  // A split contracting dim leaves partial sums; the product is linear in each operand alone.
  p.spmd.partial = PartialReduce::sum;
  p.spmd.linear = {Linearity::In::any_one, false};
  register_primitive(std::move(p));
}

}  // namespace px
