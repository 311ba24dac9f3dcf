// The schedule pass: the order in which one device runs a program. Elementwise chains are fused
// into single tiled kernels; collectives are nodes of the schedule, split into a start and a wait
// so that communication can overlap compute. Collectives that grow their operand (all-gathers) start
// late, just before their first use, with a lookahead; the others (reductions) start as soon as
// their operand is ready and are waited a few units later, so the operand is freed early.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "parallax/backend.h"  // Unit
#include "parallax/graph.h"
#include "parallax/memory.h"

namespace px {

class Backend;

struct ScheduleOptions {
  bool fuse_elementwise = true;
  // Which nodes may fuse and which have kernels of their own: the backend's answer (null: the CPU's).
  const Backend* backend = nullptr;
  // How far they fuse: the backend's fusion() unless set (a test that schedules for one backend
  // with another's decisions).
  std::optional<FusionLimits> fusion;
  // An all-gather starts when the gather `lookahead` places before it (in order of first use) is
  // first used: 0 = just before its own first use; 1 = one gather in flight ahead (FSDP: the next
  // layer's weights arrive while this layer computes).
  int collective_lookahead = 1;
  // Fetches to device memory (transfer nodes) start when the fetches `prefetch_depth` prefetch
  // groups (layers) before theirs are first used; transfers to the host start when ready.
  int prefetch_depth = 1;
  // Either kind starts no earlier than that, and no earlier than its result fits under the peak
  // that the program would have with every gather and fetch made at its first use: what is
  // fetched or gathered ahead of use never raises the peak, it fills the room below it (device
  // bytes only: the values' memory kinds are on the graph).
  // A reduction is waited at most this many compute units after it starts (or at its first use).
  int overlap_units = 2;
};

// Collectives and transfers between memory kinds: scheduled as a start and a wait.
bool is_async_primitive(const Primitive& p);

// Orders the graph's nodes into units. Compute units keep the graph's order (a fused group runs at
// its last member); collective starts and waits are placed among them as described above.
std::vector<Unit> make_schedule(const Graph& g, const ScheduleOptions& opt);

// One line per unit: "index: label (%operands) -> %results" (the schedule's PX_DUMP file).
std::string schedule_text(const std::vector<Unit>& units);

}  // namespace px
