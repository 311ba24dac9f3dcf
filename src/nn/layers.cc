// Linear, Embedding, norms and feed-forward layers.
#include "parallax/nn/layers.h"

namespace px::nn {

namespace {
void check_positive(const char* layer, const char* field, int64_t v) {
  if (v <= 0) throw Error(std::string("[") + layer + "] " + field + " must be positive, got " + std::to_string(v));
}

void check_features(const char* layer, const Tensor& x, int64_t dim, const std::string& path) {
  if (x.rank() < 1 || x.dim(-1) != dim)
    throw Error(std::string("[") + layer + "] '" + path + "' expects inputs with last dim " + std::to_string(dim) +
                ", got " + type_str(x.type()));
}

// x . w over `dims` with both operands in the compute dtype: the product accumulates in f32, is
// written in that dtype (as under PyTorch's autocast) and widened to f32 for what follows.
Tensor mixed_dot(const Tensor& x, const Tensor& w, const DotDims& dims, DType compute_dtype) {
  return cast(dot_general(cast(x, compute_dtype), cast(w, compute_dtype), dims, compute_dtype), DType::f32);
}
}  // namespace

Tensor dense(const Tensor& x, const Tensor& w, DType compute_dtype) {
  if (compute_dtype == DType::f32 && x.dtype() == DType::f32 && w.dtype() == DType::f32) return matmul(x, w);
  return mixed_dot(x, w, {{x.rank() - 1}, {0}, {}, {}}, compute_dtype);
}

// ---- Linear ----------------------------------------------------------------------------------

Linear::Linear(Scope s, int64_t in_features, int64_t out_features, LinearOptions opt)
    : Module(s), compute_dtype_(opt.compute_dtype) {
  check_positive("Linear", "in_features", in_features);
  check_positive("Linear", "out_features", out_features);
  w = s.param("w", {DType::f32, {in_features, out_features}}, opt.w_init);
  if (opt.bias) b = s.param("b", {DType::f32, {out_features}}, opt.b_init);
}

Tensor Linear::operator()(const Tensor& x) const {
  check_features("Linear", x, w.shape()[0], path());
  Tensor y = dense(x, w, compute_dtype_);
  if (!b.defined()) return y;
  y = y + b.value();
  // With a 16-bit compute dtype the output is that dtype's, bias included (as a Linear under
  // autocast): what a following activation saves for its gradient is half the bytes.
  return compute_dtype_ == DType::f32 ? y : cast(cast(y, compute_dtype_), DType::f32);
}

// ---- Embedding -------------------------------------------------------------------------------

Embedding::Embedding(Scope s, int64_t vocab, int64_t dim, Init init) : Module(s) {
  check_positive("Embedding", "vocab", vocab);
  check_positive("Embedding", "dim", dim);
  table = s.param("table", {DType::f32, {vocab, dim}}, init);
}

Tensor Embedding::operator()(const Tensor& tokens) const {
  if (tokens.dtype() != DType::i32)
    throw Error("[Embedding] '" + path() + "' looks up i32 token ids, got " + type_str(tokens.type()));
  return take(table, tokens);
}

Tensor Embedding::attend(const Tensor& x, DType compute_dtype) const {
  check_features("Embedding", x, table.shape()[1], path());
  Tensor t = table;
  DotDims dims{{x.rank() - 1}, {1}, {}, {}};
  if (compute_dtype == DType::f32 && x.dtype() == DType::f32) return dot_general(x, t, dims);
  return mixed_dot(x, t, dims, compute_dtype);
}

// ---- norms -----------------------------------------------------------------------------------

LayerNorm::LayerNorm(Scope s, int64_t dim, double eps, bool with_bias) : Module(s), eps_(eps) {
  check_positive("LayerNorm", "dim", dim);
  scale = s.param("scale", {DType::f32, {dim}}, Init::ones());
  if (with_bias) bias = s.param("bias", {DType::f32, {dim}}, Init::zeros());
}

Tensor LayerNorm::operator()(const Tensor& x) const {
  check_features("LayerNorm", x, scale.shape()[0], path());
  return layer_norm(x, scale, bias.defined() ? bias.value() : Tensor(), eps_);
}

RMSNorm::RMSNorm(Scope s, int64_t dim, double eps) : Module(s), eps_(eps) {
  check_positive("RMSNorm", "dim", dim);
  scale = s.param("scale", {DType::f32, {dim}}, Init::ones());
}

Tensor RMSNorm::operator()(const Tensor& x) const {
  check_features("RMSNorm", x, scale.shape()[0], path());
  return rms_norm(x, scale, eps_);
}

// ---- feed-forward ----------------------------------------------------------------------------

Mlp::Mlp(Scope s, int64_t dim, int64_t hidden, FfnOptions opt)
    : Module(s),
      fc(s.sub("fc"), dim, hidden, {opt.bias, opt.w_init, Init::zeros(), opt.compute_dtype}),
      proj(s.sub("proj"), hidden, dim, {opt.bias, opt.out_init, Init::zeros(), opt.compute_dtype}) {}

Tensor Mlp::operator()(const Tensor& x) const { return proj(gelu(fc(x))); }

SwiGlu::SwiGlu(Scope s, int64_t dim, int64_t hidden, FfnOptions opt)
    : Module(s),
      gate(s.sub("gate"), dim, hidden, {opt.bias, opt.w_init, Init::zeros(), opt.compute_dtype}),
      up(s.sub("up"), dim, hidden, {opt.bias, opt.w_init, Init::zeros(), opt.compute_dtype}),
      down(s.sub("down"), hidden, dim, {opt.bias, opt.out_init, Init::zeros(), opt.compute_dtype}) {}

Tensor SwiGlu::operator()(const Tensor& x) const { return down(silu(gate(x)) * up(x)); }

}  // namespace px::nn
