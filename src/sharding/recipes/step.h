// The sharding decision of a training step under a recipe, shared by ShardedTrainStep (which
// partitions, compiles and runs it) and the cost model (src/sharding/auto/, which partitions and
// plans it without allocating anything).
#pragma once

#include <vector>

#include "parallax/parallel.h"

namespace px {

struct DecidedStep {
  ShardingPlan plan;                      // each param's spec
  std::vector<PartitionSpec> state_specs;  // per optimizer-state slot
  StepProgram program;                    // the traced step (global shapes)
  ShardingDecision decision;              // what partition() applies
};

// Traces the step from the store's param types (no param is allocated), plans the recipe
// (throws px::Error when it does not apply: AUTO, an unknown axis, a spec that does not divide)
// and decides the step: what ShardedTrainStep's constructor does before partitioning.
DecidedStep decide_sharded_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                                const std::vector<TensorType>& batch_types, const Mesh& mesh,
                                ShardingStrategy strategy, const ShardingOptions& sharding,
                                const TrainStepOptions& options);

}  // namespace px
