// The traced training step as the passes see it (internal): the program and what its parts are,
// and the memory passes over it (remat, offload). trace_train_step (src/train/trace_step.cc) makes
// one; compile_step (src/train/compile_step.cc) runs the passes in order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallax/graph.h"
#include "parallax/remat.h"
#include "parallax/runtime.h"

namespace px {

// The traced training step and what its parts are: the input of the sharding decision, the
// memory report and the passes after it.
struct StepProgram {
  std::unique_ptr<Graph> graph;  // inputs: params, optimizer state ("<path>.<slot>"), batch, step (i32)
                                 // outputs: loss, gradient norm, learning rate, new params, new state
  size_t n_params = 0, n_state = 0, n_batch = 0;
  std::vector<std::string> paths;  // per param
  // The step's microbatches (1 for an unsplit step). Which node belongs to which microbatch's
  // forward or backward pass, or to the clipping and update after the last one, is a fact on the
  // node (NodeFacts); which value is a param's gradient, a fact on the value (ValueInfo::grad_of,
  // micro_grad_of); what each value holds and where it lives too. Every pass carries them.
  int microbatches = 1;
  StepProgram clone() const;  // a deep copy (the passes take programs by value)

  // Per param, the value of its gradient: the step's (before clipping), or microbatch k's.
  std::vector<int> grads() const;
  std::vector<int> micro_grads(int k) const;
  // The facts of node i, and whether it is in a forward pass.
  const NodeFacts& facts(int i) const { return graph->nodes()[static_cast<size_t>(i)].facts; }
  bool is_forward(int i) const { return facts(i).phase == StepPhase::forward; }
  // [first, last + 1) of the nodes in microbatch k's `phase` ({0, 0} when it has none).
  std::pair<int, int> span(StepPhase phase, int k) const;
};

// The remat pass: the same step in which the backward pass reads only the forward values the
// policy saves; every other forward value it reads is recomputed (a copy of the forward nodes that
// produce it, from saved values and inputs) just before its first use there, so the forward
// value is freed after its last forward use. Results are bitwise those of the program without
// remat. `recomputed_flops` (optional) receives the FLOPs of the copies.
StepProgram remat_step(StepProgram p, const RematOptions& options, double* recomputed_flops = nullptr);
// RematPolicy::automatic: the first policy of [none, full on the first 1, 2, ... layers,
// nothing_saveable] whose planned peak (`peak_of`, bytes per device) is at most `budget`; throws
// px::UserError with the peaks of none and nothing_saveable when even that does not fit.
// `chosen` (optional) receives the policy it settled on.
StepProgram remat_automatic(StepProgram p, int64_t budget, const std::function<int64_t(const StepProgram&)>& peak_of,
                            RematOptions* chosen = nullptr);

// The offload pass: inputs chosen by `options` live in pinned_host memory; every device use of one
// reads a copy fetched by a `transfer` node (px::to_memory) just before (one fetch per cluster of
// nearby uses, so forward and backward fetch separately), and values crossing to the other memory
// kind are transferred. With optimizer_state, the clipping and update nodes run on the host and
// read the gradients transferred there. Results are bitwise those without offload.
StepProgram offload_step(StepProgram p, const OffloadOptions& options);
// Where each param (by `paths`) and then each of the n_state optimizer state arrays lives under
// `options`; throws px::UserError for a pattern that matches no param or a negative prefetch depth.
std::vector<MemoryKind> offloaded_state(const OffloadOptions& options, const std::vector<std::string>& paths,
                                        size_t n_state);

}  // namespace px
