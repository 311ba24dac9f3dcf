// Global arrays: splitting a host array onto the devices of a mesh and reassembling it.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/box.h"
#include "parallax/communicator.h"
#include "parallax/sharding.h"

namespace px {

namespace {

std::string positions_text(const std::vector<int>& ps) {
  std::string t;
  for (size_t i = 0; i < ps.size(); ++i) t += (i ? ", " : "") + std::to_string(ps[i]);
  return t;
}

void check_process(const Mesh& mesh, int process, const char* who) {
  if (process < 0 || process >= mesh.num_processes())
    throw Error(std::string("[") + who + "] process " + std::to_string(process) + " is not one of the " +
                std::to_string(mesh.num_processes()) + " process(es) of " + mesh.to_string());
}

}  // namespace

namespace detail {

// A ShardedArray that can be read: this process's shards all there and of the local type. A
// default-constructed ShardedArray{} has none; mutable_shards() can leave others incomplete.
// Throws px::UserError("[<who>] ..."). Not static: the executor's run checks its inputs with it.
void check_complete(const ShardedArray& a, const char* who) {
  const std::vector<int> mine = a.positions();
  if (a.shards().empty() && !mine.empty())
    throw UserError(std::string("[") + who +
                    "] the ShardedArray has no shards (default-constructed, moved from or cleared); make "
                    "one with px::shard(array, sharding) or ShardedArray(type, sharding, shards)");
  if (a.shards().size() != mine.size())
    throw UserError(std::string("[") + who + "] the ShardedArray of " + type_str(a.type()) + " on " +
                    a.mesh().to_string() + " holds " + std::to_string(a.shards().size()) + " shards for the " +
                    std::to_string(mine.size()) + " positions of its process; give one shard per position");
  const TensorType local{a.dtype(), a.sharding().local_shape(a.shape())};
  for (size_t i = 0; i < mine.size(); ++i)
    if (!a.shards()[i].defined() || a.shards()[i].type() != local)
      throw UserError(
          std::string("[") + who + "] shard " + std::to_string(mine[i]) + " of the ShardedArray of " +
          type_str(a.type()) + " with " + a.sharding().to_string() + " is " +
          (a.shards()[i].defined() ? "of type " + type_str(a.shards()[i].type()) : std::string("undefined")) +
          ", expected " + type_str(local));
}

}  // namespace detail

namespace {
using detail::check_complete;
}  // namespace

ShardedArray::ShardedArray(TensorType global, Sharding sharding, std::vector<Array> shards, int process)
    : type_(std::move(global)), sharding_(std::move(sharding)), shards_(std::move(shards)), process_(process) {
  sharding_.validate(type_, "array");
  check_process(sharding_.mesh, process_, "sharding");
  const std::vector<int> mine = positions();
  if (shards_.size() != mine.size())
    throw Error("[sharding] a global array on " + sharding_.mesh.to_string() + " needs " +
                std::to_string(mine.size()) + " shards" +
                (sharding_.mesh.num_processes() > 1
                     ? " in process " + std::to_string(process_) + " (positions " + positions_text(mine) + ")"
                     : std::string()) +
                ", got " + std::to_string(shards_.size()));
  TensorType local{type_.dtype, sharding_.local_shape(type_.shape)};
  for (size_t i = 0; i < shards_.size(); ++i)
    if (shards_[i].type() != local)
      throw Error("[sharding] shard " + std::to_string(mine[i]) + " of " + type_str(type_) + " with " +
                  sharding_.to_string() + " has type " + type_str(shards_[i].type()) + ", expected " + type_str(local));
}

bool ShardedArray::holds(int position) const {
  return position >= 0 && position < mesh().size() && mesh().process_of(position) == process_;
}

const Array& ShardedArray::shard(int position) const {
  const Mesh& m = mesh();
  if (m.num_processes() == 1) {
    if (shards_.empty() && position >= 0 && position < m.size()) check_complete(*this, "sharding");
    if (position < 0 || position >= static_cast<int>(shards_.size()))
      throw Error("[sharding] mesh position " + std::to_string(position) + " is not in " + m.to_string() +
                  " (positions 0 .. " + std::to_string(shards_.size() - 1) + ")");
    return shards_[position];
  }
  if (!holds(position)) {
    if (position < 0 || position >= m.size())
      throw Error("[sharding] mesh position " + std::to_string(position) + " is not in " + m.to_string() +
                  " (positions 0 .. " + std::to_string(m.size() - 1) + ")");
    throw Error("[sharding] the shard of mesh position " + std::to_string(position) + " lives in process " +
                std::to_string(m.process_of(position)) + " of " + m.to_string() + "; this array belongs to process " +
                std::to_string(process_) + ", which holds only positions " + positions_text(positions()) +
                ". Read a local shard (shards(), positions()), or get the whole array with px::gather(array, "
                "communicator) called by every process");
  }
  return shards_[m.local_index(position)];
}

int64_t ShardedArray::bytes_per_device() const { return shards_.empty() ? 0 : shards_[0].nbytes(); }

ShardedArray shard(const Array& full, const Sharding& s, int process) {
  const std::vector<int64_t> zero(full.shape().size(), 0);
  const Array host = full.on_host();
  return shard(
      full.type(),
      [&](const std::vector<int64_t>& off, Array& out) {
        copy_box(host.raw(), host.shape(), off.data(), out.raw(), out.shape(), zero.data(), out.shape(),
                 dtype_size(host.dtype()));
      },
      s, process);
}

ShardedArray shard(const TensorType& type, const BoxReader& read, const Sharding& s, int process) {
  s.validate(type, "array");
  check_process(s.mesh, process, "shard");
  Shape local = s.local_shape(type.shape);
  std::vector<int> partial_axes;
  for (auto& a : s.partial) partial_axes.push_back(s.mesh.axis_index(a));
  std::vector<Array> shards;
  std::vector<std::pair<std::vector<int64_t>, size_t>> read_at;  // offsets already read -> shard index
  for (int p : s.mesh.local_positions(process)) {
    std::vector<int64_t> c = s.mesh.coords(p);
    bool holder = true;
    for (int a : partial_axes) holder = holder && c[a] == 0;
    // The shard is filled in host memory when the host cannot reach the device's, then copied there.
    const Placement at = s.mesh.placement(p);
    const bool direct = host_visible(at);
    Array a(type.dtype, local, direct ? at : Placement{});
    if (!holder) {
      if (a.nbytes()) std::memset(a.raw(), 0, static_cast<size_t>(a.nbytes()));
      shards.push_back(a.to(at));
      continue;
    }
    std::vector<int64_t> off = s.shard_offsets(type.shape, p);
    auto same = std::find_if(read_at.begin(), read_at.end(), [&](const auto& r) { return r.first == off; });
    if (same != read_at.end()) {
      shards.push_back(shards[same->second].to(at));
      continue;
    }
    read(off, a);
    if (a.type() != TensorType{type.dtype, local})
      throw Error("[shard] the reader replaced the shard of position " + std::to_string(p) + " (" +
                  type_str(TensorType{type.dtype, local}) + ") by " + type_str(a.type()) + "; fill it in place");
    read_at.emplace_back(std::move(off), shards.size());
    shards.push_back(a.to(at));
  }
  return ShardedArray(type, s, std::move(shards), process);
}

namespace {

// The full array from the shard of every mesh position (`block(p)`).
template <class Block>
Array assemble(const TensorType& type, const Sharding& s, const Block& block) {
  Shape local = s.local_shape(type.shape);
  std::vector<int64_t> zero(local.size(), 0);
  std::vector<int> partial_axes;
  for (auto& ax : s.partial) partial_axes.push_back(s.mesh.axis_index(ax));
  // Sum over partial axes in f32 (exact for i32 up to 2^24) for each distinct shard position.
  Array out(type.dtype, type.shape);
  for (int p = 0; p < s.mesh.size(); ++p) {
    std::vector<int64_t> c = s.mesh.coords(p);
    bool rep = true;  // the representative of its partial group (coordinate 0 on partial axes)
    for (int ax : partial_axes) rep = rep && c[ax] == 0;
    if (!rep) continue;
    Array blk = block(p).on_host();
    if (!partial_axes.empty()) {
      std::vector<float> acc = blk.to_f32();
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
        std::vector<float> v = block(q).to_f32();
        for (size_t i = 0; i < acc.size(); ++i) acc[i] += v[i];
      }
      blk = Array::from_f32(acc, local, type.dtype);
    }
    std::vector<int64_t> off = s.shard_offsets(type.shape, p);
    copy_box(blk.raw(), local, zero.data(), out.raw(), type.shape, off.data(), local, dtype_size(type.dtype));
  }
  return out;
}

}  // namespace

Array gather(const ShardedArray& a) {
  if (a.mesh().num_processes() > 1)
    throw Error("[gather] the array on " + a.mesh().to_string() + " holds only the shards of process " +
                std::to_string(a.process()) + "; gather it with px::gather(array, communicator), called by every " +
                "process with its own array (a collective)");
  check_complete(a, "gather");
  return assemble(a.type(), a.sharding(), [&](int p) -> const Array& { return a.shards()[p]; });
}

Array gather(const ShardedArray& a, Communicator& comm) {
  const Mesh& mesh = a.mesh();
  if (mesh.num_processes() == 1) return gather(a);
  check_complete(a, "gather");
  const std::vector<int> mine = a.positions();
  if (comm.world_size() != mesh.size() || comm.local_positions() != mine)
    throw Error("[gather] the communicator ('" + comm.name() + "', " + std::to_string(comm.local_positions().size()) +
                " of " + std::to_string(comm.world_size()) + " positions) is not the one of process " +
                std::to_string(a.process()) + " of " + mesh.to_string() + "; pass that process's communicator");
  // Every shard to every process: one all-gather over all positions, then assembled locally.
  const TensorType local{a.dtype(), a.sharding().local_shape(a.shape())};
  const int64_t count = local.numel();
  std::vector<int> all(static_cast<size_t>(mesh.size()));
  for (int p = 0; p < mesh.size(); ++p) all[p] = p;
  Buffers ins;
  MutBuffers outs;
  std::vector<Array> gathered;
  std::vector<Array> host;  // the communicator reads and writes host memory
  for (const Array& s : a.shards()) {
    host.push_back(s.on_host());
    ins.push_back(host.back().raw());
    gathered.emplace_back(a.dtype(), Shape{mesh.size(), count});
    outs.push_back(gathered.back().raw());
  }
  comm.all_gather(ins, outs, count, a.dtype(), {all});
  const auto* bytes = static_cast<const std::byte*>(gathered[0].raw());
  const int64_t nb = local.nbytes();
  return assemble(a.type(), a.sharding(), [&](int p) {
    Array b(local.dtype, local.shape);
    if (nb) std::memcpy(b.raw(), bytes + p * nb, static_cast<size_t>(nb));
    return b;
  });
}

}  // namespace px
