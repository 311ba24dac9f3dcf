// Reference kernels of the index family. take(table, indices) gathers rows of the table;
// scatter_add(indices, updates) sums update rows into a zero result of `num_rows` rows; both
// clamp indices outside [0, rows) to the nearest row, as the primitives document. one_hot gives
// 1 at each index's position along a new last dim of size `depth`, 0 elsewhere (an index outside
// [0, depth) gives a row of zeros).
#include <cstdint>
#include <cstring>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

namespace {

int64_t clamp_row(int32_t i, int64_t rows) { return i < 0 ? 0 : (i >= rows ? rows - 1 : i); }

// Elements per row of a shape whose dim 0 counts the rows (the product of the other dims).
int64_t row_elems(const Shape& s) { return numel(Shape(s.begin() + 1, s.end())); }

Kernel make_take(const Spec& s) {
  const TensorType& table = s.in.at(0);
  if (table.rank() < 1 || s.in.at(1).dtype != DType::i32) throw InternalError("[ref] take of " + type_str(table));
  int64_t rows = table.shape[0];
  int64_t n = s.in[1].numel();
  size_t row_bytes = static_cast<size_t>(row_elems(table.shape) * dtype_size(table.dtype));
  if (rows == 0 && n > 0 && row_bytes > 0) throw InternalError("[ref] take from a table with no rows");
  return [rows, n, row_bytes](const void* const* in, void* const* out) {
    if (row_bytes == 0) return;
    const std::byte* t = static_cast<const std::byte*>(in[0]);
    const int32_t* idx = static_cast<const int32_t*>(in[1]);
    std::byte* o = static_cast<std::byte*>(out[0]);
    for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * row_bytes, t + clamp_row(idx[i], rows) * row_bytes, row_bytes);
  };
}

// Floats accumulate in double in index order and round once; i32 wraps.
Kernel make_scatter_add(const Spec& s) {
  const TensorType& idx = s.in.at(0);
  const TensorType& out_t = s.out.at(0);
  int64_t rows = out_t.shape.at(0);
  int64_t d = row_elems(out_t.shape);
  int64_t n = idx.numel();
  DType t = out_t.dtype;
  if (s.in.at(1).numel() != n * d) throw InternalError("[ref] scatter_add: updates do not match " + type_str(out_t));
  if (rows == 0 && n * d > 0) throw InternalError("[ref] scatter_add into no rows");
  if (t == DType::i32)
    return [=](const void* const* in, void* const* out) {
      const int32_t* ix = static_cast<const int32_t*>(in[0]);
      const int32_t* u = static_cast<const int32_t*>(in[1]);
      std::vector<uint32_t> acc(static_cast<size_t>(rows * d), 0u);
      for (int64_t i = 0; i < n; ++i) {
        int64_t r = clamp_row(ix[i], rows);
        for (int64_t c = 0; c < d; ++c) acc[r * d + c] += static_cast<uint32_t>(u[i * d + c]);
      }
      int32_t* o = static_cast<int32_t*>(out[0]);
      for (int64_t k = 0; k < rows * d; ++k) o[k] = static_cast<int32_t>(acc[k]);
    };
  return [=](const void* const* in, void* const* out) {
    const int32_t* ix = static_cast<const int32_t*>(in[0]);
    std::vector<double> acc(static_cast<size_t>(rows * d), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      int64_t r = clamp_row(ix[i], rows);
      for (int64_t c = 0; c < d; ++c) acc[r * d + c] += load(in[1], t, i * d + c);
    }
    for (int64_t k = 0; k < rows * d; ++k) store(out[0], t, k, acc[k]);
  };
}

Kernel make_one_hot(const Spec& s) {
  int64_t n = s.in.at(0).numel();
  int64_t depth = s.attrs.i("depth");
  const TensorType& out_t = s.out.at(0);
  if (out_t.numel() != n * depth) throw InternalError("[ref] one_hot: result " + type_str(out_t));
  DType t = out_t.dtype;
  return [n, depth, t](const void* const* in, void* const* out) {
    const int32_t* idx = static_cast<const int32_t*>(in[0]);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t k = 0; k < depth; ++k) store(out[0], t, i * depth + k, idx[i] == k ? 1.0 : 0.0);
  };
}

}  // namespace

void register_index_kernels() {
  register_kernels(
      {{prims::take(), make_take}, {prims::scatter_add(), make_scatter_add}, {prims::one_hot(), make_one_hot}});
}

}  // namespace px::ref
