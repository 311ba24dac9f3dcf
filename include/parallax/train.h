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

#include "parallax/nn/module.h"
#include "parallax/optim.h"
#include "parallax/runtime.h"
#include "parallax/strategy.h"

namespace px {

// Rematerialization: which forward values the backward pass reads as saved, and which it
// recomputes from them (see remat_step and docs/memory.md). Layers are what lies between values
// tagged "layer_input" (px::tag; TransformerLm tags each block's input and the last block's output
// "layers_end"); a program without such tags is one layer whose inputs are the graph's inputs.
enum class RematPolicy {
  none,              // save everything the backward pass reads
  full,              // in each layer save only its input; recompute the rest of the layer
  nothing_saveable,  // full, and outside the layers too (embedding, head and loss recomputed)
  dots_saveable,     // in each layer save contraction outputs (dot_general, fused attention) and the input
  dots_with_no_batch_dims_saveable,  // only matmuls without batch dims (weights, not attention)
  names,                             // in each layer save the values tagged with one of RematOptions::names
  // dots_saveable, with the saved values and the layer inputs kept in pinned_host memory: sent
  // there in the forward pass, fetched back (a layer ahead) for the backward pass
  offload,
  // The least recompute whose planned per-device peak fits RematOptions::budget_bytes (else
  // CompileOptions::memory_limit_bytes): full remat of the fewest layers, else nothing_saveable;
  // chosen by the buffer planner itself.
  automatic,
};
const char* remat_policy_name(RematPolicy p);
RematPolicy parse_remat_policy(const std::string& name);  // throws naming the policies

// A function of tensors, e.g. one block of a model.
using TensorFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
// Wraps fn so that, in a traced training step, the forward values it computes follow `policy`
// (saved for the backward pass or recomputed there), whatever the step's RematOptions say; `names`
// for RematPolicy::names. Not RematPolicy::automatic (it needs the whole step's budget).
TensorFn remat(TensorFn fn, RematPolicy policy, std::vector<std::string> names = {});
// A stack of blocks run in order (each block's results are the next one's operands), each block
// rematerialized by `policy` on its own.
TensorFn remat_model(std::vector<TensorFn> blocks, RematPolicy policy);

struct RematOptions {
  RematPolicy policy = RematPolicy::none;
  std::vector<std::string> names;  // names: globs of px::tag names to save
  int layers = -1;                 // apply the policy to the first `layers` layers only (-1: all)
  int64_t budget_bytes = 0;        // automatic: the per-device peak to fit (0: the compile limit)
};

// Offload: what lives in pinned_host memory between steps instead of device memory (see
// offload_step and docs/memory.md). An offloaded param is fetched to device memory before its
// uses (again for the backward pass) and freed after them; fetches start `prefetch_depth` layers
// ahead and run on the backend's copy stream, overlapped with compute.
struct OffloadOptions {
  std::vector<std::string> params;  // globs of param paths ("*": all); each must match a param
  bool optimizer_state = false;     // keep the optimizer state on the host and run the update there
  int prefetch_depth = 1;           // layers fetched ahead of the one computing (0: fetch at first use)
};

struct TrainStepOptions {
  // Where the step runs: unset, on one device; set, on every device of the mesh, each param and
  // the batch split by `strategy` (and `sharding`'s rules and options). Over several processes
  // (Mesh::with_processes), sharding.communicator is this process's communicator.
  std::optional<Mesh> mesh;
  ShardingStrategy strategy = ShardingStrategy::DDP;
  ShardingOptions sharding;
  double clip_norm = 0.0;  // > 0: clip gradients to this global norm; 0: no clipping
  RematOptions remat;      // recompute forward values in the backward pass instead of keeping them
  OffloadOptions offload;  // keep params and optimizer state in pinned_host memory
  // When the loss or the gradient norm is NaN or infinite, keep params and optimizer state as they
  // were (the step is counted in TrainState::skipped, not in TrainState::step).
  bool skip_nonfinite = false;
  CompileOptions compile;  // e.g. .compute_dtype = DType::bf16 for mixed precision
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

  // Saves params (named by their paths) and optimizer state (named "<path>.<slot>", e.g.
  // "blocks.0.attn.wq.m") as one safetensors file of full arrays, with the step count in the
  // metadata; so a step on any mesh or strategy loads it (split again on load). Over several
  // processes every process calls save (process 0 writes) and load.
  void save(const std::string& path, const TrainState& state) const;
  TrainState load(const std::string& path) const;
  std::vector<std::string> state_names() const;  // the optimizer-state tensor names

  // Each param's spec and bytes per device (on one device: a 1-device mesh, all replicated).
  const ShardingPlan& plan() const;
  std::string table() const { return plan().table(); }
  // Collectives of one step: planned (partitioner, bytes per device) and counted at run time.
  std::string collectives_table() const;
  const Graph& graph() const;  // the traced step (global shapes, before partitioning)
  // The compiled local program (what each device runs: its memory report, profile and timeline)
  // and the sharded executable around it (shardings, collectives, the devices it runs).
  const Executable& executable() const;
  const ShardedExecutable& sharded_executable() const;
  ShardedExecutable& sharded_executable();
  int64_t peak_bytes() const;  // the planned peak per device
  const optim::Optimizer& optimizer() const;
  const Sharding& batch_sharding(int i) const;
  int64_t steps_run() const;
  int process() const;  // whose shards the state holds (0 on one device)

 private:
  std::unique_ptr<detail::Step> step_;
};

// The traced training step and what its parts are: the input of the sharding decision, the
// memory report and the passes after it.
struct StepProgram {
  std::unique_ptr<Graph> graph;  // inputs: params, optimizer state ("<path>.<slot>"), batch, step (i32)
                                 // outputs: loss, gradient norm, learning rate, new params, new state
  size_t n_params = 0, n_state = 0, n_batch = 0;
  std::vector<std::string> paths;          // per param
  std::vector<int> grads;                  // per param: the value of its gradient (before clipping)
  int forward_end = 0;                     // nodes [0, forward_end) compute the loss
  int backward_end = 0;                    // nodes [forward_end, backward_end) the gradients; then clip and update
  std::vector<MemoryCategory> categories;  // per value: params, optimizer state, gradients, activations, ...
  std::vector<MemoryKind> input_kinds;     // per graph input, where it lives (empty: all device)
  std::vector<MemoryKind> kinds;           // per value, where it is computed (empty: all device)
  StepProgram clone() const;               // a deep copy (the passes take programs by value)
};

// Traces the whole step into one program. `who` names the caller in errors. With skip_nonfinite,
// the new params and state equal the old ones when the loss or the gradient norm is not finite.
StepProgram trace_train_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                             const std::vector<TensorType>& batch_types, double clip_norm,
                             const std::string& who = "TrainStep", bool skip_nonfinite = false);

// The remat pass: the same step in which the backward pass reads only the forward values the
// policy saves; every other forward value it reads is recomputed (a copy of the forward nodes that
// produce it, from saved values and inputs) just before its first use there, so the forward
// value is freed after its last forward use. Results are bitwise those of the program without
// remat. `recomputed_flops` (optional) receives the FLOPs of the copies.
StepProgram remat_step(StepProgram p, const RematOptions& options, double* recomputed_flops = nullptr);
// RematPolicy::automatic: the first policy of [none, full on the first 1, 2, ... layers,
// nothing_saveable] whose planned peak (`peak_of`, bytes per device) is at most `budget`; throws
// px::UserError with the peaks of none and nothing_saveable when even that does not fit.
// `chosen` (optional) receives the policy it settled on.
StepProgram remat_automatic(StepProgram p, int64_t budget, const std::function<int64_t(const StepProgram&)>& peak_of,
                            RematOptions* chosen = nullptr);

// The offload pass: inputs chosen by `options` live in pinned_host memory; every device use of one
// reads a copy fetched by a `transfer` node (px::to_memory) just before (one fetch per cluster of
// nearby uses, so forward and backward fetch separately), and values crossing to the other memory
// kind are transferred. With optimizer_state, the clipping and update nodes run on the host and
// read the gradients transferred there. Results are bitwise those without offload.
StepProgram offload_step(StepProgram p, const OffloadOptions& options);

// A forward-only program over the params (e.g. logits for evaluation or decoding), on one device
// or, with a mesh, split over it by a recipe the way TrainStep is; one path for both.
struct ForwardOptions {
  std::optional<Mesh> mesh;
  ShardingStrategy strategy = ShardingStrategy::DDP;
  ShardingOptions sharding;
  CompileOptions compile;
  // Donation, as jax.jit's donate_argnums: positions in (params..., then the other arguments) whose
  // arrays the call may write its outputs into (each into the first output of its type not taken).
  // Only a call with non-const std::vector<Array> lvalues donates: it leaves the donated arrays of
  // the caller's vectors empty (released), and passing a released array again is a px::Error. Other
  // arrays are never written; without a mesh the donated buffer holds the output in place.
  std::vector<int> donate;
};

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
