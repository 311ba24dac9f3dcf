// AUTO sharding: a description of the cluster a step runs on, the predicted cost of a decided,
// partitioned step (compute, each collective kind, per-device memory) without allocating or
// running anything, and the solver that picks every param's sharding by that cost.
//
//   px::Cluster c = px::load_cluster("h100x8");                  // or "cpu", or "my_cluster.toml"
//   px::Mesh mesh = c.apply(px::Mesh::parse("data:32,model:8", px::parse_devices("cpu:256")));
// Costing the recipes and planning AUTO for a model config from shapes alone: parallax/plan.h
// (px::cost_recipes, px::plan_auto). Training with AUTO: TrainStep(..., {.mesh = mesh, .strategy =
// px::ShardingStrategy::AUTO}).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "parallax/collectives.h"
#include "parallax/optim.h"
#include "parallax/parallel.h"
#include "parallax/remat.h"
#include "parallax/spmd.h"

namespace px {

// One device's sustained rates and its memory.
struct DeviceSpec {
  double matmul_flops_f32 = 0;   // FLOP/s of matmuls with f32 operands
  double matmul_flops_bf16 = 0;  // with bf16 or f16 operands (f32 accumulation)
  double vector_flops = 0;       // FLOP/s of everything else (elementwise, reductions, norms)
  double memory_bandwidth = 0;   // bytes/s between the device's memory and its cores
  int64_t memory_bytes = 0;      // capacity
  double launch_s = 0;           // fixed cost of one kernel (launch, dispatch)
  // bytes/s between device memory and pinned host memory (offload transfers; 0: memory_bandwidth)
  double host_link_bandwidth = 0;
  double matmul_flops(DType operands) const;  // bf16/f16: the bf16 rate, else f32
  // One kernel on the roofline: max(matmul / matmul rate + (flops - matmul) / vector rate,
  // bytes / memory_bandwidth) + launch_s. The cost model times every kernel with it; a solver
  // costs an op's candidate shardings with it.
  double kernel_seconds(double flops, double matmul, DType operands, double bytes) const;
};

// Virtual devices' collectives are not rings: the in-process communicator copies and adds the
// buffers of every device at once through the host's memory, on the compute cores. Per kind, the
// payload bytes per second per device with two devices, measured (calibrate). With N devices
// on the host and a group of n, a collective takes (n - 1) link latencies (permute: one) plus
// payload * N / 2 / rate, reduce_scatter times (n + 2) / 2n (each device reads its payload and
// writes a 1/n share).
struct InProcessRates {
  double all_reduce = 0, all_gather = 0, reduce_scatter = 0, all_to_all = 0;  // bytes/s; 0: unknown
  bool known() const { return all_reduce > 0 && all_gather > 0 && reduce_scatter > 0 && all_to_all > 0; }
};

// The machines a mesh runs on: one kind of device, grouped in nodes of devices_per_node linked by
// intra_node (NVLink, in-process copies), nodes linked by inter_node (InfiniBand).
struct Cluster {
  std::string name;
  DeviceSpec device;
  int64_t devices_per_node = 0;  // 0: every device in one node
  Link intra_node, inter_node;
  // Links named per mesh axis (TOML [axis.<name>]); they win over the node topology.
  std::map<std::string, Link> axis_links;
  // Virtual CPU devices share the host: each of N devices gets 1/N of the rates, the memory and
  // (in apply()) the links' bandwidth, as their collectives copy through the same memory at once.
  bool devices_share_host = false;
  // With devices_share_host: what the in-process communicator's collectives move (see
  // InProcessRates); all zero: the links' ring model.
  InProcessRates in_process;
  // Collectives run beside compute (a DMA / NIC engine): a start only queues them, and compute
  // waits only at the wait. false: they run on the compute cores at their start, in turn.
  bool overlap_collectives = true;
  std::string source;  // where the figures come from (datasheets, a calibration, a file)

  // An axis's link: its named link, else intra_node when each group of the axis stays inside a
  // node (positions are row-major, the last axis fastest; node n holds positions
  // [n * devices_per_node, (n + 1) * devices_per_node)), else inter_node.
  Link axis_link(const Mesh& mesh, int axis) const;
  Mesh apply(const Mesh& mesh) const;  // the mesh with every axis's link from this cluster
  // What one device of `mesh` gets (devices_share_host divides by the mesh size).
  DeviceSpec device_on(const Mesh& mesh) const;
  std::string to_string() const;  // a short description
  std::string to_toml() const;    // cluster_from_toml(to_toml()) gives this cluster back
};

// "cpu", "ref" (and any registered platform): this machine's devices of that platform
// (calibrated once, cached; see platform_cluster);
// "h100x8", "h200x8": 8-GPU nodes (NVLink inside, InfiniBand across); "tpuv4": a TPU-v4-like
// pod of 4096 chips on one interconnect; throws naming the presets.
Cluster cluster_preset(const std::string& name);
std::vector<std::string> cluster_preset_names();
// A preset name, or a path to a TOML file (ending in .toml; see docs/auto-sharding.md).
Cluster load_cluster(const std::string& name_or_path);
// Parses a cluster description; errors name `where`, the key and the fix.
Cluster cluster_from_toml(const std::string& text, const std::string& where = "cluster");
Cluster read_cluster_file(const std::string& path);

// This machine's devices of a platform ("cpu", "ref", or one a program registered) measured now,
// through that platform's backend: a few hundred ms of f32 and bf16 matmuls, a fused elementwise
// chain, small kernel launches, collectives between two of its devices, and memcpy. Not cached.
Cluster calibrate(const std::string& platform = "cpu");
inline Cluster calibrate_cpu() { return calibrate("cpu"); }
// The calibrated cluster of a platform (the preset of that name: load_cluster("ref")), read from
// cluster_cache_path(platform) when it was measured on this host (same host name, cores and
// threads), else measured and written there. `recalibrate` (or PX_RECALIBRATE=1) measures again.
Cluster platform_cluster(const std::string& platform, bool recalibrate = false);
inline Cluster cpu_cluster(bool recalibrate = false) { return platform_cluster("cpu", recalibrate); }
// $XDG_CACHE_HOME/parallax/<platform>_cluster-<T>threads.toml, else under ~/.cache/parallax, one
// file per platform and thread count T (...-sanitized.toml, -debug.toml for sanitized and
// unoptimized builds, which measure a slower machine).
std::string cluster_cache_path(const std::string& platform = "cpu");

// The alpha-beta model of one collective over a group of n devices whose bytes cross `link`.
// `payload` is what the runtime counts (CollectiveStats): the buffer a device contributes
// (all_gather: the gathered result). Wire bytes per device: all_reduce 2(n-1)/n of the payload
// (ring: reduce-scatter then all-gather), all_gather / reduce_scatter / all_to_all (n-1)/n,
// permute and broadcast the payload; time = steps * latency + wire / bandwidth with steps
// 2(n-1), n-1, n-1, n-1, 1, 1. An all-reduce takes the faster of that ring and a tree:
// 2 ceil(log2 n) steps + 2 * payload / bandwidth (small payloads over many devices).
int64_t collective_wire_bytes(CollectiveKind k, int64_t n, int64_t payload);
double collective_seconds(CollectiveKind k, int64_t n, int64_t payload, const Link& link);
// The same collective over virtual devices, `devices` of them on the host (see InProcessRates):
// (n - 1) latencies plus payload * devices / 2 / rate (reduce_scatter: times (n + 2) / 2n).
double in_process_collective_seconds(CollectiveKind k, int64_t n, int64_t devices, int64_t payload, const Link& link,
                                     const InProcessRates& rates);

// The predicted cost of one step on one device (every device runs the same local program).
struct StepCost {
  double compute_s = 0;  // kernels: per unit of the schedule, max(FLOPs / rate, bytes / bandwidth) + launch
  double comm_s = 0;     // collectives, summed (alpha-beta)
  double transfer_s = 0; // transfers between memory kinds (offload), summed, on their own copy engine
  double step_s = 0;     // the schedule played with collectives overlapping compute where allowed
  double flops = 0, matmul_flops = 0, memory_bytes_moved = 0;  // per device
  int64_t kernels = 0;
  struct Comm {
    int64_t calls = 0, payload_bytes = 0, wire_bytes = 0;  // as CollectiveStats counts them per device
    double seconds = 0;
  };
  std::array<Comm, kNumCollectiveKinds> collectives{};  // by CollectiveKind
  MemoryReport memory;          // per device, from the runtime's buffer plan
  int64_t memory_capacity = 0;  // per device
  bool fits() const { return memory.peak_bytes <= memory_capacity; }
  double exposed_comm_s() const { return step_s - compute_s; }
  std::string to_string() const;  // a few lines
};

// The cost of a partitioned program: its local graph planned as compile would (autocast, CSE, DCE,
// schedule, buffer plan) but without allocating, the links of program.mesh's axes, the device of
// `cluster` (cluster.device_on(program.mesh)). memory equals ShardedExecutable::memory() of
// ShardedExecutable::compile(program, opt).
StepCost cost_program(const SpmdProgram& program, const Cluster& cluster, const CompileOptions& opt = {});

// What a training step is planned for.
struct StepSetup {
  int64_t batch = 8;  // global batch (sequences)
  int64_t seq = 0;    // 0: the config's max_seq_len
  optim::OptimizerPtr optimizer;  // null: AdamW
  DType compute_dtype = DType::f32;
  ShardingOptions sharding;
  double clip_norm = 0;
  int microbatches = 1;  // gradient accumulation (TrainStepOptions::microbatches)
  RematOptions remat;  // the step is planned and costed rematerialized (not RematPolicy::automatic)
  OffloadOptions offload;  // and with these params and optimizer state in pinned_host memory
};

struct RecipeCost {
  ShardingStrategy strategy = ShardingStrategy::DDP;
  bool applies = false;
  std::string reason;  // why not, when it does not apply
  StepCost cost;
  int64_t param_bytes_per_device = 0;
  double plan_s = 0;  // seconds spent tracing, deciding, partitioning and planning it
};

// One decision of the solver: params split together (a tensor-parallel group: a column weight,
// the row weights it feeds, their siblings and biases; or one param), the same in every layer.
struct AutoUnit {
  std::string name;                  // "blocks.*.attn.qkv.w, blocks.*.attn.qkv.b, ..."
  int params = 0;                    // params of the model in it (all layers)
  bool tensor_parallel = false;      // split by its Megatron roles over the layout's model axis
  std::vector<std::string> storage;  // also stored split over these batch axes (gathered for use)
  int64_t state_bytes_per_device = 0;  // params, gradients and optimizer state
};

// What AUTO chose and why.
struct AutoPlan {
  ShardingPlan plan;  // strategy AUTO: a spec and a reason per param, the batch axes
  StepCost cost;      // predicted, by the cost model that costed the recipes
  bool fits = false;  // within the memory limit
  std::string layout;  // "batch over 'data'; tensor parallel over 'model'"
  std::string from;    // "solver", or the recipe that nothing the solver found beat
  std::vector<AutoUnit> units;
  std::vector<RecipeCost> recipes;  // DDP, FSDP, TP, FSDP_TP by the same model
  std::string why;    // why it wins; when nothing fits, by how much and what would fit
  int64_t memory_limit = 0;  // per device
  int evaluations = 0;       // step programs costed
  double solve_s = 0;
  bool timed_out = false;    // the time limit cut the search: the best plan found by then
  std::string explain() const;  // the plan, the recipes beside it, and why
};

}  // namespace px
