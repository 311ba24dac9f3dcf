// The passes that compile a local program, each in its own file, run in this order by plan_impl
// (runtime/executable.cc), which is the one place that lists them:
//
//   simplify          autocast, narrowing to 16 bits, CSE, far widening, DCE  simplify.cc
//   place_values      memory kind of every value, categories of a plain jit   place_values.cc
//   order             updates as gradients complete                           order.cc
//   schedule          units: kernels, fused groups, views, collective events  schedule.cc
//   lower_collectives collective ops, packing scratch, transfers              lower_collectives.cc
//   kernel_scratch    the working memory each kernel asks its backend for     lower_collectives.cc
//   donate            which outputs are written into donated inputs           donation.cc
//   plan_arenas       one buffer plan per memory kind                         plan.cc
//   memory_report     per-device bytes by category and layer, the floor       memory_report.cc
//   check_limits      the memory limits, with what is live at the peak        memory_report.cc
//
// Internal to the runtime: the sharding layer reaches them through plan_program (runtime/program.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallax/backend.h"
#include "parallax/runtime.h"
#include "runtime/collectives.h"
#include "runtime/plan.h"
#include "runtime/schedule.h"

namespace px {

// The graph compile runs; its values keep the facts of the source's (ValueInfo).
std::unique_ptr<Graph> simplify(const Graph& src, const CompileOptions& opt);

// Sets the memory kind of every value the program computes: a transfer's target, else the host
// when the value is marked so or every operand lives there, else the device. A program whose
// values carry no category (a jit function, not a training step) gets its caller's arrays
// (inputs and outputs) labelled activations.
void place_values(Graph& g);

// The buffers of a scheduled program: ids [0, values) are values, stored at their root (a view
// shares its operand's storage), then the collectives' packing scratch and the kernels' scratch.
struct ProgramBuffers {
  std::vector<int> root;  // per value
  std::vector<int64_t> bytes;
  std::vector<MemoryCategory> category;
  std::vector<MemoryKind> kind;
  std::vector<int> kernel_scratch;  // per unit: its kernel's working memory (a buffer id), or -1
};
ProgramBuffers value_buffers(const Graph& g, const std::vector<Unit>& units);

// Collective events of the schedule as ops the communicator runs; copies between memory kinds
// ("transfer") run on the backend's copy stream. Adds each op's packing scratch to `buffers`.
struct LoweredCollectives {
  std::vector<CollectiveOp> ops;                // in order of first start
  std::vector<int> of_unit;                     // per unit: the op it starts or waits, else -1
  std::vector<std::vector<int>> scratch_of;     // per op: its scratch buffer ids
  int64_t transfer_bytes = 0;                   // bytes copied between memory kinds per run
};
LoweredCollectives lower_collectives(const Graph& g, const std::vector<Unit>& units,
                                     const std::function<CollectiveGroups(const Node&)>& groups, ProgramBuffers& buffers);

// Asks `backend` for the working memory of every compute unit's kernel (Backend::scratch_bytes)
// and adds one device buffer per unit that needs some (category kernel_scratch): the unit writes it
// and nothing reads it, so it is live only while the unit runs.
void kernel_scratch(const Graph& g, const std::vector<Unit>& units, const Backend& backend, const Placement& device,
                    ProgramBuffers& buffers);

// Output o is written into input output_donor[o]'s array (-1: not donated); in place when that
// input's last reader runs before the writer, else computed into the arena and copied at the end.
struct Donation {
  std::vector<int> output_donor;
  std::vector<char> copy_at_end;
};
Donation donate(const Graph& g, const std::vector<Unit>& units, const ProgramBuffers& buffers,
                const std::vector<int>& output_donors);

// One arena per memory kind over the units; `external` buffers live in caller memory.
struct ArenaPlans {
  std::vector<PlanStep> steps;  // per unit: the buffers it reads and writes
  std::vector<char> external_to_device;
  std::vector<int> live_to_end;
  BufferPlan device, host;
};
ArenaPlans plan_arenas(const Graph& g, const std::vector<Unit>& units, const ProgramBuffers& buffers,
                       const LoweredCollectives& colls, const std::vector<char>& external);

// The per-device memory report: caller arrays by category, the arenas' buffers live at the peak,
// the largest users by category and layer, and the floor (with `one_forward_pass`, a training
// step's backward pass and update count as running after its one forward pass).
MemoryReport memory_report(const Graph& g, const std::vector<Unit>& units, const ProgramBuffers& buffers,
                           const LoweredCollectives& colls, const Donation& donation, const ArenaPlans& plans,
                           bool one_forward_pass);

// Throws px::UserError when the report is over opt's device or host limit, naming what is live at
// the peak and what would help.
void check_limits(const MemoryReport& report, const CompileOptions& opt, const Graph& g, const ProgramBuffers& buffers,
                  const ArenaPlans& plans);

}  // namespace px
