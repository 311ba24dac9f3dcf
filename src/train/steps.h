// The two ways px::TrainStep runs (internal): on one device, the traced step compiled into one
// Executable over full arrays; on a mesh, the step decided by a recipe or AUTO, partitioned and
// run by a ShardedExecutable over each process's shards. TrainStep (train_step.cc) holds one of
// them and gives both the same state and the same calls.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "parallax/parallel.h"
#include "parallax/train.h"

namespace px::detail {

class OneDeviceStep {
 public:
  OneDeviceStep(nn::ParamStore& store, optim::OptimizerPtr opt, TrainStep::LossFn loss_fn,
                std::vector<TensorType> batch_types, const TrainStepOptions& options);

  // One update in place over full arrays (moved to the memory kind the step keeps them in).
  StepMetrics run(std::vector<Array>& params, std::vector<Array>& opt_state, int64_t& step, int64_t& skipped,
                  const std::vector<Array>& batch);

  nn::ParamStore& store() const { return store_; }
  const optim::Optimizer& optimizer() const { return *opt_; }
  const Graph& graph() const { return *graph_; }
  const Executable& executable() const { return *exe_; }
  const ShardingPlan& plan() const { return plan_; }  // a 1-device mesh, every param replicated
  const Sharding& replicated() const { return replicated_; }
  size_t n_params() const { return n_params_; }
  size_t n_state() const { return n_state_; }
  int64_t steps_run() const { return steps_run_; }

 private:
  nn::ParamStore& store_;
  optim::OptimizerPtr opt_;
  std::vector<TensorType> batch_types_;
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<Executable> exe_;
  ShardingPlan plan_;
  Sharding replicated_;
  std::vector<Array> inputs_, outputs_;  // reused every step: no allocation after the first
  size_t n_params_ = 0, n_state_ = 0;
  int64_t steps_run_ = 0;
  bool skip_nonfinite_ = false;
  std::atomic<bool> busy_{false};  // one step at a time: a concurrent call throws
};

class MeshStep {
 public:
  MeshStep(nn::ParamStore& store, optim::OptimizerPtr opt, TrainStep::LossFn loss_fn,
           std::vector<TensorType> batch_types, const TrainStepOptions& options);

  TrainState begin_state() const;
  void set_param(TrainState& s, int i, const Array& full) const;
  void set_param(TrainState& s, int i, const BoxReader& read) const;
  StepMetrics operator()(TrainState& state, const std::vector<Array>& batch);
  std::vector<Array> gather_params(const TrainState& s) const;
  std::vector<Array> gather_opt_state(const TrainState& s) const;
  void save(const std::string& path, const TrainState& state) const;
  TrainState load(const std::string& path) const;

  nn::ParamStore& store() const { return store_; }
  const optim::Optimizer& optimizer() const { return *opt_; }
  const ShardingPlan& plan() const { return plan_; }
  std::string collectives_table() const;
  const Graph& graph() const { return *graph_; }
  const ShardedExecutable& executable() const { return *exe_; }
  ShardedExecutable& executable() { return *exe_; }
  const Sharding& batch_sharding(int i) const;
  int64_t steps_run() const { return steps_run_; }
  int process() const { return exe_->process(); }

 private:
  void check_param(const TrainState& s, int i, const TensorType& type) const;
  nn::ParamStore& store_;
  optim::OptimizerPtr opt_;
  std::vector<TensorType> batch_types_;
  Mesh mesh_;
  ShardingPlan plan_;
  std::vector<PartitionSpec> state_specs_;
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<ShardedExecutable> exe_;
  size_t n_params_ = 0, n_state_ = 0;
  int64_t steps_run_ = 0;
  bool skip_nonfinite_ = false;
  std::vector<ShardedArray> out_;  // last step's outputs: reused as the next step's buffers
  std::atomic<bool> busy_{false};  // one step at a time: a concurrent call throws
};

}  // namespace px::detail
