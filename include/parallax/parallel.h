// The sharding recipes' planning, the recipe's decision for a traced step, and px::jit for plain
// functions. A training step on a mesh is px::TrainStep with TrainStepOptions::mesh (train.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/sharding.h"
#include "parallax/spmd.h"
#include "parallax/strategy.h"
#include "parallax/graph.h"
#include "parallax/runtime.h"

namespace px {

// Decides each param's spec. `forward` is a traced program whose first inputs are the params (in
// order, named by `paths`); TP reads from it which matmul consumes each param and what it feeds.
// Throws px::Error at plan time for unknown axes and specs that do not fit a param, and for AUTO,
// which needs the whole training step (TrainStep or px::plan_auto solve it).
ShardingPlan plan_sharding(const Graph& forward, const std::vector<std::string>& paths, const Mesh& mesh,
                           ShardingStrategy strategy, const ShardingOptions& options = {});

// The rules use px::glob_match (core.h): '*' matches any run of characters, '?' one character.

// A forward-only program over the params (e.g. logits for evaluation or decoding), on one device
// or, with a mesh, split over it by a recipe the way TrainStep is; one path for both (ForwardFn in
// train.h, ShardedFunction below).
struct ForwardOptions {
  std::optional<Mesh> mesh;
  ShardingStrategy strategy = ShardingStrategy::DDP;
  ShardingOptions sharding;
  CompileOptions compile{};
  // Donation, as jax.jit's donate_argnums: positions in (params..., then the other arguments) whose
  // arrays the call may write its outputs into (each into the first output of its type not taken).
  // Only a call with non-const std::vector<Array> lvalues donates: it leaves the donated arrays of
  // the caller's vectors empty (released), and passing a released array again is a px::Error. Other
  // arrays are never written; without a mesh the donated buffer holds the output in place.
  std::vector<int> donate{};
};

// A plain function sharded by a recipe or AUTO over `on.mesh` (unset: one device, every param
// replicated): its first argument is the params (as one list).
class ShardedFunction {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>& params, const std::vector<Tensor>& args)>;
  ShardedFunction(Fn fn, std::vector<TensorType> param_types, std::vector<std::string> param_paths,
                  std::vector<TensorType> arg_types, const ForwardOptions& on);
  ~ShardedFunction();
  // Full host arrays in, full outputs out (sharded, run, gathered). Writes into no argument: with
  // ForwardOptions::donate set it throws, since the donated arrays could not be released.
  std::vector<Array> operator()(const std::vector<Array>& params, const std::vector<Array>& args);
  // With ForwardOptions::donate: the donated arrays' buffers take outputs (in place on one device),
  // and the caller's donated arrays are left empty (released); a released array passed again is a
  // px::Error. Without donate, the same as the const form.
  std::vector<Array> operator()(std::vector<Array>& params, std::vector<Array>& args);
  const ShardingPlan& plan() const { return plan_; }
  const ShardedExecutable& executable() const { return *exe_; }

 private:
  ShardingPlan plan_;
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<ShardedExecutable> exe_;
  std::vector<int> donate_;        // positions donated (ForwardOptions::donate)
  std::vector<int> donor_of_out_;  // per output: the donated position whose array takes it, or -1
  std::vector<std::string> names_;
  std::vector<Array> run(const std::vector<Array>& in, bool donating);
};

// px::jit(fn, strategy, ...): fn's first argument is the params (paths name them for rules and tables).
std::unique_ptr<ShardedFunction> jit(ShardedFunction::Fn fn, ShardingStrategy strategy,
                                     const std::vector<TensorType>& param_types,
                                     const std::vector<std::string>& param_paths,
                                     const std::vector<TensorType>& arg_types, const Mesh& mesh,
                                     const ShardingOptions& options = {});

}  // namespace px
