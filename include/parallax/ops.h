// Ops on symbolic Tensors. Each call validates shapes and dtypes and emits one or more
// primitives into the graph being traced; errors name the op: "[add] ...".
//
//   px::Tensor h = px::gelu(px::matmul(x, w) + b);              // numpy-style broadcasting
//   px::Tensor p = px::softmax(h, /*axis=*/-1);
//   px::Tensor l = px::cross_entropy_loss(logits, labels);      // mean over non-ignored tokens
#pragma once

#include <optional>
#include <vector>

#include "parallax/graph.h"

namespace px {

// ---- constants -------------------------------------------------------------------------
Tensor constant(const Array& value);                              // into current_graph()
Tensor full(const Shape& shape, double value, DType dtype = DType::f32);
Tensor full_like(const Tensor& x, double value);
Tensor zeros_like(const Tensor& x);
Tensor ones_like(const Tensor& x);
Tensor iota(const Shape& shape, int axis, DType dtype = DType::i32);  // x[i...] = i[axis]

// ---- elementwise (binary ops broadcast numpy-style; operand dtypes must match) ----------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor square(const Tensor& x);  // x * x
Tensor sigmoid(const Tensor& x);
// Comparisons return bool tensors.
Tensor equal(const Tensor& a, const Tensor& b);
Tensor not_equal(const Tensor& a, const Tensor& b);
Tensor less(const Tensor& a, const Tensor& b);
Tensor less_equal(const Tensor& a, const Tensor& b);
Tensor greater(const Tensor& a, const Tensor& b);
Tensor greater_equal(const Tensor& a, const Tensor& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& x);
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  // select; broadcasts
Tensor cast(const Tensor& x, DType dtype);
Tensor stop_gradient(const Tensor& x);

// Scalars take the tensor's dtype.
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator-(const Tensor& a, double b);
Tensor operator*(const Tensor& a, double b);
Tensor operator/(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(double a, const Tensor& b);

// ---- shape -------------------------------------------------------------------------------
// Numpy broadcasting of a to shape (trailing alignment).
Tensor broadcast_to(const Tensor& x, const Shape& shape);
// x's dim i becomes result dim dims[i]; other result dims are broadcast.
Tensor broadcast_in_dim(const Tensor& x, const Shape& shape, const std::vector<int64_t>& dims);
Tensor reshape(const Tensor& x, const Shape& shape);  // one dim may be -1
Tensor transpose(const Tensor& x, const std::vector<int64_t>& perm);
Tensor swap_axes(const Tensor& x, int64_t a, int64_t b);
Tensor slice(const Tensor& x, const std::vector<int64_t>& starts, const std::vector<int64_t>& limits,
             const std::vector<int64_t>& strides = {});
Tensor slice_axis(const Tensor& x, int64_t axis, int64_t start, int64_t limit);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
Tensor pad(const Tensor& x, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi, double value = 0.0);
Tensor expand_dims(const Tensor& x, int64_t axis);
Tensor squeeze(const Tensor& x, int64_t axis);

// ---- reductions (axes empty = all axes; f32 accumulation for 16-bit floats) -------------
Tensor sum(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Tensor max(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& axes = {}, bool keepdims = false);

// ---- matmul ------------------------------------------------------------------------------
struct DotDims {
  std::vector<int64_t> lhs_contract, rhs_contract, lhs_batch, rhs_batch;
};
// Result dims: batch, lhs free, rhs free (XLA order). 16-bit inputs accumulate in f32;
// out_dtype (default: the input dtype) selects the result dtype, e.g. f32 from bf16 inputs.
Tensor dot_general(const Tensor& a, const Tensor& b, const DotDims& dims,
                   std::optional<DType> out_dtype = std::nullopt);
// a[..., m, k] @ b[..., k, n]; leading batch dims must match, or b is 2-D and shared.
Tensor matmul(const Tensor& a, const Tensor& b);

// ---- neural-network building blocks -------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);
Tensor logsumexp(const Tensor& x, int64_t axis = -1, bool keepdims = false);
// Normalize over the last axis; gamma/beta have shape [last dim] (beta may be undefined).
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);
Tensor rms_norm(const Tensor& x, const Tensor& gamma, double eps = 1e-6);
Tensor gelu(const Tensor& x, bool approximate_tanh = true);
Tensor silu(const Tensor& x);
// Per-position loss -log softmax(logits)[label], f32, shape = labels' shape; positions whose
// label equals ignore_index get 0. logits [..., V] float, labels [...] i32. A label outside
// [0, V) (labels are only known when the program runs) gives NaN there, and so a NaN loss:
// TrainStep reports it as StepMetrics::finite == false and can skip the update (skip_nonfinite).
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index = -100);
// Scalar: sum(w * loss) / max(sum(w), 1) where w = weights (same shape as labels, float)
// times (label != ignore_index). weights may be undefined (all ones).
Tensor cross_entropy_loss(const Tensor& logits, const Tensor& labels, const Tensor& weights = Tensor(),
                          int64_t ignore_index = -100);
// A language model's head and loss fused: softmax_cross_entropy(logits, labels, ignore_index) of
// logits = h w^T (vocab_axis 0: w [V, D], an embedding table) or h w (vocab_axis 1: w [D, V], a
// Linear weight), computed in chunks of rows and vocabulary so that the [..., V] logits never
// exist whole, forward or backward; f32 accumulation whatever the dtype (h and w share one).
// h [..., D], labels i32 [...]; the result is f32 [...].
Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& labels, int64_t vocab_axis,
                            int64_t ignore_index = -100);
// cross_entropy_loss of the same logits, through linear_cross_entropy.
Tensor linear_cross_entropy_loss(const Tensor& h, const Tensor& w, const Tensor& labels, int64_t vocab_axis,
                                 const Tensor& weights = Tensor(), int64_t ignore_index = -100);
struct AttentionOptions {
  bool causal = true;
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  Tensor key_padding;           // optional bool [B, Sk]: true = attend, false = masked out
};
// q [B, H, Sq, D], k/v [B, Hkv, Sk, D] with H % Hkv == 0 (grouped-query). Returns [B, H, Sq, D].
Tensor dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt = {});

// ---- indexing ----------------------------------------------------------------------------
// Gathers rows: result = table[indices] along axis 0 -> indices.shape + table.shape[1:].
// indices are i32; out-of-range ones are clamped to [0, rows - 1] (never a crash).
Tensor take(const Tensor& table, const Tensor& indices);
// The gradient of take: zeros(shape) with updates[i] added at row indices[i], clamped like take.
// Deterministic: the same bits whatever the thread count.
Tensor scatter_add(const Tensor& indices, const Tensor& updates, int64_t num_rows);
// indices.shape + [depth]; an index outside [0, depth) gives an all-zero row.
Tensor one_hot(const Tensor& indices, int64_t depth, DType dtype = DType::f32);

// ---- counter-based random numbers ---------------------------------------------------------
// A key is an i32[2] tensor. Values depend only on (key, element index), so they are the
// same whatever the sharding. random_key makes a constant key from a seed.
Tensor random_key(uint64_t seed);
Tensor fold_in(const Tensor& key, int64_t data);  // a new key derived from key and data
Tensor random_uniform(const Tensor& key, const Shape& shape, DType dtype = DType::f32, double lo = 0.0,
                      double hi = 1.0);
Tensor random_normal(const Tensor& key, const Shape& shape, DType dtype = DType::f32);
Tensor dropout_mask(const Tensor& key, const Shape& shape, double keep_prob);  // bool
Tensor dropout(const Tensor& key, const Tensor& x, double rate);               // scaled by 1/keep

// ---- sharding hint (no-op until a mesh is in play) --------------------------------------
Tensor tag(const Tensor& x, const std::string& name);  // names a value (remat policies, dumps)

// ---- memory kinds ------------------------------------------------------------------------
// A copy of x in the given memory kind (device or pinned_host), made by the backend's copy stream.
// Fetches (to device) with the same `group` form one prefetch group (a layer's params): the
// schedule starts them together, CompileOptions::prefetch_depth groups ahead of their first use.
Tensor to_memory(const Tensor& x, MemoryKind kind, const std::string& group = "");

}  // namespace px
