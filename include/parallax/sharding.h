// Device meshes, partition specs, shardings, and global arrays made of per-device shards.
//
//   auto mesh = px::Mesh::cpu({{"data", 4}, {"model", 2}});           // 8 virtual CPU devices
//   auto m2 = px::Mesh::create({{"data", -1}, {"model", 2}});          // data = devices / 2 (PX_DEVICES)
//   auto m3 = px::Mesh::parse("data:4,model:2", px::parse_devices("cpu:8"));  // from a CLI flag
//   px::Sharding s(mesh, px::PartitionSpec{"data", px::none});        // rows split 4 ways
//   px::ShardedArray xs = px::shard(x, s);                             // x: f32[8,16] -> 8 shards f32[2,16]
//   px::Array back = px::gather(xs);                                   // == x
//   px::Tensor h = px::with_sharding_constraint(t, {"data", "model"}); // while tracing
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "parallax/core.h"
#include "parallax/graph.h"

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

// The devices a mesh is made on: "cpu:8" is 8 virtual CPU devices in this process.
struct DeviceSet {
  std::string platform = "cpu";
  int64_t count = 1;
  std::string to_string() const;  // "cpu:8"
  bool operator==(const DeviceSet& o) const = default;
};
// Parses "cpu" (= cpu:1) or "cpu:N" (N >= 1); anything else (e.g. "cuda:2", not supported yet)
// throws px::Error naming the text and the accepted forms.
DeviceSet parse_devices(const std::string& text);
// The devices named by PX_DEVICES (cpu:1 when unset).
DeviceSet default_devices();

// Ordered named axes over a list of devices. Device position p (0 .. size()-1) has row-major
// coordinates over the axes (the last axis varies fastest) and runs on device_ids()[p].
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

  std::string to_string() const;  // "Mesh{data: 4, model: 2} on cpu:8"
  bool operator==(const Mesh& o) const;
  bool operator!=(const Mesh& o) const { return !(*this == o); }

 private:
  std::vector<MeshAxis> axes_;
  std::vector<int> device_ids_{0};
  std::string platform_ = "cpu";
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

// A global array: one host Array per device of the mesh (indexed by mesh position) + its Sharding.
class ShardedArray {
 public:
  ShardedArray() = default;
  // Checks the sharding against `global` and every shard's type against the local shape.
  ShardedArray(TensorType global, Sharding sharding, std::vector<Array> shards);

  const TensorType& type() const { return type_; }
  const Shape& shape() const { return type_.shape; }
  DType dtype() const { return type_.dtype; }
  const Sharding& sharding() const { return sharding_; }
  const Mesh& mesh() const { return sharding_.mesh; }
  const std::vector<Array>& shards() const { return shards_; }
  std::vector<Array>& mutable_shards() { return shards_; }
  const Array& shard(int position) const { return shards_.at(position); }
  int64_t bytes_per_device() const;

 private:
  TensorType type_;
  Sharding sharding_;
  std::vector<Array> shards_;
};

// Splits a full host array onto the devices of s.mesh. Replicated dims are copied; partial-sum
// axes hold the value at coordinate 0 and zeros elsewhere, so that their sum is the value.
ShardedArray shard(const Array& full, const Sharding& s);
// Reassembles the full array (summing over partial axes, in a fixed order).
Array gather(const ShardedArray& a);

// While tracing: x with the given sharding required at this point of the program (an identity
// that the SPMD partitioner honours; its gradient carries the same constraint).
Tensor with_sharding_constraint(const Tensor& x, const PartitionSpec& spec);

}  // namespace px
