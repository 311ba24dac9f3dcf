// CheckpointManager: saving (synchronous and asynchronous), atomic commit and the keep policy.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include <sys/resource.h>
#include <unistd.h>

#include "checkpoint/fs.h"
#include "checkpoint/layout.h"
#include "core/exclusive.h"
#include "core/log.h"
#include "io/zarr.h"

namespace px {

using namespace ckpt;

namespace ckpt {

// What one save writes: the metadata and, per array, the chunks this process owns.
struct SaveJob {
  int64_t step = 0;
  std::string metadata;
  struct ArrayJob {
    std::string name;
    zarr::ArrayMeta meta;
    std::vector<std::pair<std::vector<int64_t>, Array>> chunks;  // chunk index, data
  };
  std::vector<ArrayJob> arrays;
};

}  // namespace ckpt

using Job = ckpt::SaveJob;

struct CheckpointManager::Pending {
  std::thread thread;
  std::exception_ptr error;
  int64_t step = -1;
  // The host buffers of the last asynchronous save, reused by the next one: copying into pages
  // already mapped is several times faster than into fresh ones, and this copy stalls training.
  std::vector<Array> staging;
  // save, save_async, wait and remove run one call at a time (they join and replace the thread).
  std::atomic<bool> busy{false};
};

namespace {
constexpr const char* kManagerCalls = "checkpoint manager (save, save_async, wait, remove)";
}  // namespace

namespace {

constexpr int kIoThreads = 4;  // chunks encoded and written (or read) at once: the disk likes a queue

// mkdir -p for the manager's own directory (the checkpoint tree below it is made one level at a time).
void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i)
    if (i == path.size() || path[i] == '/') ckpt_fs::make_dir(path.substr(0, i));
}

std::string parent_of(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// What a save checks before writing: names, groups, and that every array holds this process's shards.
void check_entries(const Checkpoint& c) {
  const std::string who = "[checkpoint] step " + std::to_string(c.step) + ": ";
  if (c.step < 0) throw Error(who + "the step must be >= 0");
  std::set<std::string> seen;
  for (const CheckpointEntry& e : c.entries) {
    validate_array_name(e.name);
    if (!seen.insert(e.name).second) throw Error(who + "the array name '" + e.name + "' is used twice");
    if (e.group.empty()) throw Error(who + "array '" + e.name + "' has an empty group; use e.g. \"params\"");
    const ShardedArray& a = e.array;
    if (!a.sharding().partial.empty())
      throw Error(who + "array '" + e.name + "' holds partial sums over " + a.sharding().to_string() +
                  "; reduce it (or gather it) before saving");
    const std::vector<int> local = local_positions(a.mesh(), a.process());
    if (a.shards().size() != local.size())
      throw Error(who + "array '" + e.name + "' has " + std::to_string(a.shards().size()) + " shards for the " +
                  std::to_string(local.size()) + " devices of its process on " + a.mesh().to_string());
    for (int p : local)
      if (!a.shard(p).defined() || a.shard(p).type() != TensorType{a.dtype(), a.sharding().local_shape(a.shape())})
        throw Error(who + "array '" + e.name + "': the shard on mesh position " + std::to_string(p) +
                    " is undefined or not of the local type " +
                    type_str({a.dtype(), a.sharding().local_shape(a.shape())}));
  }
  checked_json(c.config_json, who + "config_json");
  checked_json(c.data_state_json, who + "data_state_json");
  checked_json(c.rng_state_json, who + "rng_state_json");
}

// The job for c: metadata and owned chunks; with `staging`, private host copies (for async saves).
void build_job(const Checkpoint& c, int zstd_level, std::vector<Array>* staging, Job& job) {
  job.step = c.step;
  job.metadata = metadata_json(c);
  for (const CheckpointEntry& e : c.entries) {
    const ShardedArray& a = e.array;
    Job::ArrayJob aj;
    aj.name = e.name;
    aj.meta.type = a.type();
    aj.meta.chunk_shape = chunk_shape(a.type(), a.sharding());
    aj.meta.zstd_level = zstd_level;
    nlohmann::json attrs = {
        {"parallax", {{"group", e.group}, {"mesh", mesh_text(a.mesh())}, {"sharding", a.sharding().spec.to_string()}}}};
    aj.meta.attributes_json = attrs.dump();
    std::vector<int> local = local_positions(a.mesh(), a.process());
    for (const ChunkRef& r : distinct_chunks(a.type(), a.sharding()))
      if (std::binary_search(local.begin(), local.end(), r.owner))  // device memory the host cannot read: copied
        aj.chunks.emplace_back(r.index, a.shard(r.owner).on_host());
    job.arrays.push_back(std::move(aj));
  }
  if (!staging) return;
  // Private copies, into the previous save's buffers where the types line up (same state, same order).
  std::vector<std::pair<Array*, Array>> copies;  // (chunk slot, source)
  size_t k = 0;
  for (Job::ArrayJob& aj : job.arrays)
    for (auto& [index, data] : aj.chunks) {
      Array dst;
      if (k < staging->size() && (*staging)[k].type() == data.type() && (*staging)[k].sole_owner())
        dst = std::move((*staging)[k]);
      else
        dst = Array(data.dtype(), data.shape());
      ++k;
      copies.emplace_back(&data, std::move(dst));
    }
  staging->clear();
  ckpt_fs::parallel_for(copies.size(), 2, [&](size_t i, int) {
    auto& [slot, dst] = copies[i];
    if (slot->nbytes() > 0) std::memcpy(dst.raw(), slot->raw(), static_cast<size_t>(slot->nbytes()));
    std::swap(*slot, dst);
  });
}

// Writes this process's part of the job into `tmp` (made by process 0 before the "prepared"
// barrier) and, on process 0, commits it: marker inside, then `commit(tmp)` (a rename) once every
// process's chunks are durable.
void write_job(Job& job, const std::string& tmp, const CheckpointOptions& options, const std::function<void()>& prepare,
               const std::function<void()>& commit) {
  const bool primary = options.processes.index == 0;
  auto barrier = [&](const char* stage) {
    if (options.processes.barrier) options.processes.barrier(stage);
  };
  auto pause = [&] {
    if (options.testing_file_delay_ms > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(options.testing_file_delay_ms));
  };
  if (primary) prepare();
  barrier("prepared");

  // Files are written without waiting for the disk, several at once (each file-system call costs
  // about a millisecond on a virtual disk), then made durable together. Per array first: its
  // directories and zarr.json; then the chunks.
  std::vector<std::vector<std::string>> made(job.arrays.size());
  ckpt_fs::parallel_for(job.arrays.size(), kIoThreads, [&](size_t i, int) {
    Job::ArrayJob& a = job.arrays[i];
    const std::string adir = tmp + "/" + a.name;
    ckpt_fs::make_dir(adir);
    made[i].push_back(adir);
    if (primary) {
      ckpt_fs::write_file(adir + "/zarr.json", zarr::array_metadata(a.meta), /*sync=*/false);
      made[i].push_back(adir + "/zarr.json");
      pause();
    }
    std::set<std::string> dirs;
    for (auto& chunk : a.chunks) {
      std::string key = zarr::chunk_key(chunk.first);
      for (size_t k = key.find('/'); k != std::string::npos; k = key.find('/', k + 1)) {
        std::string d = adir + "/" + key.substr(0, k);
        if (dirs.insert(d).second) ckpt_fs::make_dir(d);
      }
      made[i].push_back(adir + "/" + key);
    }
    made[i].insert(made[i].end(), dirs.begin(), dirs.end());
  });
  std::vector<std::string> written;
  std::vector<std::pair<Job::ArrayJob*, size_t>> tasks;
  for (size_t i = 0; i < job.arrays.size(); ++i) {
    written.insert(written.end(), made[i].begin(), made[i].end());
    for (size_t c = 0; c < job.arrays[i].chunks.size(); ++c) tasks.emplace_back(&job.arrays[i], c);
  }
  std::vector<std::vector<char>> bufs(kIoThreads);
  ckpt_fs::parallel_for(tasks.size(), kIoThreads, [&](size_t t, int worker) {
    auto& [a, c] = tasks[t];
    const auto& [index, data] = a->chunks[c];
    std::vector<char>& buf = bufs[worker];
    const std::string key = zarr::chunk_key(index);
    zarr::encode_chunk(data.raw(), static_cast<size_t>(data.nbytes()), a->meta.zstd_level, buf,
                       chunk_tag(job.step, a->name, key, a->meta.type.dtype));
    ckpt_fs::write_file(tmp + "/" + a->name + "/" + key, buf.data(), buf.size(), /*sync=*/false);
    pause();
  });
  if (primary) {
    ckpt_fs::write_file(tmp + "/" + kMetadata, job.metadata, /*sync=*/false);
    ckpt_fs::write_file(tmp + "/zarr.json",
                        zarr::group_metadata("{\"parallax\": {\"step\": " + std::to_string(job.step) +
                                             ", \"metadata\": \"" + kMetadata + "\"}}"),
                        /*sync=*/false);
    written.push_back(tmp + "/" + kMetadata);
    written.push_back(tmp + "/zarr.json");
    pause();
  }
  written.push_back(tmp);
  ckpt_fs::fsync_all(written);
  barrier("written");  // hook for the communicator: every process's chunks are durable past here
  if (!primary) return;
  // The commit: the marker inside the directory, then the rename to the final name.
  ckpt_fs::write_file(tmp + "/" + kMarker, "step " + std::to_string(job.step) + "\n");
  ckpt_fs::fsync_dir(tmp);
  commit();
}

}  // namespace

void write_checkpoint(const std::string& checkpoint_dir, const Checkpoint& c, const CheckpointOptions& options) {
  std::string dir = checkpoint_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir.empty() || dir == "/" || dir == "." || dir == "..")
    throw UserError("[checkpoint] write_checkpoint: '" + checkpoint_dir +
                    "' cannot be a checkpoint directory; give a new directory's path, e.g. run/ckpt");
  // Never delete what is not a checkpoint: a file or another directory at the path is refused.
  if (ckpt_fs::exists(dir) && !(ckpt_fs::is_dir(dir) && is_committed(dir)))
    throw UserError("[checkpoint] " + dir + " exists and is not a committed checkpoint (no " + kMarker +
                    " in it), so it is not replaced; remove it or save to another path");
  check_entries(c);
  Job job;
  build_job(c, options.zstd_level, /*staging=*/nullptr, job);
  const std::string tmp = dir + kTmpSuffix;
  write_job(
      job, tmp, options,
      [&] {
        make_dirs(parent_of(dir));
        ckpt_fs::remove_tree(tmp);  // left by a save that did not finish
        ckpt_fs::make_dir(tmp);
        ckpt_fs::fsync_dir(parent_of(dir));
      },
      [&] {
        // A committed checkpoint already there is swapped out in one step, so the path always
        // holds a committed checkpoint, then deleted.
        if (ckpt_fs::exists(dir)) {
          ckpt_fs::exchange(tmp, dir);
          ckpt_fs::fsync_dir(parent_of(dir));
          ckpt_fs::remove_tree(tmp);
        } else {
          ckpt_fs::rename(tmp, dir);
        }
        ckpt_fs::fsync_dir(parent_of(dir));
      });
}

CheckpointManager::CheckpointManager(std::string dir, CheckpointOptions options)
    : dir_(std::move(dir)), options_(std::move(options)), pending_(std::make_unique<Pending>()) {
  if (dir_.empty()) throw Error("[checkpoint] the checkpoint directory is empty; pass e.g. JOB_DIR/checkpoints");
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
  if (options_.keep_last < 0) throw Error("[checkpoint] keep_last must be >= 0 (0 keeps every checkpoint)");
  if (options_.keep_every < 0) throw Error("[checkpoint] keep_every must be >= 0 (0: none kept for their step)");
  // zstd clamps an out-of-range level when it compresses, but the level is also written to each
  // array's zarr.json, which readers check: refuse it here rather than commit what cannot be read.
  const int lo = zarr::min_zstd_level(), hi = zarr::max_zstd_level();
  if (options_.zstd_level < lo || options_.zstd_level > hi)
    throw UserError("[checkpoint] zstd_level " + std::to_string(options_.zstd_level) + " is out of range; use " +
                    std::to_string(lo) + " .. " + std::to_string(hi) +
                    " (1: fast, the default; higher: smaller and slower; 0: zstd's default, 3; negative: faster and "
                    "larger)");
  if (options_.background_nice < 0 || options_.background_nice > 19)
    throw UserError("[checkpoint] background_nice " + std::to_string(options_.background_nice) +
                    " is out of range; use a nice value 0 .. 19 (19, the default: yield the cores to training)");
}

CheckpointManager::~CheckpointManager() {
  if (pending_->thread.joinable()) pending_->thread.join();
  if (pending_->error) {
    try {
      std::rethrow_exception(pending_->error);
    } catch (const std::exception& e) {
      PX_LOG(error) << "[checkpoint] the asynchronous save of step " << pending_->step
                    << " failed and nobody waited for it: " << e.what();
    }
  }
}

std::string CheckpointManager::path(int64_t step) const { return dir_ + "/" + step_dir_name(step); }
std::vector<int64_t> CheckpointManager::steps() const { return committed_steps(dir_); }
std::optional<int64_t> CheckpointManager::latest_step() const {
  auto s = steps();
  if (s.empty()) return std::nullopt;
  return s.back();
}
bool CheckpointManager::pending() const { return pending_->thread.joinable(); }

void CheckpointManager::wait() {
  ExclusiveCall call(pending_->busy, kManagerCalls);
  wait_pending();
}

void CheckpointManager::wait_pending() {
  if (pending_->thread.joinable()) pending_->thread.join();
  if (std::exception_ptr e = std::exchange(pending_->error, nullptr)) std::rethrow_exception(e);
}

void CheckpointManager::check_saveable(const Checkpoint& c) const {
  check_entries(c);
  const std::string who = "[checkpoint] step " + std::to_string(c.step) + ": ";
  std::vector<int64_t> done = steps();
  if (std::binary_search(done.begin(), done.end(), c.step))
    throw Error(who + "a committed checkpoint of this step already exists at " + path(c.step) +
                "; remove(" + std::to_string(c.step) + ") it first to replace it");
  if (!done.empty() && done.back() > c.step)
    throw Error(who + "older than the committed step " + std::to_string(done.back()) + " in " + dir_ +
                ", which would stay the latest; remove(" + std::to_string(done.back()) +
                ") the newer checkpoints to continue from an earlier one, or save into another directory");
}

void CheckpointManager::save(const Checkpoint& c) {
  ExclusiveCall call(pending_->busy, kManagerCalls);
  wait_pending();
  check_saveable(c);
  Job job;
  build_job(c, options_.zstd_level, /*staging=*/nullptr, job);  // the caller's buffers: it waits
  write(job);
}

void CheckpointManager::save_async(const Checkpoint& c) {
  ExclusiveCall call(pending_->busy, kManagerCalls);
  wait_pending();
  check_saveable(c);
  auto job = std::make_shared<Job>();
  build_job(c, options_.zstd_level, &pending_->staging, *job);
  pending_->step = c.step;
  pending_->thread = std::thread([this, job] {
    // The training loop's threads come first: a writer preempting an OpenMP worker stalls the
    // whole step. Threads this one starts inherit the priority.
    if (options_.background_nice > 0)
      (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), options_.background_nice);
    try {
      write(*job);
    } catch (...) {
      pending_->error = std::current_exception();
    }
    for (Job::ArrayJob& a : job->arrays)
      for (auto& chunk : a.chunks) pending_->staging.push_back(std::move(chunk.second));
  });
}

void CheckpointManager::write(Job& job) {
  const std::string final_dir = path(job.step), tmp = final_dir + kTmpSuffix;
  auto prepare = [&] {
    make_dirs(dir_);
    // Leftovers of a crash: temporary and half-deleted directories, and any step directory
    // without its commit marker. None of them was ever taken for a checkpoint.
    for (const std::string& n : ckpt_fs::list_dir(dir_)) {
      bool stale = false;
      if (n.rfind("checkpoint_", 0) == 0) {
        if (n.size() > 4 && (n.ends_with(kTmpSuffix) || n.ends_with(kDeletingSuffix))) stale = true;
        else if (parse_step_dir(n) && !is_committed(dir_ + "/" + n)) stale = true;
      }
      if (stale) ckpt_fs::remove_tree(dir_ + "/" + n);
    }
    ckpt_fs::make_dir(tmp);
    ckpt_fs::fsync_dir(dir_);
  };
  bool committed = false;
  write_job(job, tmp, options_, prepare, [&] {
    ckpt_fs::rename(tmp, final_dir);
    ckpt_fs::fsync_dir(dir_);
    committed = true;
  });
  if (!committed) return;  // another process commits

  // Keep policy, now that a newer checkpoint is committed.
  std::vector<int64_t> all = steps();
  std::set<int64_t> keep;
  for (size_t i = 0; i < all.size(); ++i) {
    bool recent = options_.keep_last == 0 || i + static_cast<size_t>(options_.keep_last) >= all.size();
    bool every = options_.keep_every > 0 && all[i] % options_.keep_every == 0;
    if (recent || every || all[i] == job.step) keep.insert(all[i]);
  }
  for (int64_t s : all) {
    if (keep.count(s)) continue;
    // Renamed first, so that a crash half-way through the deletion never leaves a committed-looking torn dir.
    std::string gone = path(s) + kDeletingSuffix;
    ckpt_fs::rename(path(s), gone);
    ckpt_fs::fsync_dir(dir_);
    ckpt_fs::remove_tree(gone);
  }
}

void CheckpointManager::remove(int64_t step) {
  ExclusiveCall call(pending_->busy, kManagerCalls);
  wait_pending();
  std::string p = path(step);
  if (!ckpt_fs::is_dir(p)) throw Error("[checkpoint] no checkpoint of step " + std::to_string(step) + " in " + dir_);
  std::string gone = p + kDeletingSuffix;
  ckpt_fs::rename(p, gone);
  ckpt_fs::fsync_dir(dir_);
  ckpt_fs::remove_tree(gone);
}

}  // namespace px
