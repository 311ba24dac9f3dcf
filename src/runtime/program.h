// Compiling a local program for several devices of this process: the interface between the
// runtime and the sharding layer (which resolves the device groups of each collective).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallax/runtime.h"
#include "runtime/collectives.h"

namespace px {

struct DeviceSetup {
  std::vector<int> device_ids{0};  // one per local device, in the order of run_on_devices' lists
  Communicator* comm = nullptr;    // required when the program has collectives
  std::function<CollectiveGroups(const Node&)> groups;
  bool over_devices = false;  // run the devices of a block in parallel, one thread each
};

// After autocast: all-gathers whose readers all cast to bf16/f16 gather the cast operand.
std::unique_ptr<Graph> narrow_gathers(const Graph& g);

// One schedule and one buffer plan for the whole program; each device gets its own arena and
// kernel instances. Executable::compile is this with one device and no collectives.
std::unique_ptr<Executable> compile_on_devices(const Graph& g, const CompileOptions& opt, const DeviceSetup& setup);

}  // namespace px
