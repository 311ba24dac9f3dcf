// A dot_general as one strided batched GEMM (gemm_layout.h).
#include "backend/cuda/gemm_layout.h"

#include <algorithm>
#include <vector>

namespace px::cuda {

namespace {

// One group of an operand's dims collapsed into a single strided dim.
struct Collapsed {
  int64_t size = 1, stride = 0;
};

// Dims `group` (outer to inner) of a row-major `shape`, as one dim; nothing when they do not nest
// evenly. Size-1 dims take no part.
std::optional<Collapsed> collapse(const Shape& shape, const std::vector<int64_t>& strides,
                                  const std::vector<int64_t>& group) {
  Collapsed c;
  bool first = true;
  for (int64_t d : group) {
    if (shape[d] == 1) continue;
    if (!first && c.stride != strides[d] * shape[d]) return std::nullopt;
    c.size *= shape[d];
    c.stride = strides[d];
    first = false;
  }
  if (first) c.stride = 0;
  return c;
}

std::vector<int64_t> row_major(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int64_t i = static_cast<int64_t>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

// The dims of a rank-r operand that are neither batch nor contracted, in order.
std::vector<int64_t> free_dims(size_t rank, const std::vector<int64_t>& batch, const std::vector<int64_t>& contract) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < static_cast<int64_t>(rank); ++d)
    if (std::count(batch.begin(), batch.end(), d) == 0 && std::count(contract.begin(), contract.end(), d) == 0)
      out.push_back(d);
  return out;
}

// The logical matrix X[i][j] (i < r at stride sr, j < c at stride sc) in column-major storage:
// as is where its rows are unit-strided, else transposed where its columns are.
std::optional<GemmOperand> stored(Collapsed r, Collapsed c) {
  GemmOperand o;
  if (r.size == 1 || r.stride == 1) {
    o.rows = r.size;
    o.cols = c.size;
    o.ld = std::max<int64_t>(c.size == 1 ? r.size : c.stride, std::max<int64_t>(r.size, 1));
    if (c.size > 1 && c.stride < r.size) return std::nullopt;  // columns overlap
    return o;
  }
  if (c.size == 1 || c.stride == 1) {
    o.transpose = true;
    o.rows = c.size;
    o.cols = r.size;
    o.ld = std::max<int64_t>(r.stride, std::max<int64_t>(c.size, 1));
    if (r.stride < c.size) return std::nullopt;
    return o;
  }
  return std::nullopt;
}

}  // namespace

std::optional<GemmLayout> gemm_layout(const Shape& lhs, const Shape& rhs, const DotDims& dims, std::string* why) {
  auto fail = [&](const std::string& w) -> std::optional<GemmLayout> {
    if (why) *why = w;
    return std::nullopt;
  };
  const std::vector<int64_t> sl = row_major(lhs), sr = row_major(rhs);
  const auto lb = collapse(lhs, sl, dims.lhs_batch), rb = collapse(rhs, sr, dims.rhs_batch);
  const auto lm = collapse(lhs, sl, free_dims(lhs.size(), dims.lhs_batch, dims.lhs_contract));
  const auto lk = collapse(lhs, sl, dims.lhs_contract);
  const auto rn = collapse(rhs, sr, free_dims(rhs.size(), dims.rhs_batch, dims.rhs_contract));
  const auto rk = collapse(rhs, sr, dims.rhs_contract);
  if (!lb || !rb) return fail("the batch dims do not nest in memory");
  if (!lm || !lk) return fail("the lhs's free or contracted dims do not nest in memory");
  if (!rn || !rk) return fail("the rhs's free or contracted dims do not nest in memory");
  if (lb->size != rb->size || lk->size != rk->size) return fail("the operands' batch or contracted sizes differ");
  GemmLayout L;
  L.m = rn->size;
  L.n = lm->size;
  L.k = lk->size;
  L.batch = lb->size;
  // a = rhs^T: a[i = n][j = k] = rhs[k][n]; b = lhs^T: b[i = k][j = m] = lhs[m][k].
  const auto a = stored(*rn, *rk), b = stored(*lk, *lm);
  if (!a) return fail("the rhs has no unit stride in its matrix dims");
  if (!b) return fail("the lhs has no unit stride in its matrix dims");
  L.a = *a;
  L.b = *b;
  L.a.batch_stride = rb->stride;
  L.b.batch_stride = lb->stride;
  L.ldd = std::max<int64_t>(L.m, 1);
  L.d_batch_stride = L.m * L.n;
  return L;
}

}  // namespace px::cuda
