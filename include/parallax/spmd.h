// SPMD: partition a traced program over a mesh and run it on every device in lockstep.
//
//   auto mesh = px::Mesh::cpu({{"data", 4}, {"model", 2}});
//   auto g = px::trace(mlp, {x_type, w1_type, w2_type});
//   auto exe = px::ShardedExecutable::compile(*g, mesh,
//       {px::PartitionSpec{"data"}, px::PartitionSpec{px::none, "model"}, px::PartitionSpec{"model"}});
//   std::cout << exe->program().summary();       // local graph and the collectives it inserted
//   std::vector<px::ShardedArray> out = exe->run({px::shard(x, exe->in_sharding(0)), ...});
//   std::cout << exe->stats().to_string();       // bytes each collective moved, per device
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/collectives.h"  // CollectiveKind, CollectiveStats
#include "parallax/graph.h"
#include "parallax/runtime.h"
#include "parallax/sharding.h"

namespace px {

class Communicator;

// One collective inserted by the partitioner, for inspection and tests.
struct CollectiveRecord {
  // The collective, or none for a local slice (a replicated value cut to this device's part: no
  // communication).
  std::optional<CollectiveKind> kind;
  bool local_slice() const { return !kind; }
  std::vector<std::string> axes;  // mesh axes of the group
  TensorType operand;             // local type of the operand
  TensorType result;              // local type of the result
  int64_t dim = -1;               // gathered / scattered / sliced dim (all_to_all: split dim)
  int64_t concat_dim = -1;        // all_to_all only
  std::string reduce;             // "sum" / "max" for all_reduce and reduce_scatter
  std::string reason;             // the global value and why, e.g. "%7 dot_general partial sum"
  std::string to_string() const;  // "all_reduce(sum) over 'model' of f32[8,16]"
};

// Emits the collectives into the local graph. The partitioner calls it for every collective it
// needs; tests inject a recording emitter to check what was inserted without running devices.
class CollectiveEmitter {
 public:
  virtual ~CollectiveEmitter() = default;
  virtual Tensor all_reduce(const Tensor& x, const std::vector<std::string>& axes, const std::string& reduce);
  virtual Tensor all_gather(const Tensor& x, const std::vector<std::string>& axes, int dim);
  virtual Tensor reduce_scatter(const Tensor& x, const std::vector<std::string>& axes, int dim,
                                const std::string& reduce);
  virtual Tensor all_to_all(const Tensor& x, const std::vector<std::string>& axes, int split_dim, int concat_dim);
  // This device's block of `dim` out of a value replicated over `axes` (no communication).
  virtual Tensor local_slice(const Tensor& x, const std::vector<std::string>& axes, int dim);

  // Sets the mesh and the local graph's device-coordinates input; registers the primitives.
  void bind(const Mesh* mesh, Tensor coords);
  Tensor coords() const { return coords_; }

 protected:
  int64_t group_size(const std::vector<std::string>& axes) const;
  const Mesh* mesh_ = nullptr;
  Tensor coords_;  // the device-coordinates input of the local graph
};

struct PartitionOptions {
  // Required shardings of the outputs (unset: whatever propagation chose, never partial). One with
  // partial axes stays a partial sum over them where the value is one, laid out as asked, else is
  // reduced to its spec: SpmdProgram::out_shardings says which.
  std::vector<std::optional<Sharding>> out_shardings;
  CollectiveEmitter* emitter = nullptr;  // default: emits the collective primitives
};

// The result of partitioning: one local program that every device of the mesh runs.
struct SpmdProgram {
  Mesh mesh;
  std::unique_ptr<Graph> local;  // inputs: the local shards of the global inputs, then coords
  // Per output, the input whose arrays it is written into (empty: none), used when the compile
  // options give none (CompileOptions::output_donors); a training step donates its state.
  std::vector<int> output_donors;
  std::vector<Sharding> in_shardings, out_shardings;
  std::vector<Sharding> value_shardings;  // per value of the global graph, as propagated
  std::vector<CollectiveRecord> collectives;
  std::string summary() const;  // shardings of inputs/outputs, collectives, the local graph
};

// Propagates shardings through `g` from its inputs (and sharding_constraint hints) and emits the
// local program with collectives. Throws px::Error naming the input when a sharding does not fit.
SpmdProgram partition(const Graph& g, const Mesh& mesh, const std::vector<Sharding>& in_shardings,
                      const PartitionOptions& opt = {});

// A required layout of one value of a traced program: of the value itself (every reader sees it
// so laid out, e.g. a gradient pinned to its param's spec), or only as read by the nodes in
// [readers_begin, readers_end) (e.g. FSDP: a param gathered for the forward pass, and gathered
// again for the backward pass with `regather`, so the first gather is freed in between).
struct ValueConstraint {
  int value = -1;
  PartitionSpec spec;
  int readers_begin = -1, readers_end = -1;  // -1: the value itself
  bool regather = false;  // emit its own collectives even where an earlier read gathered the value
};

// The sharding decision for a program: what a recipe, the user's rules or AUTO chose. partition()
// only emits what it says (collectives included); it decides nothing beyond propagation.
struct ShardingDecision {
  Mesh mesh;
  std::vector<Sharding> inputs;                   // one per graph input
  std::vector<std::optional<Sharding>> outputs;  // per graph output; unset: as propagated
  std::vector<ValueConstraint> constraints;
  // Values (pinned replicated, same dtype) flattened into one buffer and reduced together (DDP
  // buckets); each is a list of value ids.
  std::vector<std::vector<int>> buckets;
  std::string to_string(const Graph& g) const;  // one line per input and constraint
};

// The decision applied as sharding_constraint nodes: a pure graph pass (its result is what
// PX_DUMP shows as "annotate"). `value_map` receives each value's id in the result.
std::unique_ptr<Graph> annotate(const Graph& g, const ShardingDecision& d, std::vector<int>* value_map = nullptr);
// annotate + partition. The local program's values carry the facts of g's (ValueInfo: category,
// memory kind, layer).
SpmdProgram partition(const Graph& g, const ShardingDecision& d, CollectiveEmitter* emitter = nullptr);

// How the virtual devices of one process share the cores (never more threads than cores):
// over_devices runs the devices of a segment in parallel, each on one thread; within_kernels runs
// them one after the other with multi-threaded kernels. automatic picks over_devices when there
// are at least as many devices as threads.
enum class DeviceParallelism { automatic, over_devices, within_kernels };

// The local program compiled once and run on every device of the mesh in lockstep: one schedule in
// which collectives are nodes (gathers placed late, reductions early), one buffer plan, an arena
// per device.
class ShardedExecutable {
 public:
  static std::unique_ptr<ShardedExecutable> compile(const Graph& g, const Mesh& mesh,
                                                    const std::vector<PartitionSpec>& in_specs,
                                                    const PartitionOptions& popt = {}, const CompileOptions& copt = {},
                                                    DeviceParallelism par = DeviceParallelism::automatic);
  // `comm` (optional, not owned) runs the collectives; default: an in-process communicator over
  // every position (a mesh held by one process). The executable runs the communicator's local
  // positions, which must be those of one process of the mesh (mesh.local_positions(process)); its
  // inputs and outputs hold that process's shards only.
  static std::unique_ptr<ShardedExecutable> compile(SpmdProgram program, const CompileOptions& copt = {},
                                                    DeviceParallelism par = DeviceParallelism::automatic,
                                                    Communicator* comm = nullptr);
  ~ShardedExecutable();

  // Inputs must carry the compiled shardings (see in_sharding()).
  std::vector<ShardedArray> run(const std::vector<ShardedArray>& inputs);
  // Like run, but copies into `outputs` where they already hold shards of the right types
  // (reused buffers across steps: no fresh allocation), and allocates the rest. Outputs must
  // not share buffers with the inputs.
  void run_into(const std::vector<ShardedArray>& inputs, std::vector<ShardedArray>& outputs);
  // Convenience for tests: shards full arrays, runs, gathers the outputs (a collective when the
  // mesh spans several processes: every process calls it).
  std::vector<Array> run_full(const std::vector<Array>& inputs);

  int process() const;                      // the mesh process it runs (0 in one process)
  const std::vector<int>& positions() const;  // the mesh positions it runs
  Communicator& communicator() const;         // the injected one, or its own in-process one
  const Sharding& in_sharding(int i) const;
  const Sharding& out_sharding(int i) const;
  const SpmdProgram& program() const;
  const CollectiveStats& stats() const;  // accumulated over runs, for this process's positions
  void reset_stats();
  int64_t runs_counted() const;  // the runs stats() holds: since compile or the last reset_stats
  // The one program every device runs: its schedule (kernels and collectives) and buffer plan.
  const Executable& executable() const;
  // Runs device `device_id`'s program in the caller's arena (Executable::use_arena).
  void use_arena(int device_id, void* arena);
  MemoryReport memory() const;             // per device, known before the first run
  int64_t peak_bytes(int position) const;  // planned bytes of the device at a mesh position
  std::string summary() const;

  struct Impl;

 private:
  explicit ShardedExecutable(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace px
