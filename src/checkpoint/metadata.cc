// The Checkpoint value type, directory naming, chunk ownership and metadata.json.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <set>

#include "checkpoint/fs.h"
#include "io/json_number.h"
#include "checkpoint/layout.h"

#ifndef PX_VERSION
#define PX_VERSION "unknown"
#endif

namespace px {

using nlohmann::json;

void Checkpoint::add(std::string name, ShardedArray a, std::string group) {
  entries.push_back({std::move(name), std::move(a), std::move(group)});
}

void Checkpoint::add(std::string name, const Array& a, std::string group) {
  add(std::move(name), ShardedArray(a.type(), Sharding::replicated(Mesh()), {a}), std::move(group));
}

bool Checkpoint::contains(const std::string& name) const {
  return std::any_of(entries.begin(), entries.end(), [&](const CheckpointEntry& e) { return e.name == name; });
}

const ShardedArray& Checkpoint::get(const std::string& name) const {
  for (const CheckpointEntry& e : entries)
    if (e.name == name) return e.array;
  std::string have;
  for (size_t i = 0; i < entries.size() && i < 20; ++i) have += (i ? ", " : "") + entries[i].name;
  if (entries.size() > 20) have += ", ... (" + std::to_string(entries.size()) + " in all)";
  throw Error("[checkpoint] no array named '" + name + "' in the checkpoint of step " + std::to_string(step) +
              "; it has: " + (have.empty() ? "(none)" : have));
}

Array Checkpoint::full(const std::string& name) const {
  const ShardedArray& a = get(name);
  if (a.shards().size() == 1 && a.sharding().partial.empty()) return a.shard(0);
  return gather(a);
}

std::vector<std::string> Checkpoint::names(const std::string& group) const {
  std::vector<std::string> out;
  for (const CheckpointEntry& e : entries)
    if (group.empty() || e.group == group) out.push_back(e.name);
  return out;
}

namespace ckpt {

std::string step_dir_name(int64_t step) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "checkpoint_%08" PRId64, step);
  return buf;
}

std::optional<int64_t> parse_step_dir(const std::string& name) {
  // Every step step_dir_name writes, up to INT64_MAX (19 digits), reads back; a number past it is
  // no step of ours.
  const std::string prefix = "checkpoint_";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return std::nullopt;
  const char *first = name.data() + prefix.size(), *last = name.data() + name.size();
  if (!std::all_of(first, last, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  int64_t step = 0;
  auto [end, ec] = std::from_chars(first, last, step);
  if (ec != std::errc() || end != last) return std::nullopt;
  return step;
}

bool is_committed(const std::string& checkpoint_dir) { return ckpt_fs::exists(checkpoint_dir + "/" + kMarker); }

std::vector<int64_t> committed_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  for (const std::string& n : ckpt_fs::list_dir(dir))
    if (auto s = parse_step_dir(n); s && is_committed(dir + "/" + n)) steps.push_back(*s);
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<int> local_positions(const Mesh& mesh, int process) { return mesh.local_positions(process); }

Shape chunk_shape(const TensorType& type, const Sharding& s) {
  Shape c = s.local_shape(type.shape);
  for (int64_t& d : c) d = std::max<int64_t>(d, 1);
  return c;
}

std::vector<ChunkRef> distinct_chunks(const TensorType& type, const Sharding& s) {
  Shape local = s.local_shape(type.shape);
  std::map<std::vector<int64_t>, ChunkRef> by_offset;  // positions ascend, so the first seen owns it
  for (int p = 0; p < static_cast<int>(s.mesh.size()); ++p) {
    std::vector<int64_t> off = s.shard_offsets(type.shape, p);
    if (by_offset.count(off)) continue;
    ChunkRef r;
    r.offset = off;
    r.owner = p;
    r.index.resize(off.size());
    for (size_t d = 0; d < off.size(); ++d) r.index[d] = local[d] > 0 ? off[d] / local[d] : 0;
    by_offset.emplace(off, std::move(r));
  }
  std::vector<ChunkRef> out;
  if (type.numel() == 0) return out;  // no chunks: Zarr reads the fill value
  for (auto& [off, r] : by_offset) out.push_back(std::move(r));
  return out;
}

void validate_array_name(const std::string& name) {
  auto bad = [&](const std::string& why) {
    throw Error("[checkpoint] array name '" + name + "' " + why +
                "; Zarr array names are non-empty, without '/', and do not start with \"__\"");
  };
  if (name.empty()) bad("is empty");
  if (name.find('/') != std::string::npos || name.find('\0') != std::string::npos) bad("contains '/'");
  if (name == "." || name == "..") bad("is a path component");
  if (name.rfind("__", 0) == 0) bad("starts with \"__\"");
  if (name == "zarr.json" || name == kMetadata || name == kMarker || name == "c") bad("is a reserved file name");
}

std::string mesh_text(const Mesh& m) {
  std::string s;
  for (const MeshAxis& a : m.axes()) s += (s.empty() ? "" : ",") + a.name + ":" + std::to_string(a.size);
  return s;
}

std::string checked_json(const std::string& text, const std::string& what) {
  try {
    return json::parse(text).dump();
  } catch (const json::exception& e) {
    throw Error("[checkpoint] " + what + " is not valid JSON: " + e.what());
  }
}

std::string chunk_tag(int64_t step, const std::string& array, const std::string& key, DType dtype, int version) {
  return "parallax-chunk/" + std::to_string(version) + "\n" + std::to_string(step) + "\n" + key + "\n" +
         (version >= 2 ? std::string(dtype_name(dtype)) + "\n" : "") + array;
}

std::string describe_chunk_tag(const std::string& tag) {
  // Fields as chunk_tag writes them; the array name comes last and may hold anything.
  const bool v1 = tag.rfind("parallax-chunk/1\n", 0) == 0;
  if (!v1 && tag.rfind("parallax-chunk/2\n", 0) != 0) return "a chunk tag of another format";
  std::vector<std::string> f;
  size_t start = 0;
  for (int i = 0; i < (v1 ? 3 : 4); ++i) {
    size_t nl = tag.find('\n', start);
    if (nl == std::string::npos) return "a chunk tag of another format";
    f.push_back(tag.substr(start, nl - start));
    start = nl + 1;
  }
  return "chunk " + f[2] + " of array '" + tag.substr(start) + "'" + (v1 ? "" : " (" + f[3] + ")") + " of step " + f[1];
}

std::string metadata_json(const Checkpoint& c) {
  json arrays = json::array();
  for (const CheckpointEntry& e : c.entries) {
    const ShardedArray& a = e.array;
    arrays.push_back({{"name", e.name},
                      {"group", e.group},
                      {"dtype", dtype_name(a.dtype())},
                      {"shape", a.shape()},
                      {"chunk_shape", chunk_shape(a.type(), a.sharding())},
                      {"mesh", mesh_text(a.mesh())},
                      {"sharding", a.sharding().spec.to_string()}});
  }
  json j = {{"format", "parallax.checkpoint"},
            {"format_version", kFormatVersion},
            {"library_version", PX_VERSION},
            {"step", c.step},
            {"config", json::parse(c.config_json)},
            {"data_state", json::parse(c.data_state_json)},
            {"rng_state", json::parse(c.rng_state_json)},
            {"chunk_tags", kChunkTagVersion},
            {"arrays", arrays}};
  if (!c.optimizer.empty()) j["optimizer"] = c.optimizer;
  return j.dump(2) + "\n";
}

CheckpointInfo parse_metadata(const std::string& text, const std::string& where, int64_t* chunk_tags) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(where + ": not valid JSON (truncated?): " + e.what());
  }
  try {
    if (j.value("format", "") != "parallax.checkpoint")
      throw Error(where + ": not a parallax checkpoint's metadata (no \"format\": \"parallax.checkpoint\")");
    const int64_t version = json_int(j.at("format_version"), where + ": format_version");
    if (version > kFormatVersion)
      throw Error(where + ": format_version " + std::to_string(version) +
                  " is newer than this library reads (" + std::to_string(kFormatVersion) + "); upgrade parallax");
    CheckpointInfo info;
    info.step = json_int(j.at("step"), where + ": step");
    info.library_version = j.at("library_version").get<std::string>();
    info.config_json = j.at("config").dump();
    info.data_state_json = j.at("data_state").dump();
    info.rng_state_json = j.at("rng_state").dump();
    if (j.contains("optimizer")) info.optimizer = j["optimizer"].get<std::string>();
    if (info.step < 0) throw Error(where + ": step " + std::to_string(info.step) + " is negative; restore the file");
    const int64_t tags = j.contains("chunk_tags") ? json_int(j["chunk_tags"], where + ": chunk_tags") : 0;
    if (tags < 0 || tags > kChunkTagVersion)
      throw Error(where + ": chunk_tags " + std::to_string(tags) +
                  " is not a chunk tag version this library reads (0 .. " + std::to_string(kChunkTagVersion) +
                  "); upgrade parallax");
    if (chunk_tags) *chunk_tags = tags;
    std::set<std::string> names;
    for (const json& a : j.at("arrays")) {
      CheckpointArrayInfo ai;
      ai.name = a.at("name").get<std::string>();
      // The name is a directory of the checkpoint: "../x" or "/x" would read outside it.
      try {
        validate_array_name(ai.name);
      } catch (const Error& e) {
        std::string why = e.what();
        if (why.rfind("[checkpoint] ", 0) == 0) why.erase(0, 13);
        throw Error(where + ": " + why + "; the metadata is corrupt or not written by parallax: restore it");
      }
      if (!names.insert(ai.name).second)
        throw Error(where + ": array '" + ai.name + "' is listed twice; the metadata is corrupt: restore it");
      ai.group = a.at("group").get<std::string>();
      ai.type.dtype = dtype_from_name(a.at("dtype").get<std::string>());
      ai.type.shape = json_shape(a.at("shape"), where + ": shape");
      ai.chunk_shape = json_shape(a.at("chunk_shape"), where + ": chunk_shape");
      ai.mesh = a.at("mesh").get<std::string>();
      ai.sharding = a.at("sharding").get<std::string>();
      info.arrays.push_back(std::move(ai));
    }
    return info;
  } catch (const json::exception& e) {
    throw Error(where + ": malformed metadata: " + e.what());
  }
}

void copy_box(const char* src, const Shape& src_shape, const std::vector<int64_t>& src_begin, char* dst,
              const Shape& dst_shape, const std::vector<int64_t>& dst_begin, const Shape& extent, int64_t elem) {
  const int rank = static_cast<int>(extent.size());
  for (int64_t e : extent)
    if (e == 0) return;
  if (rank == 0) {
    std::memcpy(dst, src, static_cast<size_t>(elem));
    return;
  }
  // Row-major strides in bytes; the innermost dim is copied with one memcpy per row.
  std::vector<int64_t> ss(rank), ds(rank);
  ss[rank - 1] = ds[rank - 1] = elem;
  for (int d = rank - 2; d >= 0; --d) {
    ss[d] = ss[d + 1] * src_shape[d + 1];
    ds[d] = ds[d + 1] * dst_shape[d + 1];
  }
  const size_t row = static_cast<size_t>(extent[rank - 1] * elem);
  std::vector<int64_t> i(rank, 0);
  while (true) {
    int64_t so = 0, doff = 0;
    for (int d = 0; d < rank; ++d) {
      so += (src_begin[d] + i[d]) * ss[d];
      doff += (dst_begin[d] + i[d]) * ds[d];
    }
    std::memcpy(dst + doff, src + so, row);
    int d = rank - 2;
    for (; d >= 0; --d) {
      if (++i[d] < extent[d]) break;
      i[d] = 0;
    }
    if (d < 0) break;
  }
}

}  // namespace ckpt
}  // namespace px
