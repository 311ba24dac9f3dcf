// dot_product_attention. The forward and backward run as fused primitives ("attention" and
// "attention_grad": scores live in per-thread row blocks, never in a [B,H,Sq,Sk] tensor, and
// causal blocks skip masked columns). The same computation written with public ops (masks from
// iota comparisons, softmax in f32) is the reference and gives attention_grad its own vjp, so
// attention stays differentiable to any order.
#include <cmath>

#include "ir/primitive.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"

namespace px {

namespace {

constexpr const char* kOp = "[dot_product_attention] ";

// Queries [B,Hkv,G,Sq,D] (query head hkv*G+g uses key/value head hkv), keys and values
// [B,Hkv,Sk,D], optional bool key padding [B,Sk]; returns [B,Hkv,G,Sq,D].
Tensor composite_attention(const Tensor& q5, const Tensor& k, const Tensor& v, const Tensor& pad, bool causal,
                           double scale) {
  const int64_t b = q5.dim(0), hkv = q5.dim(1), g = q5.dim(2), sq = q5.dim(3), sk = k.dim(2);
  Tensor scores = dot_general(q5 * scale, k, DotDims{{4}, {3}, {0, 1}, {0, 1}}, DType::f32);  // [B,Hkv,G,Sq,Sk]
  Tensor mask;
  if (causal) {
    // Queries are aligned to the end of the keys (decoding appends queries after a cache).
    Tensor row = iota({sq, sk}, 0, DType::i32) + full({}, static_cast<double>(sk - sq), DType::i32);
    Tensor col = iota({sq, sk}, 1, DType::i32);
    mask = broadcast_in_dim(less_equal(col, row), {b, hkv, g, sq, sk}, {3, 4});
  }
  if (pad.defined()) {
    Tensor p = broadcast_in_dim(pad, {b, hkv, g, sq, sk}, {0, 4});
    mask = mask.defined() ? logical_and(mask, p) : p;
  }
  // A large finite negative keeps fully masked rows finite (uniform) instead of NaN.
  if (mask.defined()) scores = where(mask, scores, full({}, -1e30, DType::f32));
  Tensor probs = softmax(scores, -1);
  if (probs.dtype() != v.dtype()) probs = cast(probs, v.dtype());
  return dot_general(probs, v, DotDims{{4}, {2}, {0, 1}, {0, 1}});
}

bool has_pad(const Attrs& a) { return a.i("key_padding") != 0; }

void check_qkv(const char* prim, const std::vector<TensorType>& in, const Attrs& a) {
  const size_t want = 3 + (has_pad(a) ? 1 : 0);
  if (in.size() < want) throw Error(std::string("[") + prim + "] expects q, k, v" + (has_pad(a) ? " and key_padding" : ""));
  const TensorType &q = in[0], &k = in[1], &v = in[2];
  if (q.rank() != 5 || k.rank() != 4 || k != v || !is_float(q.dtype) || q.dtype != k.dtype || q.shape[0] != k.shape[0] ||
      q.shape[1] != k.shape[1] || q.shape[4] != k.shape[3])
    throw Error(std::string("[") + prim + "] expects q [B,Hkv,G,Sq,D] and k, v [B,Hkv,Sk,D] of one float dtype, got " +
                type_str(q) + ", " + type_str(k) + ", " + type_str(v));
  if (has_pad(a) && in[3] != TensorType{DType::boolean, {k.shape[0], k.shape[2]}})
    throw Error(std::string("[") + prim + "] key_padding must be bool[" + std::to_string(k.shape[0]) + "," +
                std::to_string(k.shape[2]) + "], got " + type_str(in[3]));
}

std::vector<TensorType> infer_attention(const std::vector<TensorType>& in, const Attrs& a) {
  check_qkv("attention", in, a);
  if (in.size() != 3 + (has_pad(a) ? 1u : 0u)) throw Error("[attention] too many operands");
  Shape lse(in[0].shape.begin(), in[0].shape.end() - 1);
  return {in[0], TensorType{DType::f32, lse}};
}

std::vector<TensorType> infer_attention_grad(const std::vector<TensorType>& in, const Attrs& a) {
  check_qkv("attention_grad", in, a);
  const size_t p = has_pad(a) ? 4 : 3;
  if (in.size() != p + 2) throw Error("[attention_grad] expects q, k, v, [key_padding], lse and the output cotangent");
  Shape lse(in[0].shape.begin(), in[0].shape.end() - 1);
  if (in[p] != TensorType{DType::f32, lse} || in[p + 1] != in[0])
    throw Error("[attention_grad] lse must be f32" + shape_str(lse) + " and the cotangent " + type_str(in[0]) +
                ", got " + type_str(in[p]) + " and " + type_str(in[p + 1]));
  return {in[0], in[1], in[2]};
}

// Pairs (query, key) that take part: all of them, or the causal triangle aligned to the end.
double attended_pairs(int64_t sq, int64_t sk, bool causal) {
  if (!causal) return static_cast<double>(sq) * static_cast<double>(sk);
  double n = 0;
  for (int64_t i = 0; i < sq; ++i) n += static_cast<double>(std::clamp<int64_t>(i + sk - sq + 1, 0, sk));
  return n;
}

Cost attention_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a,
                    double matmuls) {
  const Shape& q = in[0].shape;
  double heads = static_cast<double>(q[0] * q[1] * q[2]);
  double pairs = heads * attended_pairs(q[3], in[1].shape[2], a.i("causal") != 0);
  Cost c = default_cost(in, out);
  c.matmul_flops = matmuls * 2.0 * pairs * static_cast<double>(q[4]);
  c.flops = c.matmul_flops + 6.0 * pairs;  // + mask, exp, normalization
  return c;
}

// b, hkv, g parallel; key length and head dim whole; query length parallel unless causal
// (the mask depends on absolute positions). In the gradient, dk/dv sum over g and Sq.
ShardingRule attention_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a,
                            bool grad) {
  using K = ShardingRule::Kind;
  const Shape& q = in[0].shape;
  const bool causal = a.i("causal") != 0;
  ShardingRule r;
  r.factor_sizes = {q[0], q[1], q[2], q[3], in[1].shape[2], q[4]};
  r.factor_kinds = {K::parallel, K::parallel, grad ? K::whole : K::parallel, (grad || causal) ? K::whole : K::parallel,
                    K::whole, K::whole};
  const std::vector<int> fq{0, 1, 2, 3, 5}, fkv{0, 1, 4, 5}, fpad{0, 4}, flse{0, 1, 2, 3};
  r.operands = {fq, fkv, fkv};
  if (has_pad(a)) r.operands.push_back(fpad);
  if (grad) {
    r.operands.push_back(flse);
    r.operands.push_back(fq);
    r.results = {fq, fkv, fkv};
  } else {
    r.results = {fq, flse};
  }
  return r;
}

std::vector<Tensor> attention_vjp(const VjpArgs& a) {
  if (a.cotangents[1].defined())
    throw Error("[attention] the log-sum-exp output is internal and cannot be differentiated");
  const Tensor& dout = a.cotangents[0];
  std::vector<Tensor> res(a.inputs.size());
  if (!dout.defined()) return res;
  std::vector<Tensor> ins = a.inputs;
  ins.push_back(a.outputs[1]);
  ins.push_back(dout);
  std::vector<Tensor> g = emit("attention_grad", ins, a.attrs);
  res[0] = g[0];
  res[1] = g[1];
  res[2] = g[2];
  return res;
}

// Second order: differentiate the composite formulation's gradient.
std::vector<Tensor> attention_grad_vjp(const VjpArgs& a) {
  const bool pad = has_pad(a.attrs);
  // Fresh copies: the inputs may depend on each other (dout usually depends on q, k, v through
  // the forward), and the nested gradients must take partial derivatives only; the caller's
  // autodiff follows those dependencies itself.
  const Tensor q = stop_gradient(a.inputs[0]), k = stop_gradient(a.inputs[1]), v = stop_gradient(a.inputs[2]);
  const Tensor dout = stop_gradient(a.inputs.back());
  Tensor o = composite_attention(q, k, v, pad ? a.inputs[3] : Tensor(), a.attrs.i("causal") != 0, a.attrs.f("scale"));
  std::vector<Tensor> first = gradients({o}, {q, k, v}, {dout});
  std::vector<Tensor> ys, cts;
  for (int i = 0; i < 3; ++i)
    if (a.cotangents[i].defined()) {
      ys.push_back(first[i]);
      cts.push_back(a.cotangents[i]);
    }
  std::vector<Tensor> res(a.inputs.size());
  if (ys.empty()) return res;
  std::vector<Tensor> second = gradients(ys, {q, k, v, dout}, cts);
  res[0] = second[0];
  res[1] = second[1];
  res[2] = second[2];
  res.back() = second[3];
  return res;
}

}  // namespace

Tensor dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  if (!q.defined() || !k.defined() || !v.defined()) throw Error(std::string(kOp) + "q, k and v must be defined");
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    throw Error(std::string(kOp) + "expects q [B,H,Sq,D] and k, v [B,Hkv,Sk,D], got q " + type_str(q.type()) + ", k " +
                type_str(k.type()) + ", v " + type_str(v.type()));
  if (!is_float(q.dtype()) || q.dtype() != k.dtype() || q.dtype() != v.dtype())
    throw Error(std::string(kOp) + "q, k and v must share one float dtype, got q " + type_str(q.type()) + ", k " +
                type_str(k.type()) + ", v " + type_str(v.type()));
  const int64_t b = q.dim(0), h = q.dim(1), sq = q.dim(2), d = q.dim(3);
  const int64_t hkv = k.dim(1), sk = k.dim(2);
  if (k.shape() != v.shape())
    throw Error(std::string(kOp) + "k " + type_str(k.type()) + " and v " + type_str(v.type()) + " must have one shape");
  if (k.dim(0) != b || k.dim(3) != d)
    throw Error(std::string(kOp) + "k " + type_str(k.type()) + " must have batch " + std::to_string(b) +
                " and head dim " + std::to_string(d) + " like q " + type_str(q.type()));
  if (hkv == 0 || h % hkv != 0)
    throw Error(std::string(kOp) + "query heads " + std::to_string(h) + " (q " + type_str(q.type()) +
                ") must be a multiple of key/value heads " + std::to_string(hkv) + " (k " + type_str(k.type()) + ")");
  if (opt.key_padding.defined() &&
      (opt.key_padding.dtype() != DType::boolean || opt.key_padding.shape() != Shape{b, sk}))
    throw Error(std::string(kOp) + "key_padding must be bool[" + std::to_string(b) + "," + std::to_string(sk) +
                "], got " + type_str(opt.key_padding.type()));
  const double scale = opt.scale.value_or(d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0);
  Tensor q5 = reshape(q, {b, hkv, h / hkv, sq, d});
  std::vector<Tensor> ins{q5, k, v};
  if (opt.key_padding.defined()) ins.push_back(opt.key_padding);
  Attrs attrs{{"causal", int64_t{opt.causal}},
              {"scale", scale},
              {"key_padding", int64_t{opt.key_padding.defined()}}};
  Tensor o = emit("attention", ins, attrs).at(0);
  return reshape(o, {b, h, sq, d});
}

void register_attention_primitives() {
  {
    Primitive p;
    p.name = "attention";
    p.attrs = {{"causal", AttrKind::integer}, {"scale", AttrKind::number}, {"key_padding", AttrKind::integer}};
    p.infer = infer_attention;
    p.vjp = attention_vjp;
    p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
      return attention_rule(in, out, a, false);
    };
    p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
      return attention_cost(in, out, a, 2);  // q k^T and p v
    };
    register_primitive(std::move(p));
  }
  {
    Primitive p;
    p.name = "attention_grad";
    p.attrs = {{"causal", AttrKind::integer}, {"scale", AttrKind::number}, {"key_padding", AttrKind::integer}};
    p.infer = infer_attention_grad;
    p.vjp = attention_grad_vjp;
    p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
      return attention_rule(in, out, a, true);
    };
    p.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs& a) {
      return attention_cost(in, out, a, 5);  // recomputed scores, dv, dp, dq, dk
    };
    register_primitive(std::move(p));
  }
}

}  // namespace px
