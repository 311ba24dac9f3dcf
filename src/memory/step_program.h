// The traced training step as the passes see it (internal): the program and what its parts are,
// and the memory passes over it (remat, offload). trace_train_step (src/train/trace_step.cc) makes
// one; compile_step (src/train/compile_step.cc) runs the passes in order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
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
  std::vector<std::string> paths;          // per param
  std::vector<int> grads;                  // per param: the value of its gradient (before clipping)
  // The step's microbatches, in node order (one for an unsplit step). Microbatch k's forward nodes
  // are [begin(k), forward_end): they slice its rows of the batch and compute its loss; its
  // backward nodes [forward_end, backward_end) compute its gradients and add them to the sum of
  // the earlier microbatches'. After the last microbatch: the mean loss and gradients, clipping
  // and the update.
  struct Microbatch {
    int forward_end = 0, backward_end = 0;
    std::vector<int> grads;  // per param: this microbatch's gradient (for one microbatch, = grads)
  };
  std::vector<Microbatch> micro;
  // What each value holds and where it lives are facts on the graph's values (ValueInfo).
  StepProgram clone() const;               // a deep copy (the passes take programs by value)

  int begin(size_t k) const { return k == 0 ? 0 : micro[k - 1].backward_end; }
  int backward_end() const { return micro.empty() ? 0 : micro.back().backward_end; }
  // The microbatch whose forward pass node i belongs to; -1 for the backward nodes and after.
  int forward_of(int i) const;
  bool is_forward(int i) const { return forward_of(i) >= 0; }
  // After a pass that rebuilt the nodes: start[i] is where old node i's nodes begin in the new
  // program (what the pass added before it included), start[old size] the new size.
  void remap_nodes(const std::vector<int>& start);
  // The same after a pass that renumbered the values: value v is now new_id[v].
  void remap_grads(const std::function<int(int)>& new_id);
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
