// How px::TrainStep runs (internal). One path for every mesh: one device is a mesh of one device.
// compile_step (compile_step.cc) runs the pass pipeline once; Step (step.cc) holds its result and
// runs it over this process's shards; TrainStep (train_step.cc) is the public face of a Step.
#pragma once

#include <atomic>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/state.h"
#include "memory/step_program.h"
#include "parallax/parallel.h"
#include "parallax/train.h"
#include "sharding/recipes/step.h"

namespace px {

// Traces the whole step into one program. `who` names the caller in errors. With skip_nonfinite,
// the new params and state equal the old ones when the loss or the gradient norm is not finite.
// With microbatches = m > 1, each batch array's rows are split into m microbatches (rows k, k + m,
// ...), each run forward and backward in turn, and the gradients averaged before one update.
StepProgram trace_train_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                             const std::vector<TensorType>& batch_types, double clip_norm,
                             const std::string& who = "TrainStep", bool skip_nonfinite = false, int microbatches = 1);

// px::UserError unless microbatches >= 1 divides every batch array's leading dim.
void check_microbatches(int microbatches, const std::vector<TensorType>& batch_types, const std::string& who);

}  // namespace px

namespace px::detail {

class PipelineRunner;

// The first passes (trace and autodiff, remat, the sharding decision) without compiling: what
// the cost model and pax's plan read.
DecidedStep decide_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                        const std::vector<TensorType>& batch_types, const TrainStepOptions& options);

// A batch input used as an index: its values must lie in [0, bound) (or equal `allowed`, an
// ignore_index). index_uses finds them per graph input of the traced step; check_indices throws
// px::UserError naming the batch input, the first bad value and where (index_check.cc).
struct IndexUse {
  int64_t bound = -1;                                     // -1: not an index
  int64_t allowed = std::numeric_limits<int64_t>::min();  // one more allowed value (ignore_index)
  std::string use;                                        // "take, the rows of f32[512,64]"
};
std::vector<IndexUse> index_uses(const Graph& g);
void check_indices(const std::vector<IndexUse>& uses, size_t first, const std::vector<Array>& batch);

// The traced step input (i32, the count of updates so far) for `step`; throws px::UserError naming
// `who` when it does not fit (the step computes step + 1, so at most 2^31 - 2).
int32_t traced_step(int64_t step, const std::string& who);

// Metrics from the step's first three outputs (loss, grad norm, lr); `skip` says whether the graph
// was traced with skip_nonfinite (then a non-finite step left params and state unchanged).
StepMetrics step_metrics(float loss, float grad_norm, float lr, bool skip);

// What the pipeline leaves: the plan, the traced step and its programs, staged (one stage on a mesh
// without a `stage` axis) and run by one runner.
struct CompiledStep {
  CompiledStep();
  CompiledStep(CompiledStep&&) noexcept;
  CompiledStep& operator=(CompiledStep&&) noexcept;
  ~CompiledStep();
  ShardingPlan plan;                       // each param's spec (one device: all replicated)
  std::vector<PartitionSpec> state_specs;  // per optimizer-state slot
  std::unique_ptr<Graph> graph;            // the traced step, global shapes, after remat
  std::unique_ptr<PipelineRunner> runner;  // this process's programs and their run loop
  Communicator* comm = nullptr;            // over several processes; else null
  std::vector<Sharding> in_shardings;      // per input of the traced step: how the caller's arrays are split
  int process = 0;                         // the mesh process this step runs
  size_t n_params = 0, n_state = 0;
  std::vector<IndexUse> index_uses;  // per input of the traced step
};

// The whole pipeline of a training step, each pass once and in order (see compile_step.cc).
CompiledStep compile_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                          const std::vector<TensorType>& batch_types, const TrainStepOptions& options);

class Step {
 public:
  Step(nn::ParamStore& store, optim::OptimizerPtr opt, TrainStep::LossFn loss_fn, std::vector<TensorType> batch_types,
       const TrainStepOptions& options);

  TrainState begin_state() const;
  void set_param(TrainState& s, int i, const Array& full) const;
  void set_param(TrainState& s, int i, const BoxReader& read) const;
  StepMetrics operator()(TrainState& state, const std::vector<Array>& batch);
  std::vector<Array> gather_params(const TrainState& s) const;
  std::vector<Array> gather_opt_state(const TrainState& s) const;
  void save(const std::string& path, const TrainState& state) const;
  TrainState load(const std::string& path) const;
  // The checkpoint layout: params by path, then optimizer state "<path>.<slot>".
  ckpt::StateLayout layout() const;
  Checkpoint checkpoint(const TrainState& state, const std::string& who) const;
  RestoreOptions restore_options() const;
  // `where` names the checkpoint in errors; whole arrays off this step's shardings are split.
  TrainState restore(Checkpoint c, const std::string& where) const;

  nn::ParamStore& store() const { return store_; }
  const optim::Optimizer& optimizer() const { return *opt_; }
  const ShardingPlan& plan() const { return c_.plan; }
  std::string collectives_table() const;
  const Graph& graph() const { return *c_.graph; }
  // The compiled programs: one, or a pipeline's programs of this process's stages.
  int num_programs() const;
  ShardedExecutable& program(int i) const;
  int64_t peak_bytes() const;  // per device, planned
  bool pipelined() const;      // the mesh has a `stage` axis
  const PipelineReport& pipeline_report() const;
  const Sharding& batch_sharding(int i) const;
  int64_t steps_run() const { return steps_run_; }
  int process() const { return c_.process; }
  int rank() const;                    // this process's index among the mesh's processes
  Communicator* communicator() const;  // over several processes; else null

 private:
  void check_param(const TrainState& s, int i, const TensorType& type) const;
  MemoryKind input_kind(size_t i) const;
  ShardedArray placed(ShardedArray a, size_t i) const;
  Array gathered(size_t i, const ShardedArray& a) const;
  void count(TrainState& state, const StepMetrics& m);
  nn::ParamStore& store_;
  optim::OptimizerPtr opt_;
  std::vector<TensorType> batch_types_;
  CompiledStep c_;
  int64_t steps_run_ = 0;
  bool skip_nonfinite_ = false;
  std::atomic<bool> busy_{false};  // one step at a time: a concurrent call throws
};

}  // namespace px::detail
