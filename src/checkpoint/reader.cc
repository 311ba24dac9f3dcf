// Reading checkpoints: metadata, restore onto any sharding (only the chunks that the requested
// shards overlap are read), checksum verification, and safetensors export/import.
#include <algorithm>
#include <charconv>
#include <map>
#include <optional>

#include "checkpoint/fs.h"
#include "checkpoint/layout.h"
#include "io/zarr.h"
#include "parallax/io.h"

namespace px {

using namespace ckpt;

namespace {

std::string parent_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string steps_text(const std::vector<int64_t>& steps) {
  std::string s;
  for (int64_t x : steps) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s.empty() ? "(none)" : s;
}

// What to do when `step` cannot be read: the committed checkpoint before it, if any.
std::string earlier_hint(const std::string& checkpoint_dir, int64_t step) {
  std::string base = checkpoint_dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  if (!parse_step_dir(base.substr(base.find_last_of('/') == std::string::npos ? 0 : base.find_last_of('/') + 1)))
    return "the checkpoint is damaged: restore it from a copy or save it again";
  std::vector<int64_t> earlier;
  for (int64_t s : committed_steps(parent_of(checkpoint_dir)))
    if (s < step) earlier.push_back(s);
  if (earlier.empty()) return "no earlier committed checkpoint exists in " + parent_of(checkpoint_dir);
  return "the previous committed checkpoint is step " + std::to_string(earlier.back()) +
         ": restore it instead (restore_step=" + std::to_string(earlier.back()) +
         "); committed steps before this one: " + steps_text(earlier);
}

// One distinct block of the target sharding (replicas share it) and the positions holding it.
struct Block {
  std::vector<int64_t> offset;
  Array data;
  std::vector<int> positions;
};

// One array to restore: its target blocks, filled by the chunk reads.
struct ArrayPlan {
  std::string name, group, adir;
  TensorType type;
  Shape cshape, local;
  Sharding target;
  int process = 0;
  std::vector<Block> blocks;
};

// One chunk to read and the blocks it overlaps.
struct ChunkTask {
  size_t array = 0;
  std::vector<int64_t> index, begin, end;  // chunk grid index; its box in the array
  std::vector<size_t> hits;
};

// Allocates the target blocks and lists the chunks that they overlap (only those are read).
void plan_array(ArrayPlan& a, size_t array_index, std::vector<ChunkTask>& tasks) {
  a.local = a.target.local_shape(a.type.shape);
  std::map<std::vector<int64_t>, size_t> by_offset;
  for (int p : local_positions(a.target.mesh, a.process)) {
    std::vector<int64_t> off = a.target.shard_offsets(a.type.shape, p);
    auto [it, fresh] = by_offset.emplace(off, a.blocks.size());
    if (fresh) a.blocks.push_back({off, Array(a.type.dtype, a.local), {}});
    a.blocks[it->second].positions.push_back(p);
  }
  if (a.type.numel() == 0) return;
  const int rank = a.type.rank();
  std::vector<int64_t> grid = zarr::chunk_grid(a.type.shape, a.cshape);
  std::vector<int64_t> ci(rank, 0);
  while (true) {
    ChunkTask t;
    t.array = array_index;
    t.index = ci;
    t.begin.resize(rank);
    t.end.resize(rank);
    for (int d = 0; d < rank; ++d) {
      t.begin[d] = ci[d] * a.cshape[d];
      t.end[d] = std::min(t.begin[d] + a.cshape[d], a.type.shape[d]);
    }
    for (size_t b = 0; b < a.blocks.size(); ++b) {
      bool overlap = true;
      for (int d = 0; d < rank && overlap; ++d)
        overlap = std::max(t.begin[d], a.blocks[b].offset[d]) < std::min(t.end[d], a.blocks[b].offset[d] + a.local[d]);
      if (overlap) t.hits.push_back(b);
    }
    if (!t.hits.empty()) tasks.push_back(std::move(t));
    int d = rank - 1;
    for (; d >= 0; --d) {
      if (++ci[d] < grid[d]) break;
      ci[d] = 0;
    }
    if (d < 0) break;
  }
}

// Reads, checks and decodes one chunk into the blocks it overlaps (chunks touch disjoint parts
// of the blocks, so tasks run concurrently). `file` and `chunk` are the worker's scratch.
void read_chunk(ArrayPlan& a, const ChunkTask& t, const std::string& checkpoint_dir, int64_t step, int64_t tagged,
                std::vector<char>& file, std::vector<char>& chunk) {
  const int rank = a.type.rank();
  const int64_t elem = dtype_size(a.type.dtype);
  const std::string key = zarr::chunk_key(t.index);
  auto fail = [&](const std::string& what) {
    throw Error("[checkpoint] " + checkpoint_dir + ": array '" + a.name + "' chunk " + key + " (file " + a.adir + "/" +
                key + "): " + what + "; " + earlier_hint(checkpoint_dir, step));
  };
  if (!ckpt_fs::exists(a.adir + "/" + key)) fail("the chunk file is missing");
  ckpt_fs::read_file(a.adir + "/" + key, file);
  const size_t chunk_bytes = static_cast<size_t>(numel(a.cshape) * elem);
  // A chunk that is exactly one block decodes straight into it.
  Block& first = a.blocks[t.hits[0]];
  const bool exact = t.hits.size() == 1 && a.cshape == a.local && first.offset == t.begin;
  void* out = exact ? first.data.raw() : (chunk.resize(chunk_bytes), chunk.data());
  std::string tag;
  std::string err = zarr::decode_chunk(file.data(), file.size(), out, chunk_bytes, &tag);
  if (!err.empty()) fail(err);
  // The tag binds the file to this array, chunk and step: a chunk swapped with another, or one left
  // from another save, would otherwise restore as other values with a valid checksum.
  // The version metadata.json names; without one (written before tags), the tag's own.
  const int version = tagged > 0 ? static_cast<int>(tagged)
                      : tag.rfind("parallax-chunk/1\n", 0) == 0 ? 1
                                                                 : kChunkTagVersion;
  const std::string want = chunk_tag(step, a.name, key, a.type.dtype, version);
  if (tag.empty() && tagged > 0)
    fail(
        "the chunk file has no tag naming its array, chunk and step, which every chunk of this checkpoint has: "
        "it was copied from elsewhere");
  if (!tag.empty() && tag != want)
    fail("the chunk file holds " + describe_chunk_tag(tag) + ", not " + describe_chunk_tag(want) +
         ": it was moved or copied from elsewhere, or the array's dtype in " + std::string(kMetadata) +
         " and zarr.json was edited");
  if (exact) return;
  for (size_t h : t.hits) {
    Block& b = a.blocks[h];
    std::vector<int64_t> ext(rank), src(rank), dst(rank);
    for (int d = 0; d < rank; ++d) {
      int64_t lo = std::max(t.begin[d], b.offset[d]);
      ext[d] = std::min(t.end[d], b.offset[d] + a.local[d]) - lo;
      src[d] = lo - t.begin[d];
      dst[d] = lo - b.offset[d];
    }
    copy_box(chunk.data(), a.cshape, src, static_cast<char*>(b.data.raw()), a.local, dst, ext, elem);
  }
}

ShardedArray assemble(ArrayPlan& a) {
  std::vector<Array> shards(a.target.mesh.local_positions(a.process).size());
  for (Block& b : a.blocks)
    for (size_t i = 0; i < b.positions.size(); ++i) {
      // Read in host memory; on another platform's devices (an accelerator's), copied there.
      const Placement at = a.target.mesh.placement(b.positions[i]);
      shards[a.target.mesh.local_index(b.positions[i])] = at.platform != b.data.placement().platform ? b.data.to(at)
                                                          : i == 0                                   ? b.data
                                                                                                     : b.data.clone();
    }
  return ShardedArray(a.type, a.target, std::move(shards), a.process);
}

constexpr int kIoThreads = 4;

void require_committed(const std::string& checkpoint_dir) {
  if (!ckpt_fs::is_dir(checkpoint_dir))
    throw Error("[checkpoint] no checkpoint directory " + checkpoint_dir + "; committed steps in " +
                parent_of(checkpoint_dir) + ": " + steps_text(committed_steps(parent_of(checkpoint_dir))));
  if (!is_committed(checkpoint_dir))
    throw Error("[checkpoint] " + checkpoint_dir + " is not a committed checkpoint (no " + kMarker +
                " marker: its save did not finish); committed steps in " + parent_of(checkpoint_dir) + ": " +
                steps_text(committed_steps(parent_of(checkpoint_dir))));
}

// The metadata, checked against the directory's name and the commit marker: a step that disagrees
// with them would make a resumed run and an eval of "step N" read different states.
CheckpointInfo read_info(const std::string& checkpoint_dir, int64_t* chunk_tags) {
  require_committed(checkpoint_dir);
  const std::string mpath = checkpoint_dir + "/" + kMetadata;
  CheckpointInfo info = parse_metadata(ckpt_fs::read_file(mpath), "[checkpoint] " + mpath, chunk_tags);
  info.path = checkpoint_dir;
  std::string base = checkpoint_dir;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  base = base.substr(base.find_last_of('/') == std::string::npos ? 0 : base.find_last_of('/') + 1);
  if (std::optional<int64_t> named = parse_step_dir(base); named && *named != info.step)
    throw Error("[checkpoint] " + mpath + " says step " + std::to_string(info.step) + " but its directory is " + base +
                " (step " + std::to_string(*named) +
                "); a checkpoint directory was renamed or its metadata replaced: give it back its name (" +
                step_dir_name(info.step) + ") or restore another step; " + earlier_hint(checkpoint_dir, *named));
  const std::string marker = ckpt_fs::read_file(checkpoint_dir + "/" + kMarker);
  if (marker.rfind("step ", 0) == 0 && marker != "step " + std::to_string(info.step) + "\n")
    throw Error("[checkpoint] " + checkpoint_dir + "/" + kMarker + " commits " + marker.substr(0, marker.find('\n')) +
                " but " + mpath + " says step " + std::to_string(info.step) +
                "; the metadata was replaced after the commit: restore another step; " +
                earlier_hint(checkpoint_dir, info.step));
  return info;
}

}  // namespace

CheckpointInfo read_checkpoint_info(const std::string& checkpoint_dir) { return read_info(checkpoint_dir, nullptr); }

Checkpoint read_checkpoint(const std::string& checkpoint_dir, const RestoreOptions& options) {
  int64_t chunk_tags = 0;
  CheckpointInfo info = read_info(checkpoint_dir, &chunk_tags);
  auto has = [&](const std::string& n) {
    return std::any_of(info.arrays.begin(), info.arrays.end(), [&](const CheckpointArrayInfo& a) { return a.name == n; });
  };
  auto missing = [&](const std::string& n, const char* where) {
    std::string names;
    for (size_t i = 0; i < info.arrays.size() && i < 20; ++i) names += (i ? ", " : "") + info.arrays[i].name;
    throw Error("[checkpoint] " + checkpoint_dir + ": " + where + " names array '" + n +
                "', which the checkpoint does not have; it has: " + names);
  };
  for (auto& [n, s] : options.shardings)
    if (!has(n)) missing(n, "RestoreOptions::shardings");
  for (const std::string& n : options.only)
    if (!has(n)) missing(n, "RestoreOptions::only");
  if (!options.group.empty()) {
    std::vector<std::string> groups;
    for (const CheckpointArrayInfo& a : info.arrays)
      if (std::find(groups.begin(), groups.end(), a.group) == groups.end()) groups.push_back(a.group);
    auto quoted = [](const std::vector<std::string>& v) {
      std::string s;
      for (const std::string& x : v) s += (s.empty() ? "'" : ", '") + x + "'";
      return s.empty() ? std::string("(none)") : s;
    };
    if (std::find(groups.begin(), groups.end(), options.group) == groups.end())
      throw Error("[checkpoint] " + checkpoint_dir + " has no arrays in group '" + options.group +
                  "'; its groups: " + quoted(groups) + " (RestoreOptions::group)");
    for (const std::string& n : options.only)
      for (const CheckpointArrayInfo& a : info.arrays)
        if (a.name == n && a.group != options.group)
          throw Error("[checkpoint] " + checkpoint_dir + ": RestoreOptions::only names array '" + n +
                      "', which is in group '" + a.group + "', not in RestoreOptions::group '" + options.group +
                      "'; drop one of the two filters");
  }

  Checkpoint c(info.step);
  c.config_json = info.config_json;
  c.data_state_json = info.data_state_json;
  c.rng_state_json = info.rng_state_json;
  c.optimizer = info.optimizer;
  c.library_version = info.library_version;
  std::vector<ArrayPlan> plans;
  std::vector<ChunkTask> tasks;
  for (const CheckpointArrayInfo& a : info.arrays) {
    if (!options.group.empty() && a.group != options.group) continue;
    if (!options.only.empty() && std::find(options.only.begin(), options.only.end(), a.name) == options.only.end())
      continue;
    auto it = options.shardings.find(a.name);
    Sharding target = it != options.shardings.end() ? it->second : Sharding::replicated(Mesh());
    const std::string what = "checkpoint array '" + a.name + "' (" + type_str(a.type) + ")";
    if (!target.partial.empty())
      throw Error("[checkpoint] the restore target of " + what + " has partial-sum axes; give a sharding without them");
    target.validate(a.type, what);
    const int process = target.mesh.num_processes() > 1 ? options.process : 0;
    if (process < 0 || process >= target.mesh.num_processes())
      throw Error("[checkpoint] RestoreOptions::process is " + std::to_string(options.process) + " but the target of " +
                  what + " is on " + target.mesh.to_string() + "; give a process of that mesh");
    plans.push_back({a.name, a.group, checkpoint_dir + "/" + a.name, a.type, a.chunk_shape, {}, target,
                     process, {}});
  }
  // Each array's zarr.json must agree with metadata.json (read several at once: small files).
  ckpt_fs::parallel_for(plans.size(), kIoThreads, [&](size_t i, int) {
    const ArrayPlan& a = plans[i];
    const std::string zpath = a.adir + "/zarr.json";
    if (!ckpt_fs::exists(zpath))
      throw Error("[checkpoint] " + checkpoint_dir + ": array '" + a.name + "' has no " + zpath + "; " +
                  earlier_hint(checkpoint_dir, info.step));
    zarr::ArrayMeta z;
    try {
      z = zarr::parse_array_metadata(ckpt_fs::read_file(zpath), "[checkpoint] " + zpath);
    } catch (const Error& e) {
      throw Error(std::string(e.what()) + "; " + earlier_hint(checkpoint_dir, info.step));
    }
    if (z.type != a.type || z.chunk_shape != a.cshape)
      throw Error("[checkpoint] " + zpath + " describes " + type_str(z.type) + " in chunks " +
                  shape_str(z.chunk_shape) + " but " + kMetadata + " says " + type_str(a.type) + " in chunks " +
                  shape_str(a.cshape) + "; " + earlier_hint(checkpoint_dir, info.step));
  });
  for (size_t i = 0; i < plans.size(); ++i) plan_array(plans[i], i, tasks);
  // Errors name the first bad chunk in file order, whichever thread meets one first.
  std::vector<std::string> errors(tasks.size());
  std::vector<std::vector<char>> files(kIoThreads), chunks(kIoThreads);
  ckpt_fs::parallel_for(tasks.size(), kIoThreads, [&](size_t i, int w) {
    try {
      read_chunk(plans[tasks[i].array], tasks[i], checkpoint_dir, info.step, chunk_tags, files[w], chunks[w]);
    } catch (const Error& e) {
      errors[i] = e.what();
    }
  });
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
  for (ArrayPlan& p : plans) c.add(p.name, assemble(p), p.group);
  return c;
}

CheckpointInfo CheckpointManager::info(int64_t step) const { return read_checkpoint_info(path(step)); }

Checkpoint CheckpointManager::restore(int64_t step, const RestoreOptions& options) const {
  return read_checkpoint(path(step), options);
}

void CheckpointManager::verify(int64_t step) const {
  CheckpointInfo i = info(step);
  for (const CheckpointArrayInfo& a : i.arrays) {
    RestoreOptions one;
    one.only = {a.name};
    read_checkpoint(path(step), one);  // one array at a time: memory stays one array's size
  }
}

void export_safetensors(const std::string& checkpoint_dir, const std::string& out_path, const std::string& group) {
  RestoreOptions o;
  o.group = group;
  export_safetensors(read_checkpoint(checkpoint_dir, o), out_path, group);
}

void export_safetensors(const Checkpoint& c, const std::string& out_path, const std::string& group) {
  std::vector<std::string> names;
  std::vector<Array> arrays;
  std::string groups;
  for (const CheckpointEntry& e : c.entries) {
    if (groups.find("'" + e.group + "'") == std::string::npos) groups += (groups.empty() ? "'" : ", '") + e.group + "'";
    if (!group.empty() && e.group != group) continue;
    names.push_back(e.name);
    arrays.push_back(c.full(e.name));
  }
  if (names.empty())
    throw Error("[checkpoint] the checkpoint of step " + std::to_string(c.step) + " has no arrays in group '" + group +
                "'; its groups: " + (groups.empty() ? "(none)" : groups));
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"step", std::to_string(c.step)}, {"group", group}};
  if (!c.optimizer.empty()) meta["optimizer"] = c.optimizer;
  save_safetensors(out_path, names, arrays, meta);
}

Checkpoint import_safetensors(const std::string& path, const RestoreOptions& options, const std::string& group) {
  SafetensorsFile f = load_safetensors(path);
  for (auto& [n, s] : options.shardings)
    if (!f.contains(n)) f.get(n);  // throws, listing the names
  for (const std::string& n : options.only)
    if (!f.contains(n)) f.get(n);
  Checkpoint c;
  if (auto it = f.metadata.find("step"); it != f.metadata.end()) {
    const std::string& t = it->second;
    // Decimal digits only: "+3", " 3", "-0" or "0x10" are not steps, and nothing is truncated.
    const bool digits =
        !t.empty() && t.size() <= 18 && std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (!digits)
      throw UserError("[checkpoint] " + path + ": the metadata's step '" + t +
                      "' is not a step (an integer >= 0); fix or remove the \"step\" entry of the file's metadata");
    std::from_chars(t.data(), t.data() + t.size(), c.step);
  }
  if (auto it = f.metadata.find("optimizer"); it != f.metadata.end()) c.optimizer = it->second;
  for (size_t i = 0; i < f.names.size(); ++i) {
    const std::string& n = f.names[i];
    if (!options.only.empty() && std::find(options.only.begin(), options.only.end(), n) == options.only.end()) continue;
    auto it = options.shardings.find(n);
    if (it == options.shardings.end()) {
      c.add(n, f.arrays[i], group);
    } else {
      it->second.validate(f.arrays[i].type(), "safetensors tensor '" + n + "'");
      const int process = it->second.mesh.num_processes() > 1 ? options.process : 0;
      c.add(n, shard(f.arrays[i], it->second, process), group);
    }
  }
  return c;
}

}  // namespace px
