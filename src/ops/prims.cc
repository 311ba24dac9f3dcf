// The registered primitives behind src/ops/prims.h's handles, looked up once by name.
#include "ops/prims.h"

namespace px::prims {

namespace {
const Primitive* lookup(const char* name) { return &get_primitive(name); }
}  // namespace

const Primitive* add() { static const Primitive* p = lookup("add"); return p; }
const Primitive* attention() { static const Primitive* p = lookup("attention"); return p; }
const Primitive* broadcast_in_dim() { static const Primitive* p = lookup("broadcast_in_dim"); return p; }
const Primitive* cast() { static const Primitive* p = lookup("cast"); return p; }
const Primitive* dot_general() { static const Primitive* p = lookup("dot_general"); return p; }
const Primitive* iota() { static const Primitive* p = lookup("iota"); return p; }
const Primitive* reshape() { static const Primitive* p = lookup("reshape"); return p; }
const Primitive* scatter_add() { static const Primitive* p = lookup("scatter_add"); return p; }
const Primitive* slice() { static const Primitive* p = lookup("slice"); return p; }
const Primitive* softmax_cross_entropy() { static const Primitive* p = lookup("softmax_cross_entropy"); return p; }
const Primitive* softmax_cross_entropy_grad() {
  static const Primitive* p = lookup("softmax_cross_entropy_grad");
  return p;
}
const Primitive* tag() { static const Primitive* p = lookup("tag"); return p; }
const Primitive* take() { static const Primitive* p = lookup("take"); return p; }
const Primitive* transfer() { static const Primitive* p = lookup("transfer"); return p; }
const Primitive* transpose() { static const Primitive* p = lookup("transpose"); return p; }

}  // namespace px::prims
