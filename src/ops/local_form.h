// Helpers for the local forms of primitives whose split factor needs this device's position in
// the mesh (SpmdTraits::local_form): each family file writes its primitive's local form beside
// the primitive with these, using public ops plus the context's all-reduces, so that the sharded
// program gives the unsharded values up to f32 reduction order. The partitioner
// (src/sharding/partitioner.cc) calls them through the primitive.
#pragma once

#include <vector>

#include "ir/primitive.h"

namespace px::local_form {

Tensor i32_scalar(int64_t v);
// The first global index of this device's block of `block` elements along a dim split over
// `axes` (first axis major), from the coordinates input.
Tensor block_start(const spmd::LocalContext& c, const std::vector<int>& axes, int64_t block);
// Broadcasts a mask over the leading dims of `like` (the mask's dims come first).
Tensor mask_like(const Tensor& mask, const Tensor& like);

// Global row indices clamped like take / scatter_add do, then made relative to this device's
// block of `local_rows`; `inside` says which fall in the block (the others read row 0).
struct LocalRows {
  Tensor rel, inside;
};
LocalRows local_rows(const spmd::LocalContext& c, const Tensor& idx, int64_t rows, int64_t local_rows,
                     const std::vector<int>& axes);

// The mesh axes of the primitive's one positional factor (take, scatter_add, cross entropy).
const std::vector<int>& positional_axes(const LocalFormArgs& a);

}  // namespace px::local_form
