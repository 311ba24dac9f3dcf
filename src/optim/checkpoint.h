// The training checkpoint format shared by TrainStep and ShardedTrainStep (internal): one
// safetensors file, params named by path, optimizer state "<path>.<slot>", metadata "step" and
// "optimizer". Both steps write and read full arrays through these, so their files are interchangeable.
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

// Reads a file written by write_checkpoint; every tensor of the layout must be there with its type.
TrainState read_checkpoint(const std::string& path, const CheckpointLayout& layout);

}  // namespace px::detail
