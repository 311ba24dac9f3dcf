// Checkpoints: every tensor a Zarr v3 array whose chunks are its shards (zstd + crc32c), JSON
// metadata, atomic commit, asynchronous save, a keep policy, restore onto any sharding, and
// export to safetensors.
//
//   px::CheckpointManager ckpt(job_dir + "/checkpoints", {.keep_last = 3, .keep_every = 1000});
//   px::Checkpoint c(state.step);
//   c.add("blocks.0.w", state.params[0]);               // a ShardedArray, or a plain Array
//   c.add("blocks.0.w.m", state.opt_state[0], "opt_state");
//   c.config_json = resolved_config;                     // any JSON text
//   ckpt.save_async(c);                                  // copies to host buffers, writes in background
//   ...
//   ckpt.wait();                                         // throws if that write failed
//   if (auto step = ckpt.latest_step()) {                // the newest committed checkpoint
//     px::Checkpoint r = ckpt.restore(*step, {.shardings = {{"blocks.0.w", new_sharding}}});
//     px::ShardedArray w = r.get("blocks.0.w");          // on new_sharding's mesh
//   }
//   px::export_safetensors(ckpt.path(*ckpt.latest_step()), "model.safetensors");  // params only
//
// One checkpoint directory without a manager (what TrainStep::save writes):
//   px::write_checkpoint("run/ckpt", c);                // replaces a committed checkpoint there
//   px::Checkpoint r = px::read_checkpoint("run/ckpt", {.shardings = ...});
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/core.h"
#include "parallax/sharding.h"

namespace px {

struct CheckpointEntry {
  std::string name;  // the Zarr array's name: no '/', not starting with "__"
  ShardedArray array;
  std::string group = "params";  // e.g. "params" or "opt_state"; export writes one group
};

// A step's state: named tensors plus JSON documents (text) that resuming needs.
struct Checkpoint {
  int64_t step = 0;
  std::vector<CheckpointEntry> entries;
  std::string config_json = "{}";        // the resolved experiment config
  std::string data_state_json = "null";  // the data iterator's position
  std::string rng_state_json = "null";
  // The optimizer whose state the arrays hold (optim::Optimizer::name(); "" when none is recorded):
  // two optimizers can share slot names, and a restore checks it.
  std::string optimizer;
  std::string library_version;  // filled by restore: the version that wrote the checkpoint

  Checkpoint() = default;
  explicit Checkpoint(int64_t s) : step(s) {}
  void add(std::string name, ShardedArray a, std::string group = "params");
  void add(std::string name, const Array& a, std::string group = "params");  // one device
  bool contains(const std::string& name) const;
  // Throws px::Error listing the names when absent.
  const ShardedArray& get(const std::string& name) const;
  // The whole tensor as one host array (the shard itself on one device, gathered otherwise).
  Array full(const std::string& name) const;
  std::vector<std::string> names(const std::string& group = "") const;  // "" = every group
};

// Which processes take part in a save, and the communicator hooks a multi-process save needs.
struct CheckpointProcesses {
  int index = 0;  // process 0 cleans up, writes the metadata, commits and applies the keep policy
  // Called on every process at two stages of each save: "prepared" (process 0 has cleaned up and
  // made the temporary directory) and "written" (this process's chunks are on disk); the commit
  // marker follows the second. Empty: one process, nothing to wait for.
  std::function<void(const std::string& stage)> barrier;
};

struct CheckpointOptions {
  int keep_last = 3;        // keep the newest N committed checkpoints (0: keep all)
  int64_t keep_every = 0;   // and every step divisible by K (0: none)
  int zstd_level = 1;       // 1 is fast; state of trained floats hardly compresses further
  // Nice value (0..19) of an asynchronous save's threads, so that they yield the cores to training.
  int background_nice = 19;
  CheckpointProcesses processes;
  // Test hook: sleep this long after each file written, so a kill can land inside a write.
  int testing_file_delay_ms = 0;
};

// Where restored tensors go. Arrays without a target sharding come back on one device.
struct RestoreOptions {
  std::map<std::string, Sharding> shardings;
  std::vector<std::string> only;  // restore only these arrays (empty: all)
  std::string group;              // restore only this group (empty: all)
  // For target meshes over several processes: the process whose shards are read and returned
  // (targets on a mesh of one process ignore it).
  int process = 0;
};

struct CheckpointArrayInfo {
  std::string name, group;
  TensorType type;
  Shape chunk_shape;
  std::string mesh;      // the mesh it was saved from: "data:4,model:2" ("" for one device)
  std::string sharding;  // its spec then: "P('data', None)"
};

// A checkpoint's metadata, without reading any chunk.
struct CheckpointInfo {
  int64_t step = 0;
  std::string path, library_version, config_json, data_state_json, rng_state_json, optimizer;
  std::vector<CheckpointArrayInfo> arrays;
};

namespace ckpt {
struct SaveJob;  // what one save writes (internal)
}  // namespace ckpt

// One directory of checkpoints: DIR/checkpoint_%08d/. Only committed checkpoints are seen.
// Threads: save, save_async, wait and remove run one call at a time (a second call from another
// thread meanwhile throws px::UserError); the const calls may run from any thread.
class CheckpointManager {
 public:
  explicit CheckpointManager(std::string dir, CheckpointOptions options = {});
  ~CheckpointManager();  // waits for a pending save; an unreported failure is logged to stderr
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Writes and commits the checkpoint before returning. Throws px::Error on failure.
  void save(const Checkpoint& c);
  // Waits for the previous save (throwing its error), copies the shards this process writes to
  // host buffers and returns; a background thread writes and commits.
  void save_async(const Checkpoint& c);
  // Blocks until the pending save is committed; throws its error (once).
  void wait();
  bool pending() const;

  const std::string& dir() const { return dir_; }
  std::string path(int64_t step) const;  // DIR/checkpoint_%08d
  std::vector<int64_t> steps() const;    // committed, ascending
  std::optional<int64_t> latest_step() const;
  CheckpointInfo info(int64_t step) const;
  // Reads a committed checkpoint onto the requested shardings, checking every chunk's checksum.
  Checkpoint restore(int64_t step, const RestoreOptions& options = {}) const;
  // Reads every chunk and checks it; throws the error restore would give.
  void verify(int64_t step) const;
  // Deletes a committed checkpoint (e.g. a newer one to abandon after restoring an older one).
  void remove(int64_t step);

 private:
  void write(ckpt::SaveJob& job);
  void wait_pending();  // wait() without the one-call-at-a-time check
  void check_saveable(const Checkpoint& c) const;

  std::string dir_;
  CheckpointOptions options_;
  struct Pending;
  std::unique_ptr<Pending> pending_;
};

// Free functions over one checkpoint directory (DIR/checkpoint_%08d, or any directory that
// write_checkpoint wrote).
CheckpointInfo read_checkpoint_info(const std::string& checkpoint_dir);
Checkpoint read_checkpoint(const std::string& checkpoint_dir, const RestoreOptions& options = {});
// Writes c as the one checkpoint `checkpoint_dir` (each process its own shards, as a manager's
// save does; options.processes and zstd_level apply, the keep policy does not) and commits it:
// into DIR.tmp, then swapped with a committed checkpoint already at DIR, which is deleted. Refuses
// to replace a directory that is not a committed checkpoint. Throws px::Error on failure.
void write_checkpoint(const std::string& checkpoint_dir, const Checkpoint& c, const CheckpointOptions& options = {});

// Writes one group (default the params) of a checkpoint as one safetensors file of full arrays
// (metadata: "step", "format"), which safetensors, torch and numpy read.
void export_safetensors(const std::string& checkpoint_dir, const std::string& out_path,
                        const std::string& group = "params");
// The same from a checkpoint in memory (its arrays gathered on this process; "" writes every
// group), with the metadata "step", "group" and, when recorded, "optimizer".
void export_safetensors(const Checkpoint& c, const std::string& out_path, const std::string& group = "params");
// Reads a safetensors file (e.g. an export, or weights from another tool) as a Checkpoint of
// one group, each array placed on options.shardings (one device when absent); the metadata's
// "step" and "optimizer" when present.
Checkpoint import_safetensors(const std::string& path, const RestoreOptions& options = {},
                              const std::string& group = "params");

}  // namespace px
