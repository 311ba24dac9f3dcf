// Collective nodes of a local program as the runtime runs them: the layout packing around a
// Communicator call (blocks along a dim that is not leading are made contiguous in scratch by the
// backend's copy_boxes).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "parallax/communicator.h"
#include "parallax/graph.h"

namespace px {

// The device groups of one collective node (mesh positions), resolved by the sharding layer.
struct CollectiveGroups {
  DeviceGroups groups;
  std::vector<std::pair<int, int>> pairs;  // collective_permute: (source, target) positions
};

// A collective of the schedule as the runtime runs it: a CollectiveKind through the Communicator,
// or (transfer) a copy between memory kinds on the backend's copy stream.
struct CollectiveOp {
  CollectiveKind kind = CollectiveKind::all_reduce;
  bool transfer = false;
  std::string name() const;  // "all_gather", ... or "transfer" (timelines, errors)
  DType dtype = DType::f32;
  Shape in_shape, out_shape;
  int dim = -1, concat_dim = -1;
  ReduceOp op = ReduceOp::sum;
  CollectiveGroups groups;
  int64_t n = 1;              // group size
  int64_t scratch_in = 0;     // elements of packing scratch needed per device (0: none)
  int64_t scratch_out = 0;
};

// The op of a collective node (a primitive whose spmd.collective is set).
CollectiveOp make_collective_op(const Graph& g, const Node& n, CollectiveGroups groups);

// Starts the collective for every local device at once (one buffer per device in each list;
// scratch as sized by the op), the packing around it on `backend`. The returned handle is waited
// before the result is read. `stage`: the buffers are device memory the host cannot reach and the
// communicator reads host memory (the caller decides: Communicator::reads_device_memory,
// Backend::host_visible): each call goes through host copies (and returns complete).
CollectiveHandle start_collective(Communicator& comm, Backend& backend, const CollectiveOp& c, const Buffers& ins,
                                  const MutBuffers& outs, const MutBuffers& scratch_in, const MutBuffers& scratch_out,
                                  bool stage = false);

}  // namespace px
