// Pipeline parallelism (internal): the traced step of one microbatch cut into stage programs
// (stage_programs.cc) and the run loop that runs them in a schedule's order, one thread per
// device, messages between stages (pipeline_step.cc).
//
// Every node of the traced step gets a stage: the stage of the layer its value belongs to
// (memory_pass::label_layers), moved so that forward values only flow to the same or later stages
// and backward values to the same or earlier ones. The nodes of one stage and phase are one
// program: its forward (F) and backward (B; for the zero-bubble schedule the input-gradient part I,
// what earlier stages wait for, and the weight-gradient part W). Each microbatch's loss and
// gradients are summed on their stage (an accumulate program, the same additions as the
// microbatched step on one device) and divided by the microbatch count (a mean program); the
// update is cut by stage into levels, a level reading other stages' values of earlier levels only
// (the clipping norm sums every stage's part).
//
// A pipeline device is a group of devices: the mesh's positions at one `stage` coordinate, over the
// mesh's other axes. Every program is partitioned over its group like any step, by the recipe's
// plan for the group's mesh (DDP, FSDP, tensor parallelism: each param's spec, the batch split over
// the batch axes, each microbatch's gradients reduced to their param's spec in its backward
// program), and compiled as a ShardedExecutable.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memory/step_program.h"
#include "parallax/auto.h"
#include "parallax/communicator.h"
#include "parallax/pipeline.h"
#include "parallax/plan.h"
#include "parallax/runtime.h"
#include "parallax/spmd.h"
#include "parallax/train.h"

namespace px::detail {

// `step`: the whole step of a one-stage pipeline in one program (forward, backward and the gradient
// sums of every microbatch, then the update): with one stage nothing is sent, so nothing is cut.
enum class StagePart { forward, backward, backward_input, backward_weight, update, accumulate, mean, reduce, step };

// One program of the pipelined step, over values of the traced step.
struct StageProgram {
  StagePart part = StagePart::forward;
  int stage = 0;
  int level = 0;                           // update: programs of a level read other stages' earlier levels
  std::vector<int> inputs, outputs;        // value ids of the traced step, in the program's order
  std::vector<MemoryKind> input_kinds;     // per input: where the program reads it (pinned_host: offloaded)
  std::unique_ptr<ShardedExecutable> exe;  // over the stage's device group (null when only planned)
  std::unique_ptr<Executable> local;       // accumulate and mean: run on each device's copy (in turn)
  // Working memory per device, planned. The programs of a device group run one at a time, in one
  // arena per device the size of the largest (PipelineRunner::share_arenas).
  int64_t arena_bytes = 0;
  double seconds = 0;                      // predicted on the cluster it was planned for (0: none)
};

// The stage computing value v of a cut step's graph: its producer's stage (NodeFacts::stage), -1
// for an input.
inline int stage_of(const Graph& g, int v) {
  const int producer = g.values()[static_cast<size_t>(v)].producer;
  return producer < 0 ? -1 : g.nodes()[static_cast<size_t>(producer)].facts.stage;
}

struct StagedStep {
  std::unique_ptr<Graph> graph;  // the traced step of one microbatch (after remat), each node's stage on it
  size_t n_params = 0, n_state = 0, n_batch = 0;
  pipeline::Schedule schedule;
  bool split_backward = false;        // the schedule's actions are I and W: each backward is two programs
  std::vector<Mesh> groups;           // per pipeline device: its devices, over the mesh's other axes
  std::vector<int> process_of_group;  // per pipeline device: the process running it (0 in one process);
                                      // empty: every process runs its part of the one group
  int process = 0;                    // this process's index among the mesh's processes
  // The threads each device group's kernels are made for and run on: the process's threads split
  // between the groups one process runs (0: one group a process, every thread).
  int threads_per_group = 0;
  int batch_shards = 1;               // the batch's rows are split this many ways in a group
  std::vector<std::vector<std::string>> stage_layers;
  std::vector<StageProgram> programs;
  // Per stage: the program index of each part (-1: none).
  std::vector<int> forward, backward, backward_input, backward_weight, accumulate, mean, reduce;
  std::vector<int> updates;                // run once a step after the actions: updates by level, then stage
  std::vector<int> accumulated;            // values summed over microbatches: the loss and each gradient
  std::vector<int64_t> device_bytes;       // per value crossing programs: bytes on each device of its group
  std::vector<PartitionSpec> value_spec;   // per value crossing programs: its layout on its group
  std::vector<PartitionSpec> input_specs;  // per graph input: params and state by the plan, the batch
  std::optional<Link> stage_link;          // planned for a cluster: the link messages cross
  int stage_of(int v) const { return px::detail::stage_of(*graph, v); }
};

// Cuts `p` (traced for one microbatch of each device's rows, after remat) into stage programs for
// `schedule` on `mesh` (a `stage` axis and others), each partitioned by `plan` (made for the mesh of
// one group), offloaded by `offload` and compiled with `copt`. Throws px::UserError for a model without numbered layers,
// more stages than layers or a split that does not add up.
// With `cluster`, each program's time is predicted on it; without `compile`, nothing is compiled
// or allocated (planning only: the report, not run).
StagedStep stage_programs(StepProgram p, const pipeline::Schedule& schedule, const PipelineOptions& options,
                          const Mesh& mesh, const ShardingPlan& plan, const std::vector<PartitionSpec>& state_specs,
                          const CompileOptions& copt, const OffloadOptions& offload = {},
                          const Cluster* cluster = nullptr, bool compile = true);

// The staged step of a mesh without a `stage` axis: one stage whose one program (`exe`, compiled
// from the traced step `graph`, its microbatches inside) is the whole step; its group is the mesh,
// run by every process holding a part of it.
StagedStep one_stage(std::unique_ptr<Graph> graph, std::unique_ptr<ShardedExecutable> exe, size_t n_params,
                     size_t n_state);

// A training step built by the pass pipeline (compile_step.cc, the one list of its passes): the
// plan, the traced step and its stage programs (one stage on a mesh without a `stage` axis, its
// one program the whole step). compile = false plans a pipelined step's programs without
// compiling them (AUTO's pipelined candidates, plan_pipeline); cluster times them.
struct BuiltStep {
  ShardingPlan plan;  // on the whole mesh: each param's spec inside its stage
  std::vector<PartitionSpec> state_specs;
  std::unique_ptr<Graph> graph;  // the traced step (of one microbatch when pipelined), after remat
  StagedStep staged;
};
BuiltStep build_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                     const std::vector<TensorType>& batch_types, const TrainStepOptions& options,
                     const Cluster* cluster = nullptr, bool compile = true);

// AUTO's pipelined candidates for base.mesh's devices (px::search_pipelines says which): every
// stage count S > 1 dividing the devices that `stages_ok` accepts, each planned (nothing compiled)
// and predicted on `cluster`; fastest first, those that fit (base.sharding.auto_memory_limit_bytes,
// else the cluster's memory) before the rest; stops adding candidates after time_limit_s.
std::vector<PipelineCandidate> pipeline_candidates(nn::ParamStore& store, const optim::Optimizer& opt,
                                                   const TrainStep::LossFn& loss_fn,
                                                   const std::vector<TensorType>& batch_types,
                                                   const TrainStepOptions& base, const Cluster& cluster,
                                                   const std::function<bool(int64_t)>& stages_ok, double time_limit_s);

// What the staged step plans: stages, memory per device, messages and, when planned for a cluster,
// the predicted step time and bubble.
PipelineReport pipeline_report(const StagedStep& s);

// Who reads what, per device group: the counts the run loop and the plan both walk by.
struct Readers {
  std::vector<std::map<int, int>> micro, step;              // per group: value -> its programs reading it
  std::vector<std::vector<int>> micro_remote, step_remote;  // per value: other groups reading it
};

// Runs a staged step (every training step: a mesh without a `stage` axis is one stage). The state (params and optimizer
// state) is held where it is updated: each array on the device group of its home stage (the stage whose update program
// writes it), split by the plan's spec there (state_shardings()), and only by the process running that group; other
// processes hold nothing of it. A group of another stage that reads it (a tied embedding's head)
// gets a copy at the start of each step, a message when the groups are in different processes.
// The batch is whole (split into microbatches here) and `step` the counter (i32).
//
// Over several processes (`comm`: this process's communicator; each process holds whole device
// groups) every process runs its own groups; a message to a group of another process is a
// point-to-point message. The loss, gradient norm and learning rate reach every process.
class PipelineRunner {
 public:
  explicit PipelineRunner(StagedStep s, Communicator* comm = nullptr);
  struct Outputs {
    Array loss, grad_norm, lr;        // whole, on every process
    std::vector<ShardedArray> state;  // the new params and optimizer state, in state_shardings()
  };
  // donate[j]: state input j may be written in place by a program that updates it (nobody else
  // holds its arrays).
  Outputs run(const std::vector<ShardedArray>& state, const std::vector<char>& donate, const Array& step,
              const std::vector<Array>& batch);
  // Where state input j is kept (pinned_host when offloaded): as the first program reading it wants it.
  MemoryKind state_kind(size_t j) const;
  // The most bytes a device of any group plans to use (its programs, the state, what it holds).
  int64_t planned_peak() const;
  // Per state input (params, then optimizer state): its home group's devices and the plan's spec,
  // the mesh knowing the process that runs the group (of this runner's processes).
  const std::vector<Sharding>& state_shardings() const { return state_shardings_; }
  // Per input of the traced step: the state's as above, then how the caller's batch arrays and
  // step counter are split (whole where the runner splits them into microbatches).
  const std::vector<Sharding>& input_shardings() const { return input_shardings_; }
  // State input j whole: every process calls it, in the same order; the home process sends it.
  Array gather_state(size_t j, const ShardedArray& a) const;
  const PipelineReport& report() const { return report_; }
  const StagedStep& staged() const { return s_; }
  // This process's compiled programs, by stage and then part (forward, backward or I and W, update
  // levels, the reduction of gradient sums).
  const std::vector<ShardedExecutable*>& programs() const { return programs_; }
  std::string collectives_table() const;  // each program's collectives, planned and counted; messages
  int process() const { return process_; }
  int num_processes() const { return processes_; }
  Communicator* communicator() const { return comm_; }

 private:
  struct Exchange;  // one run's inputs and what its device groups send each other
  class GroupRun;   // one device group's actions in a run
  int64_t message_tag(int v, int m, int to, int shard) const;
  // The shards of state input j as program input `sh` on group d (its home's arrays, or the copy
  // made for d at the start of the step).
  ShardedArray state_input(size_t j, int d, const Sharding& sh, const std::vector<ShardedArray>& state,
                           const std::map<std::pair<size_t, int>, ShardedArray>& copies) const;
  std::map<std::pair<size_t, int>, ShardedArray> copy_state(const std::vector<ShardedArray>& state) const;
  std::vector<ShardedArray> new_state(const std::vector<ShardedArray>& state,
                                      const std::map<int, ShardedArray>& results) const;
  Array metric(int o, const std::map<int, ShardedArray>& results) const;
  void share_arenas();
  // One device arena per device of this process's groups that their programs run in, one program
  // at a time (declared before s_: freed after the programs).
  struct Arena {
    Placement at;
    void* data = nullptr;
    int64_t bytes = 0;
    Arena(Placement p, int64_t n) : at(std::move(p)), data(allocate_bytes(at, n)), bytes(n) {}
    Arena(const Arena&) = delete;
    Arena& operator=(const Arena&) = delete;
    ~Arena() { free_bytes(at, data, bytes); }
  };
  std::vector<std::unique_ptr<Arena>> arenas_;
  StagedStep s_;
  PipelineReport report_;
  Readers readers_;              // fixed by the programs: computed once
  std::vector<char> is_output_;  // per value: an output of the step
  Communicator* comm_ = nullptr;
  int process_ = 0, processes_ = 1;
  std::vector<int> message_index_;         // per value sent to another process: its number
  int64_t output_tag_ = 0;                 // the first tag after the messages' (message_tag)
  int64_t gather_tag_ = 0, copy_tag_ = 0;  // gather_state's, then the state copies'
  std::vector<int> home_;                  // per state input: its home group
  std::vector<std::vector<int>> away_;     // per state input: the other groups reading it
  std::vector<Sharding> state_shardings_;  // per state input
  std::vector<Sharding> input_shardings_;  // per input of the traced step
  std::vector<ShardedExecutable*> programs_;
};

}  // namespace px::detail
