// CPU kernel of dot_general on oneDNN. The factory views each operand as a strided
// [batch, rows, cols] matrix stack when its dims nest evenly (transposed layouts included), and
// otherwise gathers it into its scratch (planned by the runtime with the program's buffers). f32 runs on sgemm called directly (oneDNN's
// matmul primitive wraps the same jit sgemm): nothing to set up per call, and stacks of small
// matrices run one matrix per thread. bf16 operands run on oneDNN's bf16 matmul primitive where
// the CPU has a native one (AVX512-BF16, AMX; f32 accumulation), else they are converted to f32
// scratch for sgemm: oneDNN 2.6 has only a slow reference bf16 matmul on other CPUs.
#include <algorithm>
#include <cstring>
#include <array>
#include <map>
#include <memory>
#include <mutex>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>

#include "backend/cpu/kernel.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

constexpr int kMaxRank = 16;

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

// Gives size-1 dims strides sgemm accepts and checks that one of the matrix strides is unit.
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

// The loops below are orphaned `omp for`s: they share the caller's parallel region (one
// region converts both operands) and run serially outside of one.
template <class Load>
void gather_rows(const Gather& g, float* dst, Load load) {
  const int64_t inner = g.sizes[g.rank - 1], is = g.strides[g.rank - 1];
  const int64_t rows = g.count / inner;
#pragma omp for schedule(static) nowait
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

constexpr int64_t kChunk = 16384;
// Conversions run at ~0.1 ns per element while a parallel region costs microseconds (and a
// scheduler slice when cores are shared), so only very large operands convert in parallel.
constexpr int64_t kParallelConvert = int64_t{1} << 22;
constexpr int64_t kParallelGather = int64_t{1} << 19;

// Contiguous dtype conversion in chunks (an orphaned `omp for`, like gather_rows).
void convert_to_f32(const void* src, DType t, float* dst, int64_t n) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp for schedule(static) nowait
  for (int64_t c = 0; c < chunks; ++c) load_f32(src, t, c * kChunk, dst + c * kChunk, std::min(kChunk, n - c * kChunk));
}

// f32 -> bf16 with round-to-nearest-even, written so that it vectorizes (NaN stays NaN).
void store_bf16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, src + i, 4);
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    dst[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : r);
  }
}

void convert_from_f32(const float* src, void* dst, DType t, int64_t n) {
  int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelConvert)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t off = c * kChunk, len = std::min(kChunk, n - off);
    if (t == DType::bf16) store_bf16(src + off, static_cast<uint16_t*>(dst) + off, len);
    else store_f32(src + off, dst, t, off, len);
  }
}

// One sgemm call per matrix of the stack: op(A) is r x c row-major ('N', ld = row stride) or
// its transpose ('T', ld = col stride).
struct Operand {
  char trans = 'N';
  int64_t ld = 1, batch_stride = 0;
};
Operand operand_of(const View& v) {
  bool t = !(v.sc == 1 && v.sr >= v.c);
  return {t ? 'T' : 'N', t ? v.sc : v.sr, v.sb};
}

// A bf16 matmul primitive over strided views, with the operands' pointers and oneDNN's scratchpad
// (planned with the program's buffers: user scratchpad mode) set per call.
struct NativeMatmul {
  dnnl::matmul prim;
  dnnl::memory a, b, c, scratch;
  dnnl::stream stream;
  void run(const void* pa, const void* pb, void* pc, void* ps) {
    a.set_data_handle(const_cast<void*>(pa));
    b.set_data_handle(const_cast<void*>(pb));
    c.set_data_handle(pc);
    scratch.set_data_handle(ps);
    // The C call with an array of arguments: the C++ one builds a hash map at every call.
    const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, a.get()},
                                     {DNNL_ARG_WEIGHTS, b.get()},
                                     {DNNL_ARG_DST, c.get()},
                                     {DNNL_ARG_SCRATCHPAD, scratch.get()}};
    dnnl_status_t st = dnnl_primitive_execute(prim.get(), stream.get(), 4, args);
    if (st == dnnl_success) st = dnnl_stream_wait(stream.get());
    if (st != dnnl_success) throw InternalError("[cpu] dot_general: a oneDNN bf16 matmul failed with status " + std::to_string(st));
  }
};

const dnnl::engine& cpu_engine() {
  static const dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

using MatmulPd = dnnl::matmul::primitive_desc;

// The native bf16 matmul for direct views, or null where oneDNN has none but its reference code.
// Cached by shape and strides: the scratch size (at plan time) and the kernel ask for the same.
std::shared_ptr<const MatmulPd> native_bf16(const View& a, const View& b, int64_t bt, int64_t m, int64_t n,
                                            int64_t k, DType out_t) {
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  if (out_t != DType::f32 && out_t != DType::bf16) return nullptr;
  using Key = std::array<int64_t, 11>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const MatmulPd>> cache;
  const Key key{a.sb, a.sr, a.sc, b.sb, b.sr, b.sc, bt, m, n, k, static_cast<int64_t>(out_t)};
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  std::shared_ptr<const MatmulPd> pd;
  try {
    md a_md({bt, m, k}, dt::bf16, dnnl::memory::dims{bt == 1 ? m * k : a.sb, a.sr, a.sc});
    md b_md({bt, k, n}, dt::bf16, dnnl::memory::dims{bt == 1 ? k * n : b.sb, b.sr, b.sc});
    md c_md({bt, m, n}, out_t == DType::f32 ? dt::f32 : dt::bf16, dnnl::memory::dims{m * n, n, 1});
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto made = std::make_shared<MatmulPd>(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
    if (std::string(made->impl_info_str()).rfind("ref", 0) != 0) pd = std::move(made);
  } catch (const dnnl::error&) {
    // unimplemented for these strides on this CPU: the f32 path below
  }
  cache.emplace(key, pd);
  return pd;
}

std::shared_ptr<NativeMatmul> native_matmul(const MatmulPd& pd) {
  auto nm = std::make_shared<NativeMatmul>();
  nm->prim = dnnl::matmul(pd);
  nm->a = dnnl::memory(pd.src_desc(), cpu_engine(), DNNL_MEMORY_NONE);
  nm->b = dnnl::memory(pd.weights_desc(), cpu_engine(), DNNL_MEMORY_NONE);
  nm->c = dnnl::memory(pd.dst_desc(), cpu_engine(), DNNL_MEMORY_NONE);
  nm->scratch = dnnl::memory(pd.scratchpad_desc(), cpu_engine(), DNNL_MEMORY_NONE);
  nm->stream = dnnl::stream(cpu_engine());
  return nm;
}

struct GemmState {
  Operand a, b;
  int64_t bt = 1, m = 1, n = 1, k = 1;
  bool batch_parallel = false;
  std::atomic<int> err{0};  // the first failing dnnl_sgemm status of a run
  Gather a_gather, b_gather;
  bool a_copy = false, b_copy = false;  // gather into scratch (else maybe convert in place)
  DType a_t = DType::f32, b_t = DType::f32, out_t = DType::f32;
  int64_t a_n = 0, b_n = 0, out_n = 0;
  int64_t convert_work = 0;  // elements to convert, gathers weighted as slower
  int threads = 1;
};

std::vector<int64_t> free_dims(int rank, const std::vector<int64_t>& b, const std::vector<int64_t>& c) {
  std::vector<int64_t> f;
  for (int64_t d = 0; d < rank; ++d)
    if (std::find(b.begin(), b.end(), d) == b.end() && std::find(c.begin(), c.end(), d) == c.end()) f.push_back(d);
  return f;
}

// Tries the contracting dims in the lhs's order and in the rhs's order; returns the cheaper plan.
std::pair<View, View> cheaper_views(const TensorType& lt, const TensorType& rt, const std::vector<int64_t>& lb,
                                    const std::vector<int64_t>& lf, const std::vector<int64_t>& lc,
                                    const std::vector<int64_t>& rb, const std::vector<int64_t>& rf,
                                    const std::vector<int64_t>& rc) {
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
  return {best_a, best_b};
}

std::shared_ptr<GemmState> make_gemm_state(const TensorType& lt, const TensorType& rt, const TensorType& ot,
                                           const View& a, const View& b, int64_t bt, int64_t m, int64_t n,
                                           int64_t k) {
  auto st = std::make_shared<GemmState>();
  st->a = operand_of(a);
  st->b = operand_of(b);
  st->bt = bt;
  st->m = m;
  st->n = n;
  st->k = k;
  st->threads = num_threads();
  // Many small matrices (attention): one single-threaded sgemm per matrix beats splitting each.
  const double flops_per_matrix = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  st->batch_parallel = bt > 1 && bt >= st->threads && (bt >= 4 * st->threads || flops_per_matrix < 3.2e7);
  st->a_t = lt.dtype;
  st->b_t = rt.dtype;
  st->out_t = ot.dtype;
  st->a_n = lt.numel();
  st->b_n = rt.numel();
  st->out_n = ot.numel();
  st->a_copy = !a.direct;
  st->b_copy = !b.direct;
  if (st->a_copy) st->a_gather = make_gather(lt, a.order);
  if (st->b_copy) st->b_gather = make_gather(rt, b.order);
  for (int side = 0; side < 2; ++side) {
    bool copy = side ? st->b_copy : st->a_copy;
    bool conv = copy || (side ? st->b_t : st->a_t) != DType::f32;
    int64_t count = side ? st->b_n : st->a_n;
    if (conv) st->convert_work += copy ? count * (kParallelConvert / kParallelGather) : count;
  }
  return st;
}

// The f32 copies of the operands and the f32 result, [a | b | c] as needed, in the kernel's scratch.
struct GemmScratch {
  bool a_conv, b_conv, c_conv;
  int64_t a_len, b_len, c_len;
  explicit GemmScratch(const GemmState& s)
      : a_conv(s.a_copy || s.a_t != DType::f32), b_conv(s.b_copy || s.b_t != DType::f32), c_conv(s.out_t != DType::f32),
        a_len(a_conv ? s.a_n : 0), b_len(b_conv ? s.b_n : 0), c_len(c_conv ? s.out_n : 0) {}
  int64_t bytes() const { return (a_len + b_len + c_len) * static_cast<int64_t>(sizeof(float)); }
};

Kernel sgemm_kernel(std::shared_ptr<GemmState> st) {
  return [st](const void* const* in, void* const* out) {
    GemmState& s = *st;
    const GemmScratch sc(s);
    const bool a_conv = sc.a_conv, b_conv = sc.b_conv, c_conv = sc.c_conv;
    float* base = sc.bytes() > 0 ? scratch_of(out, 1) : nullptr;
    float* a_buf = a_conv ? base : nullptr;
    float* b_buf = b_conv ? base + sc.a_len : nullptr;
    float* c_buf = c_conv ? base + sc.a_len + sc.b_len : nullptr;
    if (a_conv || b_conv) {
#pragma omp parallel if (s.convert_work > kParallelConvert)
      {
        if (s.a_copy) run_gather(s.a_gather, in[0], a_buf);
        else if (a_conv) convert_to_f32(in[0], s.a_t, a_buf, s.a_n);
        if (s.b_copy) run_gather(s.b_gather, in[1], b_buf);
        else if (b_conv) convert_to_f32(in[1], s.b_t, b_buf, s.b_n);
      }
    }
    const float* a_ptr = a_conv ? a_buf : static_cast<const float*>(in[0]);
    const float* b_ptr = b_conv ? b_buf : static_cast<const float*>(in[1]);
    float* c_ptr = c_conv ? c_buf : static_cast<float*>(out[0]);
    auto gemm = [&](int64_t i) {
      sgemm(s.err, s.a.trans, s.b.trans, s.m, s.n, s.k, 1.0f, a_ptr + i * s.a.batch_stride, s.a.ld,
            b_ptr + i * s.b.batch_stride, s.b.ld, 0.0f, c_ptr + i * s.m * s.n, s.n);
    };
    if (s.batch_parallel) {
      // Inside the region oneDNN runs each sgemm on the calling thread.
#pragma omp parallel for num_threads(s.threads) schedule(static)
      for (int64_t i = 0; i < s.bt; ++i) gemm(i);
    } else if (s.threads > 1 && omp_in_parallel() && s.m >= 16 * s.threads) {
      // On a thread of an enclosing region (a pipeline's device group), oneDNN would run the sgemm
      // on that thread alone: the group's threads take a block of rows each.
      for (int64_t i = 0; i < s.bt; ++i) {
        const float* a0 = a_ptr + i * s.a.batch_stride;
        const float* b0 = b_ptr + i * s.b.batch_stride;
        float* c0 = c_ptr + i * s.m * s.n;
#pragma omp parallel num_threads(s.threads)
        {
          const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
          const int64_t r0 = s.m * t / nt, r1 = s.m * (t + 1) / nt;
          const float* a_rows = s.a.trans == 'N' ? a0 + r0 * s.a.ld : a0 + r0;
          sgemm(s.err, s.a.trans, s.b.trans, r1 - r0, s.n, s.k, 1.0f, a_rows, s.a.ld, b0, s.b.ld, 0.0f, c0 + r0 * s.n,
                s.n);
        }
      }
    } else {
      for (int64_t i = 0; i < s.bt; ++i) gemm(i);
    }
    throw_if_sgemm_failed(s.err, "dot_general");
    if (c_conv) convert_from_f32(c_buf, out[0], s.out_t, s.out_n);
  };
}

// What a dot_general's kernel will be, from its spec alone: the kernel and its scratch size are
// both made from this.
struct MatmulPlan {
  int64_t bt = 1, m = 1, n = 1, k = 1;
  bool empty = false;                        // no result elements, or k = 0 (zeros)
  std::shared_ptr<const MatmulPd> native;    // bf16 on oneDNN's matmul, else sgemm:
  std::shared_ptr<GemmState> gemm;
};

MatmulPlan plan_matmul(const KernelSpec& spec) {
  const TensorType &lt = spec.in[0], &rt = spec.in[1], &ot = spec.out[0];
  const auto &lc = spec.attrs.ints("lhs_contract"), &rc = spec.attrs.ints("rhs_contract");
  const auto &lb = spec.attrs.ints("lhs_batch"), &rb = spec.attrs.ints("rhs_batch");
  if (lt.rank() > kMaxRank || rt.rank() > kMaxRank)
    throw Error("[dot_general] the CPU kernel supports operands up to rank " + std::to_string(kMaxRank));
  std::vector<int64_t> lf = free_dims(lt.rank(), lb, lc), rf = free_dims(rt.rank(), rb, rc);
  MatmulPlan p;
  for (int64_t d : lb) p.bt *= lt.shape[d];
  for (int64_t d : lf) p.m *= lt.shape[d];
  for (int64_t d : rf) p.n *= rt.shape[d];
  for (int64_t d : lc) p.k *= lt.shape[d];
  p.empty = ot.numel() == 0 || p.k == 0;
  if (p.empty) return p;
  auto [a, b] = cheaper_views(lt, rt, lb, lf, lc, rb, rf, rc);
  if (lt.dtype == DType::bf16 && rt.dtype == DType::bf16 && a.direct && b.direct)
    if ((p.native = native_bf16(a, b, p.bt, p.m, p.n, p.k, ot.dtype))) return p;
  if (!a.direct) make_contiguous(a);
  if (!b.direct) make_contiguous(b);
  p.gemm = make_gemm_state(lt, rt, ot, a, b, p.bt, p.m, p.n, p.k);
  return p;
}

int64_t dot_general_scratch(const KernelSpec& spec) {
  const MatmulPlan p = plan_matmul(spec);
  if (p.empty) return 0;
  if (p.native) return static_cast<int64_t>(p.native->scratchpad_desc().get_size());
  return GemmScratch(*p.gemm).bytes();
}

Kernel dot_general_kernel(const KernelSpec& spec) {
  MatmulPlan p = plan_matmul(spec);
  const int64_t out_n = spec.out[0].numel();
  const DType out_t = spec.out[0].dtype;
  if (out_n == 0) return [](const void* const*, void* const*) {};
  if (p.empty)
    return [out_n, out_t](const void* const*, void* const* out) {
      std::memset(out[0], 0, static_cast<size_t>(out_n * dtype_size(out_t)));
    };
  if (p.native) {
    const bool scratch = p.native->scratchpad_desc().get_size() > 0;
    return [nm = native_matmul(*p.native), scratch](const void* const* in, void* const* out) {
      nm->run(in[0], in[1], out[0], scratch ? out[1] : nullptr);
    };
  }
  return sgemm_kernel(std::move(p.gemm));
}

}  // namespace

void register_matmul_kernels() { register_kernel(prims::dot_general(), dot_general_kernel, dot_general_scratch); }

}  // namespace px::cpu
