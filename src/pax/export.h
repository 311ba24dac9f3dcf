// pax export's options beyond the public export_checkpoint (parallax/pax.h): the dtype and shard
// size of a Hugging Face export. The special ids and tokenizer files come from the run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "parallax/core.h"
#include "parallax/pax.h"

namespace px::pax {

struct ExportOptions {
  std::string format = "hf";    // hf (a model dir) or safetensors (one file of the checkpoint's params)
  std::optional<int64_t> step;  // latest when empty
  DType dtype = DType::f32;     // hf: f32, bf16 or f16
  int64_t max_shard_bytes = 0;  // hf: > 0 splits the weights into shards of at most this size
};

// Returns the step exported. hf: special ids (bos/eos/pad) in config.json and generation_config.json,
// from train.init_from_hf's directory (with its tokenizer files copied) or else from the run's tokenizer.
int64_t export_run(const ExperimentConfig& c, const RunOptions& opts, const std::string& out, const ExportOptions& x);

}  // namespace px::pax
