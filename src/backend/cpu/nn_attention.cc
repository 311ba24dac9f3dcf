// CPU kernels of fused attention. Work is split into blocks of query rows of one head; a
// block's scores [rows, Sk] live in per-thread scratch and go through sgemm -> masked softmax
// -> sgemm, so no [B,H,Sq,Sk] tensor exists. Causal blocks stop at their last visible key.
// The backward recomputes the probabilities from the saved log-sum-exp (flash-attention style)
// and keeps per-query-head dk/dv partials that are summed over grouped heads at the end.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <oneapi/dnnl/dnnl.h>

#include "backend/cpu/kernel.h"
#include "backend/cpu/nn_math.h"

namespace px::cpu {

namespace {

constexpr int64_t kRows = 64;  // query rows per block
constexpr float kNegInf = -INFINITY;

struct Geom {
  int64_t b = 0, hkv = 0, g = 0, sq = 0, sk = 0, d = 0;
  bool causal = false, pad = false;
  float scale = 1;
  DType dt = DType::f32;
  int64_t blocks() const { return (sq + kRows - 1) / kRows; }
  // Keys [0, limit) are visible to query row i (before padding).
  int64_t limit(int64_t i) const { return causal ? std::clamp<int64_t>(i + sk - sq + 1, 0, sk) : sk; }
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

// Per-thread scratch rows and f32 copies of 16-bit operands, all sized in the factory.
struct Buffers {
  int threads = 1;
  int64_t per_thread = 0;
  std::vector<float> rows;
  std::vector<float> copies[4];
  std::atomic<int> gemm_err{0};  // the first failing dnnl_sgemm status of a run
  float* mine() { return rows.data() + static_cast<size_t>(omp_get_thread_num()) * per_thread; }
};

const float* as_f32(const void* p, DType t, std::vector<float>& copy, int64_t n) {
  if (t == DType::f32) return static_cast<const float*>(p);
  load_f32(p, t, 0, copy.data(), n);
  return copy.data();
}

Kernel attention_kernel(const KernelSpec& spec) {
  const Geom G = geom_of(spec);
  const int64_t q_n = spec.in[0].numel(), kv_n = spec.in[1].numel();
  auto buf = std::make_shared<Buffers>();
  buf->threads = num_threads();
  buf->per_thread = kRows * std::max<int64_t>(G.sk, 1);
  buf->rows.resize(static_cast<size_t>(buf->threads * buf->per_thread));
  if (G.dt != DType::f32)
    for (int c = 0; c < 4; ++c) buf->copies[c].resize(static_cast<size_t>(c == 1 || c == 2 ? kv_n : q_n));
  const int64_t items = G.b * G.hkv * G.g * G.blocks();
  return [G, buf, q_n, kv_n, items](const void* const* in, void* const* out) {
    Buffers& B = *buf;
    const float* q = as_f32(in[0], G.dt, B.copies[0], q_n);
    const float* k = as_f32(in[1], G.dt, B.copies[1], kv_n);
    const float* v = as_f32(in[2], G.dt, B.copies[2], kv_n);
    const uint8_t* pad = G.pad ? static_cast<const uint8_t*>(in[3]) : nullptr;
    float* o = G.dt == DType::f32 ? static_cast<float*>(out[0]) : B.copies[3].data();
    float* lse = static_cast<float*>(out[1]);
    if (G.sk == 0 || G.d == 0) {  // no keys: zeros; no head dim: nothing to compute
      if (q_n > 0) std::memset(o, 0, static_cast<size_t>(q_n) * sizeof(float));  // o is null when empty
      std::fill(lse, lse + G.b * G.hkv * G.g * G.sq, kNegInf);
    } else {
#pragma omp parallel for num_threads(B.threads) schedule(dynamic) if (items > 1)
      for (int64_t it = 0; it < items; ++it) {
        const int64_t blk = it % G.blocks(), head = it / G.blocks();
        const int64_t gi = head % G.g, h = head / G.g % G.hkv, bi = head / (G.g * G.hkv);
        const int64_t r0 = blk * kRows, nr = std::min(kRows, G.sq - r0);
        const float* qb = q + G.q_off(bi, h, gi) + r0 * G.d;
        const float* kb = k + G.kv_off(bi, h);
        const float* vb = v + G.kv_off(bi, h);
        float* ob = o + G.q_off(bi, h, gi) + r0 * G.d;
        float* lb = lse + ((bi * G.hkv + h) * G.g + gi) * G.sq + r0;
        const uint8_t* keep = pad ? pad + bi * G.sk : nullptr;
        float* s = B.mine();
        const int64_t ncols = G.limit(r0 + nr - 1);
        sgemm(B.gemm_err, 'N', 'T', nr, ncols, G.d, G.scale, qb, G.d, kb, G.d, 0.0f, s, G.sk);
        bool any_uniform = false;
        for (int64_t r = 0; r < nr; ++r) {
          float* sr = s + r * G.sk;
          if (!mask_row(G, sr, r0 + r, ncols, keep)) {
            any_uniform = true;
            lb[r] = kNegInf;
            continue;
          }
          const float m = vmath::row_max(sr, ncols);
          const float sum = vmath::exp_shift_sum(sr, m, sr, ncols);
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < ncols; ++j) sr[j] *= inv;
          lb[r] = m + std::log(sum);
        }
        int64_t ncols_eff = ncols;
        if (any_uniform) {
          ncols_eff = G.sk;
          for (int64_t r = 0; r < nr; ++r) {
            float* sr = s + r * G.sk;
            if (lb[r] == kNegInf) uniform_row(sr, G.sk);
            else std::fill(sr + ncols, sr + G.sk, 0.0f);
          }
        }
        sgemm(B.gemm_err, 'N', 'N', nr, G.d, ncols_eff, 1.0f, s, G.sk, vb, G.d, 0.0f, ob, G.d);
      }
    }
    throw_if_sgemm_failed(B.gemm_err, "attention");
    if (G.dt != DType::f32) store_f32(o, out[0], G.dt, 0, q_n);
  };
}

Kernel attention_grad_kernel(const KernelSpec& spec) {
  const Geom G = geom_of(spec);
  const int64_t q_n = spec.in[0].numel(), kv_n = spec.in[1].numel();
  const int p = G.pad ? 4 : 3;  // index of lse; the output cotangent follows
  auto buf = std::make_shared<Buffers>();
  buf->threads = num_threads();
  buf->per_thread = 2 * kRows * std::max<int64_t>(G.sk, 1);
  buf->rows.resize(static_cast<size_t>(buf->threads * buf->per_thread));
  // copies: 0 q, 1 k, 2 v, 3 dout; f32 results: dq, and dk/dv partials per query head.
  if (G.dt != DType::f32)
    for (int c = 0; c < 4; ++c) buf->copies[c].resize(static_cast<size_t>(c == 1 || c == 2 ? kv_n : q_n));
  const bool direct_kv = G.g == 1 && G.dt == DType::f32;
  auto dq_buf = std::make_shared<std::vector<float>>(G.dt == DType::f32 ? 0 : q_n);
  auto part = std::make_shared<std::vector<float>>(direct_kv ? 0 : 2 * kv_n * G.g);
  const int64_t heads = G.b * G.hkv * G.g;
  return [=](const void* const* in, void* const* out) {
    Buffers& B = *buf;
    const float* q = as_f32(in[0], G.dt, B.copies[0], q_n);
    const float* k = as_f32(in[1], G.dt, B.copies[1], kv_n);
    const float* v = as_f32(in[2], G.dt, B.copies[2], kv_n);
    const uint8_t* pad = G.pad ? static_cast<const uint8_t*>(in[3]) : nullptr;
    const float* lse = static_cast<const float*>(in[p]);
    const float* dout = as_f32(in[p + 1], G.dt, B.copies[3], q_n);
    float* dq = G.dt == DType::f32 ? static_cast<float*>(out[0]) : dq_buf->data();
    // dk/dv of query head (b, h, g): written straight out when there is one query head per
    // key/value head, else into partials laid out [b, h, g, Sk, D] and summed over g below.
    auto dk_of = [&](int64_t bi, int64_t h, int64_t gi) {
      return direct_kv ? static_cast<float*>(out[1]) + G.kv_off(bi, h)
                       : part->data() + ((bi * G.hkv + h) * G.g + gi) * G.sk * G.d;
    };
    auto dv_of = [&](int64_t bi, int64_t h, int64_t gi) {
      return direct_kv ? static_cast<float*>(out[2]) + G.kv_off(bi, h)
                       : part->data() + kv_n * G.g + ((bi * G.hkv + h) * G.g + gi) * G.sk * G.d;
    };
#pragma omp parallel for num_threads(B.threads) schedule(dynamic) if (heads > 1)
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
      float* s = B.mine();
      float* dp = s + kRows * G.sk;
      for (int64_t blk = 0; blk < G.blocks(); ++blk) {
        const int64_t r0 = blk * kRows, nr = std::min(kRows, G.sq - r0);
        const int64_t qo = G.q_off(bi, h, gi) + r0 * G.d;
        const float* lb = lse + ((bi * G.hkv + h) * G.g + gi) * G.sq + r0;
        int64_t ncols = G.limit(r0 + nr - 1);
        for (int64_t r = 0; r < nr; ++r)
          if (lb[r] == kNegInf) ncols = G.sk;  // a uniform row touches every key
        if (G.sk == 0 || G.d == 0) {
          std::fill(dq + qo, dq + qo + nr * G.d, 0.0f);
          continue;
        }
        // P from the saved log-sum-exp.
        sgemm(B.gemm_err, 'N', 'T', nr, ncols, G.d, G.scale, q + qo, G.d, kb, G.d, 0.0f, s, G.sk);
        for (int64_t r = 0; r < nr; ++r) {
          float* sr = s + r * G.sk;
          if (lb[r] == kNegInf) {
            uniform_row(sr, ncols);
            continue;
          }
          mask_row(G, sr, r0 + r, ncols, keep);
          const float l = lb[r];
          vmath::map(sr, sr, ncols, [l](vmath::V8 x) { return vmath::exp(x - l); });
        }
        sgemm(B.gemm_err, 'T', 'N', ncols, G.d, nr, 1.0f, s, G.sk, dout + qo, G.d, 1.0f, dvb, G.d);  // dv += P^T dO
        sgemm(B.gemm_err, 'N', 'T', nr, ncols, G.d, 1.0f, dout + qo, G.d, vb, G.d, 0.0f, dp, G.sk);  // dP = dO V^T
        for (int64_t r = 0; r < nr; ++r) {
          float* sr = s + r * G.sk;
          float* dr = dp + r * G.sk;
          if (lb[r] == kNegInf) {  // constant scores: no gradient to q or k
            std::fill(dr, dr + ncols, 0.0f);
            continue;
          }
          float di = 0;
          for (int64_t j = 0; j < ncols; ++j) di += sr[j] * dr[j];
          for (int64_t j = 0; j < ncols; ++j) dr[j] = sr[j] * (dr[j] - di) * G.scale;  // dS
        }
        sgemm(B.gemm_err, 'N', 'N', nr, G.d, ncols, 1.0f, dp, G.sk, kb, G.d, 0.0f, dq + qo, G.d);         // dQ = dS K
        sgemm(B.gemm_err, 'T', 'N', ncols, G.d, nr, 1.0f, dp, G.sk, q + qo, G.d, 1.0f, dkb, G.d);          // dK += dS^T Q
      }
    }
    throw_if_sgemm_failed(B.gemm_err, "attention_grad");
    if (G.dt != DType::f32) store_f32(dq, out[0], G.dt, 0, q_n);
    if (!direct_kv) {
      // Sum the partials over grouped query heads and store in the result dtype.
      const int64_t slab = G.sk * G.d;
#pragma omp parallel for num_threads(B.threads) schedule(static) if (kv_n > 65536)
      for (int64_t bh = 0; bh < G.b * G.hkv; ++bh)
        for (int which = 0; which < 2; ++which) {
          float* base = part->data() + which * kv_n * G.g + bh * G.g * slab;
          for (int64_t gi = 1; gi < G.g; ++gi)
            for (int64_t e = 0; e < slab; ++e) base[e] += base[gi * slab + e];
          store_f32(base, out[1 + which], G.dt, bh * slab, slab);
        }
    }
  };
}

}  // namespace

void register_attention_kernels() {
  register_kernel("attention", attention_kernel);
  register_kernel("attention_grad", attention_grad_kernel);
}

}  // namespace px::cpu
