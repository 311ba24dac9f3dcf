// Primitives of the elementwise family: constants (constant, full, iota), broadcast_in_dim, and
// same-shaped elementwise ops. The public functions that broadcast live in elementwise_api.cc.
#include <algorithm>

#include "ir/primitive.h"
#include "parallax/ops.h"

namespace px {

namespace {

using Types = std::vector<TensorType>;
using Ints = std::vector<int64_t>;

// Which operand dtypes an elementwise primitive accepts.
enum class Accept { any, numeric, floating, boolean };

const char* accept_text(Accept a) {
  switch (a) {
    case Accept::numeric: return "a numeric (non-bool) dtype";
    case Accept::floating: return "a floating-point dtype (f32, bf16, f16)";
    case Accept::boolean: return "bool";
    default: return "any dtype";
  }
}

bool accepts(Accept a, DType d) {
  switch (a) {
    case Accept::numeric: return d != DType::boolean;
    case Accept::floating: return is_float(d);
    case Accept::boolean: return d == DType::boolean;
    default: return true;
  }
}

std::string types_str(const Types& in) {
  std::string s;
  for (size_t i = 0; i < in.size(); ++i) s += (i ? ", " : "") + type_str(in[i]);
  return s;
}

void check_arity(const std::string& name, const Types& in, size_t n) {
  if (in.size() != n)
    throw Error("[" + name + "] expects " + std::to_string(n) + " operand" + (n == 1 ? "" : "s") + ", got " +
                std::to_string(in.size()) + (in.empty() ? "" : " (" + types_str(in) + ")"));
}

// Same shapes and dtypes: the primitive does not broadcast (the public function does).
void check_same(const std::string& name, const Types& in) {
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].shape != in[0].shape)
      throw Error("[" + name + "] operand shapes differ: " + types_str(in) +
                  " (the primitive needs equal shapes; the public px:: function broadcasts)");
    if (in[i].dtype != in[0].dtype)
      throw Error("[" + name + "] operand dtypes differ: " + types_str(in) +
                  "; convert one with px::cast(x, DType::...)");
  }
}

InferFn same_rule(const std::string& name, size_t arity, Accept accept, bool bool_result) {
  return [=](const Types& in, const Attrs&) {
    check_arity(name, in, arity);
    check_same(name, in);
    if (!accepts(accept, in[0].dtype))
      throw Error("[" + name + "] needs " + accept_text(accept) + ", got " + types_str(in) +
                  (accept == Accept::floating ? "; use px::cast(x, DType::f32) first" : ""));
    TensorType t = in[0];
    if (bool_result) t.dtype = DType::boolean;
    return Types{t};
  };
}

ShardingFn eltwise_sharding() {
  return [](const Types& in, const Types& out, const Attrs&) { return elementwise_rule(in, out); };
}

// flops per element: transcendental functions cost several arithmetic operations.
CostFn eltwise_cost(double flops_per_elem) {
  return [flops_per_elem](const Types& in, const Types& out, const Attrs&) {
    Cost c = default_cost(in, out);
    c.flops = flops_per_elem * static_cast<double>(out.at(0).numel());
    return c;
  };
}

void reg_eltwise(const std::string& name, size_t arity, Accept accept, bool bool_result, double flops, VjpFn vjp,
                 Linearity linear = {}) {
  Primitive p;
  p.name = name;
  p.infer = same_rule(name, arity, accept, bool_result);
  p.vjp = std::move(vjp);
  p.sharding = eltwise_sharding();
  p.cost = eltwise_cost(flops);
  p.elementwise = true;
  p.spmd.linear = linear;
  register_primitive(std::move(p));
}

Tensor zeros_of(const Tensor& t) { return zeros_like(t); }

// ---- vjp rules (public ops only, so gradients can be differentiated again) ---------------

std::vector<Tensor> vjp_add(const VjpArgs& a) { return {a.cotangents[0], a.cotangents[0]}; }
std::vector<Tensor> vjp_sub(const VjpArgs& a) { return {a.cotangents[0], neg(a.cotangents[0])}; }
std::vector<Tensor> vjp_mul(const VjpArgs& a) {
  const Tensor& ct = a.cotangents[0];
  return {mul(ct, a.inputs[1]), mul(ct, a.inputs[0])};
}
std::vector<Tensor> vjp_div(const VjpArgs& a) {
  // d(x/y)/dx = 1/y; d(x/y)/dy = -x/y^2 = -(1/y) * out.
  Tensor gx = div(a.cotangents[0], a.inputs[1]);
  return {gx, neg(mul(gx, a.outputs[0]))};
}
std::vector<Tensor> vjp_pow(const VjpArgs& a) {
  const Tensor &ct = a.cotangents[0], &x = a.inputs[0], &y = a.inputs[1], &out = a.outputs[0];
  // d/dx = y x^(y-1), taken as 0 where y == 0 (avoids 0 * inf at x == 0).
  Tensor dx = where(equal(y, zeros_of(y)), zeros_of(x), mul(y, pow(x, y - 1.0)));
  // d/dy = x^y log x, with log 0 replaced by 0 (the limit of x^y log x for y > 0).
  Tensor safe_x = where(equal(x, zeros_of(x)), ones_like(x), x);
  return {mul(ct, dx), mul(ct, mul(out, log(safe_x)))};
}
// Max/min route the cotangent to the selected operand; ties split it equally.
std::vector<Tensor> vjp_extremum(const VjpArgs& a, bool is_max) {
  const Tensor &ct = a.cotangents[0], &x = a.inputs[0], &y = a.inputs[1];
  Tensor x_wins = is_max ? greater(x, y) : less(x, y);
  Tensor gx = where(equal(x, y), ct * 0.5, where(x_wins, ct, zeros_of(ct)));
  return {gx, sub(ct, gx)};
}
std::vector<Tensor> vjp_neg(const VjpArgs& a) { return {neg(a.cotangents[0])}; }
std::vector<Tensor> vjp_exp(const VjpArgs& a) { return {mul(a.cotangents[0], a.outputs[0])}; }
std::vector<Tensor> vjp_log(const VjpArgs& a) { return {div(a.cotangents[0], a.inputs[0])}; }
std::vector<Tensor> vjp_tanh(const VjpArgs& a) {
  return {mul(a.cotangents[0], 1.0 - square(a.outputs[0]))};
}
std::vector<Tensor> vjp_sqrt(const VjpArgs& a) { return {div(a.cotangents[0], a.outputs[0] * 2.0)}; }
std::vector<Tensor> vjp_rsqrt(const VjpArgs& a) {
  // d x^(-1/2) = -0.5 x^(-3/2) = -0.5 * out / x.
  return {mul(a.cotangents[0], div(a.outputs[0] * -0.5, a.inputs[0]))};
}
std::vector<Tensor> vjp_abs(const VjpArgs& a) {
  const Tensor &ct = a.cotangents[0], &x = a.inputs[0];
  Tensor z = zeros_of(x);
  return {where(greater(x, z), ct, where(less(x, z), neg(ct), zeros_of(ct)))};
}
std::vector<Tensor> vjp_sigmoid(const VjpArgs& a) {
  const Tensor& s = a.outputs[0];
  return {mul(a.cotangents[0], mul(s, 1.0 - s))};
}
std::vector<Tensor> vjp_select(const VjpArgs& a) {
  const Tensor &ct = a.cotangents[0], &c = a.inputs[0];
  Tensor z = zeros_of(ct);
  return {Tensor(), where(c, ct, z), where(c, z, ct)};
}
std::vector<Tensor> vjp_cast(const VjpArgs& a) {
  DType from = a.inputs[0].dtype();
  if (!is_float(from)) return {Tensor()};
  return {cast(a.cotangents[0], from)};
}

// ---- constants and broadcast_in_dim ---------------------------------------------------------

void check_shape(const std::string& name, const Shape& s) {
  for (int64_t d : s)
    if (d < 0) throw Error("[" + name + "] negative dimension in shape " + shape_str(s));
}

Types infer_constant(const Types& in, const Attrs& attrs) {
  check_arity("constant", in, 0);
  return {attrs.array("value").type()};
}

Types infer_full(const Types& in, const Attrs& attrs) {
  check_arity("full", in, 0);
  Shape s = attrs.ints("shape");
  check_shape("full", s);
  return {TensorType{attrs.dtype("dtype"), s}};
}

Types infer_iota(const Types& in, const Attrs& attrs) {
  check_arity("iota", in, 0);
  Shape s = attrs.ints("shape");
  check_shape("iota", s);
  DType d = attrs.dtype("dtype");
  if (d == DType::boolean) throw Error("[iota] dtype bool is not supported; use i32 or a float dtype");
  int64_t axis = attrs.i("axis");
  if (axis < 0 || axis >= static_cast<int64_t>(s.size()))
    throw Error("[iota] axis " + std::to_string(axis) + " is out of range for shape " + shape_str(s));
  return {TensorType{d, s}};
}

std::string ints_str(const Ints& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + ")";
}

Types infer_broadcast_in_dim(const Types& in, const Attrs& attrs) {
  check_arity("broadcast_in_dim", in, 1);
  const Shape& s = attrs.ints("shape");
  const Ints& dims = attrs.ints("dims");
  check_shape("broadcast_in_dim", s);
  const TensorType& x = in[0];
  // The text only for an error: shape rules run in every pass that verifies a graph.
  auto what = [&] { return "operand " + type_str(x) + " to shape " + shape_str(s) + " with dims " + ints_str(dims); };
  if (static_cast<int>(dims.size()) != x.rank())
    throw Error("[broadcast_in_dim] " + what() + ": dims needs one entry per operand dim (" +
                std::to_string(x.rank()) + ")");
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= static_cast<int64_t>(s.size()))
      throw Error("[broadcast_in_dim] " + what() + ": dim " + std::to_string(dims[i]) + " is out of range");
    if (i > 0 && dims[i] <= dims[i - 1])
      throw Error("[broadcast_in_dim] " + what() + ": dims must be strictly increasing");
    if (x.shape[i] != 1 && x.shape[i] != s[dims[i]])
      throw Error("[broadcast_in_dim] " + what() + ": operand dim " + std::to_string(i) + " has size " +
                  std::to_string(x.shape[i]) + " but result dim " + std::to_string(dims[i]) + " has size " +
                  std::to_string(s[dims[i]]) + " (only size-1 dims broadcast)");
  }
  return {TensorType{x.dtype, s}};
}

std::vector<Tensor> vjp_broadcast_in_dim(const VjpArgs& a) {
  const Tensor& ct = a.cotangents[0];
  // Copies: emitting nodes below may reallocate the graph's value table.
  const Shape in_shape = a.inputs[0].shape();
  const Shape out_shape = ct.shape();
  const Ints& dims = a.attrs.ints("dims");
  // Sum over result dims that are new or that broadcast a size-1 operand dim.
  std::vector<char> kept(out_shape.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i)
    if (in_shape[i] == out_shape[dims[i]]) kept[dims[i]] = 1;
  Ints axes;
  for (size_t d = 0; d < out_shape.size(); ++d)
    if (!kept[d]) axes.push_back(static_cast<int64_t>(d));
  Tensor r = axes.empty() ? ct : sum(ct, axes, false);
  if (r.shape() != in_shape) r = reshape(r, in_shape);
  return {r};
}

ShardingRule broadcast_sharding(const Types& in, const Types& out, const Attrs& attrs) {
  ShardingRule r = elementwise_rule({}, out);
  const Ints& dims = attrs.ints("dims");
  std::vector<int> f;
  for (size_t i = 0; i < dims.size(); ++i)
    f.push_back(in[0].shape[i] == out[0].shape[dims[i]] ? static_cast<int>(dims[i]) : -1);
  r.operands.push_back(f);
  return r;
}

Cost copy_cost(const Types& in, const Types& out, const Attrs&) {
  Cost c = default_cost(in, out);
  c.flops = 0;
  return c;
}

}  // namespace

void register_elementwise_primitives() {
  // Constants (no operands). `full` is elementwise so that scalar operands (x * 2.0) fuse into
  // the consumer's loop instead of being materialized.
  Primitive c;
  c.name = "constant";
  c.attrs = {{"value", AttrKind::array}};
  c.infer = infer_constant;
  c.cost = copy_cost;
  register_primitive(std::move(c));

  Primitive f;
  f.name = "full";
  f.attrs = {{"shape", AttrKind::ints}, {"value", AttrKind::number}, {"dtype", AttrKind::dtype}};
  f.infer = infer_full;
  f.sharding = eltwise_sharding();
  f.cost = copy_cost;
  f.elementwise = true;
  register_primitive(std::move(f));

  Primitive io;
  io.name = "iota";
  io.attrs = {{"shape", AttrKind::ints}, {"axis", AttrKind::integer}, {"dtype", AttrKind::dtype}};
  io.infer = infer_iota;
  io.sharding = [](const Types& in, const Types& out, const Attrs& attrs) {
    // The iota axis stays whole: a shard would need its offset.
    ShardingRule r = elementwise_rule(in, out);
    r.factor_kinds.at(attrs.i("axis")) = ShardingRule::Kind::whole;
    return r;
  };
  // A split iota axis needs the block's offset; the partitioner emits that block itself.
  io.spmd.positional.factors = [](const ShardingRule& r, const Attrs& attrs) {
    return std::vector<int>{r.results.at(0).at(attrs.i("axis"))};
  };
  io.cost = copy_cost;
  register_primitive(std::move(io));

  Primitive b;
  b.name = "broadcast_in_dim";
  b.attrs = {{"shape", AttrKind::ints}, {"dims", AttrKind::ints}};
  b.infer = infer_broadcast_in_dim;
  b.vjp = vjp_broadcast_in_dim;
  b.sharding = broadcast_sharding;
  b.cost = copy_cost;
  b.spmd.linear = kLinearJointly;
  b.tp.view = TpTraits::View::layout;
  register_primitive(std::move(b));

  // Linear maps let partial sums flow through unreduced: sums of partial sums are partial sums, a
  // product is linear in one factor, a quotient in its numerator.
  reg_eltwise("add", 2, Accept::numeric, false, 1, vjp_add, kLinearJointly);
  reg_eltwise("sub", 2, Accept::numeric, false, 1, vjp_sub, kLinearJointly);
  reg_eltwise("mul", 2, Accept::numeric, false, 1, vjp_mul, {Linearity::In::any_one, false});
  reg_eltwise("div", 2, Accept::numeric, false, 4, vjp_div, {Linearity::In::first, false});
  reg_eltwise("pow", 2, Accept::floating, false, 30, vjp_pow);
  reg_eltwise("maximum", 2, Accept::numeric, false, 1,
              [](const VjpArgs& a) { return vjp_extremum(a, true); });
  reg_eltwise("minimum", 2, Accept::numeric, false, 1,
              [](const VjpArgs& a) { return vjp_extremum(a, false); });
  reg_eltwise("neg", 1, Accept::numeric, false, 1, vjp_neg, kLinearJointly);
  reg_eltwise("exp", 1, Accept::floating, false, 12, vjp_exp);
  reg_eltwise("log", 1, Accept::floating, false, 14, vjp_log);
  reg_eltwise("tanh", 1, Accept::floating, false, 20, vjp_tanh);
  reg_eltwise("sqrt", 1, Accept::floating, false, 4, vjp_sqrt);
  reg_eltwise("rsqrt", 1, Accept::floating, false, 5, vjp_rsqrt);
  reg_eltwise("abs", 1, Accept::numeric, false, 1, vjp_abs);
  reg_eltwise("sigmoid", 1, Accept::floating, false, 16, vjp_sigmoid);
  // Comparisons and logical ops are not differentiable (bool results carry no gradient).
  for (const char* name : {"eq", "ne"}) reg_eltwise(name, 2, Accept::any, true, 1, nullptr);
  for (const char* name : {"lt", "le", "gt", "ge"}) reg_eltwise(name, 2, Accept::numeric, true, 1, nullptr);
  reg_eltwise("logical_and", 2, Accept::boolean, true, 1, nullptr);
  reg_eltwise("logical_or", 2, Accept::boolean, true, 1, nullptr);
  reg_eltwise("logical_not", 1, Accept::boolean, true, 1, nullptr);

  Primitive sel;
  sel.name = "select";
  sel.infer = [](const Types& in, const Attrs&) {
    check_arity("select", in, 3);
    if (in[0].dtype != DType::boolean)
      throw Error("[select] the condition must be bool, got " + types_str(in) +
                  "; build it with a comparison such as px::greater");
    if (in[1].dtype != in[2].dtype)
      throw Error("[select] the two branches have different dtypes: " + types_str(in) +
                  "; convert one with px::cast(x, DType::...)");
    if (in[0].shape != in[1].shape || in[1].shape != in[2].shape)
      throw Error("[select] operand shapes differ: " + types_str(in) +
                  " (the primitive needs equal shapes; px::where broadcasts)");
    return Types{in[1]};
  };
  sel.vjp = vjp_select;
  sel.sharding = eltwise_sharding();
  sel.cost = eltwise_cost(1);
  sel.elementwise = true;
  register_primitive(std::move(sel));

  Primitive cst;
  cst.name = "cast";
  cst.attrs = {{"dtype", AttrKind::dtype}};
  cst.infer = [](const Types& in, const Attrs& attrs) {
    check_arity("cast", in, 1);
    return Types{TensorType{attrs.dtype("dtype"), in[0].shape}};
  };
  cst.vjp = vjp_cast;
  cst.sharding = eltwise_sharding();
  cst.cost = eltwise_cost(1);
  cst.elementwise = true;
  cst.tp.view = TpTraits::View::same_dims;  // not linear: rounding partial sums differs from rounding their sum
  register_primitive(std::move(cst));

  // Identities: stop_gradient blocks the cotangent, tag passes it through.
  Primitive sg;
  sg.name = "stop_gradient";
  sg.infer = same_rule("stop_gradient", 1, Accept::any, false);
  sg.vjp = [](const VjpArgs&) { return std::vector<Tensor>{Tensor()}; };
  sg.sharding = eltwise_sharding();
  sg.cost = copy_cost;
  sg.elementwise = true;
  sg.spmd.linear = kLinearJointly;
  sg.tp.view = TpTraits::View::same_dims;
  register_primitive(std::move(sg));

  Primitive tg;
  tg.name = "tag";
  // px::remat marks its region's boundaries with tags that also carry the region's id, policy and
  // saved names (src/memory/remat.cc).
  tg.attrs = {{"name", AttrKind::string},
              {"region", AttrKind::integer, false},
              {"policy", AttrKind::string, false},
              {"names", AttrKind::string, false}};
  tg.infer = [](const Types& in, const Attrs& attrs) {
    check_arity("tag", in, 1);
    attrs.s("name");
    return Types{in[0]};
  };
  tg.vjp = [](const VjpArgs& a) { return std::vector<Tensor>{a.cotangents[0]}; };
  tg.sharding = eltwise_sharding();
  tg.cost = copy_cost;
  tg.elementwise = true;
  tg.spmd.linear = kLinearJointly;
  tg.tp.view = TpTraits::View::same_dims;
  register_primitive(std::move(tg));
}

}  // namespace px
