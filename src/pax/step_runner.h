// The one place pax touches a training step: a TrainStep (on one device, or on the mesh of several)
// and its state, with the checkpoint entries pax saves and restores.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallax/checkpoint.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "parallax/pax.h"
#include "parallax/train.h"

namespace px::pax {

class StepRunner {
 public:
  StepRunner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh);
  StepMetrics step(const std::vector<Array>& batch) { return step_(state_, batch); }
  // Full host arrays, in the store's order; over several processes a collective (every process calls it).
  std::vector<Array> params() const { return step_.gather_params(state_); }
  int64_t step_count() const { return state_.step; }  // updates applied so far
  // Starts from the params of a Hugging Face model dir with fresh optimizer state. On a mesh each
  // device reads only its own shard of each tensor, so the whole model never sits in memory.
  void init_from_pretrained(const std::string& dir);
  // The state as checkpoint entries (TrainStep::checkpoint): params by path (group "params"),
  // optimizer state as "<path>.<slot>" (group "opt_state"), the step and the optimizer.
  Checkpoint snapshot() const { return step_.checkpoint(state_); }
  // Where restored arrays go: this step's shardings and process.
  RestoreOptions restore_options() const { return step_.restore_options(); }
  // Takes params, optimizer state and step from a restored checkpoint; throws naming a missing or
  // mistyped tensor (a different model or optimizer).
  void restore(const Checkpoint& c) { state_ = step_.restore(c); }
  // The sharding plan the step runs (on one device: a mesh of one device, all replicated).
  const ShardingPlan& plan() const { return step_.plan(); }
  const TrainStep& train_step() const { return step_; }
  // The devices this process runs the step on (their memory counters: px::memory_stats).
  std::vector<int> device_ids() const;
  // The compiled step (one device's program on a mesh): its profile and timeline under PX_PROFILE=1.
  const Executable& executable() const;

 private:
  TrainStep step_;
  TrainState state_;
};

// Compiles the step for `model` on `mesh` and initializes params from train.seed.
// The training step's options from the config: clipping, remat, offload.
TrainStepOptions step_options(const ExperimentConfig& c);

std::unique_ptr<StepRunner> make_step_runner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh);

// The matmul FLOPs of one step (forward and backward, the whole global batch) of the traced step
// without remat: the model FLOPs that MFU counts.
double model_flops_per_step(const ExperimentConfig& c, nn::TransformerLm& model);

// sharding.strategy=auto: the plan the sharded step would solve for, costed on `cluster` ("":
// sharding.cluster), with its explanation; on one device, everything replicated.
ShardingPlan auto_plan(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh,
                       const std::string& cluster);

}  // namespace px::pax
