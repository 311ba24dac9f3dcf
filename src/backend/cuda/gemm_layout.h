// How a dot_general runs as one strided batched GEMM of cuBLASLt (matmul.cc), worked out without
// CUDA so that the CPU checks it (tests/backend/test_cuda_gemm_layout.cc runs the description
// through a host GEMM with cuBLAS's column-major semantics against the ref backend).
//
// The result [batch..., lhs free..., rhs free...] is row-major C[b][m][n]. cuBLAS is column-major,
// so the GEMM computes C^T (N x M, ld N) = op(A) op(B) with A = rhs^T and B = lhs^T: each
// operand's dims must collapse into a strided [batch, rows, cols] view (each group of dims nests
// evenly in memory) with a unit stride in one of its matrix dims.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "parallax/ops.h"

namespace px::cuda {

// One GEMM operand in cuBLAS's terms: a column-major matrix of `rows` x `cols` with leading
// dimension `ld`, used as is or transposed, `batch_stride` elements apart in the batch.
struct GemmOperand {
  int64_t rows = 0, cols = 0, ld = 1, batch_stride = 0;
  bool transpose = false;
};

// D (m x n, column-major, ld m) = op(a) (m x k) op(b) (k x n), `batch` times.
struct GemmLayout {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  GemmOperand a, b;  // a: from the dot_general's rhs, b: from its lhs
  int64_t ldd = 1, d_batch_stride = 0;
};

// The layout of dot_general(lhs, rhs, dims) on row-major operands; nothing when an operand's dims
// do not collapse into such a view (`why` says which).
std::optional<GemmLayout> gemm_layout(const Shape& lhs, const Shape& rhs, const DotDims& dims, std::string* why);

}  // namespace px::cuda
