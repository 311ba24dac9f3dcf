// The single-file training checkpoint of TrainStep (internal), on one device or a mesh: one
// safetensors file, params named by path, optimizer state "<path>.<slot>", metadata "step" and
// "optimizer". Every step writes and reads full arrays through these, so any mesh loads what another saved.
#pragma once

#include <string>
#include <vector>

#include "parallax/train.h"

namespace px::detail {

// The names and types of a model's checkpoint tensors: params first, then optimizer state.
struct CheckpointLayout {
  std::vector<std::string> names;
  std::vector<TensorType> types;
  size_t n_params = 0;
  std::string optimizer;  // Optimizer::name(), written to the metadata
};

CheckpointLayout checkpoint_layout(const nn::ParamStore& store, const optim::Optimizer& opt);

// Writes full host arrays in the layout's order. `who` (e.g. "TrainStep") names the caller in errors.
void write_checkpoint(const std::string& path, const CheckpointLayout& layout, const std::vector<Array>& params,
                      const std::vector<Array>& opt_state, int64_t step, const std::string& who);

// A state of full arrays, as a checkpoint holds it.
struct FullState {
  std::vector<Array> params;
  std::vector<Array> opt_state;
  int64_t step = 0;
};

// Reads a file written by write_checkpoint: every tensor of the layout must be there with its type,
// no other tensor may be, and the step must be a non-negative integer the traced step can hold.
FullState read_checkpoint(const std::string& path, const CheckpointLayout& layout);

// The traced step input (i32, the count of updates so far) for `step`; throws px::UserError naming
// `who` when it does not fit (the step computes step + 1, so at most 2^31 - 2).
int32_t traced_step(int64_t step, const std::string& who);

// Parses a checkpoint's "step" metadata strictly: decimal digits only, 0 <= step <= 2^31 - 2.
int64_t parse_checkpoint_step(const std::string& text, const std::string& path);

// Metrics from the step's first three outputs (loss, grad norm, lr); `skip` says whether the graph
// was traced with skip_nonfinite (then a non-finite step left params and state unchanged).
StepMetrics step_metrics(float loss, float grad_norm, float lr, bool skip);

}  // namespace px::detail
