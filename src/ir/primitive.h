// A primitive declares, in one place: its shape/dtype rule, its vjp (written with public
// ops, so it is itself traceable), its einsum-like sharding rule, how the SPMD partitioner and
// the TP recipe treat it (SpmdTraits, TpTraits) and its cost. Kernels live in
// src/backend/<backend>/ keyed by the primitive (src/ops/prims.h's handles). See docs/ir.md and
// docs/adding-a-primitive.md.
//
//   Primitive p;
//   p.name = "my_add";
//   p.infer = ...;  p.vjp = ...;  p.sharding = ...;
//   p.spmd.linear = kLinearJointly;  // partial sums of both operands add up unreduced
//   register_primitive(std::move(p));
#pragma once

#include <functional>
#include <optional>
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

// What one node costs on its (local) types: all its FLOPs, the part of them that a matrix unit
// runs (matmuls and attention's products: timed at the device's matmul rate for the operands'
// dtype, the rest at its vector rate), and the bytes it reads and writes (src/sharding/auto/).
struct Cost {
  double flops = 0;
  double matmul_flops = 0;  // <= flops
  double bytes_read = 0;
  double bytes_written = 0;
};

using InferFn = std::function<std::vector<TensorType>(const std::vector<TensorType>&, const Attrs&)>;
using ShardingFn =
    std::function<ShardingRule(const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&)>;
using CostFn = std::function<Cost(const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&)>;

// ---- What the SPMD partitioner (and a sharding solver) reads from a primitive ---------------
// Everything the partitioner knows of a primitive beyond its ShardingRule is declared here, so
// that a split of any factor can be judged from the primitive alone.

// How the partial results that a split reduction factor of the rule leaves combine into the full
// result. none: the rule's reduction factors are never split (the partitioner keeps them whole).
enum class PartialReduce { none, sum, max };
const char* partial_reduce_name(PartialReduce r);  // "", "sum", "max" (the collectives' reduce attr)

// Which operands a partial sum may flow through unreduced: the op is linear in them, so applied
// to each device's partial sums it gives partial sums of its result, and one all-reduce after it
// replaces one per operand (e.g. the q, k and v projections' input gradients are added first).
// Operands partial over different mesh axes, or combined by max, are always reduced first.
struct Linearity {
  enum class In {
    none,          // every partial operand is reduced before the op
    all_operands,  // jointly linear: all operands partial (add, sub, concat; one-operand neg, reshape, reduce_sum)
    any_one,       // linear in each operand with the others fixed: exactly one partial (mul, dot_general)
    first,         // linear in operand 0 only, which alone is partial (div's numerator)
  };
  In in = In::none;
  // The op costs little next to a collective (additions, moves): it runs unsplit over the partial
  // axes and carries the partial sum. false (products): it keeps its split, and its partial
  // operands are reduced first where that split uses one of their partial axes.
  bool cheap = false;
};
inline constexpr Linearity kLinearJointly{Linearity::In::all_operands, true};  // additions and moves

// Factors whose split needs this device's offset along them (its block's position in the mesh).
// The partitioner then emits the primitive's local form, which reads the offset from the
// device-coordinates input (a row-split table's lookup, a split random draw, a split iota).
using PositionalFn = std::function<std::vector<int>(const ShardingRule&, const Attrs&)>;
struct Positional {
  PositionalFn factors;  // the rule's factors (for these attrs) that need the offset; null: none
  // What such a factor becomes in the partitioner's rule: parallel, or reduction when the local
  // form leaves partial results (take's masked lookup: combined as SpmdTraits::partial says).
  ShardingRule::Kind split_as = ShardingRule::Kind::parallel;
  // The factors get mesh axes only after all others: a table's rows yield their axis to the batch
  // dims of the indices, so that data-parallel lookups stay local.
  bool late = false;
};

namespace spmd {
// What a local form needs from the partitioner: the local graph (being traced), the size of every
// mesh axis, the device-coordinates input (i32 [number of axes]) and an all-reduce over mesh axes
// that the partitioner records like every other collective.
struct LocalContext {
  Graph& local;
  std::vector<int64_t> axis_sizes;
  Tensor coords;
  std::function<Tensor(const Tensor&, const std::vector<int>& axes, const std::string& reduce)> all_reduce;
};
}  // namespace spmd
// What a local form gets: the global node and graph, the node's rule as the partitioner uses it
// (positional factors already converted), the mesh axes of every factor, the local operands laid
// out as the rule wants and the local result types it must return.
struct LocalFormArgs {
  const Node& node;
  const Graph& graph;
  const ShardingRule& rule;
  const std::vector<std::vector<int>>& factor_axes;
  const std::vector<Tensor>& inputs;
  const std::vector<TensorType>& want;
};
// Emits the node's local results into the context's local graph (while it is being traced).
using LocalFormFn = std::function<std::vector<Tensor>(const spmd::LocalContext&, const LocalFormArgs&)>;

struct SpmdTraits {
  PartialReduce partial = PartialReduce::none;
  Linearity linear;
  Positional positional;
  // Emitted instead of the primitive when a positional factor is split. Null with positional
  // factors only for iota, whose split the partitioner emits itself (emit_iota).
  LocalFormFn local_form;
  // A collective of local programs, run through a Communicator: which one (none: not a collective).
  std::optional<CollectiveKind> collective;
};

// How the TP recipe's graph analysis (Megatron pairing, src/sharding/recipes/plan.cc) reads a
// primitive on the path from one weight matmul to the next.
struct TpTraits {
  // Mixes the features of a row (reductions, norms, softmax): a column split of its operand does
  // not carry through, so the analysis stops there.
  bool mixes_features = false;
  // Whether the analysis sees a param through it: same_dims ops give the operand element for
  // element (cast, tag, stop_gradient, sharding_constraint); layout ops also rearrange or repeat
  // it without computing (reshape, broadcast_in_dim), which a bias may pass through.
  enum class View { opaque, same_dims, layout };
  View view = View::opaque;
};

// The attributes of a primitive, typed: a node's attrs are checked against its primitive's list
// when the node is built (Graph::emit): an unknown name, a value of another type or a missing
// required attribute is an error naming the primitive and what it takes. Passes annotate nodes
// of any primitive with a few attributes of their own (kAnnotations), which every primitive takes.
enum class AttrKind { integer, number, string, ints, dtype, array };  // number: a float (an integer is taken too)
struct AttrSpec {
  std::string name;
  AttrKind kind;
  bool required = true;
};
const char* attr_kind_name(AttrKind k);  // "an integer", "a number", ...
// Throws px::Error("[prim] ...") when `attrs` do not fit p.attrs (or kAnnotations).
void check_attrs(const Primitive& p, const Attrs& attrs);

struct Primitive {
  std::string name;
  std::vector<AttrSpec> attrs;  // what its nodes carry (empty: no attributes)
  InferFn infer;          // throws px::Error("[name] ...") on bad input
  VjpFn vjp;              // null: not differentiable (integer/bool-valued ops)
  ShardingFn sharding;    // null: every dim whole (never sharded)
  CostFn cost;            // null: default_cost (bytes of operands and results, 1 flop/elem)
  bool elementwise = false;  // same-shaped operands and result, fusible into elementwise loops
  bool no_cse = false;       // e.g. ops with side effects
  // Its kernel reads element i of every operand before it writes element i of any result, so a
  // result may take an operand's buffer (an update written over the state it reads).
  bool in_place = false;
  // Operands (bit k: operand k) that its kernels read in any float dtype and widen to f32
  // themselves, to the bits a cast would give: a widening cast in front of one is redundant, and
  // narrow_layouts hands it the narrow value where the results keep their types (adamw_update's
  // gradient, the loss's logits: a bf16 weight gradient or logits never written out in f32).
  uint32_t widens_operands = 0;
  // Null: none. The same results, to the bit, from finer primitives (written with public ops),
  // for passes that place the parts of one op apart (offload: the part of an update that reads
  // an offloaded param runs on the host, the rest where its operands live).
  std::function<std::vector<Tensor>(const std::vector<Tensor>&, const Attrs&)> decompose = nullptr;
  SpmdTraits spmd{};         // default: partial results never combined, not linear, no offsets
  TpTraits tp{};             // default: the TP analysis passes through it but never sees a param through it
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
// Every dim of every operand and result its own whole factor: nothing may be split.
ShardingRule whole_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out);
// The factors of `r` (p's rule for these attrs) whose split needs the device's offset, >= 0 only.
std::vector<int> positional_factors(const Primitive& p, const ShardingRule& r, const Attrs& attrs);

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
void register_optim_primitives();
void register_index_primitives();
void register_rng_primitives();
void register_memory_primitives();  // transfer (src/ops/transfer.cc)

}  // namespace px
