// dot_product_attention as a composite of public ops: scores and probabilities in f32, masks
// built from iota comparisons, grouped-query heads folded into the batched matmuls.
#include <cmath>

#include "ir/primitive.h"
#include "parallax/ops.h"

namespace px {

Tensor dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  const char* op = "[dot_product_attention] ";
  if (!q.defined() || !k.defined() || !v.defined()) throw Error(std::string(op) + "q, k and v must be defined");
  if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4)
    throw Error(std::string(op) + "expects q [B,H,Sq,D] and k, v [B,Hkv,Sk,D], got q " + type_str(q.type()) + ", k " +
                type_str(k.type()) + ", v " + type_str(v.type()));
  if (!is_float(q.dtype()) || q.dtype() != k.dtype() || q.dtype() != v.dtype())
    throw Error(std::string(op) + "q, k and v must share one float dtype, got q " + type_str(q.type()) + ", k " +
                type_str(k.type()) + ", v " + type_str(v.type()));
  const int64_t b = q.dim(0), h = q.dim(1), sq = q.dim(2), d = q.dim(3);
  const int64_t hkv = k.dim(1), sk = k.dim(2);
  if (k.shape() != v.shape())
    throw Error(std::string(op) + "k " + type_str(k.type()) + " and v " + type_str(v.type()) + " must have one shape");
  if (k.dim(0) != b || k.dim(3) != d)
    throw Error(std::string(op) + "k " + type_str(k.type()) + " must have batch " + std::to_string(b) +
                " and head dim " + std::to_string(d) + " like q " + type_str(q.type()));
  if (hkv == 0 || h % hkv != 0)
    throw Error(std::string(op) + "query heads " + std::to_string(h) + " (q " + type_str(q.type()) +
                ") must be a multiple of key/value heads " + std::to_string(hkv) + " (k " + type_str(k.type()) + ")");
  if (opt.key_padding.defined() &&
      (opt.key_padding.dtype() != DType::boolean || opt.key_padding.shape() != Shape{b, sk}))
    throw Error(std::string(op) + "key_padding must be bool[" + std::to_string(b) + "," + std::to_string(sk) +
                "], got " + type_str(opt.key_padding.type()));
  const int64_t g = h / hkv;
  const double scale = opt.scale.value_or(d > 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : 1.0);

  // Query head hq uses key/value head hq / g: view q as [B, Hkv, G, Sq, D].
  Tensor q5 = reshape(q * scale, {b, hkv, g, sq, d});
  Tensor scores = dot_general(q5, k, DotDims{{4}, {3}, {0, 1}, {0, 1}}, DType::f32);  // [B,Hkv,G,Sq,Sk]
  Tensor mask;
  if (opt.causal) {
    // Queries are aligned to the end of the keys (decoding appends queries after a cache).
    Tensor row = iota({sq, sk}, 0, DType::i32) + full({}, static_cast<double>(sk - sq), DType::i32);
    Tensor col = iota({sq, sk}, 1, DType::i32);
    mask = broadcast_in_dim(less_equal(col, row), {b, hkv, g, sq, sk}, {3, 4});
  }
  if (opt.key_padding.defined()) {
    Tensor pad = broadcast_in_dim(opt.key_padding, {b, hkv, g, sq, sk}, {0, 4});
    mask = mask.defined() ? logical_and(mask, pad) : pad;
  }
  // A large finite negative keeps fully masked rows finite (uniform) instead of NaN.
  if (mask.defined()) scores = where(mask, scores, full({}, -1e30, DType::f32));
  Tensor probs = softmax(scores, -1);
  if (probs.dtype() != v.dtype()) probs = cast(probs, v.dtype());
  Tensor out = dot_general(probs, v, DotDims{{4}, {2}, {0, 1}, {0, 1}});  // [B,Hkv,G,Sq,D]
  return reshape(out, {b, h, sq, d});
}

}  // namespace px
