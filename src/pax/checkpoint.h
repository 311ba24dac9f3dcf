// Checkpoints of a pax run behind one small interface: DIR/checkpoints/checkpoint_%08d/ holds the
// step's state (TrainStep's safetensors format for now) and meta.json (step, data position).
// A checkpoint appears atomically (written under a temporary name, then renamed); the newest
// `keep` are kept.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallax/nn.h"
#include "pax/step_runner.h"

namespace px::pax {

class Checkpoints {
 public:
  Checkpoints(std::string job_dir, int64_t keep);
  void save(int64_t step, const StepRunner& runner, const std::string& data_state);
  std::optional<int64_t> latest() const;
  std::vector<int64_t> steps() const;  // complete checkpoints, oldest first
  // Loads the checkpoint into the runner and returns its data state; throws naming the folder.
  std::string restore(int64_t step, StepRunner& runner) const;
  std::string path(int64_t step) const;
  // The params of the checkpoint at `step` (the latest when empty; set to the one read), checked
  // against the model's paths and types; for eval and decode, without optimizer state.
  std::vector<Array> params(std::optional<int64_t>& step, const nn::TransformerLm& model) const;

 private:
  std::string dir_;
  int64_t keep_;
};

}  // namespace px::pax
