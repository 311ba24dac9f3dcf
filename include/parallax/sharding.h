// Device meshes, partition specs, shardings, and global arrays made of per-device shards.
//
//   auto mesh = px::Mesh::cpu({{"data", 4}, {"model", 2}});           // 8 virtual CPU devices
//   auto m2 = px::Mesh::create({{"data", -1}, {"model", 2}});          // data = devices / 2 (PX_DEVICES)
//   auto m3 = px::Mesh::parse("data:4,model:2", px::parse_devices("cpu:8"));  // from a CLI flag
//   px::Sharding s(mesh, px::PartitionSpec{"data", px::none});        // rows split 4 ways
//   px::ShardedArray xs = px::shard(x, s);                             // x: f32[8,16] -> 8 shards f32[2,16]
//   px::Array back = px::gather(xs);                                   // == x
//   px::Tensor h = px::with_sharding_constraint(t, {"data", "model"}); // while tracing
//
// Processes: every device has a global id (Mesh::device_ids()), a process index
// (Mesh::process_of) and a local index within its process (Mesh::local_index). By default one
// process holds every device of a mesh; Mesh::with_processes(2) (or DeviceSet{"cpu", 8, 2} for
// Mesh::create) puts positions 0-3 of an 8-device mesh in process 0 and 4-7 in process 1. A
// ShardedArray then holds only the shards of one process; gathering it whole is a collective.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "parallax/core.h"
#include "parallax/graph.h"
#include "parallax/memory.h"  // DeviceSet

namespace px {

// The link a mesh axis runs over, for the cost model: alpha-beta (latency + bytes / bandwidth).
struct Link {
  double bandwidth_bytes_per_s = 20e9;  // in-process shared memory by default
  double latency_s = 1e-6;
};

struct MeshAxis {
  std::string name;
  int64_t size = 1;
  Link link;
};

// Ordered named axes over a list of devices. Device position p (0 .. size()-1) has row-major
// coordinates over the axes (the last axis varies fastest) and runs on device_ids()[p] (its
// global id), in process process_of(p), where it is device local_index(p) of that process.
class Mesh {
 public:
  Mesh() = default;  // a single device, no axes
  Mesh(std::vector<MeshAxis> axes, std::vector<int> device_ids = {}, std::string platform = "cpu");
  // N = product of sizes virtual CPU devices in this process, e.g. cpu({{"data", 4}, {"model", 2}}).
  static Mesh cpu(const std::vector<std::pair<std::string, int64_t>>& axes);
  // A mesh over all of `devices`: the sizes' product must equal devices.count. At most one size
  // may be -1, meaning the remaining devices ({{"data", -1}, {"model", 2}} on cpu:8: data 4).
  static Mesh create(const std::vector<std::pair<std::string, int64_t>>& axes,
                     const DeviceSet& devices = default_devices());
  // Mesh::create from a flag's text: "data:4,model:2" or "data:-1,model:2" (spaces allowed).
  static Mesh parse(const std::string& text, const DeviceSet& devices = default_devices());

  int rank() const { return static_cast<int>(axes_.size()); }
  int64_t size() const { return static_cast<int64_t>(device_ids_.size()); }  // number of devices
  const std::vector<MeshAxis>& axes() const { return axes_; }
  const std::vector<int>& device_ids() const { return device_ids_; }
  const std::string& platform() const { return platform_; }
  // Where position p's memory of a kind is: its device, on the mesh's platform.
  Placement placement(int position, MemoryKind kind = MemoryKind::device) const {
    return {device_ids_.at(static_cast<size_t>(position)), kind, platform_};
  }
  std::vector<std::string> axis_names() const;
  int axis_index(const std::string& name) const;  // -1 when absent
  // Like axis_index but throws "[<context>] unknown mesh axis 'x'; the mesh has 'data', 'model'".
  int require_axis(const std::string& name, const std::string& context) const;
  int64_t axis_size(const std::string& name) const;  // throws on unknown names

  std::vector<int64_t> coords(int position) const;
  int position(const std::vector<int64_t>& coords) const;
  // The device groups that collectives over `axes` run on: positions that share every other
  // coordinate, each group ordered by the linear index over `axes` (first axis major).
  std::vector<std::vector<int>> groups(const std::vector<int>& axes) const;
  // Linear index of `position` within its group over `axes` (first axis major).
  int64_t index_in_group(int position, const std::vector<int>& axes) const;
  int64_t group_size(const std::vector<int>& axes) const;

  // Processes. Every constructor makes a mesh held by one process (process 0, every position).
  // with_processes(n): the same mesh over n processes, each holding size()/n consecutive
  // positions (as n ranks with one node's devices each); size() must divide by n.
  // with_process_of(p): process p[position] for each position; processes are numbered 0..n-1 and
  // each holds at least one position.
  // with_process_of(p, n): the same over n processes of which some may hold no position (a
  // pipeline's device group, held by one process of the job's n); n > every index in p.
  Mesh with_processes(int64_t n) const;
  Mesh with_process_of(std::vector<int> process_of_position) const;
  Mesh with_process_of(std::vector<int> process_of_position, int num_processes) const;
  int num_processes() const;
  int process_of(int position) const;
  int local_index(int position) const;                 // index among its process's positions
  std::vector<int> local_positions(int process) const;  // ascending
  std::vector<int> process_layout() const;              // process_of for every position

  std::string to_string() const;  // "Mesh{data: 4, model: 2} on cpu:8" (+ " over 2 processes")
  bool operator==(const Mesh& o) const;  // axes, devices and processes
  bool operator!=(const Mesh& o) const { return !(*this == o); }

 private:
  struct Processes {
    int count = 1;
    std::vector<int> process_of, local_index;  // per position
    std::vector<std::vector<int>> positions;   // per process
  };
  std::vector<MeshAxis> axes_;
  std::vector<int> device_ids_{0};
  std::string platform_ = "cpu";
  std::shared_ptr<const Processes> procs_;  // null: one process holds every position
};

struct NoAxis {};
inline constexpr NoAxis none{};  // a dimension that is not split: PartitionSpec{"data", px::none}

// Per tensor dimension: nothing (not split) or a list of mesh axes, the first one major. A spec
// shorter than the tensor's rank leaves the remaining dims unsplit.
class PartitionSpec {
 public:
  struct Dim {
    std::vector<std::string> axes;
    Dim() = default;
    Dim(NoAxis) {}
    Dim(const char* axis) : axes{axis} {}
    Dim(std::string axis) : axes{std::move(axis)} {}
    Dim(std::initializer_list<std::string> a) : axes(a) {}
    Dim(std::vector<std::string> a) : axes(std::move(a)) {}
  };
  PartitionSpec() = default;
  PartitionSpec(std::initializer_list<Dim> dims) : dims_(dims) {}
  explicit PartitionSpec(std::vector<Dim> dims) : dims_(std::move(dims)) {}
  static PartitionSpec replicated(int rank = 0) { return PartitionSpec(std::vector<Dim>(rank)); }
  // Parses the printed form: "P('data', None)", "P(('data', 'fsdp'), 'model')", "P()".
  static PartitionSpec parse(const std::string& text);

  int size() const { return static_cast<int>(dims_.size()); }
  const std::vector<std::string>& operator[](int d) const;  // empty beyond size()
  const std::vector<Dim>& dims() const { return dims_; }
  bool is_replicated() const;
  std::vector<std::string> used_axes() const;
  std::string to_string() const;                  // "P('data', None)"
  bool operator==(const PartitionSpec& o) const;  // trailing unsplit dims do not count
  bool operator!=(const PartitionSpec& o) const { return !(*this == o); }

 private:
  std::vector<Dim> dims_;
};

// Where a value lives: mesh + spec + the axes over which the per-device shards are partial sums
// (the value is the sum over those axes of the shards).
struct Sharding {
  Mesh mesh;
  PartitionSpec spec;
  std::vector<std::string> partial;

  Sharding() = default;
  Sharding(Mesh m, PartitionSpec s, std::vector<std::string> partial_axes = {})
      : mesh(std::move(m)), spec(std::move(s)), partial(std::move(partial_axes)) {}
  static Sharding replicated(const Mesh& m) { return Sharding(m, PartitionSpec()); }

  // Throws px::Error naming `what` (e.g. "param 'blocks.0.w'"), the dim, the axis and a fix when
  // the spec does not fit the type: unknown axis, axis used twice, rank, divisibility.
  void validate(const TensorType& t, const std::string& what = "value") const;
  int64_t num_shards(int dim) const;  // product of the sizes of dim's axes
  Shape local_shape(const Shape& global) const;
  // Start offsets of the shard on mesh `position` within the global shape.
  std::vector<int64_t> shard_offsets(const Shape& global, int position) const;
  bool is_fully_replicated() const { return spec.is_replicated() && partial.empty(); }
  std::string to_string() const;  // "P('data', None)" plus " partial(model)" when partial
  bool operator==(const Sharding& o) const;
  bool operator!=(const Sharding& o) const { return !(*this == o); }
};

class Communicator;

// A global array as one process sees it: its Sharding and the host Arrays of the mesh positions
// that process holds (every position when the mesh has one process), in ascending position order.
class ShardedArray {
 public:
  ShardedArray() = default;
  // `shards`: one per position of mesh.local_positions(process), in that order. Checks the
  // sharding against `global` and every shard's type against the local shape.
  ShardedArray(TensorType global, Sharding sharding, std::vector<Array> shards, int process = 0);

  const TensorType& type() const { return type_; }
  const Shape& shape() const { return type_.shape; }
  DType dtype() const { return type_.dtype; }
  const Sharding& sharding() const { return sharding_; }
  const Mesh& mesh() const { return sharding_.mesh; }
  int process() const { return process_; }  // the process whose shards this array holds
  std::vector<int> positions() const { return sharding_.mesh.local_positions(process_); }
  bool holds(int position) const;  // the shard of `position` is here
  // This process's shards, in positions() order (all of them, by position, in one process).
  const std::vector<Array>& shards() const { return shards_; }
  std::vector<Array>& mutable_shards() { return shards_; }
  // The shard of a mesh position. A position of another process throws px::Error saying which
  // positions are here and how to get the whole array.
  const Array& shard(int position) const;
  int64_t bytes_per_device() const;

 private:
  TensorType type_;
  Sharding sharding_;
  std::vector<Array> shards_;
  int process_ = 0;
};

// Splits a full host array onto the devices of s.mesh that `process` holds (every device in one
// process). Replicated dims are copied; partial-sum axes hold the value at coordinate 0 and zeros
// elsewhere, so that their sum is the value.
ShardedArray shard(const Array& full, const Sharding& s, int process = 0);
// The same split, read box by box (BoxReader, core.h): each of this process's positions reads only its own shard
// (positions holding the same box read it once), straight into the shard. So nothing holds the
// whole array, and over several processes each reads only its part (e.g. a checkpoint).
ShardedArray shard(const TensorType& type, const BoxReader& read, const Sharding& s, int process = 0);
// Reassembles the full array (summing over partial axes, in a fixed order). Needs every shard:
// for a mesh over several processes it throws, naming the overload below.
Array gather(const ShardedArray& a);
// The same for an array whose mesh spans several processes: a collective (every process calls it
// with its own array and communicator, all in the same order) that all-gathers the shards, so
// every process gets the whole array. In one process it is gather(a), with no communication.
Array gather(const ShardedArray& a, Communicator& comm);

// While tracing: x with the given sharding required at this point of the program (an identity
// that the SPMD partitioner honours; its gradient carries the same constraint).
Tensor with_sharding_constraint(const Tensor& x, const PartitionSpec& spec);

}  // namespace px
