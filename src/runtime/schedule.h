// The schedule pass: the order in which one device runs a program. Elementwise chains are fused
// into single tiled kernels; collectives are nodes of the schedule, split into a start and a wait
// so that communication can overlap compute. Collectives that grow their operand (all-gathers) start
// late, just before their first use, with a lookahead; the others (reductions) start as soon as
// their operand is ready and are waited a few units later, so the operand is freed early.
#pragma once

#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {

class Backend;

struct ScheduleOptions {
  bool fuse_elementwise = true;
  // Which nodes may fuse and which have kernels of their own: the backend's answer (null: the CPU's).
  const Backend* backend = nullptr;
  // An all-gather starts when the gather `lookahead` places before it (in order of first use) is
  // first used: 0 = just before its own first use; 1 = one gather in flight ahead (FSDP: the next
  // layer's weights arrive while this layer computes).
  int collective_lookahead = 1;
  // Fetches to device memory (transfer nodes) start when the fetches `prefetch_depth` prefetch
  // groups (layers) before theirs are first used; transfers to the host start when ready.
  int prefetch_depth = 1;
  // A reduction is waited at most this many compute units after it starts (or at its first use).
  int overlap_units = 2;
};

struct Unit {
  enum class Kind { kernel, fused, view, collective_start, collective_wait };
  Kind kind = Kind::kernel;
  std::vector<int> nodes;      // graph nodes it runs (fused: members in order)
  std::vector<int> in_values;  // operands read from outside the unit
  std::vector<int> out_values; // results written (fused: only those read outside the group)
  std::string label;
  bool alias_safe = false;  // a result may share its buffer with an operand (fused loops, in_place primitives)
};

// True for the primitives that run through a Communicator rather than as kernels.
bool is_collective_primitive(const std::string& prim);
// Collectives and transfers between memory kinds: scheduled as a start and a wait.
bool is_async_primitive(const Primitive& p);

// Orders the graph's nodes into units. Compute units keep the graph's order (a fused group runs at
// its last member); collective starts and waits are placed among them as described above.
std::vector<Unit> make_schedule(const Graph& g, const ScheduleOptions& opt);

}  // namespace px
