// Sharding recipes (DDP, FSDP, TP, FSDP_TP, MANUAL) and the sharded training step built on the
// SPMD partitioner.
//
//   auto mesh = px::Mesh::cpu({{"data", 4}, {"model", 2}});
//   px::ShardedTrainStep step(model.store(), px::optim::adamw({.lr = 3e-3}), loss_fn, batch_types, mesh,
//                             px::ShardingStrategy::FSDP_TP, {.fsdp_min_bytes = 4096});
//   std::cout << step.table();                        // per param: shape, spec, bytes per device
//   px::ShardedTrainState state = step.init(0);
//   px::StepMetrics m = step(state, {tokens, targets});
//   std::cout << step.collectives_table();            // planned and counted collective bytes
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallax/sharding.h"
#include "parallax/spmd.h"
#include "parallax/train.h"

namespace px {

enum class ShardingStrategy { AUTO, DDP, FSDP, TP, FSDP_TP, MANUAL };
const char* strategy_name(ShardingStrategy s);

// A MANUAL rule: params whose path matches the glob ('*' any run of characters, '?' one) get spec.
// The first matching rule wins; under any strategy, rules override what the recipe chose.
struct PathRule {
  std::string pattern;
  PartitionSpec spec;
};

struct ShardingOptions {
  std::string data_axis = "data";    // batch axis; every other mesh axis but model_axis also splits the batch
  std::string model_axis = "model";  // tensor-parallel axis
  int64_t fsdp_min_bytes = 4096;     // FSDP keeps params smaller than this replicated
  std::vector<PathRule> rules;       // overrides, first match wins
  // Layouts required of values tagged with px::tag (first matching name wins), e.g.
  // {"layer_input", P(("data"), "model", None)}: the activations between TransformerLm blocks split
  // over the sequence on the model axis (sequence parallelism). Training steps only.
  std::vector<PathRule> activation_rules;
  // Replicated gradients are all-reduced in buckets of up to this many bytes (one collective per
  // bucket, in param order); 0: one all-reduce per gradient. -1 (default): 25 MiB buckets when a
  // batch axis runs over a link with a latency of 10 us or more (across processes), none in one
  // process, where a call costs microseconds and packing a bucket copies every gradient twice.
  int64_t bucket_bytes = -1;
  DeviceParallelism device_parallelism = DeviceParallelism::automatic;  // how virtual devices share the cores
  // A mesh over several processes (Mesh::with_processes): this process's communicator (not owned).
  // The step then runs, and its state holds, only this process's positions; the process is the
  // one whose positions the communicator holds. Unset: the in-process one over the whole mesh.
  Communicator* communicator = nullptr;
  // AUTO (see docs/auto-sharding.md): the cluster the plans are costed for (a preset name or a
  // TOML file), the solver's time limit (the best plan found by then is used) and the memory
  // each device may use (0: the cluster's device memory).
  std::string auto_cluster = "cpu";
  double auto_time_limit_s = 10;
  int64_t auto_memory_limit_bytes = 0;
};

struct ParamPlacement {
  std::string path;
  TensorType type;
  PartitionSpec spec;
  int64_t bytes_per_device = 0;
  std::string reason;  // e.g. "column (feeds blocks.0.mlp.proj.w)", "fsdp dim 0", "rule 'head.*'"
};

// The placement of every param and of the batch, decided at plan time.
struct ShardingPlan {
  Mesh mesh;
  ShardingStrategy strategy = ShardingStrategy::DDP;
  std::vector<ParamPlacement> params;   // in the store's order
  std::vector<std::string> batch_axes;  // the batch's leading dim is split over these
  std::vector<PathRule> activations;    // layouts required of tagged values (activation_rules, or AUTO's)
  std::string explanation;              // AUTO: px::AutoPlan::explain() of the plan
  double predicted_step_s = 0;          // AUTO: the cost model's step time for it
  std::string table() const;            // one row per param and a total line
  int64_t param_bytes_per_device() const;
};

// Decides each param's spec. `forward` is a traced program whose first inputs are the params (in
// order, named by `paths`); TP reads from it which matmul consumes each param and what it feeds.
// Throws px::Error at plan time for unknown axes and specs that do not fit a param, and for AUTO,
// which needs the whole training step (ShardedTrainStep or px::plan_auto solve it).
ShardingPlan plan_sharding(const Graph& forward, const std::vector<std::string>& paths, const Mesh& mesh,
                           ShardingStrategy strategy, const ShardingOptions& options = {});

// The rules use px::glob_match (core.h): '*' matches any run of characters, '?' one character.

// The recipe's decision for a traced training step: inputs laid out by the plan (optimizer state
// as its param, the batch over the batch axes), FSDP params gathered for the forward and again for
// the backward pass, every gradient pinned to its param's layout, DDP buckets.
ShardingDecision decide_train_step(const StepProgram& program, const ShardingPlan& plan,
                                   const std::vector<PartitionSpec>& state_specs,
                                   const std::vector<TensorType>& batch_types, int64_t bucket_bytes);

struct ShardedTrainState {
  std::vector<ShardedArray> params;
  std::vector<ShardedArray> opt_state;
  int64_t step = 0;     // updates applied
  int64_t skipped = 0;  // steps skipped for a non-finite loss or gradient (TrainStepOptions::skip_nonfinite)
};

// TrainStep over a mesh: the whole step (forward, backward, clipping, optimizer) traced once,
// partitioned with the recipe's specs, and run on every device by a ShardedExecutable.
class ShardedTrainStep {
 public:
  using LossFn = TrainStep::LossFn;
  ShardedTrainStep(nn::ParamStore& store, optim::OptimizerPtr opt, LossFn loss_fn, std::vector<TensorType> batch_types,
                   Mesh mesh, ShardingStrategy strategy, ShardingOptions sharding = {}, TrainStepOptions options = {});
  ~ShardedTrainStep();

  ShardedTrainState init(uint64_t seed) const;
  ShardedTrainState init(const std::vector<Array>& params) const;  // full host params, fresh optimizer state
  // A state built one param at a time (e.g. streamed by nn::load_pretrained): begin_state() has
  // no arrays yet; set_param shards param i (a full host array, which the caller may drop at
  // once) and gives it fresh optimizer state. No device ever holds more than its shards plus
  // the param being set. Every param must be set before the first step.
  ShardedTrainState begin_state() const;
  void set_param(ShardedTrainState& s, int i, const Array& full) const;
  // The same from a reader of boxes of param i (e.g. nn::load_pretrained_slices): each of this
  // process's devices reads only its own shard, straight into it, and its optimizer state starts
  // at zeros (what every optimizer's init_state gives). Nothing holds the whole param.
  void set_param(ShardedTrainState& s, int i, const BoxReader& read) const;
  // Shards the batch, runs one update in place.
  StepMetrics operator()(ShardedTrainState& state, const std::vector<Array>& batch);

  // Full arrays; over several processes a collective (every process calls it) that all-gathers.
  std::vector<Array> gather_params(const ShardedTrainState& s) const;
  std::vector<Array> gather_opt_state(const ShardedTrainState& s) const;

  // TrainStep's checkpoint format: the state is gathered to full arrays and written as one file,
  // so TrainStep and sharded steps on any mesh or strategy load it (sharded again on load). Over
  // several processes every process calls save (process 0 writes) and load.
  void save(const std::string& path, const ShardedTrainState& state) const;
  ShardedTrainState load(const std::string& path) const;

  const ShardingPlan& plan() const { return plan_; }
  std::string table() const { return plan_.table(); }
  // Collectives of one step: planned (partitioner, bytes per device) and counted at run time.
  std::string collectives_table() const;
  const Graph& graph() const { return *graph_; }
  const ShardedExecutable& executable() const { return *exe_; }
  ShardedExecutable& executable() { return *exe_; }
  const Sharding& batch_sharding(int i) const;
  int64_t steps_run() const { return steps_run_; }
  int process() const { return exe_->process(); }  // whose shards the state holds

 private:
  void check_param(const ShardedTrainState& s, int i, const TensorType& type) const;
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

// A plain function sharded by a recipe: its first argument is the params (as one list).
class ShardedFunction {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>& params, const std::vector<Tensor>& args)>;
  ShardedFunction(Fn fn, std::vector<TensorType> param_types, std::vector<std::string> param_paths,
                  std::vector<TensorType> arg_types, Mesh mesh, ShardingStrategy strategy,
                  ShardingOptions options = {});
  ~ShardedFunction();
  // Full host arrays in, full outputs out (sharded, run, gathered).
  std::vector<Array> operator()(const std::vector<Array>& params, const std::vector<Array>& args);
  const ShardingPlan& plan() const { return plan_; }
  const ShardedExecutable& executable() const { return *exe_; }

 private:
  ShardingPlan plan_;
  std::unique_ptr<Graph> graph_;
  std::unique_ptr<ShardedExecutable> exe_;
};

// px::jit(fn, strategy, ...): fn's first argument is the params (paths name them for rules and tables).
std::unique_ptr<ShardedFunction> jit(ShardedFunction::Fn fn, ShardingStrategy strategy,
                                     const std::vector<TensorType>& param_types,
                                     const std::vector<std::string>& param_paths,
                                     const std::vector<TensorType>& arg_types, const Mesh& mesh,
                                     const ShardingOptions& options = {});

// A model's forward over its store's params, sharded: create_sharded_model(store, fn, sample_types, mesh, strategy).
std::unique_ptr<ShardedFunction> create_sharded_model(
    nn::ParamStore& store, const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& model_fn,
    const std::vector<TensorType>& sample_types, const Mesh& mesh, ShardingStrategy strategy,
    const ShardingOptions& options = {});

}  // namespace px
