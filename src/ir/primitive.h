// A primitive declares, in one place: its shape/dtype rule, its vjp (written with public
// ops, so it is itself traceable), its einsum-like sharding rule and its cost. Kernels live
// in src/backend/<backend>/ keyed by the primitive's name. See docs/ir.md.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {

struct VjpArgs {
  const std::vector<Tensor>& inputs;
  const std::vector<Tensor>& outputs;
  const std::vector<Tensor>& cotangents;  // one per output; undefined = zero cotangent
  const Attrs& attrs;
};
// Returns one cotangent per input; an undefined Tensor means zero / no gradient.
using VjpFn = std::function<std::vector<Tensor>(const VjpArgs&)>;

// Einsum-like sharding rule: every dimension of every operand and result is labelled with a
// factor (or -1 when it has size 1 / takes no part). A factor that appears in the results is
// parallel: sharding it shards the work. A reduction factor appears only in operands: sharding
// it leaves a partial sum. A whole factor must not be sharded.
struct ShardingRule {
  enum class Kind { parallel, reduction, whole };
  std::vector<std::vector<int>> operands;  // factor id per operand dim
  std::vector<std::vector<int>> results;   // factor id per result dim
  std::vector<int64_t> factor_sizes;
  std::vector<Kind> factor_kinds;
  std::string to_string() const;  // "ij,jk->ik {j: reduction}"
};

struct Cost {
  double flops = 0;
  double bytes_read = 0;
  double bytes_written = 0;
};

using InferFn = std::function<std::vector<TensorType>(const std::vector<TensorType>&, const Attrs&)>;
using ShardingFn =
    std::function<ShardingRule(const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&)>;
using CostFn = std::function<Cost(const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&)>;

struct Primitive {
  std::string name;
  InferFn infer;          // throws px::Error("[name] ...") on bad input
  VjpFn vjp;              // null: not differentiable (integer/bool-valued ops)
  ShardingFn sharding;    // null: every dim whole (never sharded)
  CostFn cost;            // null: default_cost (bytes of operands and results, 1 flop/elem)
  bool elementwise = false;  // same-shaped operands and result, fusible into elementwise loops
  bool no_cse = false;       // e.g. ops with side effects
};

void register_primitive(Primitive p);
const Primitive& get_primitive(const std::string& name);  // throws if unknown
std::vector<std::string> primitive_names();

Cost default_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out);
Cost cost_of(const Primitive& p, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
             const Attrs& attrs);
ShardingRule sharding_of(const Primitive& p, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                         const Attrs& attrs);
// The rule of a same-shaped elementwise op: all dims parallel.
ShardingRule elementwise_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out);

// Emits one node of primitive `name` into the inputs' graph (or current_graph() when there
// are no inputs) and returns its outputs. Checks that inputs share one graph.
std::vector<Tensor> emit(const std::string& name, const std::vector<Tensor>& inputs, Attrs attrs = {});
inline Tensor emit1(const std::string& name, const std::vector<Tensor>& inputs, Attrs attrs = {}) {
  return emit(name, inputs, std::move(attrs)).at(0);
}

// Family registration, called once from the registry (src/ops/registry.cc).
void register_elementwise_primitives();
void register_shape_primitives();
void register_reduce_primitives();
void register_matmul_primitives();
void register_nn_primitives();
void register_index_primitives();
void register_rng_primitives();

}  // namespace px
