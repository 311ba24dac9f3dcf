// Typed handles to the primitives that passes outside src/ops recognise. A pass compares a node's
// primitive with a handle (`n.prim == prims::transfer()`), never with a name, so a misspelt or
// renamed primitive is a compile error, not a silent miss; the names live only in src/ops
// (scripts/check_primitive_names.py keeps it so). Prefer a trait on the Primitive (spmd, tp,
// elementwise, in_place, decompose) where a pass asks what a primitive does rather than which it is.
#pragma once

#include "ir/primitive.h"

namespace px::prims {

const Primitive* add();
const Primitive* attention();
const Primitive* broadcast_in_dim();
const Primitive* cast();
const Primitive* dot_general();
const Primitive* iota();
const Primitive* reshape();
const Primitive* scatter_add();
const Primitive* slice();
const Primitive* softmax_cross_entropy();
const Primitive* softmax_cross_entropy_grad();
const Primitive* tag();
const Primitive* take();
const Primitive* transfer();
const Primitive* transpose();

// True when the node runs the given primitive.
inline bool is(const Node& n, const Primitive* p) { return n.prim == p; }

}  // namespace px::prims
