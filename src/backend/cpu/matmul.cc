// CPU kernel of dot_general on oneDNN's matmul primitive. The factory views each operand as a
// strided [batch, rows, cols] matrix stack when its dims nest evenly (transposed layouts
// included), and otherwise gathers it into preallocated scratch. 16-bit inputs are converted
// to f32 scratch: oneDNN 2.6 has no bf16/f16 matmul on CPUs without AVX512.
#include <omp.h>

#include <algorithm>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "backend/cpu/kernel.h"

namespace px::cpu {

namespace {

constexpr int kMaxRank = 16;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

std::vector<int64_t> row_major_strides(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

// An operand seen as `b` matrices of `r` x `c` with element strides; `order` lists the
// operand's dims as batch group, row group, col group (the gather order when copied).
struct View {
  int64_t b = 1, r = 1, c = 1, sb = 0, sr = 0, sc = 0;
  bool direct = false;
  std::vector<int64_t> order;
};

// Collapses `dims` (outer to inner) into one strided dim; false when they do not nest evenly.
bool collapse(const Shape& shape, const std::vector<int64_t>& st, const std::vector<int64_t>& dims, int64_t& size,
              int64_t& stride) {
  size = 1;
  stride = 0;
  int64_t prev = -1;
  bool ok = true;
  for (int64_t d : dims) {
    size *= shape[d];
    if (shape[d] == 1) continue;
    if (prev >= 0 && st[prev] != st[d] * shape[d]) ok = false;
    prev = d;
    stride = st[d];
  }
  return ok;
}

// Gives size-1 dims strides oneDNN accepts and checks that one of the matrix strides is unit.
bool normalize(View& v) {
  if (v.r == 1 && v.c == 1) {
    v.sr = v.sc = 1;
  } else if (v.r == 1) {
    v.sr = v.sc == 1 ? v.c : 1;
  } else if (v.c == 1) {
    v.sc = v.sr == 1 ? v.r : 1;
  }
  if (v.b == 1) v.sb = v.r * v.c;
  return (v.sc == 1 && v.sr >= v.c) || (v.sr == 1 && v.sc >= v.r);
}

View plan_view(const Shape& shape, const std::vector<int64_t>& batch, const std::vector<int64_t>& rows,
               const std::vector<int64_t>& cols) {
  View v;
  auto st = row_major_strides(shape);
  v.order = batch;
  v.order.insert(v.order.end(), rows.begin(), rows.end());
  v.order.insert(v.order.end(), cols.begin(), cols.end());
  bool ok = collapse(shape, st, batch, v.b, v.sb);  // every group is collapsed: sizes are needed anyway
  ok = collapse(shape, st, rows, v.r, v.sr) && ok;
  ok = collapse(shape, st, cols, v.c, v.sc) && ok;
  v.direct = ok && normalize(v);
  return v;
}

void make_contiguous(View& v) {
  v.direct = false;
  v.sb = v.r * v.c;
  v.sr = v.c;
  v.sc = 1;
  normalize(v);
}

// Gathers the dims `order` of a row-major operand into contiguous f32, converting the dtype.
struct Gather {
  int rank = 0;
  int64_t sizes[kMaxRank];
  int64_t strides[kMaxRank];
  int64_t count = 0;
  DType dtype = DType::f32;
};

Gather make_gather(const TensorType& t, const std::vector<int64_t>& order) {
  Gather g;
  auto st = row_major_strides(t.shape);
  for (int64_t d : order) {
    if (t.shape[d] == 1) continue;
    g.sizes[g.rank] = t.shape[d];
    g.strides[g.rank] = st[d];
    ++g.rank;
  }
  if (g.rank == 0) {
    g.sizes[0] = 1;
    g.strides[0] = 1;
    g.rank = 1;
  }
  g.count = t.numel();
  g.dtype = t.dtype;
  return g;
}

template <class Load>
void gather_rows(const Gather& g, float* dst, Load load) {
  const int64_t inner = g.sizes[g.rank - 1], is = g.strides[g.rank - 1];
  const int64_t rows = g.count / inner;
#pragma omp parallel for schedule(static) if (g.count > 65536)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t off = 0, rem = row;
    for (int k = g.rank - 2; k >= 0; --k) {
      off += (rem % g.sizes[k]) * g.strides[k];
      rem /= g.sizes[k];
    }
    float* d = dst + row * inner;
    for (int64_t i = 0; i < inner; ++i) d[i] = load(off + i * is);
  }
}

void run_gather(const Gather& g, const void* src, float* dst) {
  switch (g.dtype) {
    case DType::f32: {
      const float* s = static_cast<const float*>(src);
      gather_rows(g, dst, [s](int64_t i) { return s[i]; });
      break;
    }
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      gather_rows(g, dst, [s](int64_t i) {
        uint32_t u = static_cast<uint32_t>(s[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
      });
      break;
    }
    default: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      gather_rows(g, dst, [s](int64_t i) { return f16_to_f32(s[i]); });
      break;
    }
  }
}

// Contiguous dtype conversion in parallel chunks.
void convert_to_f32(const void* src, DType t, float* dst, int64_t n) {
  constexpr int64_t kChunk = 16384;
  int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) load_f32(src, t, c * kChunk, dst + c * kChunk, std::min(kChunk, n - c * kChunk));
}
void convert_from_f32(const float* src, void* dst, DType t, int64_t n) {
  constexpr int64_t kChunk = 16384;
  int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t c = 0; c < chunks; ++c) store_f32(src + c * kChunk, dst, t, c * kChunk, std::min(kChunk, n - c * kChunk));
}

dnnl::memory::desc view_md(const View& v) {
  return dnnl::memory::desc({v.b, v.r, v.c}, dnnl::memory::data_type::f32, {v.sb, v.sr, v.sc});
}

// Builds the oneDNN matmul for the given views; empty when oneDNN only has its reference code.
bool make_primitive(const View& a, const View& b, int64_t bt, int64_t m, int64_t n, dnnl::matmul::primitive_desc& pd) {
  try {
    dnnl::memory::desc dst({bt, m, n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::abc);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(view_md(a), view_md(b), dst), attr, engine());
    return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
  } catch (const dnnl::error&) {
    return false;
  }
}

struct MatmulState {
  dnnl::matmul prim;
  dnnl::stream stream;
  dnnl::memory src, wei, dst, scratchpad;
  std::vector<float> a_buf, b_buf, c_buf, pad_buf;
  Gather a_gather, b_gather;
  bool a_copy = false, b_copy = false;  // gather into scratch (else maybe convert in place)
  DType a_t = DType::f32, b_t = DType::f32, out_t = DType::f32;
  int64_t a_n = 0, b_n = 0, out_n = 0;
  dnnl_exec_arg_t args[4];
  int nargs = 0;
};

Kernel dot_general_kernel(const KernelSpec& spec) {
  const TensorType &lt = spec.in[0], &rt = spec.in[1], &ot = spec.out[0];
  const auto &lc = spec.attrs.ints("lhs_contract"), &rc = spec.attrs.ints("rhs_contract");
  const auto &lb = spec.attrs.ints("lhs_batch"), &rb = spec.attrs.ints("rhs_batch");
  if (lt.rank() > kMaxRank || rt.rank() > kMaxRank)
    throw Error("[dot_general] the CPU kernel supports operands up to rank " + std::to_string(kMaxRank));

  auto free_of = [](int rank, const std::vector<int64_t>& b, const std::vector<int64_t>& c) {
    std::vector<int64_t> f;
    for (int64_t d = 0; d < rank; ++d)
      if (std::find(b.begin(), b.end(), d) == b.end() && std::find(c.begin(), c.end(), d) == c.end()) f.push_back(d);
    return f;
  };
  std::vector<int64_t> lf = free_of(lt.rank(), lb, lc), rf = free_of(rt.rank(), rb, rc);
  int64_t bt = 1, m = 1, n = 1, k = 1;
  for (int64_t d : lb) bt *= lt.shape[d];
  for (int64_t d : lf) m *= lt.shape[d];
  for (int64_t d : rf) n *= rt.shape[d];
  for (int64_t d : lc) k *= lt.shape[d];
  const int64_t out_n = ot.numel();
  const DType out_t = ot.dtype;
  if (out_n == 0) return [](const void* const*, void* const*) {};
  if (k == 0)
    return [out_n, out_t](const void* const*, void* const* out) {
      std::memset(out[0], 0, static_cast<size_t>(out_n * dtype_size(out_t)));
    };

  // Try the contracting dims in the lhs's order and in the rhs's order; keep the cheaper plan.
  std::vector<size_t> idx(lc.size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  View best_a, best_b;
  int64_t best_cost = -1;
  for (int side = 0; side < 2; ++side) {
    std::vector<size_t> o = idx;
    const auto& key = side == 0 ? lc : rc;
    std::sort(o.begin(), o.end(), [&](size_t x, size_t y) { return key[x] < key[y]; });
    std::vector<int64_t> lcs, rcs;
    for (size_t i : o) {
      lcs.push_back(lc[i]);
      rcs.push_back(rc[i]);
    }
    View a = plan_view(lt.shape, lb, lf, lcs), b = plan_view(rt.shape, rb, rcs, rf);
    int64_t cost = (a.direct ? 0 : lt.numel()) + (b.direct ? 0 : rt.numel());
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best_a = a;
      best_b = b;
    }
  }
  View a = best_a, b = best_b;
  if (!a.direct) make_contiguous(a);
  if (!b.direct) make_contiguous(b);
  dnnl::matmul::primitive_desc pd;
  if (!make_primitive(a, b, bt, m, n, pd)) {
    // The strided views were refused: fall back to contiguous copies of both operands.
    make_contiguous(a);
    make_contiguous(b);
    if (!make_primitive(a, b, bt, m, n, pd))
      throw Error("[dot_general] oneDNN has no CPU matmul for " + type_str(lt) + " x " + type_str(rt));
  }

  auto st = std::make_shared<MatmulState>();
  st->prim = dnnl::matmul(pd);
  st->stream = dnnl::stream(engine());
  st->a_t = lt.dtype;
  st->b_t = rt.dtype;
  st->out_t = out_t;
  st->a_n = lt.numel();
  st->b_n = rt.numel();
  st->out_n = out_n;
  st->a_copy = !a.direct;
  st->b_copy = !b.direct;
  if (st->a_copy) st->a_gather = make_gather(lt, a.order);
  if (st->b_copy) st->b_gather = make_gather(rt, b.order);
  if (st->a_copy || st->a_t != DType::f32) st->a_buf.resize(static_cast<size_t>(st->a_n));
  if (st->b_copy || st->b_t != DType::f32) st->b_buf.resize(static_cast<size_t>(st->b_n));
  if (out_t != DType::f32) st->c_buf.resize(static_cast<size_t>(out_n));
  st->src = dnnl::memory(pd.src_desc(), engine(), DNNL_MEMORY_NONE);
  st->wei = dnnl::memory(pd.weights_desc(), engine(), DNNL_MEMORY_NONE);
  st->dst = dnnl::memory(pd.dst_desc(), engine(), DNNL_MEMORY_NONE);
  st->args[0] = {DNNL_ARG_SRC, st->src.get()};
  st->args[1] = {DNNL_ARG_WEIGHTS, st->wei.get()};
  st->args[2] = {DNNL_ARG_DST, st->dst.get()};
  st->nargs = 3;
  size_t pad = pd.scratchpad_desc().get_size();
  if (pad > 0) {
    st->pad_buf.resize((pad + sizeof(float) - 1) / sizeof(float) + 16);
    st->scratchpad = dnnl::memory(pd.scratchpad_desc(), engine(), st->pad_buf.data());
    st->args[st->nargs++] = {DNNL_ARG_SCRATCHPAD, st->scratchpad.get()};
  }

  return [st](const void* const* in, void* const* out) {
    MatmulState& s = *st;
    const void* a_ptr = in[0];
    const void* b_ptr = in[1];
    if (s.a_copy) {
      run_gather(s.a_gather, in[0], s.a_buf.data());
      a_ptr = s.a_buf.data();
    } else if (s.a_t != DType::f32) {
      convert_to_f32(in[0], s.a_t, s.a_buf.data(), s.a_n);
      a_ptr = s.a_buf.data();
    }
    if (s.b_copy) {
      run_gather(s.b_gather, in[1], s.b_buf.data());
      b_ptr = s.b_buf.data();
    } else if (s.b_t != DType::f32) {
      convert_to_f32(in[1], s.b_t, s.b_buf.data(), s.b_n);
      b_ptr = s.b_buf.data();
    }
    void* c_ptr = s.out_t == DType::f32 ? out[0] : s.c_buf.data();
    dnnl_memory_set_data_handle(s.src.get(), const_cast<void*>(a_ptr));
    dnnl_memory_set_data_handle(s.wei.get(), const_cast<void*>(b_ptr));
    dnnl_memory_set_data_handle(s.dst.get(), c_ptr);
    dnnl_primitive_execute(s.prim.get(), s.stream.get(), s.nargs, s.args);
    dnnl_stream_wait(s.stream.get());
    if (s.out_t != DType::f32) convert_from_f32(s.c_buf.data(), out[0], s.out_t, s.out_n);
  };
}

}  // namespace

void register_matmul_kernels() { register_kernel("dot_general", dot_general_kernel); }

}  // namespace px::cpu
