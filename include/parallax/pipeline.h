// Pipeline schedules: which forward and backward pass of which microbatch each device of a pipeline
// runs, in what order. A schedule is data: it can be printed, checked and simulated (unit costs give
// its bubble and the activations each device holds) before any program is compiled for it.
//
//   px::pipeline::Schedule s = px::pipeline::make_schedule(px::pipeline::Kind::one_f_one_b, 4, 8);
//   std::cout << s.to_string();                    // one line per device: F0 F1 F2 F3 B0 F4 B1 ...
//   px::pipeline::Simulation r = px::pipeline::simulate(s);
//   r.bubble;                                      // idle fraction, (S-1)/(M+S-1) for 1F1B
//
// Training with a pipeline: give TrainStep a mesh whose `stage` axis has the devices and say how
// (TrainStepOptions::pipeline, below). The model's numbered layers ("blocks.3") are split into
// contiguous stages (embedding with the first, final norm and head with the last); each stage's
// forward, backward and update are programs of their own, compiled through the same passes as any
// step, and each device runs its stages' programs in the schedule's order, activations and their
// gradients passed between neighbouring stages as messages.
//
//   px::TrainStepOptions o;
//   o.mesh = px::Mesh({{"stage", 4}});
//   o.microbatches = 8;
//   o.pipeline.schedule = px::pipeline::Kind::one_f_one_b;
//   px::TrainStep step(store, opt, loss, batch_types, o);
//   step.pipeline_report().to_string();           // stages, planned memory, measured bubble
//
// Stages: with D devices and V virtual stages per device (interleaved schedules) the model is cut
// into S = D * V stages; device d holds stages d, d + D, d + 2D, ... (the looped placement of
// Megatron-LM's interleaved 1F1B and of Pax's circular pipeline). Without interleaving, device d
// holds stage d.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace px {
class Mesh;
}

namespace px::pipeline {

enum class Kind {
  gpipe,        // every forward, then every backward: holds all M microbatches' activations
  one_f_one_b,  // 1F1B (PipeDream-flush): warm up, then one forward and one backward in turn
  interleaved,  // interleaved 1F1B: V stages per device, a smaller bubble for more messages
  zero_bubble,  // ZB-H1: the backward split into its input-gradient (I) and weight-gradient (W)
                // parts, the W parts deferred into the bubbles; no device holds more microbatches
                // than 1F1B's first (D), later devices hold more than under 1F1B
};
const char* kind_name(Kind k);
Kind parse_kind(const std::string& name);  // "gpipe", "1f1b", "interleaved", "zero_bubble"; throws px::UserError

enum class Op : uint8_t {
  forward,          // F: the stage's forward pass of a microbatch
  backward,         // B: its whole backward pass (input and weight gradients)
  backward_input,   // I: the input gradient only (what the previous stage waits for)
  backward_weight,  // W: the weight gradient only (nobody waits for it)
};

struct Action {
  Op op;
  int microbatch;
  int stage;  // 0 .. S-1, over the whole pipeline
  bool operator==(const Action&) const = default;
};

struct Schedule {
  Kind kind = Kind::one_f_one_b;
  int devices = 1;
  int virtual_stages = 1;  // per device
  int microbatches = 1;
  std::vector<std::vector<Action>> per_device;  // what each device runs, in order

  int stages() const { return devices * virtual_stages; }
  int device_of(int stage) const { return stage % devices; }
  // Whether the actions split a backward pass into its I and W parts: then each stage's backward
  // is compiled as two programs (whatever the kind that made the list).
  bool splits_backward() const;
  // One line per device, e.g. "device 0: F0 F1 B0 F2 B1 B2"; with V > 1 or to name stages,
  // actions read "F3.s4" (microbatch 3 of stage 4); I and W for the split backward.
  std::string to_string() const;
};

// Builds a schedule; throws px::UserError naming the problem for devices < 1, microbatches < 1,
// virtual_stages < 1, virtual_stages > 1 with a kind other than interleaved, and interleaved with
// microbatches not a multiple of devices.
Schedule make_schedule(Kind kind, int devices, int microbatches, int virtual_stages = 1);

// The time of each action in units (the same for every stage), and of one point-to-point message
// between neighbouring stages on different devices.
struct Costs {
  double forward = 1.0;
  double backward_input = 1.0;   // B = I + W
  double backward_weight = 1.0;
  double message = 0.0;
};

struct Simulation {
  double makespan = 0;
  std::vector<double> busy;               // per device: time spent running actions
  double bubble = 0;                      // idle fraction: 1 - sum(busy) / (devices * makespan)
  std::vector<int> peak_activations;      // per device: most microbatch-stages whose forward has run
                                          // and whose backward (B, or W when split) has not
  std::vector<std::vector<double>> start;  // per device, per action: when it starts
};

// Runs the schedule on the costs, each device in its order, each action as soon as what it needs
// is done: F(m, s) needs F(m, s-1); B or I of (m, s) needs F(m, s) and the input gradient of
// (m, s+1); W(m, s) needs I(m, s). Throws px::Error when the schedule is not a valid one: an
// action missing or repeated, or an order that deadlocks (naming each device's next action).
Simulation simulate(const Schedule& s, const Costs& costs = {});
// The same with each stage's own costs (one per stage; `message`: a message from that stage).
Simulation simulate(const Schedule& s, const std::vector<Costs>& per_stage);

// The bubble (idle fraction) the schedule kind has in theory with the given costs:
// (S-1)/(M+S-1) for GPipe and 1F1B, (D-1)/(V*M+D-1) interleaved, and for ZB-H1
// (D-1)(F+I-W) / (M(F+I+W) + (D-1)(F+I-W)).
double bubble_theory(Kind kind, int devices, int microbatches, int virtual_stages = 1, const Costs& costs = {});

// A mesh with a `stage` axis: a step on it is pipelined.
bool has_stage_axis(const Mesh& mesh);

// "F3" (forward of microbatch 3), "B3", "I3", "W3"; with `stage`, "F3.s4".
std::string action_name(const Action& a, bool with_stage = false);

}  // namespace px::pipeline

namespace px {

// How a step on a mesh with a `stage` axis is pipelined (TrainStepOptions::pipeline).
struct PipelineOptions {
  pipeline::Kind schedule = pipeline::Kind::one_f_one_b;
  int virtual_stages = 1;  // stages per device (the interleaved schedule): stages = devices * this
  // Numbered layers per stage, one entry per stage (their sum: the model's numbered layers);
  // empty: an even split, which needs the stage count to divide the layers.
  std::vector<int> layers_per_stage;
  // Split by cost instead: the step's FLOPs per layer (the embedding counted with the first stage,
  // the head and the loss with the last), contiguous stages whose costliest is as cheap as it can
  // be. Needs layers_per_stage empty.
  bool balance = false;
};

// What a pipelined step planned and what its last run measured (TrainStep::pipeline_report()).
struct PipelineReport {
  pipeline::Schedule schedule;
  std::vector<std::vector<std::string>> stage_layers;  // per stage: the layers it holds
  // Per device: bytes of params and optimizer state its stages read, of the gradient sums, of its
  // programs' working memory (arenas), and the most bytes of activations, gradients and messages
  // it holds at once (planned from the schedule before running; measured on the last run).
  std::vector<int64_t> state_bytes, accumulator_bytes, arena_bytes, planned_held_bytes, measured_held_bytes;
  std::vector<int64_t> param_bytes;  // per device: of its params (a part of state_bytes)
  int64_t planned_peak(int device) const;   // state + accumulators + arenas + planned held
  int64_t measured_peak(int device) const;  // the same with the measured held bytes (0 before a run)
  // The threads each device group's kernels are made for and run on, where one process runs
  // several groups (each on a thread of its own, sharing the process's threads); 0: one group a
  // process, every thread.
  int threads_per_group = 0;
  int64_t message_bytes = 0;  // sent between devices per step, over all devices (activations and their gradients)
  int messages = 0;
  // The last run, per device: each action (and "update") with when it began and ended, in seconds
  // since the step began.
  struct Span {
    std::string name;  // "F3", "B3.s4", "update"
    double begin_s = 0, end_s = 0;
  };
  std::vector<std::vector<Span>> timeline;
  double schedule_s = 0;  // from the first action's start to the last action's end
  // Planned for a cluster (px::plan_pipeline, pax plan --cluster): each stage program timed by the
  // cost model (auto.h), played in the schedule's order with messages over the `stage` axis's link.
  double predicted_step_s = 0, predicted_schedule_s = 0, predicted_bubble = 0;
  // Idle fraction of the devices over the schedule (the update excluded): 1 - busy / (D * schedule_s).
  double bubble_measured() const;
  double bubble_theory() const;  // pipeline::bubble_theory of the schedule with unit costs
  std::string to_string() const;
  std::string chrome_trace() const;  // one track per device (chrome://tracing, ui.perfetto.dev)
};

}  // namespace px
