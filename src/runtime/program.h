// Compiling a local program for several devices of this process: the interface between the
// runtime and the sharding layer (which resolves the device groups of each collective).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallax/runtime.h"
#include "runtime/collectives.h"
#include "runtime/schedule.h"

namespace px {

struct DeviceSetup {
  std::vector<int> device_ids{0};  // one per local device, in the order of run_on_devices' lists
  Communicator* comm = nullptr;    // required when the program has collectives
  std::function<CollectiveGroups(const Node&)> groups;
  bool over_devices = false;  // run the devices of a block in parallel, one thread each
};

// After autocast: a value that every reader casts to the same bf16/f16 type is made in that type
// where its producer can: an all-gather gathers the cast operand (FSDP moves and holds 16-bit
// weights), a primitive with an `out_dtype` attribute writes it (the head's f32 gradient,
// vocabulary wide, is never stored; a norm's output feeds the matmuls in bf16). Null when no value
// narrows: g is then the graph to use.
std::unique_ptr<Graph> narrow_producers(const Graph& g);
std::unique_ptr<Graph> narrow_layouts(const Graph& g);  // layout ops moved to the 16-bit side of casts
std::unique_ptr<Graph> widen_near_readers(const Graph& g);  // far readers of a widened value widen it themselves

// What compile decides for a program before it allocates anything: the prepared graph (after
// autocast, CSE and DCE), its schedule, its collectives and the per-device memory report of its
// buffer plan. The cost model reads it; compile_on_devices runs the same code, so the report
// equals Executable::memory() of the compiled program.
struct PlannedProgram {
  std::unique_ptr<Graph> graph;
  std::vector<Unit> units;
  std::vector<CollectiveOp> collectives;  // in order of first start
  std::vector<int> collective_of_unit;    // per unit: the collective it starts or waits, else -1
  MemoryReport report;
};
// Plans without allocating arenas or making kernels. `groups` resolves each collective's device
// groups (the sharding layer's, as in DeviceSetup); null for a program without collectives.
// Throws like compile when opt.memory_limit_bytes is exceeded.
PlannedProgram plan_program(const Graph& g, const CompileOptions& opt,
                            const std::function<CollectiveGroups(const Node&)>& groups);

// One schedule and one buffer plan for the whole program; each device gets its own arena and
// kernel instances. Executable::compile is this with one device and no collectives.
std::unique_ptr<Executable> compile_on_devices(const Graph& g, const CompileOptions& opt, const DeviceSetup& setup);

}  // namespace px
