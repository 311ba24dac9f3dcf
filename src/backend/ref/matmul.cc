// Reference kernel of the matmul family: dot_general, an XLA-style contraction. The result is
// [batch dims, lhs free dims, rhs free dims] (free dims in ascending order); each element is the
// sum over the contracting dims of lhs * rhs, accumulated in double and rounded once to the
// result dtype (which may be wider than the operands', e.g. bf16 operands with an f32 result).
#include <algorithm>
#include <vector>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

namespace {

bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// The dims of a rank-r operand that are neither batch nor contracting, ascending.
std::vector<int64_t> free_dims(int rank, const std::vector<int64_t>& batch, const std::vector<int64_t>& contract) {
  std::vector<int64_t> f;
  for (int64_t d = 0; d < rank; ++d)
    if (!contains(batch, d) && !contains(contract, d)) f.push_back(d);
  return f;
}

Kernel make_dot_general(const Spec& s) {
  const TensorType &lt = s.in.at(0), &rt = s.in.at(1), &ot = s.out.at(0);
  const std::vector<int64_t> lc = s.attrs.ints("lhs_contract"), rc = s.attrs.ints("rhs_contract");
  const std::vector<int64_t> lb = s.attrs.ints("lhs_batch"), rb = s.attrs.ints("rhs_batch");
  const std::vector<int64_t> ls = strides_of(lt.shape), rs = strides_of(rt.shape);
  const std::vector<int64_t> lf = free_dims(lt.rank(), lb, lc), rf = free_dims(rt.rank(), rb, rc);

  // For each result dim: its size and how far one step along it moves in lhs and in rhs.
  std::vector<int64_t> odim, ol, orr;
  for (size_t i = 0; i < lb.size(); ++i) {
    odim.push_back(lt.shape[lb[i]]);
    ol.push_back(ls[lb[i]]);
    orr.push_back(rs[rb[i]]);
  }
  for (int64_t d : lf) {
    odim.push_back(lt.shape[d]);
    ol.push_back(ls[d]);
    orr.push_back(0);
  }
  for (int64_t d : rf) {
    odim.push_back(rt.shape[d]);
    ol.push_back(0);
    orr.push_back(rs[d]);
  }
  if (odim != ot.shape) throw InternalError("[ref] dot_general: result shape disagrees with its dims");

  // The (lhs, rhs) offsets of every point of the contraction, in row-major order of lc.
  std::vector<int64_t> koff_l{0}, koff_r{0};
  for (size_t i = 0; i < lc.size(); ++i) {
    std::vector<int64_t> nl, nr;
    for (size_t j = 0; j < koff_l.size(); ++j)
      for (int64_t t = 0; t < lt.shape[lc[i]]; ++t) {
        nl.push_back(koff_l[j] + t * ls[lc[i]]);
        nr.push_back(koff_r[j] + t * rs[rc[i]]);
      }
    koff_l = std::move(nl);
    koff_r = std::move(nr);
  }

  const DType ldt = lt.dtype, rdt = rt.dtype, odt = ot.dtype;
  const int64_t ln = lt.numel(), rn = rt.numel(), on = ot.numel();
  const int rank = static_cast<int>(odim.size());
  return [=](const void* const* in, void* const* out) {
    std::vector<double> l(static_cast<size_t>(ln)), r(static_cast<size_t>(rn));
    for (int64_t i = 0; i < ln; ++i) l[i] = load(in[0], ldt, i);
    for (int64_t i = 0; i < rn; ++i) r[i] = load(in[1], rdt, i);
    std::vector<int64_t> idx(rank, 0);  // the result's multi-index, advanced row-major
    for (int64_t o = 0; o < on; ++o) {
      int64_t lbase = 0, rbase = 0;
      for (int d = 0; d < rank; ++d) {
        lbase += idx[d] * ol[d];
        rbase += idx[d] * orr[d];
      }
      double acc = 0;
      for (size_t k = 0; k < koff_l.size(); ++k) acc += l[lbase + koff_l[k]] * r[rbase + koff_r[k]];
      store(out[0], odt, o, acc);
      for (int d = rank - 1; d >= 0; --d) {
        if (++idx[d] < odim[d]) break;
        idx[d] = 0;
      }
    }
  };
}

}  // namespace

void register_matmul_kernels() { register_kernel(prims::dot_general(), make_dot_general); }

}  // namespace px::ref
