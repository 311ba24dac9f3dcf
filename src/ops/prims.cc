// The registered primitives behind src/ops/prims.h's handles, looked up once by name.
#include "ops/prims.h"

#include <atomic>
#include <string>

namespace px::prims {

namespace {
const Primitive* lookup(const char* name) { return &get_primitive(name); }
}  // namespace

const Primitive* abs() { static const Primitive* p = lookup("abs"); return p; }
const Primitive* adamw_update() { static const Primitive* p = lookup("adamw_update"); return p; }
const Primitive* add() { static const Primitive* p = lookup("add"); return p; }
const Primitive* attention() { static const Primitive* p = lookup("attention"); return p; }
const Primitive* attention_grad() { static const Primitive* p = lookup("attention_grad"); return p; }
const Primitive* broadcast_in_dim() { static const Primitive* p = lookup("broadcast_in_dim"); return p; }
const Primitive* cast() { static const Primitive* p = lookup("cast"); return p; }
const Primitive* concat() { static const Primitive* p = lookup("concat"); return p; }
const Primitive* constant() { static const Primitive* p = lookup("constant"); return p; }
const Primitive* div() { static const Primitive* p = lookup("div"); return p; }
const Primitive* dot_general() { static const Primitive* p = lookup("dot_general"); return p; }
const Primitive* eq() { static const Primitive* p = lookup("eq"); return p; }
const Primitive* exp() { static const Primitive* p = lookup("exp"); return p; }
const Primitive* fold_in() { static const Primitive* p = lookup("fold_in"); return p; }
const Primitive* full() { static const Primitive* p = lookup("full"); return p; }
const Primitive* ge() { static const Primitive* p = lookup("ge"); return p; }
const Primitive* gelu() { static const Primitive* p = lookup("gelu"); return p; }
const Primitive* gelu_grad() { static const Primitive* p = lookup("gelu_grad"); return p; }
const Primitive* gt() { static const Primitive* p = lookup("gt"); return p; }
const Primitive* iota() { static const Primitive* p = lookup("iota"); return p; }
const Primitive* layer_norm() { static const Primitive* p = lookup("layer_norm"); return p; }
const Primitive* layer_norm_grad() { static const Primitive* p = lookup("layer_norm_grad"); return p; }
const Primitive* le() { static const Primitive* p = lookup("le"); return p; }
const Primitive* linear_cross_entropy() { static const Primitive* p = lookup("linear_cross_entropy"); return p; }
const Primitive* linear_cross_entropy_grad() {
  static const Primitive* p = lookup("linear_cross_entropy_grad");
  return p;
}
const Primitive* log() { static const Primitive* p = lookup("log"); return p; }
const Primitive* log_softmax() { static const Primitive* p = lookup("log_softmax"); return p; }
const Primitive* logical_and() { static const Primitive* p = lookup("logical_and"); return p; }
const Primitive* logical_not() { static const Primitive* p = lookup("logical_not"); return p; }
const Primitive* logical_or() { static const Primitive* p = lookup("logical_or"); return p; }
const Primitive* lt() { static const Primitive* p = lookup("lt"); return p; }
const Primitive* maximum() { static const Primitive* p = lookup("maximum"); return p; }
const Primitive* minimum() { static const Primitive* p = lookup("minimum"); return p; }
const Primitive* mul() { static const Primitive* p = lookup("mul"); return p; }
const Primitive* ne() { static const Primitive* p = lookup("ne"); return p; }
const Primitive* neg() { static const Primitive* p = lookup("neg"); return p; }
const Primitive* one_hot() { static const Primitive* p = lookup("one_hot"); return p; }
const Primitive* pad() { static const Primitive* p = lookup("pad"); return p; }
const Primitive* pow() { static const Primitive* p = lookup("pow"); return p; }
const Primitive* random_normal() { static const Primitive* p = lookup("random_normal"); return p; }
const Primitive* random_uniform() { static const Primitive* p = lookup("random_uniform"); return p; }
const Primitive* reduce_max() { static const Primitive* p = lookup("reduce_max"); return p; }
const Primitive* reduce_sum() { static const Primitive* p = lookup("reduce_sum"); return p; }
const Primitive* reshape() { static const Primitive* p = lookup("reshape"); return p; }
const Primitive* rms_norm() { static const Primitive* p = lookup("rms_norm"); return p; }
const Primitive* rms_norm_grad() { static const Primitive* p = lookup("rms_norm_grad"); return p; }
const Primitive* rsqrt() { static const Primitive* p = lookup("rsqrt"); return p; }
const Primitive* scatter_add() { static const Primitive* p = lookup("scatter_add"); return p; }
const Primitive* select() { static const Primitive* p = lookup("select"); return p; }
const Primitive* sigmoid() { static const Primitive* p = lookup("sigmoid"); return p; }
const Primitive* silu() { static const Primitive* p = lookup("silu"); return p; }
const Primitive* slice() { static const Primitive* p = lookup("slice"); return p; }
const Primitive* softmax() { static const Primitive* p = lookup("softmax"); return p; }
const Primitive* softmax_cross_entropy() { static const Primitive* p = lookup("softmax_cross_entropy"); return p; }
const Primitive* softmax_cross_entropy_grad() {
  static const Primitive* p = lookup("softmax_cross_entropy_grad");
  return p;
}
const Primitive* sqrt() { static const Primitive* p = lookup("sqrt"); return p; }
const Primitive* stop_gradient() { static const Primitive* p = lookup("stop_gradient"); return p; }
const Primitive* sub() { static const Primitive* p = lookup("sub"); return p; }
const Primitive* tag() { static const Primitive* p = lookup("tag"); return p; }
const Primitive* take() { static const Primitive* p = lookup("take"); return p; }
const Primitive* tanh() { static const Primitive* p = lookup("tanh"); return p; }
const Primitive* transfer() { static const Primitive* p = lookup("transfer"); return p; }
const Primitive* transpose() { static const Primitive* p = lookup("transpose"); return p; }

namespace {
// A primitive registered above src/ops, or null while it is not: cached once found.
const Primitive* if_registered(std::atomic<const Primitive*>& cache, const char* name) {
  if (const Primitive* p = cache.load(std::memory_order_acquire)) return p;
  for (const std::string& n : primitive_names())
    if (n == name) {
      const Primitive* p = &get_primitive(n);
      cache.store(p, std::memory_order_release);
      return p;
    }
  return nullptr;
}
}  // namespace

const Primitive* local_slice_if_registered() {
  static std::atomic<const Primitive*> p{nullptr};
  return if_registered(p, "local_slice");
}
const Primitive* sharding_constraint_if_registered() {
  static std::atomic<const Primitive*> p{nullptr};
  return if_registered(p, "sharding_constraint");
}

}  // namespace px::prims
