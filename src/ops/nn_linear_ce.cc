// linear_cross_entropy: a language model's head and loss in one primitive. The per-row loss of
// logits = h w^T (w [V, D], vocab_axis 0: a tied embedding table) or h w (w [D, V], vocab_axis 1:
// a Linear weight) is computed by the kernels chunk by chunk over rows and vocabulary, so the
// [rows, V] logits are never held whole; the second result is each row's logsumexp (f32), saved
// for the gradient. linear_cross_entropy_grad recomputes each chunk's logits from it (one more
// logits matmul than the unfused backward) and gives dh and dw without a [rows, V] buffer either.
//
// The gradient is recomputed, not computed in the forward pass and scaled by the cotangent (the
// way Liger-Kernel does it): the rows' cotangents here are per row (the loss's weights and its
// mean), dw = sum_r ct_r (p_r - onehot_r) h_r cannot be formed before they are known, and an
// eval or decode program that never differentiates pays for no gradient.
#include <algorithm>

#include "ir/primitive.h"
#include "ops/local_form.h"
#include "parallax/ops.h"

namespace px {

namespace {

const char* kOp = "linear_cross_entropy";
const char* kGrad = "linear_cross_entropy_grad";

[[noreturn]] void fail(const char* op, const std::string& m) { throw Error(std::string("[") + op + "] " + m); }

// h [..., D], w [V, D] or [D, V] (vocab_axis), labels i32 [...]; returns V.
int64_t check_head(const char* op, const TensorType& h, const TensorType& w, const TensorType& labels,
                   int64_t vocab_axis) {
  if (!is_float(h.dtype)) fail(op, "h must be floating point, got " + type_str(h));
  if (h.rank() < 1) fail(op, "h must have rank >= 1 ([..., d_model]), got " + type_str(h));
  if (vocab_axis != 0 && vocab_axis != 1)
    fail(op,
         "vocab_axis must be 0 (w is [vocab, d_model], an embedding table) or 1 (w is [d_model, vocab], a "
         "Linear weight), got " +
             std::to_string(vocab_axis));
  if (w.rank() != 2) fail(op, "w must be a matrix, got " + type_str(w));
  if (w.dtype != h.dtype)
    fail(op, "w " + type_str(w) + " and h " + type_str(h) + " must have one dtype; cast one of them first");
  const int64_t d = h.shape.back(), wd = w.shape[1 - vocab_axis];
  if (wd != d)
    fail(op, "w " + type_str(w) + " has " + std::to_string(wd) + " features along axis " +
                 std::to_string(1 - vocab_axis) + " but h " + type_str(h) + " has " + std::to_string(d) +
                 (w.shape[vocab_axis] == d ? "; is vocab_axis " + std::to_string(vocab_axis) + " right?" : ""));
  if (labels.dtype != DType::i32) fail(op, "labels must be i32, got " + type_str(labels));
  const Shape lead(h.shape.begin(), h.shape.end() - 1);
  if (labels.shape != lead)
    fail(op, "labels " + type_str(labels) + " must have the leading shape " + shape_str(lead) + " of h " + type_str(h));
  return w.shape[vocab_axis];
}

std::vector<TensorType> infer_lce(const std::vector<TensorType>& in, const Attrs& a) {
  if (in.size() != 3) fail(kOp, "takes h, w and labels");
  check_head(kOp, in[0], in[1], in[2], a.i("vocab_axis"));
  const TensorType row{DType::f32, in[2].shape};
  return {row, row};  // the loss and the logsumexp of each row
}

std::vector<TensorType> infer_lce_grad(const std::vector<TensorType>& in, const Attrs& a) {
  if (in.size() != 5) fail(kGrad, "takes h, w, labels, the rows' logsumexp and the loss cotangent");
  check_head(kGrad, in[0], in[1], in[2], a.i("vocab_axis"));
  const TensorType row{DType::f32, in[2].shape};
  if (in[3] != row) fail(kGrad, "logsumexp must be " + type_str(row) + ", got " + type_str(in[3]));
  if (in[4] != row) fail(kGrad, "cotangent must be " + type_str(row) + ", got " + type_str(in[4]));
  return {in[0], in[1]};
}

// The rows (h's leading dims) are parallel; the vocabulary and the features stay whole, so a
// weight split over either arrives gathered (the kernels need every class of a row for its
// logsumexp). The gradient's rows are positional: its local form all-reduces dw over their axes.
ShardingRule lce_rule(const std::vector<TensorType>& in, const Attrs& a, bool grad) {
  ShardingRule r;
  auto factor = [&](int64_t size, ShardingRule::Kind k) {
    r.factor_sizes.push_back(size);
    r.factor_kinds.push_back(k);
    return static_cast<int>(r.factor_sizes.size()) - 1;
  };
  const TensorType& h = in[0];
  std::vector<int> lead;
  for (int d = 0; d + 1 < h.rank(); ++d) lead.push_back(factor(h.shape[d], ShardingRule::Kind::parallel));
  const int feat = factor(h.shape.back(), ShardingRule::Kind::whole);
  const int vocab_axis = static_cast<int>(a.i("vocab_axis"));
  const int vocab = factor(in[1].shape[vocab_axis], ShardingRule::Kind::whole);
  std::vector<int> hf = lead;
  hf.push_back(feat);
  const std::vector<int> wf = vocab_axis == 0 ? std::vector<int>{vocab, feat} : std::vector<int>{feat, vocab};
  r.operands = {hf, wf, lead};
  for (size_t i = 3; i < in.size(); ++i) r.operands.push_back(lead);
  r.results = grad ? std::vector<std::vector<int>>{hf, wf} : std::vector<std::vector<int>>{lead, lead};
  return r;
}

Cost lce_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, int matmuls) {
  Cost c = default_cost(in, out);
  const double rows = static_cast<double>(in[2].numel()), d = static_cast<double>(in[0].shape.back());
  const double v = static_cast<double>(in[1].numel()) / std::max(d, 1.0);
  c.matmul_flops = 2.0 * rows * v * d * matmuls;
  c.flops = c.matmul_flops + 4.0 * rows * v * matmuls;  // max, exp, sum (and the gradient's scale)
  return c;
}

std::vector<Tensor> lce_vjp(const VjpArgs& a) {
  if (a.cotangents.size() > 1 && a.cotangents[1].defined())
    fail(kOp,
         "its second result (the rows' logsumexp, kept for the gradient) is not differentiable; use "
         "logsumexp of the logits instead");
  if (!a.cotangents[0].defined()) return {Tensor(), Tensor(), Tensor()};
  std::vector<Tensor> g = emit(kGrad, {a.inputs[0], a.inputs[1], a.inputs[2], a.outputs[1], a.cotangents[0]}, a.attrs);
  return {g[0], g[1], Tensor()};
}

// With the rows split: each device's dh rows are its own; its dw is the sum over its rows only,
// so the local dw is all-reduced over the rows' mesh axes.
std::vector<Tensor> lce_grad_local(const spmd::LocalContext& c, const LocalFormArgs& a) {
  std::vector<int> axes;
  for (int f : positional_factors(*a.node.prim, a.rule, a.node.attrs))
    axes.insert(axes.end(), a.factor_axes[f].begin(), a.factor_axes[f].end());
  std::vector<Tensor> g = emit(kGrad, a.inputs, a.node.attrs);
  if (!axes.empty()) g[1] = c.all_reduce(g[1], axes, "sum");
  return g;
}

Tensor valid_weights(const Tensor& labels, const Tensor& weights, int64_t ignore_index, const char* op) {
  Tensor w = cast(not_equal(labels, full({}, static_cast<double>(ignore_index), DType::i32)), DType::f32);
  if (!weights.defined()) return w;
  if (weights.shape() != labels.shape() || !is_float(weights.dtype()))
    throw Error(std::string("[") + op + "] weights must be a float tensor shaped like labels " +
                type_str(labels.type()) + ", got " + type_str(weights.type()));
  return w * (weights.dtype() == DType::f32 ? weights : cast(weights, DType::f32));
}

}  // namespace

Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& labels, int64_t vocab_axis,
                            int64_t ignore_index) {
  return emit(kOp, {h, w, labels}, Attrs{{"vocab_axis", vocab_axis}, {"ignore_index", ignore_index}}).at(0);
}

Tensor linear_cross_entropy_loss(const Tensor& h, const Tensor& w, const Tensor& labels, int64_t vocab_axis,
                                 const Tensor& weights, int64_t ignore_index) {
  Tensor loss = linear_cross_entropy(h, w, labels, vocab_axis, ignore_index);
  Tensor wt = valid_weights(labels, weights, ignore_index, "linear_cross_entropy_loss");
  return sum(wt * loss) / maximum(sum(wt), full({}, 1.0, DType::f32));
}

void register_linear_ce_primitives() {
  const std::vector<AttrSpec> attrs{{"vocab_axis", AttrKind::integer}, {"ignore_index", AttrKind::integer}};
  {
    Primitive p;
    p.name = kOp;
    p.attrs = attrs;
    p.infer = infer_lce;
    p.vjp = lce_vjp;
    p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
      return lce_rule(in, a, false);
    };
    p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
      return lce_cost(in, out, 1);
    };
    p.tp.mixes_features = true;
    register_primitive(std::move(p));
  }
  Primitive p;  // not differentiable again: a second derivative through it fails naming it
  p.name = kGrad;
  p.attrs = attrs;
  p.infer = infer_lce_grad;
  p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs& a) {
    return lce_rule(in, a, true);
  };
  p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return lce_cost(in, out, 3);
  };
  // Every leading (row) factor: a split one gives partial weight gradients, summed by the local form.
  p.spmd.positional = Positional{[](const ShardingRule& r, const Attrs&) {
                                   std::vector<int> f(r.operands.at(2).begin(), r.operands.at(2).end());
                                   return f;
                                 },
                                 ShardingRule::Kind::parallel, false};
  p.spmd.local_form = lce_grad_local;
  p.tp.mixes_features = true;
  register_primitive(std::move(p));
}

}  // namespace px
