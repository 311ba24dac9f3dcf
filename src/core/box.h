// Copies of rectangular boxes between row-major buffers: the data movement under shard(),
// gather(), local_slice and the layout packing around collectives.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "parallax/core.h"

namespace px {

// Copies the box of extent `box` at `src_off` in a row-major `src_shape` buffer to `dst_off` in a
// `dst_shape` buffer; elements are `elem` bytes. Never allocates; ranks up to 16.
void copy_box(const void* src, const Shape& src_shape, const int64_t* src_off, void* dst, const Shape& dst_shape,
              const int64_t* dst_off, const Shape& box, int64_t elem);

}  // namespace px
