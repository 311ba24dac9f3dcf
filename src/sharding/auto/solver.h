// The AUTO search over a training step, independent of how the step is traced: the caller gives
// functions that cost a plan. Used by TrainStep on a mesh (one traced step) and by px::plan_auto
// (a TransformerLm from shapes, searched on fewer layers).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <memory>

#include "memory/step_program.h"
#include "parallax/auto.h"

namespace px::autoshard {

// A traced training step the search can cost plans of.
struct Model {
  std::vector<std::string> paths;
  std::vector<TensorType> types;
  std::vector<int> state_copies;  // per param: optimizer-state slots laid out like it
  int grads = 1;                  // gradient copies per param (0: a forward-only function)
  // Decides, partitions and costs the step under `plan`; throws px::Error when the plan does not
  // apply (e.g. a batch that does not divide over the plan's batch axes).
  std::function<StepCost(const ShardingPlan&)> cost;
};

struct Problem {
  const Graph* forward = nullptr;  // the whole model's loss traced over its params (params first)
  Model full;
  // Deep models: the same model with 1 and 2 layers. The effect of each choice is measured on
  // `two_layers` (a layered unit's scaled by layers / 2); the memory beside the params and their
  // state is extrapolated from both. Unset (empty cost): everything is measured on `full`.
  Model one_layer, two_layers;
  int64_t layers = 0;
  Mesh mesh;  // with the cluster's links
  int64_t memory_limit = 0;
  ShardingOptions options;  // rules (fixed), the time limit, fsdp names for the recipes
  std::vector<ShardingStrategy> recipes{ShardingStrategy::DDP, ShardingStrategy::FSDP, ShardingStrategy::TP,
                                        ShardingStrategy::FSDP_TP};
};

AutoPlan solve(const Problem& p);

// A traced step as the search sees it: each plan decided, partitioned, offloaded and costed on
// `cluster`. `program` must outlive the model.
Model model_of(std::shared_ptr<const StepProgram> program, const std::vector<optim::StateSlot>& slots,
               const std::vector<TensorType>& param_types, const std::vector<TensorType>& batch_types,
               const Cluster& cluster, const ShardingOptions& sharding, const CompileOptions& compile,
               const OffloadOptions& offload);
// The per-device memory the search plans for: the option, else the cluster's device memory.
int64_t memory_limit_of(const ShardingOptions& s, const Cluster& c, const Mesh& m);

}  // namespace px::autoshard
