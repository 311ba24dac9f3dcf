// One training step as one program: forward, loss, backward, clipping and the optimizer update
// are traced together and compiled once; each call runs the whole step. On one device, or on
// every device of a mesh (TrainStepOptions::mesh), split by a recipe or AUTO.
//
//   px::nn::TransformerLm model(px::nn::gpt2_tiny());
//   px::TrainStep step(model.store(), px::optim::adamw({.lr = 3e-3}),
//                      [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); },
//                      {{px::DType::i32, {8, 128}}, {px::DType::i32, {8, 128}}},
//                      {.mesh = px::Mesh::cpu({{"data", 4}, {"model", 2}}),   // leave out: one device
//                       .strategy = px::ShardingStrategy::FSDP_TP});
//   std::cout << step.table();                     // per param: shape, spec, bytes per device
//   px::TrainState state = step.init(/*seed=*/0);
//   for (int i = 0; i < 100; ++i) std::cout << step(state, {tokens, targets}).loss << "\n";
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/checkpoint.h"
#include "parallax/nn/module.h"
#include "parallax/optim.h"
#include "parallax/parallel.h"
#include "parallax/pipeline.h"
#include "parallax/remat.h"
#include "parallax/runtime.h"
#include "parallax/strategy.h"

namespace px {

struct TrainStepOptions {
  // Where the step runs: unset, on one device; set, on every device of the mesh, each param and
  // the batch split by `strategy` (and `sharding`'s rules and options). Over several processes
  // (Mesh::with_processes), sharding.communicator is this process's communicator.
  std::optional<Mesh> mesh;
  ShardingStrategy strategy = ShardingStrategy::DDP;
  ShardingOptions sharding;
  double clip_norm = 0.0;  // > 0: clip gradients to this global norm; 0: no clipping
  // Gradient accumulation: each batch array's rows are split into this many microbatches (rows
  // k, k + m, k + 2m, ...; on a mesh, each device's microbatch is made of its own rows), each run
  // forward and backward in turn, and their mean gradient applied in one update. One
  // microbatch's activations are alive at a time, so the planned peak falls as m grows; the loss
  // reported is the mean of the microbatches' losses (the whole batch's when the loss is a mean
  // over equal microbatches' rows). m must divide the batch rows each device holds.
  int microbatches = 1;
  RematOptions remat;      // recompute forward values in the backward pass instead of keeping them
  OffloadOptions offload;  // keep params and optimizer state in pinned_host memory
  // When the loss or the gradient norm is NaN or infinite, keep params and optimizer state as they
  // were (the step is counted in TrainState::skipped, not in TrainState::step).
  bool skip_nonfinite = false;
  CompileOptions compile;  // e.g. .compute_dtype = DType::bf16 for mixed precision
  // On a mesh with a `stage` axis: the schedule and the layer split (parallax/pipeline.h). The
  // microbatches above are the pipeline's; each device runs its stages' programs in the schedule's
  // order, and the state is held once per process (each stage's programs read their params).
  PipelineOptions pipeline;
};

// The training state: params (in the store's declaration order) and optimizer state, each this
// process's shards of its array (on one device, one shard holding the whole array: use
// TrainStep::gather_params or px::gather for full arrays), and the number of updates applied.
struct TrainState {
  std::vector<ShardedArray> params;
  std::vector<ShardedArray> opt_state;
  int64_t step = 0;     // updates applied (at most 2^31 - 2: the traced step counter is i32)
  int64_t skipped = 0;  // steps skipped for a non-finite loss or gradient (skip_nonfinite; not saved)
};

struct StepMetrics {
  float loss = 0;
  float grad_norm = 0;  // global norm of the gradients before clipping
  float lr = 0;
  bool finite = true;    // false when the loss or the gradient norm is NaN or infinite
  bool skipped = false;  // the update was skipped (not finite and skip_nonfinite set)
};

namespace detail {
class Step;
}  // namespace detail

class TrainStep {
 public:
  // loss_fn runs with the store's params bound and returns a scalar loss from the batch tensors.
  using LossFn = std::function<Tensor(const std::vector<Tensor>& batch)>;

  // Traces, plans (the recipe or AUTO, on a mesh), partitions and compiles the step. Throws
  // px::Error for a plan that does not apply (an unknown axis, a spec that does not divide) and
  // px::UserError when the step does not fit the devices' memory (saying what would).
  TrainStep(nn::ParamStore& store, optim::OptimizerPtr opt, LossFn loss_fn, std::vector<TensorType> batch_types,
            TrainStepOptions options = {});
  ~TrainStep();

  TrainState init(uint64_t seed) const;                     // params from the store's initializers
  TrainState init(const std::vector<Array>& params) const;  // full host params, fresh optimizer state
  // A state built one param at a time (e.g. streamed by nn::load_pretrained): begin_state() has
  // no arrays yet; set_param splits param i (a full host array, which the caller may drop at
  // once) and gives it fresh optimizer state. No device ever holds more than its shards plus
  // the param being set. Every param must be set before the first step.
  TrainState begin_state() const;
  void set_param(TrainState& s, int i, const Array& full) const;
  // The same from a reader of boxes of param i (e.g. nn::load_pretrained_slices): each of this
  // process's devices reads only its own shard, straight into it, and its optimizer state starts
  // at zeros (what every optimizer's init_state gives). Nothing holds the whole param.
  void set_param(TrainState& s, int i, const BoxReader& read) const;
  // Applies one update in place (the batch is split over the plan's batch axes). Checks the batch
  // against the traced types.
  StepMetrics operator()(TrainState& state, const std::vector<Array>& batch);

  // Full arrays; over several processes a collective (every process calls it) that all-gathers.
  std::vector<Array> gather_params(const TrainState& s) const;
  std::vector<Array> gather_opt_state(const TrainState& s) const;

  // Saves the state as one checkpoint directory in the format of px::CheckpointManager (and pax):
  // params named by their paths (group "params"), optimizer state "<path>.<slot>" (e.g.
  // "blocks.0.attn.wq.m", group "opt_state"), the step and the optimizer's name in the metadata.
  // Each process writes only the shards it holds (no gather); the checkpoint is committed
  // atomically and replaces a committed checkpoint at `dir`. Over several processes every
  // process calls save and load, on a file system they share.
  // A path ending in ".safetensors" is an export instead: one file of full arrays (gathered;
  // process 0 writes), with "step" and "optimizer" in its metadata.
  void save(const std::string& dir, const TrainState& state) const;
  // Loads a checkpoint onto this step's mesh and shardings, whatever mesh or strategy saved it
  // (each process reads only the chunks its shards overlap). `dir` is a checkpoint directory
  // (save's, or a pax job's checkpoints/checkpoint_N), a directory of them (the newest committed
  // one is read, e.g. JOB_DIR/checkpoints) or a ".safetensors" file (save's export, imported).
  // Throws px::UserError naming the tensor when the checkpoint is of another model or optimizer.
  TrainState load(const std::string& dir) const;
  // The same pieces for a px::CheckpointManager (keep policy, asynchronous saves):
  //   mgr.save_async(step.checkpoint(state));
  //   state = step.restore(mgr.restore(*mgr.latest_step(), step.restore_options()));
  Checkpoint checkpoint(const TrainState& state) const;  // the state's entries, shards not copied
  RestoreOptions restore_options() const;                // this step's shardings and process
  // The state from a checkpoint (checked like load); arrays not on this step's shardings are split
  // again when they are whole (e.g. import_safetensors), else refused.
  TrainState restore(const Checkpoint& c) const;
  std::vector<std::string> state_names() const;  // the optimizer-state tensor names

  // Each param's spec and bytes per device (on one device: a 1-device mesh, all replicated).
  const ShardingPlan& plan() const;
  std::string table() const { return plan().table(); }
  // Collectives of one step: planned (partitioner, bytes per device) and counted at run time.
  std::string collectives_table() const;
  const Graph& graph() const;  // the traced step (global shapes, before partitioning)
  bool pipelined() const;      // the mesh has a `stage` axis
  // The step's stages, planned memory per device and last run's timeline. Every step runs as a
  // pipeline: on a mesh without a `stage` axis it has one stage, whose one program is the whole
  // step (its microbatches inside), and no actions (its timeline is one "step" span).
  const PipelineReport& pipeline_report() const;
  // The step's compiled programs, each a sharded executable (shardings, collectives, the devices
  // it runs; its executable() is the local program each device runs: memory report, profile,
  // timeline). A step on a mesh without a `stage` axis is one program; a pipelined step's are the
  // programs of this process's stages, by stage (its forward, backward and update parts).
  int num_programs() const;
  const ShardedExecutable& program(int i = 0) const;
  ShardedExecutable& program(int i = 0);
  const Executable& executable() const { return program().executable(); }  // program(0)'s local program
  int64_t peak_bytes() const;  // the planned peak per device
  const optim::Optimizer& optimizer() const;
  const Sharding& batch_sharding(int i) const;
  int64_t steps_run() const;
  int process() const;  // whose shards the state holds (0 on one device)

 private:
  std::unique_ptr<detail::Step> step_;
};

// A forward-only program over the params on one device or a mesh (ForwardOptions, parallel.h).
class ShardedFunction;

class ForwardFn {
 public:
  using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>& batch)>;
  ForwardFn(nn::ParamStore& store, Fn fn, std::vector<TensorType> batch_types, ForwardOptions options = {});
  ~ForwardFn();
  // Full params and batch in, full outputs out.
  std::vector<Array> operator()(const std::vector<Array>& params, const std::vector<Array>& batch);
  // The same, releasing the arrays ForwardOptions::donate names (see there).
  std::vector<Array> operator()(std::vector<Array>& params, std::vector<Array>& batch);
  const Executable& executable() const;    // the compiled local program
  const ShardedFunction& sharded() const;  // the plan, the shardings and the sharded executable

 private:
  std::unique_ptr<ShardedFunction> fn_;
};

}  // namespace px
