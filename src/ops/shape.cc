// Primitives of the shape family: reshape, transpose, slice, concat, pad; and the public ops
// built on them (swap_axes, slice_axis, split, expand_dims, squeeze).
#include <algorithm>
#include <array>
#include <functional>
#include <numeric>

#include "ir/primitive.h"
#include "parallax/ops.h"

namespace px {

namespace {

using Kind = ShardingRule::Kind;
using Ints = std::vector<int64_t>;

std::string ints_str(const Ints& v) { return shape_str(v); }

// Adds factors to a ShardingRule; size-1 dims take no part (-1).
struct RuleBuilder {
  ShardingRule r;
  int factor(int64_t size, Kind k) {
    if (size == 1) return -1;
    r.factor_sizes.push_back(size);
    r.factor_kinds.push_back(k);
    return static_cast<int>(r.factor_sizes.size()) - 1;
  }
};

// Shape ops move bytes and do no arithmetic.
Cost copy_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  Cost c;
  for (auto& t : in) c.bytes_read += static_cast<double>(t.nbytes());
  for (auto& t : out) c.bytes_written += static_cast<double>(t.nbytes());
  return c;
}

void expect_operands(const char* op, const std::vector<TensorType>& in, size_t n) {
  if (in.size() != n)
    throw Error(std::string("[") + op + "] expects " + std::to_string(n) + " operand(s), got " +
                std::to_string(in.size()));
}

// Attribute list of length rank, or the default when absent (used for optional strides/interior).
Ints ints_or(const Attrs& a, const std::string& k, size_t rank, int64_t dflt) {
  return a.has(k) ? a.ints(k) : Ints(rank, dflt);
}

void check_len(const char* op, const char* what, const Ints& v, const TensorType& t) {
  if (v.size() != t.shape.size())
    throw Error(std::string("[") + op + "] " + what + " " + ints_str(v) + " has " + std::to_string(v.size()) +
                " entries but the operand " + type_str(t) + " has rank " + std::to_string(t.rank()));
}

// Slice's (starts, limits, strides) or pad's (lo, hi, interior): one entry per dim of the operand,
// each checked; the third is optional, `dflt` in every dim when absent.
std::array<Ints, 3> dim_lists(const char* op, const TensorType& t, const Attrs& a, std::array<const char*, 3> keys,
                              int64_t dflt) {
  std::array<Ints, 3> v{a.ints(keys[0]), a.ints(keys[1]), ints_or(a, keys[2], t.shape.size(), dflt)};
  for (size_t i = 0; i < 3; ++i) check_len(op, keys[i], v[i], t);
  return v;
}

// Dims for which `kept(d)` holds (taken whole, unpadded) stay parallel; the others need the whole input.
ShardingRule kept_dims_rule(const Shape& s, const Shape& out, const std::function<bool(size_t)>& kept) {
  RuleBuilder b;
  std::vector<int> fi, fo;
  for (size_t d = 0; d < s.size(); ++d) {
    if (kept(d)) {
      fi.push_back(b.factor(s[d], Kind::parallel));
      fo.push_back(fi.back());
    } else {
      fi.push_back(b.factor(s[d], Kind::whole));
      fo.push_back(b.factor(out[d], Kind::whole));
    }
  }
  b.r.operands = {fi};
  b.r.results = {fo};
  return b.r;
}

// ---- reshape ----------------------------------------------------------------------------------

std::vector<TensorType> reshape_infer(const std::vector<TensorType>& in, const Attrs& a) {
  expect_operands("reshape", in, 1);
  const Ints& shape = a.ints("shape");
  for (int64_t d : shape)
    if (d < 0) throw Error("[reshape] target shape " + ints_str(shape) + " has a negative dim");
  if (numel(shape) != in[0].numel())
    throw Error("[reshape] cannot reshape " + type_str(in[0]) + " (" + std::to_string(in[0].numel()) +
                " elements) to " + ints_str(shape) + " (" + std::to_string(numel(shape)) + " elements)");
  return {{in[0].dtype, shape}};
}

// Reshape merges or splits groups of dims. A block split of a group's major input dim into n
// parts is the same as one of its major output dim when n divides both, so those two share a
// parallel factor of size gcd(in, out); the other dims of the group are whole. Dims that map one
// to one are thus parallel, and [B*S, D] <-> [B, S, D] or [S, H*Dh] <-> [S, H, Dh] shard cleanly.
ShardingRule reshape_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
  RuleBuilder b;
  const Shape& s = in[0].shape;
  const Shape& t = out[0].shape;
  std::vector<int> fi(s.size(), -1), fo(t.size(), -1);
  if (numel(s) == 0) {
    for (size_t i = 0; i < s.size(); ++i) fi[i] = b.factor(s[i], Kind::whole);
    for (size_t j = 0; j < t.size(); ++j) fo[j] = b.factor(t[j], Kind::whole);
  } else {
    size_t i = 0, j = 0;
    while (i < s.size() && j < t.size()) {
      if (s[i] == 1) {
        ++i;
        continue;
      }
      if (t[j] == 1) {
        ++j;
        continue;
      }
      size_t i0 = i, j0 = j;
      int64_t pi = s[i++], pj = t[j++];
      while (pi != pj) {
        if (pi < pj)
          pi *= s[i++];
        else
          pj *= t[j++];
      }
      int64_t g = std::gcd(s[i0], t[j0]);
      if (g > 1) {
        fi[i0] = fo[j0] = b.factor(g, Kind::parallel);
      } else {
        fi[i0] = b.factor(s[i0], Kind::whole);
        fo[j0] = b.factor(t[j0], Kind::whole);
      }
      for (size_t k = i0 + 1; k < i; ++k) fi[k] = b.factor(s[k], Kind::whole);
      for (size_t k = j0 + 1; k < j; ++k) fo[k] = b.factor(t[k], Kind::whole);
    }
  }
  b.r.operands = {fi};
  b.r.results = {fo};
  return b.r;
}

// ---- transpose --------------------------------------------------------------------------------

void check_perm(const Ints& perm, const TensorType& t) {
  bool ok = perm.size() == t.shape.size();
  std::vector<char> seen(t.shape.size(), 0);
  for (int64_t p : perm) {
    if (!ok) break;
    ok = p >= 0 && p < t.rank() && !seen[p];
    if (ok) seen[p] = 1;
  }
  if (!ok)
    throw Error("[transpose] perm " + ints_str(perm) + " is not a permutation of the " + std::to_string(t.rank()) +
                " axes of " + type_str(t));
}

std::vector<TensorType> transpose_infer(const std::vector<TensorType>& in, const Attrs& a) {
  expect_operands("transpose", in, 1);
  const Ints& perm = a.ints("perm");
  check_perm(perm, in[0]);
  Shape s;
  for (int64_t p : perm) s.push_back(in[0].shape[p]);
  return {{in[0].dtype, s}};
}

ShardingRule transpose_rule(const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
  RuleBuilder b;
  std::vector<int> fi;
  for (int64_t d : in[0].shape) fi.push_back(b.factor(d, Kind::parallel));
  std::vector<int> fo;
  for (int64_t p : a.ints("perm")) fo.push_back(fi[p]);
  b.r.operands = {fi};
  b.r.results = {fo};
  return b.r;
}

// ---- slice ------------------------------------------------------------------------------------

int64_t slice_len(int64_t start, int64_t limit, int64_t stride) {
  return limit > start ? (limit - start + stride - 1) / stride : 0;
}

std::vector<TensorType> slice_infer(const std::vector<TensorType>& in, const Attrs& a) {
  expect_operands("slice", in, 1);
  const TensorType& t = in[0];
  auto [starts, limits, strides] = dim_lists("slice", t, a, {"starts", "limits", "strides"}, 1);
  Shape s;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (starts[d] < 0 || starts[d] > limits[d] || limits[d] > t.shape[d])
      throw Error("[slice] dim " + std::to_string(d) + " of " + type_str(t) + ": start " + std::to_string(starts[d]) +
                  " and limit " + std::to_string(limits[d]) +
                  " must satisfy 0 <= start <= limit <= " + std::to_string(t.shape[d]));
    if (strides[d] < 1)
      throw Error("[slice] dim " + std::to_string(d) + " of " + type_str(t) + ": stride " + std::to_string(strides[d]) +
                  " must be >= 1");
    s.push_back(slice_len(starts[d], limits[d], strides[d]));
  }
  return {{t.dtype, s}};
}

// Dims taken whole (start 0, full limit, stride 1) stay parallel; cut dims need the whole input.
ShardingRule slice_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
  const Shape& s = in[0].shape;
  Ints strides = ints_or(a, "strides", s.size(), 1);
  return kept_dims_rule(s, out[0].shape, [&](size_t d) {
    return a.ints("starts")[d] == 0 && a.ints("limits")[d] == s[d] && strides[d] == 1;
  });
}

Cost slice_cost(const std::vector<TensorType>&, const std::vector<TensorType>& out, const Attrs&) {
  Cost c;  // reads only what it copies
  c.bytes_read = c.bytes_written = static_cast<double>(out[0].nbytes());
  return c;
}

// ---- pad --------------------------------------------------------------------------------------

std::vector<TensorType> pad_infer(const std::vector<TensorType>& in, const Attrs& a) {
  expect_operands("pad", in, 1);
  const TensorType& t = in[0];
  auto [lo, hi, interior] = dim_lists("pad", t, a, {"lo", "hi", "interior"}, 0);
  Shape s;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (lo[d] < 0 || hi[d] < 0 || interior[d] < 0)
      throw Error("[pad] dim " + std::to_string(d) + " of " + type_str(t) + ": padding lo " + std::to_string(lo[d]) +
                  ", hi " + std::to_string(hi[d]) + ", interior " + std::to_string(interior[d]) +
                  " must be non-negative (use slice to crop)");
    int64_t n = t.shape[d];
    s.push_back(lo[d] + hi[d] + n + std::max<int64_t>(n - 1, 0) * interior[d]);
  }
  return {{t.dtype, s}};
}

ShardingRule pad_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
  Ints interior = ints_or(a, "interior", in[0].shape.size(), 0);
  return kept_dims_rule(in[0].shape, out[0].shape,
                        [&](size_t d) { return a.ints("lo")[d] == 0 && a.ints("hi")[d] == 0 && interior[d] == 0; });
}

Tensor emit_pad(const Tensor& x, const Ints& lo, const Ints& hi, const Ints& interior, double value) {
  return emit1("pad", {x}, Attrs{{"lo", lo}, {"hi", hi}, {"interior", interior}, {"value", value}});
}

// ---- concat -----------------------------------------------------------------------------------

std::vector<TensorType> concat_infer(const std::vector<TensorType>& in, const Attrs& a) {
  if (in.empty()) throw Error("[concat] needs at least one operand");
  const TensorType& t0 = in[0];
  int64_t axis = a.i("axis");
  if (t0.rank() == 0) throw Error("[concat] cannot concatenate rank-0 operands (" + type_str(t0) + ")");
  if (axis < 0 || axis >= t0.rank())
    throw Error("[concat] axis " + std::to_string(axis) + " is out of range for " + type_str(t0));
  Shape s = t0.shape;
  for (size_t k = 1; k < in.size(); ++k) {
    const TensorType& t = in[k];
    std::string which = "[concat] operand " + std::to_string(k) + " " + type_str(t) + " and operand 0 " + type_str(t0);
    if (t.dtype != t0.dtype) throw Error(which + " have different dtypes");
    if (t.rank() != t0.rank()) throw Error(which + " have different ranks");
    for (int d = 0; d < t.rank(); ++d)
      if (d != axis && t.shape[d] != t0.shape[d])
        throw Error(which + " differ in dim " + std::to_string(d) + " (" + std::to_string(t.shape[d]) + " vs " +
                    std::to_string(t0.shape[d]) + "); only the concat axis " + std::to_string(axis) + " may differ");
    s[axis] += t.shape[axis];
  }
  return {{t0.dtype, s}};
}

ShardingRule concat_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
  RuleBuilder b;
  int64_t axis = a.i("axis");
  const Shape& s = out[0].shape;
  std::vector<int> shared;
  for (size_t d = 0; d < s.size(); ++d)
    shared.push_back(d == static_cast<size_t>(axis) ? -1 : b.factor(s[d], Kind::parallel));
  for (auto& t : in) {
    std::vector<int> f = shared;
    f[axis] = b.factor(t.shape[axis], Kind::whole);
    b.r.operands.push_back(f);
  }
  std::vector<int> fo = shared;
  fo[axis] = b.factor(s[axis], Kind::whole);
  b.r.results = {fo};
  return b.r;
}

}  // namespace

// ---- public ops ---------------------------------------------------------------------------------

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape s = shape;
  int infer_at = -1;
  int64_t known = 1;
  bool overflow = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer_at >= 0) throw Error("[reshape] target shape " + ints_str(shape) + " has more than one -1");
      infer_at = static_cast<int>(i);
    } else if (s[i] < 0) {
      throw Error("[reshape] target shape " + ints_str(shape) + " has a negative dim other than -1");
    } else if (__builtin_mul_overflow(known, s[i], &known)) {
      overflow = true;
    }
  }
  // A zero dim makes the count 0 whatever the others are.
  if (overflow && std::find(s.begin(), s.end(), 0) == s.end())
    throw UserError("[reshape] target shape " + ints_str(shape) + " has more than 2^63 elements");
  if (overflow) known = 0;
  if (infer_at >= 0) {
    if (known == 0 || x.numel() % known != 0)
      throw Error("[reshape] cannot reshape " + type_str(x.type()) + " (" + std::to_string(x.numel()) +
                  " elements) to " + ints_str(shape) + ": the -1 cannot be resolved");
    s[infer_at] = x.numel() / known;
  }
  if (s == x.shape()) return x;
  return emit1("reshape", {x}, Attrs{{"shape", s}});
}

Tensor transpose(const Tensor& x, const Ints& perm) {
  Ints p = perm;
  for (auto& v : p)
    if (v < 0) v += x.rank();
  check_perm(p, x.type());  // names the perm as the user wrote it when negatives are bad
  Ints id(p.size());
  std::iota(id.begin(), id.end(), 0);
  if (p == id) return x;
  return emit1("transpose", {x}, Attrs{{"perm", p}});
}

Tensor swap_axes(const Tensor& x, int64_t a, int64_t b) {
  int ia = normalize_axis(a, x.rank(), "swap_axes"), ib = normalize_axis(b, x.rank(), "swap_axes");
  Ints perm(x.rank());
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[ia], perm[ib]);
  return transpose(x, perm);
}

Tensor slice(const Tensor& x, const Ints& starts, const Ints& limits, const Ints& strides) {
  Ints st = strides.empty() ? Ints(x.rank(), 1) : strides;
  if (starts == Ints(x.rank(), 0) && limits == x.shape() && st == Ints(x.rank(), 1)) return x;
  return emit1("slice", {x}, Attrs{{"starts", starts}, {"limits", limits}, {"strides", st}});
}

Tensor slice_axis(const Tensor& x, int64_t axis, int64_t start, int64_t limit) {
  int a = normalize_axis(axis, x.rank(), "slice");
  Ints starts(x.rank(), 0), limits = x.shape();
  starts[a] = start;
  limits[a] = limit;
  return slice(x, starts, limits);
}

std::vector<Tensor> split(const Tensor& x, const Ints& sizes, int64_t axis) {
  int a = normalize_axis(axis, x.rank(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw Error("[split] sizes " + ints_str(sizes) + " has a negative entry");
    total += s;
  }
  if (total != x.shape()[a])
    throw Error("[split] sizes " + ints_str(sizes) + " add up to " + std::to_string(total) + " but dim " +
                std::to_string(a) + " of " + type_str(x.type()) + " has " + std::to_string(x.shape()[a]));
  std::vector<Tensor> parts;
  int64_t off = 0;
  for (int64_t s : sizes) {
    parts.push_back(slice_axis(x, a, off, off + s));
    off += s;
  }
  return parts;
}

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  if (xs.empty()) throw Error("[concat] needs at least one operand");
  if (xs[0].rank() == 0) throw Error("[concat] cannot concatenate rank-0 operands (" + type_str(xs[0].type()) + ")");
  int a = normalize_axis(axis, xs[0].rank(), "concat");
  if (xs.size() == 1) return xs[0];
  return emit1("concat", xs, Attrs{{"axis", static_cast<int64_t>(a)}});
}

Tensor pad(const Tensor& x, const Ints& lo, const Ints& hi, double value) {
  if (lo == Ints(x.rank(), 0) && hi == Ints(x.rank(), 0)) return x;
  return emit_pad(x, lo, hi, Ints(x.rank(), 0), value);
}

Tensor expand_dims(const Tensor& x, int64_t axis) {
  int a = normalize_axis(axis, x.rank() + 1, "expand_dims");
  Shape s = x.shape();
  s.insert(s.begin() + a, 1);
  return reshape(x, s);
}

Tensor squeeze(const Tensor& x, int64_t axis) {
  int a = normalize_axis(axis, x.rank(), "squeeze");
  if (x.shape()[a] != 1)
    throw Error("[squeeze] dim " + std::to_string(a) + " of " + type_str(x.type()) + " has size " +
                std::to_string(x.shape()[a]) + ", not 1");
  Shape s = x.shape();
  s.erase(s.begin() + a);
  return reshape(x, s);
}

// ---- registration -------------------------------------------------------------------------------

void register_shape_primitives() {
  // Moves of elements are linear: partial sums pass through them unreduced.
  Primitive reshape_p{"reshape", {{"shape", AttrKind::ints}}, reshape_infer,
                      [](const VjpArgs& v) -> std::vector<Tensor> {
                        if (!v.cotangents[0].defined()) return {Tensor()};
                        return {reshape(v.cotangents[0], v.inputs[0].shape())};
                      },
                      reshape_rule, copy_cost};
  reshape_p.spmd.linear = kLinearJointly;
  reshape_p.tp.view = TpTraits::View::layout;
  register_primitive(std::move(reshape_p));

  Primitive transpose_p{"transpose", {{"perm", AttrKind::ints}}, transpose_infer,
                        [](const VjpArgs& v) -> std::vector<Tensor> {
                          if (!v.cotangents[0].defined()) return {Tensor()};
                          const Ints& perm = v.attrs.ints("perm");
                          Ints inv(perm.size());
                          for (size_t i = 0; i < perm.size(); ++i) inv[perm[i]] = static_cast<int64_t>(i);
                          return {transpose(v.cotangents[0], inv)};
                        },
                        transpose_rule, copy_cost};
  transpose_p.spmd.linear = kLinearJointly;
  register_primitive(std::move(transpose_p));

  // The vjp of a (strided) slice puts the cotangent back with zeros around and between.
  register_primitive({"slice",
                      {{"starts", AttrKind::ints}, {"limits", AttrKind::ints}, {"strides", AttrKind::ints, false}},
                      slice_infer,
                      [](const VjpArgs& v) -> std::vector<Tensor> {
                        const Tensor& ct = v.cotangents[0];
                        if (!ct.defined()) return {Tensor()};
                        const Shape& s = v.inputs[0].shape();
                        const Ints& starts = v.attrs.ints("starts");
                        Ints strides = ints_or(v.attrs, "strides", s.size(), 1);
                        Ints hi(s.size()), interior(s.size());
                        for (size_t d = 0; d < s.size(); ++d) {
                          int64_t n = ct.shape()[d];
                          int64_t covered = n > 0 ? (n - 1) * strides[d] + 1 : 0;
                          hi[d] = s[d] - starts[d] - covered;
                          interior[d] = strides[d] - 1;
                        }
                        return {emit_pad(ct, starts, hi, interior, 0.0)};
                      },
                      slice_rule, slice_cost});

  register_primitive({"pad",
                      {{"lo", AttrKind::ints},
                       {"hi", AttrKind::ints},
                       {"interior", AttrKind::ints, false},
                       {"value", AttrKind::number, false}},
                      pad_infer,
                      [](const VjpArgs& v) -> std::vector<Tensor> {
                        const Tensor& ct = v.cotangents[0];
                        if (!ct.defined()) return {Tensor()};
                        const Shape& s = v.inputs[0].shape();
                        const Ints& lo = v.attrs.ints("lo");
                        Ints interior = ints_or(v.attrs, "interior", s.size(), 0);
                        Ints limits(s.size()), strides(s.size());
                        for (size_t d = 0; d < s.size(); ++d) {
                          strides[d] = interior[d] + 1;
                          limits[d] = lo[d] + (s[d] > 0 ? (s[d] - 1) * strides[d] + 1 : 0);
                        }
                        return {slice(ct, lo, limits, strides)};
                      },
                      pad_rule, copy_cost});

  Primitive concat_p{"concat", {{"axis", AttrKind::integer}}, concat_infer,
                     [](const VjpArgs& v) -> std::vector<Tensor> {
                       const Tensor& ct = v.cotangents[0];
                       if (!ct.defined()) return std::vector<Tensor>(v.inputs.size());
                       int64_t axis = v.attrs.i("axis");
                       Ints sizes;
                       for (auto& x : v.inputs) sizes.push_back(x.shape()[axis]);
                       return split(ct, sizes, axis);
                     },
                     concat_rule, copy_cost};
  concat_p.spmd.linear = kLinearJointly;  // partial when all its parts are
  register_primitive(std::move(concat_p));
}

}  // namespace px
