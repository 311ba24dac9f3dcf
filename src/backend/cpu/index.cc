// CPU kernels of the index family. Indices out of [0, rows) are clamped by take and scatter_add
// (as the primitives document). scatter_add is deterministic: a counting sort groups the updates
// by destination row, then each (row, column block) is summed by one thread in index order.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "backend/cpu/kernel.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

inline int64_t clamp_row(int32_t i, int64_t rows) { return i < 0 ? 0 : (i >= rows ? rows - 1 : i); }

Kernel make_take(const KernelSpec& spec) {
  const TensorType& table = spec.in[0];
  int64_t rows = table.shape[0];
  int64_t row_bytes = rows == 0 ? 0 : table.nbytes() / rows;
  if (rows == 0) row_bytes = dtype_size(table.dtype) * numel(Shape(table.shape.begin() + 1, table.shape.end()));
  int64_t n = spec.in[1].numel();
  return [rows, row_bytes, n](const void* const* in, void* const* out) {
    if (row_bytes == 0 || n == 0) return;
    const std::byte* t = static_cast<const std::byte*>(in[0]);
    const int32_t* idx = static_cast<const int32_t*>(in[1]);
    std::byte* o = static_cast<std::byte*>(out[0]);
#pragma omp parallel for schedule(static) if (n * row_bytes > (256 << 10) && n > 1)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(o + i * row_bytes, t + clamp_row(idx[i], rows) * row_bytes, static_cast<size_t>(row_bytes));
  };
}

// ---- scatter_add --------------------------------------------------------------------------------

constexpr int64_t kCols = 1024;  // columns per work item

template <class T>
struct Accum;  // how one column block of a destination row is summed

template <>
struct Accum<float> {
  static void run(const float* upd, const int64_t* ord, int64_t b, int64_t e, int64_t d, int64_t c0, int64_t w,
                  float* dst, DType) {
    const float* first = upd + ord[b] * d + c0;
    for (int64_t c = 0; c < w; ++c) dst[c] = first[c];
    for (int64_t k = b + 1; k < e; ++k) {
      const float* u = upd + ord[k] * d + c0;
      for (int64_t c = 0; c < w; ++c) dst[c] += u[c];
    }
  }
};

template <>
struct Accum<int32_t> {
  static void run(const int32_t* upd, const int64_t* ord, int64_t b, int64_t e, int64_t d, int64_t c0, int64_t w,
                  int32_t* dst, DType) {
    uint32_t* o = reinterpret_cast<uint32_t*>(dst);  // wrapping adds
    for (int64_t c = 0; c < w; ++c) o[c] = static_cast<uint32_t>(upd[ord[b] * d + c0 + c]);
    for (int64_t k = b + 1; k < e; ++k) {
      const int32_t* u = upd + ord[k] * d + c0;
      for (int64_t c = 0; c < w; ++c) o[c] += static_cast<uint32_t>(u[c]);
    }
  }
};

// 16-bit floats: accumulate in f32, round once.
template <>
struct Accum<uint16_t> {
  static void run(const uint16_t* upd, const int64_t* ord, int64_t b, int64_t e, int64_t d, int64_t c0, int64_t w,
                  uint16_t* dst, DType t) {
    float acc[kCols], buf[kCols];
    load_f32(upd, t, ord[b] * d + c0, acc, w);
    for (int64_t k = b + 1; k < e; ++k) {
      load_f32(upd, t, ord[k] * d + c0, buf, w);
      for (int64_t c = 0; c < w; ++c) acc[c] += buf[c];
    }
    store_f32(acc, dst, t, 0, w);
  }
};

template <class T>
Kernel make_scatter_typed(int64_t nidx, int64_t rows, int64_t d, DType dtype) {
  // Scratch for the counting sort, owned by the kernel: end offsets per row and the order.
  auto ends = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(rows + 1));
  auto order = std::make_shared<std::vector<int64_t>>(static_cast<size_t>(std::max<int64_t>(nidx, 1)));
  int64_t ncb = (d + kCols - 1) / kCols;
  return [=](const void* const* in, void* const* out) {
    if (rows == 0 || d == 0) return;
    const int32_t* idx = static_cast<const int32_t*>(in[0]);
    const T* upd = static_cast<const T*>(in[1]);
    T* o = static_cast<T*>(out[0]);
    int64_t* end = ends->data();
    int64_t* ord = order->data();
    std::fill(end, end + rows + 1, 0);
    for (int64_t i = 0; i < nidx; ++i) ++end[clamp_row(idx[i], rows) + 1];
    for (int64_t r = 0; r < rows; ++r) end[r + 1] += end[r];
    // end[r] is row r's begin; placing advances it to row r's end (= row r + 1's begin).
    for (int64_t i = 0; i < nidx; ++i) ord[end[clamp_row(idx[i], rows)]++] = i;
    int64_t items = rows * ncb;
#pragma omp parallel for schedule(dynamic, 16) if (items > 1 && (nidx + rows) * d > (64 << 10))
    for (int64_t it = 0; it < items; ++it) {
      int64_t r = it / ncb, c0 = it % ncb * kCols, w = std::min(kCols, d - c0);
      int64_t b = r == 0 ? 0 : end[r - 1], e = end[r];
      T* dst = o + r * d + c0;
      if (b == e)
        std::memset(dst, 0, static_cast<size_t>(w) * sizeof(T));
      else
        Accum<T>::run(upd, ord, b, e, d, c0, w, dst, dtype);
    }
  };
}

Kernel make_scatter_add(const KernelSpec& spec) {
  const TensorType& idx = spec.in[0];
  const TensorType& out = spec.out[0];
  int64_t rows = out.shape[0];
  int64_t d = rows == 0 ? numel(Shape(out.shape.begin() + 1, out.shape.end())) : out.numel() / rows;
  int64_t n = idx.numel();
  switch (out.dtype) {
    case DType::f32:
      return make_scatter_typed<float>(n, rows, d, out.dtype);
    case DType::i32:
      return make_scatter_typed<int32_t>(n, rows, d, out.dtype);
    case DType::bf16:
    case DType::f16:
      return make_scatter_typed<uint16_t>(n, rows, d, out.dtype);
    default:
      throw Error("[scatter_add] no CPU kernel for " + type_str(out));
  }
}

// ---- one_hot ------------------------------------------------------------------------------------

Kernel make_one_hot(const KernelSpec& spec) {
  int64_t n = spec.in[0].numel();
  int64_t depth = spec.out[0].shape.back();
  DType t = spec.out[0].dtype;
  int64_t es = dtype_size(t);
  uint32_t one = 1;
  if (t == DType::f32) one = 0x3F800000u;
  if (t == DType::bf16) one = f32_to_bf16(1.0f);
  if (t == DType::f16) one = f32_to_f16(1.0f);
  return [n, depth, es, one](const void* const* in, void* const* out) {
    if (n == 0 || depth == 0) return;
    const int32_t* idx = static_cast<const int32_t*>(in[0]);
    std::byte* o = static_cast<std::byte*>(out[0]);
#pragma omp parallel for schedule(static) if (n * depth * es > (256 << 10))
    for (int64_t i = 0; i < n; ++i) {
      std::byte* row = o + i * depth * es;
      std::memset(row, 0, static_cast<size_t>(depth * es));
      int32_t k = idx[i];
      if (k < 0 || k >= depth) continue;                         // out of range: an all-zero row
      std::memcpy(row + k * es, &one, static_cast<size_t>(es));  // little-endian low bytes
    }
  };
}

}  // namespace

void register_index_kernels() {
  register_kernels(
      {{prims::take(), make_take}, {prims::scatter_add(), make_scatter_add}, {prims::one_hot(), make_one_hot}});
}

}  // namespace px::cpu
