// The sharding decision of a training step under a recipe or AUTO, shared by TrainStep on a mesh
// (which partitions, compiles and runs it) and the cost model and solver (src/sharding/auto/,
// which partition and plan it without allocating anything).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "parallax/auto.h"
#include "memory/step_program.h"
#include "parallax/parallel.h"

namespace px {

// A training step decided (src/train/compile_step.cc, decide_step): traced, rematerialized, planned.
struct DecidedStep {
  ShardingPlan plan;                      // each param's spec
  std::vector<PartitionSpec> state_specs;  // per optimizer-state slot
  StepProgram program;                    // the traced step (global shapes) after remat
};

// The recipe's decision for a traced training step: inputs laid out by the plan (optimizer state
// as its param, the batch over the batch axes), FSDP params gathered per cluster of nearby readers
// in the forward and again in the backward pass, every gradient pinned to its param's layout, DDP buckets.
ShardingDecision decide_train_step(const StepProgram& program, const ShardingPlan& plan,
                                   const std::vector<PartitionSpec>& state_specs,
                                   const std::vector<TensorType>& batch_types, int64_t bucket_bytes);

// The optimizer state's specs under a plan: a slot shaped like its param is laid out like it,
// any other slot is replicated.
std::vector<PartitionSpec> state_specs_for(const ShardingPlan& plan, const std::vector<optim::StateSlot>& slots,
                                           const std::vector<TensorType>& param_types);
// ShardingOptions::bucket_bytes, or its default from the links of the plan's batch axes.
int64_t bucket_bytes_for(const ShardingPlan& plan, const ShardingOptions& sharding);

// The offload pass (offload_step) on the partitioned local program of a traced step; sets the
// compile options that go with it (value kinds, categories, prefetch depth). Nothing when `o` offloads nothing.
void offload_local(SpmdProgram& local, const StepProgram& global, const OffloadOptions& o, CompileOptions& c);

// The passes of a traced step after remat, listed once: the decision (decide_train_step), the
// partition, offload. Used by TrainStep (src/train/compile_step.cc, which dumps and compiles the
// result) and AUTO's costing of a candidate plan (plan_auto.cc), so neither lists them again.
struct LoweredStep {
  SpmdProgram local;
  CompileOptions compile;  // `compile` with what offload and the step's shape set
};
LoweredStep lower_train_step(const StepProgram& program, const ShardingPlan& plan,
                             const std::vector<PartitionSpec>& state_specs, const std::vector<TensorType>& batch_types,
                             const ShardingOptions& sharding, const CompileOptions& compile,
                             const OffloadOptions& offload);

// One device: a mesh of one device without axes, every param replicated.
ShardingPlan one_device_plan(const std::vector<std::string>& paths, const std::vector<TensorType>& types);

// AUTO for a traced training step (src/sharding/auto/solver.cc): `forward` is the loss traced
// over the params (params first), `program` the whole step. The cluster is
// sharding.auto_cluster; the plan is costed on cluster.apply(mesh).
AutoPlan solve_train_step(const Graph& forward, const StepProgram& program, const std::vector<optim::StateSlot>& slots,
                          const std::vector<TensorType>& param_types, const std::vector<TensorType>& batch_types,
                          const Mesh& mesh, const ShardingOptions& sharding, const CompileOptions& compile,
                          const OffloadOptions& offload = {});

// AUTO's plan for a step on `mesh`, from `solve`. When the mesh spans processes (the communicator
// holds only some of its positions), the process holding position 0 alone solves and sends its
// plan to the others (separate solves could differ: a time limit, a calibration per process),
// which wait for it; a failed solve throws the same error on every process. `paths` and `types`
// are the params', in the plan's order.
ShardingPlan solve_auto_once(const ShardingOptions& sharding, const Mesh& mesh, const std::vector<std::string>& paths,
                             const std::vector<TensorType>& types, const std::function<AutoPlan()>& solve);

}  // namespace px
