// Compiling a Graph into an Executable and running it on the CPU.
//
//   auto exe = px::Executable::compile(*graph);           // schedule, fusion, buffer plan
//   std::cout << exe->peak_bytes();                        // known before the first run
//   std::vector<px::Array> out = exe->run({x, w});
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {

// One device's memory for one run, known at compile time: the caller's input and output arrays
// plus the executable's arena (the buffer plan). `by_category` splits the bytes in use at the
// peak: inputs and outputs by what they hold, and the arena buffers live at that moment.
struct MemoryReport {
  int64_t peak_bytes = 0;  // input_bytes + output_bytes + arena_bytes
  int64_t input_bytes = 0, output_bytes = 0, arena_bytes = 0;
  int64_t arena_live_bytes = 0;  // arena bytes live at the peak (the rest is fragmentation)
  std::array<int64_t, kNumMemoryCategories> by_category{};
  // The most arena bytes of each category live at once over the run (at whatever step), e.g. how
  // many gathered weights an FSDP step holds at a time.
  std::array<int64_t, kNumMemoryCategories> arena_max_by_category{};
  // pinned_host memory (offload), not counted above: inputs, outputs and the host arena.
  int64_t host_input_bytes = 0, host_output_bytes = 0, host_arena_bytes = 0;
  int64_t host_peak_bytes() const { return host_input_bytes + host_output_bytes + host_arena_bytes; }
  int64_t transfer_bytes = 0;  // bytes moved between memory kinds per run
  // Device memory at the peak by category and layer (ValueInfo::layer), largest first.
  struct Use {
    MemoryCategory category;
    std::string layer;  // "" when no layer is known
    int64_t bytes = 0;
  };
  std::vector<Use> largest;
  // The floor: the least device memory any schedule and buffer plan of this program can use. The
  // caller's arrays (inputs, outputs not donated into an input) plus the most arena bytes that must
  // be alive together whatever the order: at some unit, every value produced by it or before it
  // (by dependence) and read by it or after it. floor_live_unit is that unit (-1: no arena).
  // peak_bytes / floor_bytes is what the schedule and the buffer plan add over it.
  int64_t floor_bytes = 0;
  int floor_live_unit = -1;
  double peak_over_floor() const { return floor_bytes > 0 ? static_cast<double>(peak_bytes) / floor_bytes : 1.0; }
  // Outputs written into a donated input's array (CompileOptions::output_donors): counted once,
  // with the inputs; output_bytes leaves them out.
  int64_t donated_bytes = 0;
  std::string to_string() const;  // one line per category, then the largest users by layer
};

// One profiled run, unit by unit (Executable::timeline). The device's thread runs kernels and the
// start and wait of each collective or transfer; between its start and the end of its wait a
// collective is in flight, and the part of that the device spent in its start and wait was not
// hidden behind compute (exposed).
struct Timeline {
  struct Span {
    std::string name;  // the kernel (fused groups by their op list), "all_reduce.start", ...
    double begin_s = 0, end_s = 0;  // since the run began
    int64_t bytes = 0;              // collectives and transfers: payload per device
  };
  std::vector<Span> device;     // what the device's thread ran, in order
  std::vector<Span> in_flight;  // each collective or transfer, from its start to the end of its wait
  double run_s = 0;
  double in_flight_s = 0;  // sum over in_flight
  double exposed_s = 0;    // time the device spent starting and waiting for them
  // The share of the collectives' time hidden behind compute (0 without collectives).
  double overlap() const { return in_flight_s > 0 ? 1.0 - exposed_s / in_flight_s : 0.0; }
  // Chrome trace event JSON (chrome://tracing, ui.perfetto.dev): the device on one track, what is
  // in flight on another.
  std::string chrome_trace() const;
};

struct CompileOptions {
  // The backend that runs the program (px::backend_platforms(): "cpu", "ref", or one registered
  // by the program). A sharded program takes its mesh's platform.
  std::string platform = "cpu";
  bool fuse_elementwise = true;  // chain elementwise ops into single tiled passes
  bool optimize = true;          // run CSE and DCE first
  // Per device: the planned peak in device memory above this (0: the device's capacity, if set with
  // px::set_memory_capacity) makes compile() throw with a report; likewise pinned_host memory.
  int64_t memory_limit_bytes = 0;
  int64_t host_memory_limit_bytes = 0;
  // Mixed precision: bf16 or f16 runs every f32 matmul on 16-bit operands with f32 results
  // (see px::autocast in passes.h); f32 changes nothing.
  DType compute_dtype = DType::f32;
  bool profile = false;  // time every kernel (also PX_PROFILE=1); see profile_report and timeline
  // Collectives that gather (all_gather) start when the one `collective_lookahead` places before
  // them is first used; see runtime/schedule.h.
  int collective_lookahead = 1;
  // Fetches to device memory (transfer nodes, px::to_memory) start when the prefetch group
  // `prefetch_depth` groups before theirs is first used: 0 = just before their own first use.
  // Neither starts earlier than its result fits under the peak the program has with every gather
  // and fetch at its first use: ahead of use never raises the peak.
  int prefetch_depth = 1;
  // What each value holds, where it lives and the layer it belongs to are facts on the graph's
  // values (ValueInfo: category, kind, layer), set by the passes before compile (a training step's
  // trace, offload) or by hand (g.mutable_value(v).kind = MemoryKind::pinned_host): graph inputs
  // and outputs in pinned_host are read from and written to caller arrays placed there
  // (input_kind / output_kind); other values get their own arena per kind.
  // Donation (jax.jit's donate_argnums): per output position, the input whose array it is written
  // into, or -1 (size 0 or one entry per output). A donated pair has one type and memory kind; the
  // caller passes input i's array again as output o to run_into, and the plan counts it once. The
  // result is written in place when the schedule reads the input for the last time before (or in
  // the in-place unit that) writes it, else into the arena and copied at the end (both planned).
  std::vector<int> output_donors;
  // Training steps (values whose ValueInfo::category is gradients): every node that depends on a
  // gradient (norms, clipping, the optimizer update) runs as soon as its operands are ready, so
  // that a gradient is freed when its update has read it rather than after the whole backward pass.
  bool update_as_gradients_complete = true;
  // Training steps: the floor (MemoryReport::floor_bytes) counts the backward pass as running after
  // the whole forward pass. False for a step of several microbatches (TrainStepOptions::microbatches),
  // where each backward pass follows its own microbatch's forward pass only.
  bool one_forward_pass = true;
};

class Executable {
 public:
  static std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& opt = {});
  ~Executable();

  // Checks the inputs against the graph's input types and returns new output arrays. An input in
  // another memory kind than input_kind(i) is copied there for the call (run_into rejects it).
  std::vector<Array> run(const std::vector<Array>& inputs);
  // Writes into caller-owned outputs of the right types; steps write their results straight into
  // them. An output may be one of the inputs' arrays (an in-place update such as w -= lr * g):
  // it is written in place when that input is no longer read, else through a private copy
  // allocated on the first such run. Apart from that copy the executable's own kernels allocate
  // nothing (a test counts malloc calls); oneDNN's matmul and OpenMP's parallel teams may.
  // One Executable runs one call at a time: a second concurrent call throws (it patches pointers
  // in place).
  void run_into(const std::vector<Array>& inputs, std::vector<Array>& outputs);

  int64_t peak_bytes() const;    // working memory: the arena size of the buffer plan
  // Runs device `device_id`'s program in `arena` (at least peak_bytes() of that device's memory,
  // allocated and kept alive by the caller) instead of its own arena, which is freed: programs
  // that never run at the same time share one (a pipeline's device group).
  void use_arena(int device_id, void* arena);
  MemoryKind input_kind(int i) const;   // where input i must be placed (Array::placement().kind)
  MemoryKind output_kind(int o) const;
  int output_donor(int o) const;  // the input output o is written into (CompileOptions::output_donors), or -1
  MemoryReport memory() const;   // per device: inputs, outputs and arena, split by category
  int64_t output_bytes() const;  // bytes of the outputs (in the caller's arrays, not the arena)
  int num_steps() const;       // kernels launched per run
  int num_fused_groups() const;
  std::string summary() const;  // human-readable schedule and memory plan
  // Time per run spent in each kind of kernel, largest first (needs CompileOptions::profile).
  std::string profile_report(int top = 20) const;
  // The last run as a timeline (needs CompileOptions::profile or PX_PROFILE=1; throws otherwise).
  Timeline timeline() const;
  const Graph& graph() const;   // the optimized graph that was compiled
  int num_devices() const;

  // For the sharded executor: runs every local device's inputs (one list per device) in lockstep,
  // collectives included. Outputs as in run_into, one list per device.
  void run_on_devices(const std::vector<std::vector<Array>>& inputs, std::vector<std::vector<Array>>& outputs);

  struct Impl;
  friend std::unique_ptr<Executable> make_executable(std::unique_ptr<Impl> impl);

 private:
  explicit Executable(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace px
