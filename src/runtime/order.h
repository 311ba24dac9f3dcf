// Node order passes that run before the schedule (which keeps the graph's order).
#pragma once

#include <memory>
#include <vector>

#include "parallax/runtime.h"

namespace px {

// Update as gradients complete: every node that depends on a value labelled `gradients` (the
// gradient's norm, clipping, the optimizer update, a gradient's collective or transfer) moves to
// just after the last of its operands is computed, so that a gradient is read by its update and
// freed while the backward pass goes on, instead of all gradients being alive at its end. The
// nodes such a node needs that nothing else reads (the learning rate from the step counter) move
// with it, just before their first reader. Every other node keeps its place. Value ids do not
// change (only the order of the nodes and their producer indices). Returns null when the order stays as it is.
std::unique_ptr<Graph> update_as_gradients_complete(const Graph& g);

// The forward pass of a training step (values labelled `gradients`): per node, 1 when
// it leads to a graph output that depends on no gradient (the loss; the learning rate), else 0.
// Empty when no value is a gradient. The floor (MemoryReport::floor_bytes) runs the rest after it.
std::vector<char> forward_nodes(const Graph& g);

}  // namespace px
