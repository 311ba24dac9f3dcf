// Internals of the SPMD partitioner: per-node sharding rules (with the partitioner's refinements),
// factor assignment, and sharding propagation over a global graph.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ir/primitive.h"
#include "parallax/sharding.h"

namespace px::spmd {

// Per dim, the mesh axis ids that split it (first major).
using Spec = std::vector<std::vector<int>>;
using FactorAxes = std::vector<std::vector<int>>;  // per factor of a rule

// A primitive's rule as the partitioner uses it, from the primitive's SpmdTraits: positional
// factors converted as they declare, `reduce` says how partial results of sharded reduction
// factors combine ("sum" / "max"); reduction factors of other primitives stay whole.
struct NodeRule {
  ShardingRule rule;
  std::string reduce;
  // Factors that get mesh axes only after all others (Positional::late).
  std::vector<int> late;
};
NodeRule node_rule(const Graph& g, const Node& n);

// `fixed` per value: 0 free, 1 fixed (an input, a constraint's result), kFixedForReaders the
// result of a constraint that lays a value out for some of its readers (a gathered param, a
// sequence-parallel activation gathered for a matmul).
constexpr char kFixedForReaders = 2;

// Picks mesh axes for the rule's factors from the specs known for the node's operands and
// results (unknown: nullopt). Sources are taken by priority: `fixed` results first, then operands
// laid out for this reader (kFixedForReaders), then the largest values, so that big operands keep
// their layout (the rule's late factors after all the others); an axis serves one factor only,
// and every dim a factor labels must divide by its axes.
FactorAxes assign_factors(const Graph& g, const Node& n, const NodeRule& r, const Mesh& mesh,
                          const std::vector<std::optional<Spec>>& specs, const std::vector<char>& fixed);

// The spec a factor assignment gives to dims labelled `factors` (whole / -1 dims unsplit).
Spec spec_from_factors(const std::vector<int>& factors, const NodeRule& r, const FactorAxes& fa);
int64_t shards_of(const Mesh& mesh, const std::vector<int>& axes);
Shape local_shape(const Mesh& mesh, const Shape& global, const Spec& s);

// Shardings of every value of g. Inputs and sharding_constraint results are fixed; requested
// output shardings seed their values; everything else is refined (axes only ever added) by
// forward and backward passes until nothing changes.
struct Propagation {
  std::vector<Spec> spec;  // per value
  std::vector<char> fixed;
};
Propagation propagate(const Graph& g, const Mesh& mesh, const std::vector<Spec>& inputs,
                      const std::vector<std::optional<Spec>>& outputs);

// ---- local forms (local_forms.cc) --------------------------------------------------------------

// LocalContext (src/ir/primitive.h): what a local form gets from the partitioner.

// Whether n, with factors assigned as fa, must be emitted by its primitive's local form instead
// of as itself: one of its positional factors is split.
bool needs_local_form(const Node& n, const ShardingRule& r, const FactorAxes& fa);
// The local results of n from its resharded local operands (results typed `want`), from the
// primitive's SpmdTraits::local_form.
std::vector<Tensor> local_form(const LocalContext& c, const Node& n, const Graph& g, const ShardingRule& r,
                               const FactorAxes& fa, const std::vector<Tensor>& in,
                               const std::vector<TensorType>& want);

// Conversions with the public Sharding (axis names).
Spec to_spec(const Sharding& s, int rank);
std::vector<int> axis_ids(const Mesh& mesh, const std::vector<std::string>& names);
std::vector<std::string> axis_names(const Mesh& mesh, const std::vector<int>& ids);
Sharding to_sharding(const Mesh& mesh, const Spec& s, const std::vector<int>& partial = {});
std::string spec_str(const Mesh& mesh, const Spec& s);

}  // namespace px::spmd

namespace px::detail {
// A ShardedArray that can be read: this process's shards all there and of the local type; throws
// px::UserError("[<who>] ...") otherwise (sharded_array.cc).
void check_complete(const ShardedArray& a, const char* who);
}  // namespace px::detail
