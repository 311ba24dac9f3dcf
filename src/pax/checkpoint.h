// Checkpoints of a pax run: DIR/checkpoints/checkpoint_%08d/ in the library's format (every param
// and optimizer-state tensor a Zarr v3 array chunked by its shards, zstd + crc32c, metadata with
// the step, the resolved config and the data position; committed atomically; include
// parallax/checkpoint.h). Saves are asynchronous: the state is copied and training goes on while
// a background thread writes; the newest `keep` are kept. Under mpirun (several processes) every
// process writes its own shards synchronously, between the barriers of a multi-process save.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallax/checkpoint.h"
#include "parallax/nn.h"
#include "pax/step_runner.h"

namespace px::pax {

class Checkpoints {
 public:
  Checkpoints(const std::string& job_dir, int64_t keep);
  // Starts writing the runner's state (copied before returning); throws the previous save's error.
  void save(int64_t step, const StepRunner& runner, const std::string& config_json, const std::string& data_state);
  void wait();  // until the pending save is committed; throws its error
  // The step of the last save once it is committed (its COMMITTED marker is on disk), returned
  // once; nullopt while it is being written or when there is none. Does not wait.
  std::optional<int64_t> newly_committed();
  // Waits for the pending save (throwing its error) and returns its step when there was one.
  std::optional<int64_t> finish();
  std::optional<int64_t> latest() const;
  std::vector<int64_t> steps() const;  // committed checkpoints, oldest first
  // "4, 8, 12" (or "none"), for errors that name a step.
  std::string steps_text() const;
  // Loads the checkpoint into the runner (onto its shardings) and returns its data state; throws
  // naming the folder, the array and the chunk at fault.
  std::string restore(int64_t step, StepRunner& runner) const;
  std::string path(int64_t step) const;
  // Renames the committed checkpoints newer than `step` to checkpoint_N.discarded (no longer
  // listed, nothing deleted); returns their new paths.
  std::vector<std::string> set_aside_after(int64_t step);
  // The params of the checkpoint at `step` (the latest when empty; set to the one read), checked
  // against the model's paths and types; for eval, decode and export, without optimizer state.
  std::vector<Array> params(std::optional<int64_t>& step, const nn::TransformerLm& model) const;

 private:
  CheckpointManager mgr_;
  std::optional<int64_t> unreported_;  // saved, and not yet reported committed
};

}  // namespace px::pax
