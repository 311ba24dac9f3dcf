// The one place pax touches a training step: TrainStep on one device, ShardedTrainStep on a mesh
// of several (to fold into one type when the library does).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "parallax/checkpoint.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "parallax/pax.h"

namespace px::pax {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual StepMetrics step(const std::vector<Array>& batch) = 0;
  virtual std::vector<Array> params() const = 0;  // full host arrays, in the store's order
  virtual int64_t step_count() const = 0;         // updates applied so far
  // Starts from the params of a Hugging Face model dir with fresh optimizer state. On a mesh each
  // param is sharded as soon as it is read, so the whole model never sits in memory.
  virtual void init_from_pretrained(const std::string& dir) = 0;
  // The state as checkpoint entries: params by path (group "params"), optimizer state as
  // "<path>.<slot>" (group "opt_state"), and the step.
  virtual Checkpoint snapshot() const = 0;
  // Where restored arrays go: this step's shardings (empty: one device).
  virtual std::map<std::string, Sharding> shardings() const = 0;
  // Takes params, optimizer state and step from a restored checkpoint; throws naming a missing or
  // mistyped tensor (a different model or optimizer).
  virtual void restore(const Checkpoint& c) = 0;
  // The sharding plan the step runs (null on one device).
  virtual const ShardingPlan* plan() const { return nullptr; }
  // The devices this process runs the step on (their memory counters: px::memory_stats).
  virtual std::vector<int> device_ids() const { return {0}; }
  // The compiled step (one device's program on a mesh): its profile and timeline under PX_PROFILE=1.
  virtual const Executable& executable() const = 0;
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
