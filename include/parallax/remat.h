// Memory options of a training step: rematerialization (recompute forward values in the backward
// pass instead of keeping them) and offload (params and optimizer state in pinned_host memory),
// and px::remat to wrap one function or block in a policy of its own. docs/memory.md.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {

// Rematerialization: which forward values the backward pass reads as saved, and which it
// recomputes from them (see remat_step and docs/memory.md). Layers are what lies between values
// tagged "layer_input" (px::tag; TransformerLm tags each block's input and the last block's output
// "layers_end"); a program without such tags is one layer whose inputs are the graph's inputs.
enum class RematPolicy {
  none,              // save everything the backward pass reads
  full,              // in each layer save only its input; recompute the rest of the layer
  nothing_saveable,  // full, and outside the layers too (embedding, head and loss recomputed)
  dots_saveable,     // in each layer save contraction outputs (dot_general, fused attention) and the input
  dots_with_no_batch_dims_saveable,  // only matmuls without batch dims (weights, not attention)
  names,                             // in each layer save the values tagged with one of RematOptions::names
  // dots_saveable, with the saved values and the layer inputs kept in pinned_host memory: sent
  // there in the forward pass, fetched back (a layer ahead) for the backward pass
  offload,
  // The least recompute whose planned per-device peak fits RematOptions::budget_bytes (else
  // CompileOptions::memory_limit_bytes): full remat of the fewest layers, else nothing_saveable;
  // chosen by the buffer planner itself.
  automatic,
};
const char* remat_policy_name(RematPolicy p);
RematPolicy parse_remat_policy(const std::string& name);  // throws naming the policies

// A function of tensors, e.g. one block of a model.
using TensorFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
// Wraps fn so that, in a traced training step, the forward values it computes follow `policy`
// (saved for the backward pass or recomputed there), whatever the step's RematOptions say; `names`
// for RematPolicy::names. Not RematPolicy::automatic (it needs the whole step's budget).
TensorFn remat(TensorFn fn, RematPolicy policy, std::vector<std::string> names = {});
// A stack of blocks run in order (each block's results are the next one's operands), each block
// rematerialized by `policy` on its own.
TensorFn remat_model(std::vector<TensorFn> blocks, RematPolicy policy);

struct RematOptions {
  RematPolicy policy = RematPolicy::none;
  std::vector<std::string> names;  // names: globs of px::tag names to save
  int layers = -1;                 // apply the policy to the first `layers` layers only (-1: all)
  int64_t budget_bytes = 0;        // automatic: the per-device peak to fit (0: the compile limit)
};

// Offload: what lives in pinned_host memory between steps instead of device memory (see
// offload_step and docs/memory.md). An offloaded param is fetched to device memory before its
// uses (again for the backward pass) and freed after them; fetches start `prefetch_depth` layers
// ahead and run on the backend's copy stream, overlapped with compute.
struct OffloadOptions {
  std::vector<std::string> params;  // globs of param paths ("*": all); each must match a param
  bool optimizer_state = false;     // keep the optimizer state on the host and run the update there
  int prefetch_depth = 1;           // layers fetched ahead of the one computing (0: fetch at first use)
};

}  // namespace px
