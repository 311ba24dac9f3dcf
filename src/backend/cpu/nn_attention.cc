// CPU kernels of fused attention. Work is split into blocks of query rows of one head; a
// block's scores [rows, Sk] live in per-thread scratch and go through sgemm -> masked softmax
// -> sgemm, so no [B,H,Sq,Sk] tensor exists. Causal blocks stop at their last visible key.
// The backward recomputes the probabilities from the saved log-sum-exp (flash-attention style)
// and keeps per-query-head dk/dv partials that are summed over grouped heads at the end.
#include <immintrin.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "backend/cpu/kernel.h"
#include "backend/cpu/vmath.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

// Query rows per block: 64, and 128 for bf16 over sequences of 512 and more, where the larger
// products run faster than the causal blocks' extra masked columns cost (GPT-2 small's attention
// with its gradients 6% faster; at 256 the two are even).
constexpr int64_t kMaxRows = 128;
constexpr float kNegInf = -INFINITY;

struct Geom {
  int64_t b = 0, hkv = 0, g = 0, sq = 0, sk = 0, d = 0, rows = 64;
  bool causal = false, pad = false;
  float scale = 1;
  DType dt = DType::f32;
  int64_t blocks() const { return (sq + rows - 1) / rows; }
  // Keys [0, limit) are visible to query row i (before padding).
  int64_t limit(int64_t i) const { return causal ? std::clamp<int64_t>(i + sk - sq + 1, 0, sk) : sk; }
  // The keys the backward pass of rows [r0, r0 + nr) touches: the visible ones, or every key when
  // a row attended uniformly (its saved log-sum-exp is -inf).
  int64_t backward_cols(int64_t r0, int64_t nr, const float* lse_rows) const {
    for (int64_t r = 0; r < nr; ++r)
      if (lse_rows[r] == -INFINITY) return sk;
    return limit(r0 + nr - 1);
  }
  // Whether a row of the block starting at query r0 sees no key (its first row sees the fewest).
  bool blind_row(int64_t r0, const uint8_t* keep) const {
    const int64_t lim = limit(r0);
    if (!keep) return lim == 0;
    for (int64_t j = 0; j < lim; ++j)
      if (keep[j]) return false;
    return true;
  }
  int64_t q_off(int64_t bi, int64_t h, int64_t gi) const { return ((bi * hkv + h) * g + gi) * sq * d; }
  int64_t kv_off(int64_t bi, int64_t h) const { return (bi * hkv + h) * sk * d; }
};

Geom geom_of(const KernelSpec& s) {
  Geom G;
  const Shape& q = s.in[0].shape;
  G.b = q[0];
  G.hkv = q[1];
  G.g = q[2];
  G.sq = q[3];
  G.d = q[4];
  G.sk = s.in[1].shape[2];
  G.causal = s.attrs.i("causal") != 0;
  G.pad = s.attrs.i("key_padding") != 0;
  G.scale = static_cast<float>(s.attrs.f("scale"));
  G.dt = s.in[0].dtype;
  G.rows = G.dt == DType::bf16 && G.sq >= 512 ? kMaxRows : 64;
  return G;
}


// Masks row `r` (query i) of a score block in place: keys at or past the causal limit and
// padded keys become -inf. Returns false when nothing is visible.
bool mask_row(const Geom& G, float* s, int64_t i, int64_t ncols, const uint8_t* keep) {
  const int64_t lim = std::min(G.limit(i), ncols);
  for (int64_t j = lim; j < ncols; ++j) s[j] = kNegInf;
  bool any = false;
  if (keep) {
    for (int64_t j = 0; j < lim; ++j) {
      s[j] = keep[j] ? s[j] : kNegInf;
      any = any || keep[j];
    }
  } else {
    any = lim > 0;
  }
  return any;
}

// A fully masked row attends uniformly to every key (as the composite's large negative fill
// does); its log-sum-exp is stored as -inf to mark it for the backward pass.
void uniform_row(float* p, int64_t sk) {
  const float u = 1.0f / static_cast<float>(sk);
  for (int64_t j = 0; j < sk; ++j) p[j] = u;
}

// The sgemm status of a run (the f32 path): the first failure, thrown after the parallel region.
struct GemmErr {
  std::atomic<int> gemm_err{0};
};

// p as f32: itself, or its copy at copies + at (null copies: every operand is f32).
const float* as_f32(const void* p, DType t, float* copies, int64_t at, int64_t n) {
  if (t == DType::f32) return static_cast<const float*>(p);
  load_f32(p, t, 0, copies + at, n);
  return copies + at;
}

// ---- bf16 operands where the CPU has native bf16 matmuls ----
// The block products run on oneDNN's bf16 matmul (f32 accumulation) reading q, k, v and the
// output cotangent in place, at about twice sgemm's rate on f32 copies of them. Scores, softmax
// and dS stay f32; the probabilities and dS are rounded to bf16 for the products that take them
// (as flash attention does on GPUs). The forward pass rounds exp(s - max) and divides P V's rows
// by their sums, so that the exponentials go to bf16 in the pass that computes them.

// The products of a row block (nr query rows against its first nc keys), row-major:
//   qk    S[nr,nc]  = scale Q_b K^T      f32 (the scores scratch)
//   pv    O_b[nr,d] = P V                f32, scaled by 1 / the row sums into the output
//   ptdo  dV[nc,d] += P^T dO_b           f32 partial
//   dovt  dP[nr,nc] = dO_b V^T           f32
//   dsk   dQ_b[nr,d] = dS K              f32
//   dstq  dK[nc,d] += dS^T Q_b           f32 partial
// Every matrix is dense (ld nc for S, dP, P and dS): oneDNN runs strided results on a slower
// implementation (on AMX, its gemm-based matmul with a scalar scaling loop, 3x slower here).
enum class Form { qk, pv, ptdo, dovt, dsk, dstq };

const dnnl::engine& bf16_engine() {
  static const dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// One product's primitive, shared by the threads, with per-thread memory objects (user scratchpad,
// so that threads running it at once do not share oneDNN's).
struct Product {
  dnnl::matmul prim;
  dnnl::memory::desc scratch_md;
  struct Mem {
    dnnl::memory a, b, c, scratch;
  };
  std::vector<Mem> mem;  // per thread
};

struct Bf16Products {
  std::map<std::tuple<Form, int64_t, int64_t>, Product> table;  // (form, nr, nc)
  std::vector<dnnl::stream> streams;                            // per thread
  std::atomic<int> err{0};
  // Runs the product on thread `tid` with oneDNN's scratchpad at `pad` (the thread's, in the
  // kernel's scratch); a failure is recorded and thrown after the parallel region.
  void run(Form f, int64_t nr, int64_t nc, int tid, void* pad, const void* a, const void* b, void* c) {
    Product& prod = table.find({f, nr, nc})->second;
    Product::Mem& m = prod.mem[static_cast<size_t>(tid)];
    dnnl_memory_set_data_handle(m.scratch.get(), pad);
    dnnl_memory_set_data_handle(m.a.get(), const_cast<void*>(a));
    dnnl_memory_set_data_handle(m.b.get(), const_cast<void*>(b));
    dnnl_memory_set_data_handle(m.c.get(), c);
    const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, m.a.get()},
                                     {DNNL_ARG_WEIGHTS, m.b.get()},
                                     {DNNL_ARG_DST, m.c.get()},
                                     {DNNL_ARG_SCRATCHPAD, m.scratch.get()}};
    dnnl_status_t st = dnnl_primitive_execute(prod.prim.get(),
                                              streams[static_cast<size_t>(tid)].get(), 4, args);
    if (st == dnnl_success) st = dnnl_stream_wait(streams[static_cast<size_t>(tid)].get());
    if (st != dnnl_success) {
      int expected = 0;
      err.compare_exchange_strong(expected, static_cast<int>(st));
    }
  }
};

// One block product's description: `form` for nr query rows against nc keys.
struct ProductDesc {
  Form form;
  int64_t nr, nc;
  dnnl::matmul::primitive_desc pd;
};

// The products `forms` for every row block's (nr, nc), and for nc = Sk (rows that attend to every
// key); empty where oneDNN has no native bf16 matmul for one of them (the f32 path then runs).
std::vector<ProductDesc> bf16_product_descs(const Geom& G, std::initializer_list<Form> forms) {
  if (G.dt != DType::bf16 || G.sq == 0 || G.sk == 0 || G.d == 0) return {};
  using md = dnnl::memory::desc;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  std::vector<ProductDesc> descs;
  std::map<std::tuple<Form, int64_t, int64_t>, char> seen;
  const int64_t d = G.d, sk = G.sk;
  try {
    for (int64_t blk = 0; blk < G.blocks(); ++blk) {
      const int64_t nr = std::min(G.rows, G.sq - blk * G.rows);
      for (int64_t nc : {G.limit(blk * G.rows + nr - 1), sk}) {
        if (nc == 0) continue;
        for (Form f : forms) {
          if (!seen.emplace(std::tuple{f, nr, nc}, 1).second) continue;
          md a, b, c;
          bool acc = false;
          switch (f) {
            case Form::qk:  // [nr, d] x [nc, d]^T
            case Form::dovt:
              a = md({nr, d}, dt::bf16, dims{d, 1}), b = md({d, nc}, dt::bf16, dims{1, d});
              c = md({nr, nc}, dt::f32, dims{nc, 1});
              break;
            case Form::pv:  // [nr, nc] x [nc, d]
            case Form::dsk:
              a = md({nr, nc}, dt::bf16, dims{nc, 1}), b = md({nc, d}, dt::bf16, dims{d, 1});
              c = md({nr, d}, dt::f32, dims{d, 1});
              break;
            case Form::ptdo:  // [nr, nc]^T x [nr, d], accumulated
            case Form::dstq:
              a = md({nc, nr}, dt::bf16, dims{1, nc}), b = md({nr, d}, dt::bf16, dims{d, 1});
              c = md({nc, d}, dt::f32, dims{d, 1});
              acc = true;
              break;
          }
          dnnl::primitive_attr attr;
          attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
          if (f == Form::qk) attr.set_output_scales(0, {G.scale});
          if (acc) {
            dnnl::post_ops po;
            po.append_sum(1.0f);
            attr.set_post_ops(po);
          }
          dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, bf16_engine());
          if (std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return {};
          descs.push_back({f, nr, nc, std::move(pd)});
        }
      }
    }
  } catch (const dnnl::error&) {
    return {};
  }
  return descs;
}

std::initializer_list<Form> forms_of(bool grad) {
  static const std::initializer_list<Form> fwd{Form::qk, Form::pv};
  static const std::initializer_list<Form> bwd{Form::qk, Form::ptdo, Form::dovt, Form::dsk, Form::dstq};
  return grad ? bwd : fwd;
}

// Whether the pass (grad or not) runs on native bf16 products, and the largest scratchpad one of
// them needs: decided once per geometry, so that its scratch (planned before the kernel is made)
// and its kernel agree.
struct Native {
  bool native = false;
  int64_t scratchpad = 0;  // bytes
};
Native native_products(const Geom& G, bool grad) {
  using Key = std::tuple<bool, int64_t, int64_t, int64_t, int64_t, bool, int>;
  static std::mutex mutex;
  static std::map<Key, Native> known;
  const Key key{grad, G.sq, G.sk, G.d, G.rows, G.causal, static_cast<int>(G.dt)};
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = known.find(key); it != known.end()) return it->second;
  Native n;
  for (const ProductDesc& desc : bf16_product_descs(G, forms_of(grad))) {
    n.native = true;
    n.scratchpad = std::max(n.scratchpad, static_cast<int64_t>(desc.pd.scratchpad_desc().get_size()));
  }
  known.emplace(key, n);
  return n;
}

// The products of the pass for `threads` threads (native_products said they exist).
std::shared_ptr<Bf16Products> make_bf16_products(const Geom& G, bool grad, int threads) {
  auto P = std::make_shared<Bf16Products>();
  try {
    for (ProductDesc& desc : bf16_product_descs(G, forms_of(grad))) {
      Product& prod = P->table[{desc.form, desc.nr, desc.nc}];
      prod.prim = dnnl::matmul(desc.pd);
      prod.scratch_md = desc.pd.scratchpad_desc();
      for (int t = 0; t < threads; ++t)
        prod.mem.push_back({dnnl::memory(desc.pd.src_desc(), bf16_engine(), DNNL_MEMORY_NONE),
                            dnnl::memory(desc.pd.weights_desc(), bf16_engine(), DNNL_MEMORY_NONE),
                            dnnl::memory(desc.pd.dst_desc(), bf16_engine(), DNNL_MEMORY_NONE),
                            dnnl::memory(prod.scratch_md, bf16_engine(), DNNL_MEMORY_NONE)});
    }
    for (int t = 0; t < threads; ++t) P->streams.emplace_back(bf16_engine());
  } catch (const dnnl::error& e) {
    throw InternalError(std::string("[cpu] attention: oneDNN described a bf16 matmul it then could not make: ") +
                        e.what());
  }
  if (P->table.empty()) throw InternalError("[cpu] attention: no native bf16 products for this geometry");
  return P;
}

// A pass's scratch, from its spec alone (the kernel finds it after its results): first what the
// threads share (the f32 copies of 16-bit operands off the native path; the gradient's dk/dv
// partials per query head unless written straight out), then a part per thread: its f32 rows
// (scores, dP, a block's dq or P V's rows), its bf16 rows (P or dS) and oneDNN's scratchpad.
struct AttnScratch {
  int threads = 1;
  bool native = false;
  int64_t shared_at = 0, rows_at = 0, low_at = 0, pad_at = 0, per_thread = 0;  // bytes
  int64_t bytes = 0;
  float* shared(std::byte* base) const { return reinterpret_cast<float*>(base); }
  std::byte* mine(std::byte* base, int tid) const { return base + shared_at + tid * per_thread; }
  float* rows(std::byte* base, int tid) const { return reinterpret_cast<float*>(mine(base, tid) + rows_at); }
  uint16_t* low(std::byte* base, int tid) const { return reinterpret_cast<uint16_t*>(mine(base, tid) + low_at); }
  void* pad(std::byte* base, int tid) const { return mine(base, tid) + pad_at; }
};

AttnScratch attn_scratch(const KernelSpec& spec, bool grad) {
  const Geom G = geom_of(spec);
  const int64_t q_n = spec.in[0].numel(), kv_n = spec.in[1].numel(), sk = std::max<int64_t>(G.sk, 1);
  const Native n = native_products(G, grad);
  const bool wide_operands = G.dt == DType::f32, direct_kv = G.g == 1 && wide_operands;
  AttnScratch L;
  L.threads = num_threads();
  L.native = n.native;
  int64_t shared = 0, rows = 0;  // floats
  if (!grad) {
    shared = n.native || wide_operands ? 0 : 2 * q_n + 2 * kv_n;
    rows = n.native ? G.rows * std::max(G.sk, G.d) : G.rows * sk;
  } else if (n.native) {
    shared = 2 * kv_n * G.g;
    rows = 2 * G.rows * G.sk + G.rows * G.d;
  } else {
    shared = (direct_kv ? 0 : 2 * kv_n * G.g) + (wide_operands ? 0 : 3 * q_n + 2 * kv_n);
    rows = 2 * G.rows * sk;
  }
  ScratchLayout whole, part;
  whole.add_floats(shared);
  L.shared_at = whole.bytes;
  L.rows_at = part.add_floats(rows);
  L.low_at = part.add(n.native ? G.rows * G.sk * 2 : 0);
  L.pad_at = part.add(n.native ? std::max<int64_t>(n.scratchpad, 1) : 0);
  L.per_thread = part.bytes;
  L.bytes = L.shared_at + L.threads * L.per_thread;
  return L;
}

// The bf16 path's row loops, on the library's widest vectors (vecmath).
namespace wide {
using vecmath::kLanes;
using vecmath::V;

// sum x y over a row.
float dot(const float* x, const float* y, int64_t n) {
  V acc = vecmath::splat(0.0f);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) acc = vecmath::fmadd(vecmath::load(x + j), vecmath::load(y + j), acc);
  float s = vecmath::hsum(acc);
  for (; j < n; ++j) s += x[j] * y[j];
  return s;
}

// Stores one vector as bf16 (kLanes values), rounded to nearest even.
inline void store_bf16(uint16_t* y, V v) {
#ifdef __AVX512BF16__
  static_assert(kLanes == 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(vecmath::raw(v))));
#else
  for (int k = 0; k < kLanes; ++k) y[k] = f32_to_bf16(v[k]);
#endif
}

// y = bf16(x * c) over a row.
void to_bf16(const float* x, float c, int64_t n, uint16_t* y) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) store_bf16(y + j, vecmath::load(x + j) * c);
  for (; j < n; ++j) y[j] = f32_to_bf16(x[j] * c);
}

// e = exp(x - m) over a row in one pass: y16 = bf16(e), and y32 = e where given. Returns the sum
// of e (f32).
float exp_to_bf16(const float* x, float m, int64_t n, uint16_t* y16, float* y32) {
  V acc = vecmath::splat(0.0f);
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    const V e = vecmath::exp(vecmath::load(x + j) - m);
    acc += e;
    store_bf16(y16 + j, e);
    if (y32) vecmath::store(y32 + j, e);
  }
  float sum = vecmath::hsum(acc);
  if (j < n) {  // the tail through a padded vector: exp(-inf) = 0 past the row
    float buf[kLanes];
    uint16_t low[kLanes];
    for (int k = 0; k < kLanes; ++k) buf[k] = j + k < n ? x[j + k] - m : -INFINITY;
    const V e = vecmath::exp(vecmath::load(buf));
    store_bf16(low, e);
    for (int64_t k = 0; j + k < n; ++k) {
      sum += e[k];
      y16[j + k] = low[k];
      if (y32) y32[j + k] = e[k];
    }
  }
  return sum;
}

// y = bf16(p (d - di) c) over a row: dS from P and dP.
void ds_to_bf16(const float* p, const float* d, float di, float c, int64_t n, uint16_t* y) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
    store_bf16(y + j, vecmath::load(p + j) * (vecmath::load(d + j) - di) * c);
  for (; j < n; ++j) y[j] = f32_to_bf16(p[j] * (d[j] - di) * c);
}
}  // namespace wide

// dk and dv from their f32 partials per query head (laid out [dk | dv], each [b, hkv, g, Sk, D]):
// summed over the grouped query heads and stored in the result dtype.
void sum_kv_partials(const Geom& G, float* part, int64_t kv_n, void* dk, void* dv, int threads) {
  const int64_t slab = G.sk * G.d;
#pragma omp parallel for num_threads(threads) schedule(static) if (kv_n > 65536)
  for (int64_t bh = 0; bh < G.b * G.hkv; ++bh)
    for (int which = 0; which < 2; ++which) {
      float* base = part + which * kv_n * G.g + bh * G.g * slab;
      for (int64_t gi = 1; gi < G.g; ++gi)
        for (int64_t e = 0; e < slab; ++e) base[e] += base[gi * slab + e];
      store_f32(base, which ? dv : dk, G.dt, bh * slab, slab);
    }
}

// Softmax over the visible keys of a block's score rows (ld Sk), in place: a row keeps
// exp(s - max) and inv[r] = 1 / their sum, lse[r] its log-sum-exp; a row that sees no key attends
// uniformly to every key (lse -inf, inv 1). Returns the columns the rows then span: ncols, or Sk
// when a row is uniform (the others zero past ncols).
int64_t softmax_rows(const Geom& G, float* s, int64_t r0, int64_t nr, int64_t ncols, const uint8_t* keep, float* lse,
                     float* inv) {
  bool any_uniform = false;
  for (int64_t r = 0; r < nr; ++r) {
    float* sr = s + r * G.sk;
    if (!mask_row(G, sr, r0 + r, ncols, keep)) {
      any_uniform = true;
      lse[r] = kNegInf;
      continue;
    }
    const float m = vecmath::row_max(sr, ncols);
    const float sum = vecmath::exp_shift_sum(sr, m, sr, ncols);
    inv[r] = 1.0f / sum;
    lse[r] = m + std::log(sum);
  }
  if (!any_uniform) return ncols;
  for (int64_t r = 0; r < nr; ++r) {
    float* sr = s + r * G.sk;
    if (lse[r] == kNegInf) {
      uniform_row(sr, G.sk);
      inv[r] = 1.0f;
    } else {
      std::fill(sr + ncols, sr + G.sk, 0.0f);
    }
  }
  return G.sk;
}

// The backward pass's probabilities of a block's rows, in place, from their saved log-sum-exp.
void probability_rows(const Geom& G, float* s, int64_t r0, int64_t nr, int64_t ncols, const uint8_t* keep,
                      const float* lse) {
  for (int64_t r = 0; r < nr; ++r) {
    float* sr = s + r * G.sk;
    if (lse[r] == kNegInf) {
      uniform_row(sr, ncols);
      continue;
    }
    mask_row(G, sr, r0 + r, ncols, keep);
    const float l = lse[r];
    vecmath::map(sr, sr, ncols, [l](vecmath::V x) { return vecmath::exp(x - l); });
  }
}

// The forward pass on bf16 operands through `P` (make_bf16_products with qk and pv).
Kernel attention_bf16_kernel(const Geom& G, const AttnScratch& L, std::shared_ptr<Bf16Products> P) {
  const int64_t items = G.b * G.hkv * G.g * G.blocks();
  return [G, L, P, items](const void* const* in, void* const* out) {
    std::byte* base = scratch_of<std::byte>(out, 2);
    const auto* q = static_cast<const uint16_t*>(in[0]);
    const auto* k = static_cast<const uint16_t*>(in[1]);
    const auto* v = static_cast<const uint16_t*>(in[2]);
    const uint8_t* pad = G.pad ? static_cast<const uint8_t*>(in[3]) : nullptr;
    auto* o = static_cast<uint16_t*>(out[0]);
    float* lse = static_cast<float*>(out[1]);
#pragma omp parallel for num_threads(L.threads) schedule(dynamic) if (items > 1)
    for (int64_t it = 0; it < items; ++it) {
      const int tid = omp_get_thread_num();
      const int64_t blk = it % G.blocks(), head = it / G.blocks();
      const int64_t gi = head % G.g, h = head / G.g % G.hkv, bi = head / (G.g * G.hkv);
      const int64_t r0 = blk * G.rows, nr = std::min(G.rows, G.sq - r0);
      float* lb = lse + ((bi * G.hkv + h) * G.g + gi) * G.sq + r0;
      const uint8_t* keep = pad ? pad + bi * G.sk : nullptr;
      float* s = L.rows(base, tid);
      void* scratchpad = L.pad(base, tid);
      // Scores [nr, ncols] with ld ncols; a block with a row that sees no key spans every key (the
      // row attends to all of them uniformly).
      const int64_t ncols = G.blind_row(r0, keep) ? G.sk : G.limit(r0 + nr - 1);
      P->run(Form::qk, nr, ncols, tid, scratchpad, q + G.q_off(bi, h, gi) + r0 * G.d, k + G.kv_off(bi, h), s);
      uint16_t* pb = L.low(base, tid);  // bf16 exp(s - max), ld ncols
      float inv[kMaxRows];
      for (int64_t r = 0; r < nr; ++r) {
        float* sr = s + r * ncols;
        uint16_t* pr = pb + r * ncols;
        if (!mask_row(G, sr, r0 + r, ncols, keep)) {  // sees no key: uniform over all (ncols is Sk)
          std::fill(pr, pr + ncols, f32_to_bf16(1.0f));
          inv[r] = 1.0f / static_cast<float>(ncols);
          lb[r] = kNegInf;
          continue;
        }
        const float m = vecmath::row_max(sr, ncols);
        const float sum = wide::exp_to_bf16(sr, m, ncols, pr, nullptr);
        inv[r] = 1.0f / sum;
        lb[r] = m + std::log(sum);
      }
      P->run(Form::pv, nr, ncols, tid, scratchpad, pb, v + G.kv_off(bi, h), s);
      uint16_t* ob = o + G.q_off(bi, h, gi) + r0 * G.d;
      for (int64_t r = 0; r < nr; ++r) wide::to_bf16(s + r * G.d, inv[r], G.d, ob + r * G.d);
    }
    int st = P->err.exchange(0);
    if (st != 0) throw InternalError("[cpu] attention: a oneDNN bf16 matmul failed with status " + std::to_string(st));
  };
}

Kernel attention_kernel(const KernelSpec& spec) {
  const Geom G = geom_of(spec);
  const AttnScratch L = attn_scratch(spec, false);
  if (L.native) return attention_bf16_kernel(G, L, make_bf16_products(G, false, L.threads));
  const int64_t q_n = spec.in[0].numel(), kv_n = spec.in[1].numel();
  const int64_t items = G.b * G.hkv * G.g * G.blocks();
  auto err = std::make_shared<GemmErr>();
  return [G, L, err, q_n, kv_n, items](const void* const* in, void* const* out) {
    GemmErr& B = *err;
    std::byte* base = scratch_of<std::byte>(out, 2);
    // 16-bit operands: f32 copies of q, k, v and the f32 output, [q | k | v | o].
    float* copies = G.dt == DType::f32 ? nullptr : L.shared(base);
    const float* q = as_f32(in[0], G.dt, copies, 0, q_n);
    const float* k = as_f32(in[1], G.dt, copies, q_n, kv_n);
    const float* v = as_f32(in[2], G.dt, copies, q_n + kv_n, kv_n);
    const uint8_t* pad = G.pad ? static_cast<const uint8_t*>(in[3]) : nullptr;
    float* o = G.dt == DType::f32 ? static_cast<float*>(out[0]) : copies + q_n + 2 * kv_n;
    float* lse = static_cast<float*>(out[1]);
    if (G.sk == 0 || G.d == 0) {  // no keys: zeros; no head dim: nothing to compute
      if (q_n > 0) std::memset(o, 0, static_cast<size_t>(q_n) * sizeof(float));  // o is null when empty
      std::fill(lse, lse + G.b * G.hkv * G.g * G.sq, kNegInf);
    } else {
#pragma omp parallel for num_threads(L.threads) schedule(dynamic) if (items > 1)
      for (int64_t it = 0; it < items; ++it) {
        const int64_t blk = it % G.blocks(), head = it / G.blocks();
        const int64_t gi = head % G.g, h = head / G.g % G.hkv, bi = head / (G.g * G.hkv);
        const int64_t r0 = blk * G.rows, nr = std::min(G.rows, G.sq - r0);
        const float* qb = q + G.q_off(bi, h, gi) + r0 * G.d;
        const float* kb = k + G.kv_off(bi, h);
        const float* vb = v + G.kv_off(bi, h);
        float* ob = o + G.q_off(bi, h, gi) + r0 * G.d;
        float* lb = lse + ((bi * G.hkv + h) * G.g + gi) * G.sq + r0;
        const uint8_t* keep = pad ? pad + bi * G.sk : nullptr;
        float* s = L.rows(base, omp_get_thread_num());
        const int64_t ncols = G.limit(r0 + nr - 1);
        sgemm(B.gemm_err, 'N', 'T', nr, ncols, G.d, G.scale, qb, G.d, kb, G.d, 0.0f, s, G.sk);
        float inv[kMaxRows];
        const int64_t ncols_eff = softmax_rows(G, s, r0, nr, ncols, keep, lb, inv);
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t j = 0; j < ncols_eff; ++j) s[r * G.sk + j] *= inv[r];
        sgemm(B.gemm_err, 'N', 'N', nr, G.d, ncols_eff, 1.0f, s, G.sk, vb, G.d, 0.0f, ob, G.d);
      }
    }
    throw_if_sgemm_failed(B.gemm_err, "attention");
    if (G.dt != DType::f32) store_f32(o, out[0], G.dt, 0, q_n);
  };
}

// The backward pass on bf16 operands through `P` (qk, ptdo, dovt, dsk, dstq): a block's dq rows in
// f32 scratch, stored as bf16 as soon as they are made; dk and dv as f32 partials per query head,
// summed over grouped heads and stored as bf16.
Kernel attention_grad_bf16_kernel(const Geom& G, const AttnScratch& L, std::shared_ptr<Bf16Products> P,
                                  int64_t kv_n) {
  const int p = G.pad ? 4 : 3;  // index of lse; the output cotangent follows
  const int64_t heads = G.b * G.hkv * G.g;
  return [=](const void* const* in, void* const* out) {
    std::byte* base = scratch_of<std::byte>(out, 3);
    float* part = L.shared(base);
    const auto* q = static_cast<const uint16_t*>(in[0]);
    const auto* k = static_cast<const uint16_t*>(in[1]);
    const auto* v = static_cast<const uint16_t*>(in[2]);
    const uint8_t* pad = G.pad ? static_cast<const uint8_t*>(in[3]) : nullptr;
    const float* lse = static_cast<const float*>(in[p]);
    const auto* dout = static_cast<const uint16_t*>(in[p + 1]);
    auto* dq = static_cast<uint16_t*>(out[0]);
#pragma omp parallel for num_threads(L.threads) schedule(dynamic) if (heads > 1)
    for (int64_t head = 0; head < heads; ++head) {
      const int tid = omp_get_thread_num();
      const int64_t gi = head % G.g, h = head / G.g % G.hkv, bi = head / (G.g * G.hkv);
      const uint16_t* kb = k + G.kv_off(bi, h);
      const uint16_t* vb = v + G.kv_off(bi, h);
      float* dkb = part + ((bi * G.hkv + h) * G.g + gi) * G.sk * G.d;
      float* dvb = part + kv_n * G.g + ((bi * G.hkv + h) * G.g + gi) * G.sk * G.d;
      std::memset(dkb, 0, static_cast<size_t>(G.sk * G.d) * sizeof(float));
      std::memset(dvb, 0, static_cast<size_t>(G.sk * G.d) * sizeof(float));
      const uint8_t* keep = pad ? pad + bi * G.sk : nullptr;
      float* s = L.rows(base, tid);  // scores, dP, a block's dq rows
      void* scratchpad = L.pad(base, tid);
      float* dp = s + G.rows * G.sk;
      float* dqb = dp + G.rows * G.sk;
      uint16_t* low = L.low(base, tid);
      for (int64_t blk = 0; blk < G.blocks(); ++blk) {
        const int64_t r0 = blk * G.rows, nr = std::min(G.rows, G.sq - r0);
        const int64_t qo = G.q_off(bi, h, gi) + r0 * G.d;
        const float* lb = lse + ((bi * G.hkv + h) * G.g + gi) * G.sq + r0;
        const int64_t ncols = G.backward_cols(r0, nr, lb);
        if (ncols == 0) {  // no key visible to any row: no gradient
          std::fill(dq + qo, dq + qo + nr * G.d, uint16_t{0});
          continue;
        }
        // P from the saved log-sum-exp.
        P->run(Form::qk, nr, ncols, tid, scratchpad, q + qo, kb, s);  // ld ncols, as dP below
        for (int64_t r = 0; r < nr; ++r) {  // P in f32 (for dS) and in bf16 (for the products)
          float* sr = s + r * ncols;
          uint16_t* pr = low + r * ncols;
          if (lb[r] == kNegInf) {  // attended uniformly (ncols is Sk)
            uniform_row(sr, ncols);
            std::fill(pr, pr + ncols, f32_to_bf16(sr[0]));
            continue;
          }
          mask_row(G, sr, r0 + r, ncols, keep);
          wide::exp_to_bf16(sr, lb[r], ncols, pr, sr);
        }
        P->run(Form::ptdo, nr, ncols, tid, scratchpad, low, dout + qo, dvb);  // dv += P^T dO
        P->run(Form::dovt, nr, ncols, tid, scratchpad, dout + qo, vb, dp);    // dP = dO V^T
        for (int64_t r = 0; r < nr; ++r) {                        // dS = P (dP - rowsum(P dP)) scale, in bf16
          const float* sr = s + r * ncols;
          const float* dr = dp + r * ncols;
          if (lb[r] == kNegInf) {  // constant scores: no gradient to q or k
            std::fill(low + r * ncols, low + (r + 1) * ncols, uint16_t{0});
            continue;
          }
          wide::ds_to_bf16(sr, dr, wide::dot(sr, dr, ncols), G.scale, ncols, low + r * ncols);
        }
        P->run(Form::dsk, nr, ncols, tid, scratchpad, low, kb, dqb);       // dQ = dS K
        P->run(Form::dstq, nr, ncols, tid, scratchpad, low, q + qo, dkb);  // dK += dS^T Q
        wide::to_bf16(dqb, 1.0f, nr * G.d, dq + qo);
      }
    }
    int st = P->err.exchange(0);
    if (st != 0)
      throw InternalError("[cpu] attention_grad: a oneDNN bf16 matmul failed with status " + std::to_string(st));
    sum_kv_partials(G, part, kv_n, out[1], out[2], L.threads);
  };
}

Kernel attention_grad_kernel(const KernelSpec& spec) {
  const Geom G = geom_of(spec);
  const int64_t q_n = spec.in[0].numel(), kv_n = spec.in[1].numel();
  const AttnScratch L = attn_scratch(spec, true);
  if (L.native) return attention_grad_bf16_kernel(G, L, make_bf16_products(G, true, L.threads), kv_n);
  const int p = G.pad ? 4 : 3;  // index of lse; the output cotangent follows
  const bool direct_kv = G.g == 1 && G.dt == DType::f32;
  const int64_t heads = G.b * G.hkv * G.g;
  auto err = std::make_shared<GemmErr>();
  return [=](const void* const* in, void* const* out) {
    GemmErr& B = *err;
    std::byte* base = scratch_of<std::byte>(out, 3);
    // Shared scratch [dk/dv partials per query head | q | k | v | dout | dq]: the partials unless
    // direct, the f32 copies and result for 16-bit operands.
    const int64_t part_n = direct_kv ? 0 : 2 * kv_n * G.g, copy_n = G.dt == DType::f32 ? 0 : 3 * q_n + 2 * kv_n;
    float* part = L.shared(base);
    float* copies = copy_n ? part + part_n : nullptr;
    const float* q = as_f32(in[0], G.dt, copies, 0, q_n);
    const float* k = as_f32(in[1], G.dt, copies, q_n, kv_n);
    const float* v = as_f32(in[2], G.dt, copies, q_n + kv_n, kv_n);
    const uint8_t* pad = G.pad ? static_cast<const uint8_t*>(in[3]) : nullptr;
    const float* lse = static_cast<const float*>(in[p]);
    const float* dout = as_f32(in[p + 1], G.dt, copies, q_n + 2 * kv_n, q_n);
    float* dq = G.dt == DType::f32 ? static_cast<float*>(out[0]) : copies + 2 * q_n + 2 * kv_n;
    // dk/dv of query head (b, h, g): written straight out when there is one query head per
    // key/value head, else into partials laid out [b, h, g, Sk, D] and summed over g below.
    auto dk_of = [&](int64_t bi, int64_t h, int64_t gi) {
      return direct_kv ? static_cast<float*>(out[1]) + G.kv_off(bi, h)
                       : part + ((bi * G.hkv + h) * G.g + gi) * G.sk * G.d;
    };
    auto dv_of = [&](int64_t bi, int64_t h, int64_t gi) {
      return direct_kv ? static_cast<float*>(out[2]) + G.kv_off(bi, h)
                       : part + kv_n * G.g + ((bi * G.hkv + h) * G.g + gi) * G.sk * G.d;
    };
#pragma omp parallel for num_threads(L.threads) schedule(dynamic) if (heads > 1)
    for (int64_t head = 0; head < heads; ++head) {
      const int64_t gi = head % G.g, h = head / G.g % G.hkv, bi = head / (G.g * G.hkv);
      const float* kb = k + G.kv_off(bi, h);
      const float* vb = v + G.kv_off(bi, h);
      float* dkb = dk_of(bi, h, gi);
      float* dvb = dv_of(bi, h, gi);
      if (G.sk * G.d > 0) {
        std::memset(dkb, 0, static_cast<size_t>(G.sk * G.d) * sizeof(float));
        std::memset(dvb, 0, static_cast<size_t>(G.sk * G.d) * sizeof(float));
      }
      const uint8_t* keep = pad ? pad + bi * G.sk : nullptr;
      float* s = L.rows(base, omp_get_thread_num());
      float* dp = s + G.rows * G.sk;
      for (int64_t blk = 0; blk < G.blocks(); ++blk) {
        const int64_t r0 = blk * G.rows, nr = std::min(G.rows, G.sq - r0);
        const int64_t qo = G.q_off(bi, h, gi) + r0 * G.d;
        const float* lb = lse + ((bi * G.hkv + h) * G.g + gi) * G.sq + r0;
        const int64_t ncols = G.backward_cols(r0, nr, lb);
        if (G.sk == 0 || G.d == 0) {
          std::fill(dq + qo, dq + qo + nr * G.d, 0.0f);
          continue;
        }
        // P from the saved log-sum-exp.
        sgemm(B.gemm_err, 'N', 'T', nr, ncols, G.d, G.scale, q + qo, G.d, kb, G.d, 0.0f, s, G.sk);
        probability_rows(G, s, r0, nr, ncols, keep, lb);
        sgemm(B.gemm_err, 'T', 'N', ncols, G.d, nr, 1.0f, s, G.sk, dout + qo, G.d, 1.0f, dvb, G.d);  // dv += P^T dO
        sgemm(B.gemm_err, 'N', 'T', nr, ncols, G.d, 1.0f, dout + qo, G.d, vb, G.d, 0.0f, dp, G.sk);  // dP = dO V^T
        for (int64_t r = 0; r < nr; ++r) {
          float* sr = s + r * G.sk;
          float* dr = dp + r * G.sk;
          if (lb[r] == kNegInf) {  // constant scores: no gradient to q or k
            std::fill(dr, dr + ncols, 0.0f);
            continue;
          }
          const float di = wide::dot(sr, dr, ncols);
          for (int64_t j = 0; j < ncols; ++j) dr[j] = sr[j] * (dr[j] - di) * G.scale;  // dS
        }
        sgemm(B.gemm_err, 'N', 'N', nr, G.d, ncols, 1.0f, dp, G.sk, kb, G.d, 0.0f, dq + qo, G.d);         // dQ = dS K
        sgemm(B.gemm_err, 'T', 'N', ncols, G.d, nr, 1.0f, dp, G.sk, q + qo, G.d, 1.0f, dkb, G.d);          // dK += dS^T Q
      }
    }
    throw_if_sgemm_failed(B.gemm_err, "attention_grad");
    if (G.dt != DType::f32) store_f32(dq, out[0], G.dt, 0, q_n);
    if (!direct_kv) sum_kv_partials(G, part, kv_n, out[1], out[2], L.threads);
  };
}

}  // namespace

void register_attention_kernels() {
  for (bool grad : {false, true})
    register_kernel(grad ? prims::attention_grad() : prims::attention(), grad ? attention_grad_kernel : attention_kernel,
                    [grad](const KernelSpec& spec) { return attn_scratch(spec, grad).bytes; });
}

}  // namespace px::cpu
