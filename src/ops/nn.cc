// Primitives of the nn family: softmax, log_softmax, layer_norm, rms_norm, gelu, silu and
// softmax_cross_entropy, with their public ops. Row kernels compute in f32 whatever the dtype;
// the vjps are written with public ops so they can be differentiated again.
#include <cmath>

#include "ir/primitive.h"
#include "parallax/ops.h"
#include "ops/local_form.h"

namespace px {

namespace {

std::string axis_str(int64_t a) { return std::to_string(a); }

void require_float(const char* op, const TensorType& t, const char* what = "x") {
  if (!is_float(t.dtype))
    throw Error(std::string("[") + op + "] " + what + " must be floating point, got " + type_str(t));
}

// Every dim parallel except `axis`, which must stay whole (the op normalizes along it).
ShardingRule rows_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, int axis) {
  ShardingRule r = elementwise_rule(in, out);
  if (axis >= 0 && axis < static_cast<int>(r.factor_kinds.size())) r.factor_kinds[axis] = ShardingRule::Kind::whole;
  return r;
}

// Adds a factor per dim of `s` to `r`, the leading ones parallel and the last whole (the op works
// along rows); returns them.
std::vector<int> row_factors(ShardingRule& r, const Shape& s) {
  std::vector<int> f;
  for (size_t d = 0; d < s.size(); ++d) {
    f.push_back(static_cast<int>(r.factor_sizes.size()));
    r.factor_sizes.push_back(s[d]);
    r.factor_kinds.push_back(d + 1 == s.size() ? ShardingRule::Kind::whole : ShardingRule::Kind::parallel);
  }
  return f;
}

Cost per_element_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, double flops_per) {
  Cost c = default_cost(in, out);
  c.flops = flops_per * static_cast<double>(in.at(0).numel());
  return c;
}

std::vector<int64_t> leading_axes(int rank) {
  std::vector<int64_t> a;
  for (int i = 0; i + 1 < rank; ++i) a.push_back(i);
  return a;
}

// Sums a [..., D] tensor over its leading dims into [D] (no-op for rank 1).
Tensor sum_leading(const Tensor& t) { return t.rank() > 1 ? sum(t, leading_axes(t.rank())) : t; }

Tensor to_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : cast(t, DType::f32); }
Tensor to_dtype(const Tensor& t, DType d) { return t.dtype() == d ? t : cast(t, d); }

// ---- softmax / log_softmax ------------------------------------------------------------------

std::vector<TensorType> infer_softmax_like(const char* op, const std::vector<TensorType>& in, const Attrs& attrs) {
  if (in.size() != 1) throw Error(std::string("[") + op + "] takes 1 operand");
  require_float(op, in[0]);
  int64_t axis = attrs.i("axis");
  if (axis < 0 || axis >= in[0].rank())
    throw Error(std::string("[") + op + "] axis " + axis_str(axis) + " is out of range for " + type_str(in[0]));
  return {in[0]};
}

std::vector<Tensor> softmax_vjp(const VjpArgs& a) {
  Tensor ct = a.cotangents[0];
  if (!ct.defined()) return {Tensor()};
  int64_t axis = a.attrs.i("axis");
  const Tensor& y = a.outputs[0];
  return {y * (ct - sum(ct * y, {axis}, true))};
}

std::vector<Tensor> log_softmax_vjp(const VjpArgs& a) {
  Tensor ct = a.cotangents[0];
  if (!ct.defined()) return {Tensor()};
  int64_t axis = a.attrs.i("axis");
  return {ct - exp(a.outputs[0]) * sum(ct, {axis}, true)};
}

// ---- layer_norm / rms_norm ------------------------------------------------------------------

void check_norm_param(const char* op, const TensorType& x, const TensorType& p, const char* name) {
  int64_t d = x.shape.back();
  if (p.rank() != 1 || p.shape[0] != d)
    throw Error(std::string("[") + op + "] " + name + " must have shape [" + std::to_string(d) +
                "] (the last dim of x " + type_str(x) + "), got " + type_str(p));
  if (p.dtype != x.dtype)
    throw Error(std::string("[") + op + "] " + name + " dtype " + dtype_name(p.dtype) + " differs from x " + type_str(x) +
                "; cast it first");
}

// y has x's type, or `out_dtype` (a float type: compile writes the normalized value in bf16 when
// its every reader would cast it so, runtime/autocast.cc); the statistics are f32.
std::vector<TensorType> infer_norm(const char* op, const std::vector<TensorType>& in, const Attrs& a, size_t max_params,
                                   int stats) {
  if (in.size() < 2 || in.size() > 1 + max_params)
    throw Error(std::string("[") + op + "] takes x, gamma" + (max_params > 1 ? " and optionally beta" : ""));
  const TensorType& x = in[0];
  require_float(op, x);
  if (x.rank() < 1) throw Error(std::string("[") + op + "] x must have rank >= 1, got " + type_str(x));
  check_norm_param(op, x, in[1], "gamma");
  if (in.size() > 2) check_norm_param(op, x, in[2], "beta");
  std::vector<TensorType> out{x};
  if (a.has("out_dtype")) {
    out[0].dtype = a.dtype("out_dtype");
    if (!is_float(out[0].dtype))
      throw Error(std::string("[") + op + "] out_dtype must be f32, bf16 or f16, got " + dtype_name(out[0].dtype));
  }
  TensorType stat{DType::f32, Shape(x.shape.begin(), x.shape.end() - 1)};
  for (int i = 0; i < stats; ++i) out.push_back(stat);
  return out;
}

// The last dim is whole; gamma/beta share it; statistics follow the leading dims.
ShardingRule norm_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  ShardingRule r;
  const std::vector<int> f = row_factors(r, in[0].shape), lead(f.begin(), f.end() - 1);
  const int rank = static_cast<int>(f.size());
  r.operands.push_back(f);
  for (size_t i = 1; i < in.size(); ++i) r.operands.push_back({rank - 1});
  r.results.push_back(f);
  for (size_t i = 1; i < out.size(); ++i) r.results.push_back(lead);
  return r;
}

// The backward of a norm's result, one pass per row: x [..., D], gamma [D] (x's dtype), the
// statistics (f32 over the leading dims: mean and rstd, or rstd alone) and the result's cotangent
// dy [..., D] in any float type (read as f32). Results, both f32 [..., D]: dx, and dy * xhat
// (whose sum over the leading dims is gamma's gradient), with xhat = (x - mean) rstd,
// g = dy gamma and dx = rstd (g - mean(g) - xhat mean(g xhat)) (rms_norm: no mean(g) term).
std::vector<TensorType> infer_norm_grad(const char* op, const std::vector<TensorType>& in, int stats) {
  if (in.size() != static_cast<size_t>(3 + stats))
    throw Error(std::string("[") + op + "] takes x, gamma, " + (stats == 2 ? "mean, rstd" : "rstd") + " and dy");
  const TensorType& x = in[0];
  require_float(op, x);
  if (x.rank() < 1) throw Error(std::string("[") + op + "] x must have rank >= 1, got " + type_str(x));
  check_norm_param(op, x, in[1], "gamma");
  const TensorType stat{DType::f32, Shape(x.shape.begin(), x.shape.end() - 1)};
  for (int i = 0; i < stats; ++i)
    if (in[2 + i] != stat)
      throw Error(std::string("[") + op + "] statistic " + std::to_string(i) + " must be " + type_str(stat) + ", got " +
                  type_str(in[2 + i]));
  const TensorType& dy = in.back();
  require_float(op, dy);
  if (dy.shape != x.shape)
    throw Error(std::string("[") + op + "] dy must have x's shape " + shape_str(x.shape) + ", got " + type_str(dy));
  return {TensorType{DType::f32, x.shape}, TensorType{DType::f32, x.shape}};
}

// Rows parallel, the last dim whole: x, dy and both results by row, gamma along the last dim.
ShardingRule norm_grad_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  ShardingRule r = norm_rule({in[0], in[1]}, {out[0]});
  const std::vector<int> f = r.operands[0], lead(f.begin(), f.end() - 1);
  for (size_t i = 2; i + 1 < in.size(); ++i) r.operands.push_back(lead);
  r.operands.push_back(f);
  r.results.push_back(f);
  return r;
}

std::vector<Tensor> layer_norm_vjp(const VjpArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& gamma = a.inputs[1];
  const bool has_beta = a.inputs.size() > 2;
  Tensor ct = a.cotangents[0], ct_mean = a.cotangents[1], ct_rstd = a.cotangents[2];
  const double d = static_cast<double>(x.shape().back());
  Tensor xf = to_f32(x);
  Tensor m = expand_dims(a.outputs[1], -1), r = expand_dims(a.outputs[2], -1);
  Tensor xc = xf - m;
  Tensor dx, dgamma, dbeta;
  if (ct.defined()) {
    std::vector<Tensor> g = emit("layer_norm_grad", {x, gamma, a.outputs[1], a.outputs[2], ct});
    dx = g[0];
    dgamma = to_dtype(sum_leading(g[1]), gamma.dtype());
    if (has_beta) dbeta = to_dtype(sum_leading(to_f32(ct)), gamma.dtype());
  }
  // The statistics are outputs too: d mean/dx = 1/D, d rstd/dx = -rstd^3 (x - mean) / D.
  if (ct_mean.defined()) {
    Tensor t = expand_dims(ct_mean, -1) * (1.0 / d) + zeros_like(xf);
    dx = dx.defined() ? dx + t : t;
  }
  if (ct_rstd.defined()) {
    Tensor t = expand_dims(ct_rstd, -1) * (r * r * r) * xc * (-1.0 / d);
    dx = dx.defined() ? dx + t : t;
  }
  if (dx.defined()) dx = to_dtype(dx, x.dtype());
  std::vector<Tensor> res{dx, dgamma};
  if (has_beta) res.push_back(dbeta);
  return res;
}

std::vector<Tensor> rms_norm_vjp(const VjpArgs& a) {
  const Tensor& x = a.inputs[0];
  const Tensor& gamma = a.inputs[1];
  Tensor ct = a.cotangents[0], ct_rstd = a.cotangents[1];
  const double d = static_cast<double>(x.shape().back());
  Tensor xf = to_f32(x);
  Tensor r = expand_dims(a.outputs[1], -1);
  Tensor dx, dgamma;
  if (ct.defined()) {
    std::vector<Tensor> g = emit("rms_norm_grad", {x, gamma, a.outputs[1], ct});
    dx = g[0];
    dgamma = to_dtype(sum_leading(g[1]), gamma.dtype());
  }
  if (ct_rstd.defined()) {
    Tensor t = expand_dims(ct_rstd, -1) * (r * r * r) * xf * (-1.0 / d);
    dx = dx.defined() ? dx + t : t;
  }
  if (dx.defined()) dx = to_dtype(dx, x.dtype());
  return {dx, dgamma};
}

// ---- gelu / silu ----------------------------------------------------------------------------

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
constexpr double kInvSqrt2Pi = 0.3989422804014327;

std::vector<TensorType> infer_unary_float(const char* op, const std::vector<TensorType>& in, const Attrs& attrs) {
  if (in.size() != 1) throw Error(std::string("[") + op + "] takes 1 operand");
  require_float(op, in[0]);
  if (attrs.has("approximate")) {
    const std::string& s = attrs.s("approximate");
    if (s != "tanh" && s != "erf")
      throw Error(std::string("[") + op + "] approximate must be \"tanh\" or \"erf\", got \"" + s + "\"");
  }
  return {in[0]};
}

std::vector<Tensor> gelu_vjp(const VjpArgs& a) {
  if (!a.cotangents[0].defined()) return {Tensor()};
  return {a.cotangents[0] * emit1("gelu_grad", {a.inputs[0]}, a.attrs)};
}

// Second derivative of gelu, for differentiating gelu_grad.
std::vector<Tensor> gelu_grad_vjp(const VjpArgs& a) {
  if (!a.cotangents[0].defined()) return {Tensor()};
  const Tensor& x = a.inputs[0];
  Tensor d2;
  if (a.attrs.s("approximate") == "erf") {
    d2 = exp(square(x) * -0.5) * kInvSqrt2Pi * (2.0 - square(x));  // phi(x) (2 - x^2)
  } else {
    Tensor x2 = square(x);
    Tensor t = tanh((x + x2 * x * kGeluCubic) * kSqrt2OverPi);
    Tensor du = (1.0 + x2 * (3.0 * kGeluCubic)) * kSqrt2OverPi;
    Tensor ddu = x * (6.0 * kGeluCubic * kSqrt2OverPi);
    Tensor sech2 = 1.0 - square(t);
    d2 = sech2 * (du + x * 0.5 * (ddu - 2.0 * t * square(du)));
  }
  return {a.cotangents[0] * d2};
}

std::vector<Tensor> silu_vjp(const VjpArgs& a) {
  if (!a.cotangents[0].defined()) return {Tensor()};
  const Tensor& x = a.inputs[0];
  Tensor s = sigmoid(x);
  return {a.cotangents[0] * (s * (1.0 + x * (1.0 - s)))};
}

// ---- softmax cross entropy ------------------------------------------------------------------

void check_ce(const char* op, const TensorType& logits, const TensorType& labels) {
  require_float(op, logits, "logits");
  if (logits.rank() < 1) throw Error(std::string("[") + op + "] logits must have rank >= 1, got " + type_str(logits));
  if (labels.dtype != DType::i32)
    throw Error(std::string("[") + op + "] labels must be i32, got " + type_str(labels));
  Shape lead(logits.shape.begin(), logits.shape.end() - 1);
  if (labels.shape != lead)
    throw Error(std::string("[") + op + "] labels " + type_str(labels) + " must have the leading shape " +
                shape_str(lead) + " of logits " + type_str(logits));
}

std::vector<TensorType> infer_ce(const std::vector<TensorType>& in, const Attrs&) {
  if (in.size() != 2) throw Error("[softmax_cross_entropy] takes logits and labels");
  check_ce("softmax_cross_entropy", in[0], in[1]);
  return {TensorType{DType::f32, in[1].shape}};
}

// The gradient has the logits' type, or `out_dtype` (a float type: compile writes the head's
// gradient in bf16 when every reader would cast it so, runtime/autocast.cc).
std::vector<TensorType> infer_ce_grad(const std::vector<TensorType>& in, const Attrs& a) {
  if (in.size() != 3) throw Error("[softmax_cross_entropy_grad] takes logits, labels and the loss cotangent");
  check_ce("softmax_cross_entropy_grad", in[0], in[1]);
  if (in[2] != TensorType{DType::f32, in[1].shape})
    throw Error("[softmax_cross_entropy_grad] cotangent must be f32" + shape_str(in[1].shape) + ", got " +
                type_str(in[2]));
  TensorType out = in[0];
  if (a.has("out_dtype")) {
    out.dtype = a.dtype("out_dtype");
    if (!is_float(out.dtype))
      throw Error(std::string("[softmax_cross_entropy_grad] out_dtype must be f32, bf16 or f16, got ") +
                  dtype_name(out.dtype));
  }
  return {out};
}

// logits [..., V] and labels [...]: leading dims parallel, the class dim whole.
ShardingRule ce_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  ShardingRule r;
  const std::vector<int> f = row_factors(r, in[0].shape), lead(f.begin(), f.end() - 1);
  const int rank = static_cast<int>(f.size());
  r.operands = {f, lead};
  if (in.size() > 2) r.operands.push_back(lead);
  r.results = {out[0].rank() == rank ? f : lead};
  return r;
}

Tensor valid_mask(const Tensor& labels, int64_t ignore_index) {
  return not_equal(labels, full({}, static_cast<double>(ignore_index), DType::i32));
}

std::vector<Tensor> ce_vjp(const VjpArgs& a) {
  if (!a.cotangents[0].defined()) return {Tensor(), Tensor()};
  return {emit1("softmax_cross_entropy_grad", {a.inputs[0], a.inputs[1], a.cotangents[0]}, a.attrs), Tensor()};
}

// grad = (softmax(x) - onehot) * c with c = ct * valid; differentiated w.r.t. x and ct.
std::vector<Tensor> ce_grad_vjp(const VjpArgs& a) {
  Tensor g = a.cotangents[0];
  if (!g.defined()) return {Tensor(), Tensor(), Tensor()};
  const Tensor &x = a.inputs[0], &labels = a.inputs[1], &ct = a.inputs[2];
  int64_t v = x.shape().back();
  Tensor valid = cast(valid_mask(labels, a.attrs.i("ignore_index")), DType::f32);
  Tensor c = expand_dims(ct * valid, -1);
  Tensor s = softmax(to_f32(x), -1);
  Tensor gf = to_f32(g);
  Tensor sg = s * gf;
  Tensor dx = c * (sg - s * sum(sg, {-1}, true));
  Tensor dct = sum((s - one_hot(labels, v, DType::f32)) * gf, {-1}) * valid;
  return {to_dtype(dx, x.dtype()), Tensor(), dct};
}

// Attrs of a normalizing op along one axis.
Attrs axis_attr(const Tensor& x, int64_t axis, const char* op) {
  return Attrs{{"axis", static_cast<int64_t>(normalize_axis(axis, x.rank(), op))}};
}

// Cross entropy (or its gradient) with the class dim split: the row max and the sum of
// exponentials are all-reduced (max, then sum), and the label's logit comes from the device
// that holds it. Ignored labels give 0 and out-of-range labels NaN, as the unsplit kernel does.
Tensor vocab_cross_entropy(const spmd::LocalContext& c, const LocalFormArgs& a, bool grad) {
  using local_form::i32_scalar;
  const std::vector<int>& axes = local_form::positional_axes(a);
  const Node& n = a.node;
  const std::vector<Tensor>& in = a.inputs;
  const int64_t classes = a.graph.type(n.inputs[0]).shape.back();
  Tensor x = in[0].dtype() == DType::f32 ? in[0] : cast(in[0], DType::f32);
  const int64_t last = x.rank() - 1, local_classes = x.shape().back();
  const Tensor& labels = in[1];
  Tensor m = c.all_reduce(max(x, {last}), axes, "max");
  Tensor ex = exp(x - expand_dims(m, -1));
  Tensor rel = labels - local_form::block_start(c, axes, local_classes);
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
  y = where(local_form::mask_like(bad, y), full_like(y, NAN), y);
  return in[0].dtype() == DType::f32 ? y : cast(y, in[0].dtype());
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return emit1("softmax", {x}, axis_attr(x, axis, "softmax")); }

Tensor log_softmax(const Tensor& x, int64_t axis) {
  return emit1("log_softmax", {x}, axis_attr(x, axis, "log_softmax"));
}

Tensor logsumexp(const Tensor& x, int64_t axis, bool keepdims) {
  if (!is_float(x.dtype())) throw Error("[logsumexp] x must be floating point, got " + type_str(x.type()));
  int64_t ax = normalize_axis(axis, x.rank(), "logsumexp");
  // Shift by the (constant) row max; rows that are all -inf keep a zero shift and give -inf.
  Tensor m = stop_gradient(max(x, {ax}, true));
  Tensor finite = less(abs(m), full({}, INFINITY, x.dtype()));
  m = where(finite, m, zeros_like(m));
  Tensor r = log(sum(exp(x - m), {ax}, true)) + m;
  return keepdims ? r : squeeze(r, ax);
}

Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps) {
  if (!(eps >= 0)) throw Error("[layer_norm] eps must be >= 0, got " + std::to_string(eps));
  std::vector<Tensor> in{x, gamma};
  if (beta.defined()) in.push_back(beta);
  return emit("layer_norm", in, Attrs{{"eps", eps}}).at(0);
}

Tensor rms_norm(const Tensor& x, const Tensor& gamma, double eps) {
  if (!(eps >= 0)) throw Error("[rms_norm] eps must be >= 0, got " + std::to_string(eps));
  return emit("rms_norm", {x, gamma}, Attrs{{"eps", eps}}).at(0);
}

Tensor gelu(const Tensor& x, bool approximate_tanh) {
  return emit1("gelu", {x}, Attrs{{"approximate", std::string(approximate_tanh ? "tanh" : "erf")}});
}

Tensor silu(const Tensor& x) { return emit1("silu", {x}); }

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index) {
  return emit1("softmax_cross_entropy", {logits, labels}, Attrs{{"ignore_index", ignore_index}});
}

Tensor cross_entropy_loss(const Tensor& logits, const Tensor& labels, const Tensor& weights, int64_t ignore_index) {
  Tensor loss = softmax_cross_entropy(logits, labels, ignore_index);
  Tensor w = cast(valid_mask(labels, ignore_index), DType::f32);
  if (weights.defined()) {
    if (weights.shape() != labels.shape() || !is_float(weights.dtype()))
      throw Error("[cross_entropy_loss] weights must be a float tensor shaped like labels " +
                  type_str(labels.type()) + ", got " + type_str(weights.type()));
    w = w * to_f32(weights);
  }
  return sum(w * loss) / maximum(sum(w), full({}, 1.0, DType::f32));
}

void register_attention_primitives();  // nn_attention.cc
void register_linear_ce_primitives();   // nn_linear_ce.cc

void register_nn_primitives() {
  register_attention_primitives();
  register_linear_ce_primitives();
  using Vjp = std::vector<Tensor> (*)(const VjpArgs&);
  for (auto [name, vjp] : {std::pair<const char*, Vjp>{"softmax", softmax_vjp}, {"log_softmax", log_softmax_vjp}}) {
    Primitive p;
    p.name = name;
    p.attrs = {{"axis", AttrKind::integer}};
    p.infer = [name](const std::vector<TensorType>& in, const Attrs& a) { return infer_softmax_like(name, in, a); };
    p.vjp = vjp;
    p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
      return rows_rule(in, out, static_cast<int>(a.i("axis")));
    };
    p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return per_element_cost(in, out, 5);  // max, sub, exp, sum, scale
    };
    p.tp.mixes_features = true;
    register_primitive(std::move(p));
  }
  // layer_norm takes gamma and an optional beta and keeps two statistics (mean, rstd); rms_norm
  // one of each. Flops: mean, centre, square-sum, normalize, scale, shift (rms_norm: 4 of them).
  struct Norm {
    const char* name;
    int params;
    Vjp vjp;
    double flops;
  };
  for (Norm n : {Norm{"layer_norm", 2, layer_norm_vjp, 8}, Norm{"rms_norm", 1, rms_norm_vjp, 4}}) {
    Primitive p;
    p.name = n.name;
    p.attrs = {{"eps", AttrKind::number}, {"out_dtype", AttrKind::dtype, false}};
    p.infer = [n](const std::vector<TensorType>& in, const Attrs& a) {
      return infer_norm(n.name, in, a, static_cast<size_t>(n.params), n.params);
    };
    p.vjp = n.vjp;
    p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return norm_rule(in, out);
    };
    p.cost = [flops = n.flops](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return per_element_cost(in, out, flops);
    };
    p.tp.mixes_features = true;
    register_primitive(std::move(p));
  }
  // Their backward passes (not differentiable again: a second derivative through a norm fails
  // naming the primitive).
  for (auto [name, stats] : {std::pair<const char*, int>{"layer_norm_grad", 2}, {"rms_norm_grad", 1}}) {
    Primitive p;
    p.name = name;
    p.infer = [name, stats](const std::vector<TensorType>& in, const Attrs&) {
      return infer_norm_grad(name, in, stats);
    };
    p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return norm_grad_rule(in, out);
    };
    p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return per_element_cost(in, out, 12);  // centre, normalize, two row sums, scale, the two results
    };
    p.tp.mixes_features = true;
    register_primitive(std::move(p));
  }
  // Split classes: the local form all-reduces the row max and the sum of exponentials, and the
  // label's logit comes from the device that holds it.
  Positional split_classes{[](const ShardingRule& r, const Attrs&) {
                             return r.operands.at(0).empty() ? std::vector<int>{}
                                                             : std::vector<int>{r.operands[0].back()};
                           },
                           ShardingRule::Kind::parallel, false};
  auto eltwise_prim = [](const char* name, std::vector<AttrSpec> attrs, VjpFn vjp, double flops) {
    Primitive p;
    p.name = name;
    p.attrs = std::move(attrs);
    std::string n = name;
    p.infer = [n](const std::vector<TensorType>& in, const Attrs& a) { return infer_unary_float(n.c_str(), in, a); };
    p.vjp = std::move(vjp);
    p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return elementwise_rule(in, out);
    };
    p.cost = [flops](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return per_element_cost(in, out, flops);
    };
    p.elementwise = true;
    register_primitive(std::move(p));
  };
  eltwise_prim("gelu", {{"approximate", AttrKind::string}}, gelu_vjp, 10);  // "erf" or "tanh"
  eltwise_prim("gelu_grad", {{"approximate", AttrKind::string}}, gelu_grad_vjp, 16);
  eltwise_prim("silu", {}, silu_vjp, 5);
  // The loss and its gradient: one rule, split over the classes by the same local form.
  auto ce_prim = [&](const char* name, std::vector<AttrSpec> attrs, InferFn infer, VjpFn vjp,
                     double flops_per_element, bool grad) {
    Primitive p;
    p.name = name;
    p.attrs = std::move(attrs);
    p.infer = std::move(infer);
    p.vjp = std::move(vjp);
    p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return ce_rule(in, out);
    };
    p.cost = [flops_per_element](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return per_element_cost(in, out, flops_per_element);
    };
    p.spmd.positional = split_classes;
    p.spmd.local_form = [grad](const spmd::LocalContext& c, const LocalFormArgs& a) {
      return std::vector<Tensor>{vocab_cross_entropy(c, a, grad)};
    };
    p.tp.mixes_features = !grad;
    p.widens_operands = 1u;  // the logits: every kernel computes a row in f32
    register_primitive(std::move(p));
  };
  ce_prim("softmax_cross_entropy", {{"ignore_index", AttrKind::integer}}, infer_ce, ce_vjp, 4, false);
  ce_prim("softmax_cross_entropy_grad", {{"ignore_index", AttrKind::integer}, {"out_dtype", AttrKind::dtype, false}},
          infer_ce_grad, ce_grad_vjp, 6, true);
}

}  // namespace px
