// Counter-based random numbers (Philox-4x32-10). A key is i32[2]; element i of a draw depends
// only on (key, i), so values do not change with sharding. A block of a larger draw carries the
// attr global_shape and its offset, as the attr offset or as an i32[rank] origin operand.
#include <cmath>

#include "ir/primitive.h"
#include "parallax/ops.h"
#include "ops/local_form.h"

namespace px {

namespace {

void check_key(const char* op, const std::vector<TensorType>& in, size_t max_operands = 1) {
  if (in.empty() || in.size() > max_operands)
    throw Error(std::string("[") + op + "] takes " + (max_operands > 1 ? "a key and an optional origin" : "one key") +
                " operand, got " + std::to_string(in.size()));
  if (in[0] != TensorType{DType::i32, {2}})
    throw Error(std::string("[") + op + "] key must be i32[2] (see px::random_key), got " + type_str(in[0]));
}

std::vector<TensorType> infer_draw(const char* op, const std::vector<TensorType>& in, const Attrs& a) {
  check_key(op, in, 2);
  const Shape& shape = a.ints("shape");
  for (int64_t d : shape)
    if (d < 0) throw Error(std::string("[") + op + "] shape " + shape_str(shape) + " has a negative dim");
  DType dt = a.dtype("dtype");
  if (!is_float(dt)) throw Error(std::string("[") + op + "] dtype must be floating point, got " + dtype_name(dt));
  if (in.size() == 2) {
    // The origin operand (i32[rank]) is the block's offset, known only at run time (the partitioner
    // computes it from the device's mesh coordinates); the kernel trusts it to fit global_shape.
    if (in[1] != TensorType{DType::i32, {static_cast<int64_t>(shape.size())}})
      throw Error(std::string("[") + op + "] the origin operand must be i32[" + std::to_string(shape.size()) +
                  "], got " + type_str(in[1]));
    if (!a.has("global_shape") || a.has("offset"))
      throw Error(std::string("[") + op + "] an origin operand needs the global_shape attr and no offset attr");
    const auto& gs = a.ints("global_shape");
    if (gs.size() != shape.size())
      throw Error(std::string("[") + op + "] global_shape " + shape_str(gs) + " must have the rank of shape " +
                  shape_str(shape));
    for (size_t i = 0; i < shape.size(); ++i)
      if (shape[i] > gs[i])
        throw Error(std::string("[") + op + "] shape " + shape_str(shape) + " exceeds global_shape " + shape_str(gs));
  } else if (a.has("global_shape") || a.has("offset")) {
    const auto& gs = a.ints("global_shape");
    const auto& off = a.ints("offset");
    if (gs.size() != shape.size() || off.size() != shape.size())
      throw Error(std::string("[") + op + "] global_shape " + shape_str(gs) + " and offset " + shape_str(off) +
                  " must have the rank of shape " + shape_str(shape));
    for (size_t i = 0; i < shape.size(); ++i)
      if (off[i] < 0 || off[i] + shape[i] > gs[i])
        throw Error(std::string("[") + op + "] the slice at offset " + shape_str(off) + " of shape " +
                    shape_str(shape) + " does not fit in global_shape " + shape_str(gs));
  }
  return {TensorType{dt, shape}};
}

// The attributes of a draw: its shape and dtype, and for a block of a larger draw (its local
// form) the global shape and, unless an origin operand gives it, the block's offset.
std::vector<AttrSpec> draw_attrs() {
  return {{"shape", AttrKind::ints},
          {"dtype", AttrKind::dtype},
          {"global_shape", AttrKind::ints, false},
          {"offset", AttrKind::ints, false}};
}

bool is_block(const Attrs& a) { return a.has("global_shape") || a.has("offset"); }

// Result dims are parallel: a local shard must carry global_shape and its origin. A draw that is
// already a block of a larger draw is not split again.
ShardingRule draw_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
  if (is_block(a)) return whole_rule(in, out);
  ShardingRule r;
  r.operands = {{-1}};
  std::vector<int> f;
  for (int64_t d : out[0].shape) {
    f.push_back(static_cast<int>(r.factor_sizes.size()));
    r.factor_sizes.push_back(d);
    r.factor_kinds.push_back(ShardingRule::Kind::parallel);
  }
  r.results = {f};
  r.operands[0] = {static_cast<int>(r.factor_sizes.size())};
  r.factor_sizes.push_back(2);
  r.factor_kinds.push_back(ShardingRule::Kind::whole);
  return r;
}

// Every split result dim needs the block's origin (draw_local_form passes it as an operand).
std::vector<int> draw_positional(const ShardingRule& r, const Attrs& a) {
  if (is_block(a)) return {};
  return r.results.at(0);
}

Cost draw_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, double per_elem) {
  Cost c = default_cost(in, out);
  c.flops = per_elem * static_cast<double>(out[0].numel());
  return c;
}

Tensor draw(const char* op, const Tensor& key, const Shape& shape, DType dtype, Attrs extra = {}) {
  Attrs a = std::move(extra);
  a.set("shape", std::vector<int64_t>(shape.begin(), shape.end())).set("dtype", dtype);
  return emit1(op, {key}, std::move(a));
}

// A random draw of this device's block: the global shape and the block's origin (per dim, the
// start of its block) let the kernel compute the same values as the unsplit draw.
std::vector<Tensor> draw_local_form(const spmd::LocalContext& c, const LocalFormArgs& args) {
  const Node& n = args.node;
  const TensorType& want = args.want[0];
  const Shape& global = args.graph.type(n.outputs[0]).shape;
  std::vector<Tensor> starts;
  for (size_t d = 0; d < global.size(); ++d) {
    int f = args.rule.results[0][d];
    const auto& axes = f >= 0 ? args.factor_axes[f] : std::vector<int>{};
    Tensor s = axes.empty() ? local_form::i32_scalar(0) : local_form::block_start(c, axes, want.shape[d]);
    starts.push_back(reshape(s, {1}));
  }
  Attrs a = n.attrs;
  a.set("shape", std::vector<int64_t>(want.shape.begin(), want.shape.end()));
  a.set("global_shape", std::vector<int64_t>(global.begin(), global.end()));
  return {c.local.emit(*n.prim, {args.inputs[0], concat(starts, 0)}, a).at(0)};
}

}  // namespace

Tensor random_key(uint64_t seed) {
  Array k = Array::from_i32({static_cast<int32_t>(static_cast<uint32_t>(seed & 0xffffffffu)),
                             static_cast<int32_t>(static_cast<uint32_t>(seed >> 32))},
                            {2});
  return constant(k);
}

Tensor fold_in(const Tensor& key, int64_t data) { return emit1("fold_in", {key}, Attrs{{"data", data}}); }

Tensor random_uniform(const Tensor& key, const Shape& shape, DType dtype, double lo, double hi) {
  if (!(lo < hi) || !std::isfinite(lo) || !std::isfinite(hi))
    throw Error("[random_uniform] needs finite lo < hi, got lo " + std::to_string(lo) + ", hi " + std::to_string(hi));
  return draw("random_uniform", key, shape, dtype, Attrs{{"lo", lo}, {"hi", hi}});
}

Tensor random_normal(const Tensor& key, const Shape& shape, DType dtype) {
  return draw("random_normal", key, shape, dtype);
}

Tensor dropout_mask(const Tensor& key, const Shape& shape, double keep_prob) {
  if (!(keep_prob >= 0.0 && keep_prob <= 1.0))
    throw Error("[dropout_mask] keep_prob must be in [0, 1], got " + std::to_string(keep_prob));
  return less(random_uniform(key, shape, DType::f32), full({}, keep_prob, DType::f32));
}

Tensor dropout(const Tensor& key, const Tensor& x, double rate) {
  if (!(rate >= 0.0 && rate < 1.0)) throw Error("[dropout] rate must be in [0, 1), got " + std::to_string(rate));
  if (!is_float(x.dtype())) throw Error("[dropout] x must be floating point, got " + type_str(x.type()));
  if (rate == 0.0) return x;
  double keep = 1.0 - rate;
  Tensor mask = dropout_mask(key, x.shape(), keep);
  return where(mask, x * (1.0 / keep), zeros_like(x));
}

void register_rng_primitives() {
  {
    Primitive p;
    p.name = "fold_in";
    p.attrs = {{"data", AttrKind::integer}};
    p.infer = [](const std::vector<TensorType>& in, const Attrs& a) {
      check_key("fold_in", in);
      a.i("data");
      return std::vector<TensorType>{in[0]};
    };
    p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return draw_cost(in, out, 20);
    };
    register_primitive(std::move(p));
  }
  {
    Primitive p;
    p.name = "random_uniform";
    p.attrs = draw_attrs();
    p.attrs.push_back({"lo", AttrKind::number});
    p.attrs.push_back({"hi", AttrKind::number});
    p.infer = [](const std::vector<TensorType>& in, const Attrs& a) {
      if (!(a.f("lo") < a.f("hi"))) throw Error("[random_uniform] needs lo < hi");
      return infer_draw("random_uniform", in, a);
    };
    p.sharding = draw_rule;
    p.spmd.positional.factors = draw_positional;
    p.spmd.local_form = draw_local_form;
    p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return draw_cost(in, out, 12);  // a quarter of a Philox block (10 rounds of 2 mul + xors) + scaling
    };
    register_primitive(std::move(p));
  }
  {
    Primitive p;
    p.name = "random_normal";
    p.attrs = draw_attrs();
    p.infer = [](const std::vector<TensorType>& in, const Attrs& a) { return infer_draw("random_normal", in, a); };
    p.sharding = draw_rule;
    p.spmd.positional.factors = draw_positional;
    p.spmd.local_form = draw_local_form;
    p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return draw_cost(in, out, 30);  // Philox plus log, sqrt and sin/cos of Box-Muller
    };
    register_primitive(std::move(p));
  }
}

}  // namespace px
