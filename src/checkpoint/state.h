// A training state as a checkpoint holds it (internal): params by path (group "params"), then
// optimizer state "<path>.<slot>" (group "opt_state"), the step, and the optimizer's name. The
// same checks apply to both formats: a Zarr checkpoint's metadata and an imported safetensors file.
#pragma once

#include <string>
#include <vector>

#include "parallax/checkpoint.h"

namespace px::ckpt {

inline constexpr const char* kParamsGroup = "params";
inline constexpr const char* kOptStateGroup = "opt_state";

struct StateLayout {
  std::vector<std::string> names;  // params, then optimizer state
  std::vector<TensorType> types;
  size_t n_params = 0;
  std::string optimizer;  // optim::Optimizer::name()
};

// Throws px::UserError naming `where`, the tensor and the fix when `arrays` (their names and types)
// and `optimizer` (the recorded one; "" when none is) are not the layout's: another optimizer, a
// tensor the layout lacks (another model), a missing tensor or one of another type. Reads no chunk.
void check_state(const std::vector<CheckpointArrayInfo>& arrays, const std::string& optimizer, const StateLayout& l,
                 const std::string& where);

// The names and types of a checkpoint in memory, for check_state.
std::vector<CheckpointArrayInfo> array_infos(const Checkpoint& c);

}  // namespace px::ckpt
