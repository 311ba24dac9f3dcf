// The collectives as memory operations over buffers addressed by mesh position, shared by the
// communicators whose participants all live in one OS process: the in-process one (every position
// is local) and the threaded world (each "process" computes only its own positions' outputs,
// reading the other processes' inputs once they have arrived).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "parallax/communicator.h"

namespace px::collective_math {

// One call's buffers by mesh position: every participant's input, and the outputs this caller
// computes (nullptr where another caller computes them). An output may be its own position's
// input only for all_reduce (in place, when nobody else reads that input during the call).
struct PositionBuffers {
  std::vector<const std::byte*> in;
  std::vector<std::byte*> out;
};

// Reductions run in group order (bitwise deterministic whichever caller computes them); 16-bit
// floats accumulate in f32 and round once. Parallelized over elements with OpenMP.
void all_reduce(const PositionBuffers& b, int64_t count, DType t, ReduceOp op, const DeviceGroups& groups);
void all_gather(const PositionBuffers& b, int64_t count, DType t, const DeviceGroups& groups);
void reduce_scatter(const PositionBuffers& b, int64_t count, DType t, ReduceOp op, const DeviceGroups& groups);
void all_to_all(const PositionBuffers& b, int64_t count, DType t, const DeviceGroups& groups);
// Computed outputs that receive nothing are zero-filled.
void permute(const PositionBuffers& b, int64_t count, DType t, const std::vector<std::pair<int, int>>& pairs);
void broadcast(const PositionBuffers& b, int64_t count, DType t, int root, const DeviceGroups& groups);

}  // namespace px::collective_math
