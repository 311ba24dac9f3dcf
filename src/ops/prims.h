// Typed handles to the primitives that passes outside src/ops recognise and that the backends key
// their kernels by. A pass compares a node's
// primitive with a handle (`n.prim == prims::transfer()`), never with a name, so a misspelt or
// renamed primitive is a compile error, not a silent miss; the names live only in src/ops
// (scripts/check_primitive_names.py keeps it so). Prefer a trait on the Primitive (spmd, tp,
// elementwise, in_place, decompose) where a pass asks what a primitive does rather than which it is.
#pragma once

#include "ir/primitive.h"

namespace px::prims {

const Primitive* abs();
const Primitive* adamw_update();
const Primitive* add();
const Primitive* attention();
const Primitive* attention_grad();
const Primitive* broadcast_in_dim();
const Primitive* cast();
const Primitive* concat();
const Primitive* constant();
const Primitive* div();
const Primitive* dot_general();
const Primitive* eq();
const Primitive* exp();
const Primitive* fold_in();
const Primitive* full();
const Primitive* ge();
const Primitive* gelu();
const Primitive* gelu_grad();
const Primitive* gt();
const Primitive* iota();
const Primitive* layer_norm();
const Primitive* layer_norm_grad();
const Primitive* le();
const Primitive* linear_cross_entropy();
const Primitive* linear_cross_entropy_grad();
const Primitive* log();
const Primitive* log_softmax();
const Primitive* logical_and();
const Primitive* logical_not();
const Primitive* logical_or();
const Primitive* lt();
const Primitive* maximum();
const Primitive* minimum();
const Primitive* mul();
const Primitive* ne();
const Primitive* neg();
const Primitive* one_hot();
const Primitive* pad();
const Primitive* pow();
const Primitive* random_normal();
const Primitive* random_uniform();
const Primitive* reduce_max();
const Primitive* reduce_sum();
const Primitive* reshape();
const Primitive* rms_norm();
const Primitive* rms_norm_grad();
const Primitive* rsqrt();
const Primitive* scatter_add();
const Primitive* select();
const Primitive* sigmoid();
const Primitive* silu();
const Primitive* slice();
const Primitive* softmax();
const Primitive* softmax_cross_entropy();
const Primitive* softmax_cross_entropy_grad();
const Primitive* sqrt();
const Primitive* stop_gradient();
const Primitive* sub();
const Primitive* tag();
const Primitive* take();
const Primitive* tanh();
const Primitive* transfer();
const Primitive* transpose();

// The SPMD primitives that src/sharding registers on its first use (src/sharding/prims.h has their
// handles, which register them): null until then. For the backends' kernel tables, which sit below
// src/sharding and look these up when a node of theirs first asks for a kernel.
const Primitive* local_slice_if_registered();
const Primitive* sharding_constraint_if_registered();

// True when the node runs the given primitive.
inline bool is(const Node& n, const Primitive* p) { return n.prim == p; }

}  // namespace px::prims
