#include "core/box.h"

namespace px {

namespace {
// Row-major strides in elements.
void strides_of(const Shape& s, int64_t* st) {
  int64_t acc = 1;
  for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
}
}  // namespace

void copy_box(const void* src, const Shape& src_shape, const int64_t* src_off, void* dst, const Shape& dst_shape,
              const int64_t* dst_off, const Shape& box, int64_t elem) {
  const int r = static_cast<int>(box.size());
  for (int64_t b : box)
    if (b == 0) return;
  auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  if (r == 0) {
    std::memcpy(d, s, static_cast<size_t>(elem));
    return;
  }
  int64_t sst[16], dst_st[16], idx[16];
  strides_of(src_shape, sst);
  strides_of(dst_shape, dst_st);
  // Merge the contiguous tail: the last dim is copied with one memcpy per row.
  const int64_t row = box[r - 1] * elem;
  int64_t rows = 1;
  for (int k = 0; k < r - 1; ++k) rows *= box[k];
  for (int k = 0; k < r; ++k) idx[k] = 0;
  for (int64_t n = 0; n < rows; ++n) {
    int64_t so = 0, doff = 0;
    for (int k = 0; k < r; ++k) {
      so += (src_off[k] + idx[k]) * sst[k];
      doff += (dst_off[k] + idx[k]) * dst_st[k];
    }
    std::memcpy(d + doff * elem, s + so * elem, static_cast<size_t>(row));
    for (int k = r - 2; k >= 0; --k) {
      if (++idx[k] < box[k]) break;
      idx[k] = 0;
    }
  }
}

}  // namespace px
