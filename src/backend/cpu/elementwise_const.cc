// CPU kernels for constants (constant, full, iota) and broadcast_in_dim.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "backend/cpu/kernel.h"
#include "backend/cpu/loops.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

constexpr int64_t kChunk = 1 << 14;  // elements per parallel work unit

// Fills n elements of size esize (1, 2 or 4 bytes) with the value whose bytes are at src.
void fill(void* dst, const void* src, int64_t esize, int64_t n) {
  if (esize == 4) {
    uint32_t v;
    std::memcpy(&v, src, 4);
    std::fill_n(static_cast<uint32_t*>(dst), n, v);
  } else if (esize == 2) {
    uint16_t v;
    std::memcpy(&v, src, 2);
    std::fill_n(static_cast<uint16_t*>(dst), n, v);
  } else {
    std::memset(dst, *static_cast<const uint8_t*>(src), static_cast<size_t>(n));
  }
}

Kernel make_full(const KernelSpec& s) {
  const TensorType& t = s.out.at(0);
  uint32_t bits = element_bits(s.attrs.f("value"), t.dtype);
  int64_t esize = dtype_size(t.dtype), count = t.numel();
  return [=](const void* const*, void* const* out) {
    int64_t chunks = (count + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t off = c * kChunk, len = std::min(kChunk, count - off);
      fill(static_cast<std::byte*>(out[0]) + off * esize, &bits, esize, len);
    }
  };
}

Kernel make_constant(const KernelSpec& s) {
  auto value = std::make_shared<Array>(s.attrs.array("value"));  // shares the graph's buffer
  return [value](const void* const*, void* const* out) {
    if (value->nbytes()) std::memcpy(out[0], value->raw(), static_cast<size_t>(value->nbytes()));
  };
}

Kernel make_iota(const KernelSpec& s) {
  const TensorType& t = s.out.at(0);
  int axis = static_cast<int>(s.attrs.i("axis"));
  int64_t outer = 1, inner = 1, n = t.shape.at(axis);
  for (int d = 0; d < axis; ++d) outer *= t.shape[d];
  for (int d = axis + 1; d < t.rank(); ++d) inner *= t.shape[d];
  int64_t esize = dtype_size(t.dtype);
  // One precomputed value per position along the axis, in the target dtype.
  auto line = std::make_shared<std::vector<uint32_t>>(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) (*line)[i] = element_bits(static_cast<double>(i), t.dtype);
  return [=](const void* const*, void* const* out) {
    std::byte* o = static_cast<std::byte*>(out[0]);
    int64_t rows = outer * n;
#pragma omp parallel for schedule(static) if (rows * inner > 4 * kChunk)
    for (int64_t r = 0; r < rows; ++r) fill(o + r * inner * esize, &(*line)[r % n], esize, inner);
  };
}

// broadcast_in_dim as a strided copy. Result dims are collapsed where the operand strides
// allow, so the common cases become a few long runs: a fill (scalar, column) or a memcpy (row).
Kernel make_broadcast(const KernelSpec& s) {
  const TensorType& x = s.in.at(0);
  const TensorType& t = s.out.at(0);
  const std::vector<int64_t>& dims = s.attrs.ints("dims");
  int64_t esize = dtype_size(t.dtype), count = t.numel();
  int r = t.rank();
  // Operand stride (in elements) of every result dim; 0 where the result dim is broadcast.
  std::vector<int64_t> stride(r, 0);
  int64_t st = 1;
  for (int i = x.rank() - 1; i >= 0; --i) {
    if (x.shape[i] != 1) stride[dims[i]] = st;
    st *= x.shape[i];
  }
  // Collapse: drop size-1 dims, merge neighbours whose strides compose.
  std::vector<int64_t> sz, sd;
  for (int d = 0; d < r; ++d) {
    if (t.shape[d] == 1) continue;
    if (!sz.empty() && sd.back() == stride[d] * t.shape[d]) {
      sz.back() *= t.shape[d];
      sd.back() = stride[d];
    } else {
      sz.push_back(t.shape[d]);
      sd.push_back(stride[d]);
    }
  }
  if (sz.empty()) {
    sz.push_back(1);
    sd.push_back(0);
  }
  int64_t row = sz.back(), row_stride = sd.back();  // innermost run: stride 1 (copy) or 0 (fill)
  std::vector<int64_t> osz(sz.begin(), sz.end() - 1), osd(sd.begin(), sd.end() - 1);
  int64_t rows = row == 0 ? 0 : count / row;
  int64_t pieces = (row + kChunk - 1) / kChunk;  // long runs are split for parallelism
  int64_t units = rows * pieces;
  int nouter = static_cast<int>(osz.size());
  return [=](const void* const* in, void* const* out) {
    const std::byte* src = static_cast<const std::byte*>(in[0]);
    std::byte* dst = static_cast<std::byte*>(out[0]);
#pragma omp parallel for schedule(static) if (count > 4 * kChunk)
    for (int64_t u = 0; u < units; ++u) {
      int64_t rw = u / pieces, piece = u % pieces;
      int64_t src_off = 0, rem = rw;
      for (int d = nouter - 1; d >= 0; --d) {
        src_off += (rem % osz[d]) * osd[d];
        rem /= osz[d];
      }
      int64_t lo = piece * kChunk, len = std::min(kChunk, row - lo);
      std::byte* o = dst + (rw * row + lo) * esize;
      if (row_stride == 0) {
        fill(o, src + src_off * esize, esize, len);
      } else {
        std::memcpy(o, src + (src_off + lo) * esize, static_cast<size_t>(len * esize));
      }
    }
  };
}

}  // namespace

void register_constant_kernels() {
  register_kernels({{prims::constant(), make_constant},
                    {prims::full(), make_full},
                    {prims::iota(), make_iota},
                    {prims::broadcast_in_dim(), make_broadcast}});
}

}  // namespace px::cpu
