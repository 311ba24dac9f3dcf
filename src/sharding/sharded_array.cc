// Global arrays: splitting a host array onto the devices of a mesh and reassembling it.
#include <cstring>
#include <vector>

#include "backend/cpu/kernel.h"
#include "parallax/sharding.h"
#include "core/box.h"

namespace px {

ShardedArray::ShardedArray(TensorType global, Sharding sharding, std::vector<Array> shards)
    : type_(std::move(global)), sharding_(std::move(sharding)), shards_(std::move(shards)) {
  sharding_.validate(type_, "array");
  if (static_cast<int64_t>(shards_.size()) != sharding_.mesh.size())
    throw Error("[sharding] a global array on " + sharding_.mesh.to_string() + " needs " +
                std::to_string(sharding_.mesh.size()) + " shards, got " + std::to_string(shards_.size()));
  TensorType local{type_.dtype, sharding_.local_shape(type_.shape)};
  for (size_t p = 0; p < shards_.size(); ++p)
    if (shards_[p].type() != local)
      throw Error("[sharding] shard " + std::to_string(p) + " of " + type_str(type_) + " with " +
                  sharding_.to_string() + " has type " + type_str(shards_[p].type()) + ", expected " + type_str(local));
}

int64_t ShardedArray::bytes_per_device() const { return shards_.empty() ? 0 : shards_[0].nbytes(); }

ShardedArray shard(const Array& full, const Sharding& s) {
  s.validate(full.type(), "array");
  Shape local = s.local_shape(full.shape());
  std::vector<int64_t> zero(full.shape().size(), 0);
  std::vector<int> partial_axes;
  for (auto& a : s.partial) partial_axes.push_back(s.mesh.axis_index(a));
  std::vector<Array> shards;
  for (int p = 0; p < s.mesh.size(); ++p) {
    // On partial axes only coordinate 0 holds the value; the others hold zeros.
    std::vector<int64_t> c = s.mesh.coords(p);
    bool holder = true;
    for (int a : partial_axes) holder = holder && c[a] == 0;
    Array a(full.dtype(), local, Placement{s.mesh.device_ids()[p]});
    if (!holder) {
      if (a.nbytes()) std::memset(a.raw(), 0, static_cast<size_t>(a.nbytes()));
      shards.push_back(a);
      continue;
    }
    std::vector<int64_t> off = s.shard_offsets(full.shape(), p);
    copy_box(full.raw(), full.shape(), off.data(), a.raw(), local, zero.data(), local, dtype_size(full.dtype()));
    shards.push_back(a);
  }
  return ShardedArray(full.type(), s, std::move(shards));
}

Array gather(const ShardedArray& a) {
  const Sharding& s = a.sharding();
  Shape local = s.local_shape(a.shape());
  std::vector<int64_t> zero(local.size(), 0);
  std::vector<int> partial_axes;
  for (auto& ax : s.partial) partial_axes.push_back(s.mesh.axis_index(ax));
  // Sum over partial axes in f32 (exact for i32 up to 2^24) for each distinct shard position.
  Array out(a.dtype(), a.shape());
  for (int p = 0; p < s.mesh.size(); ++p) {
    std::vector<int64_t> c = s.mesh.coords(p);
    bool rep = true;  // the representative of its partial group (coordinate 0 on partial axes)
    for (int ax : partial_axes) rep = rep && c[ax] == 0;
    if (!rep) continue;
    Array block = a.shard(p);
    if (!partial_axes.empty()) {
      std::vector<float> acc = block.to_f32();
      for (int q = 0; q < s.mesh.size(); ++q) {
        if (q == p) continue;
        std::vector<int64_t> cq = s.mesh.coords(q);
        bool same = true;  // same coordinates outside the partial axes
        for (int ax = 0; ax < s.mesh.rank(); ++ax) {
          bool is_partial = false;
          for (int pa : partial_axes) is_partial = is_partial || pa == ax;
          same = same && (is_partial || cq[ax] == c[ax]);
        }
        if (!same) continue;
        std::vector<float> v = a.shard(q).to_f32();
        for (size_t i = 0; i < acc.size(); ++i) acc[i] += v[i];
      }
      block = Array::from_f32(acc, local, a.dtype());
    }
    std::vector<int64_t> off = s.shard_offsets(a.shape(), p);
    copy_box(block.raw(), local, zero.data(), out.raw(), a.shape(), off.data(), local, dtype_size(a.dtype()));
  }
  return out;
}

}  // namespace px
