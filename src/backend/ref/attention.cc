// Reference kernels of fused attention (src/ops/nn_attention.cc), computed straight from the math
// in double. Layouts: q [B,Hkv,G,Sq,D] (query head h*G+g reads key/value head h, which is how
// grouped-query attention is expressed), k and v [B,Hkv,Sk,D], optional bool key_padding [B,Sk]
// (true: the key takes part).
//
//  attention(q, k, v[, pad]) -> (o, lse): o = softmax(scale q k^T, masked) v, and lse (f32
//    [B,Hkv,G,Sq]) the natural log-sum-exp of each row's visible scaled scores. Causal queries are
//    aligned to the end of the keys: query i sees keys j <= i + Sk - Sq. A row that sees no key
//    attends uniformly to all Sk keys (as the composite's large negative fill does) and its lse
//    is -inf.
//  attention_grad(q, k, v[, pad], lse, dout) -> (dq, dk, dv): the gradient of o. It recomputes the
//    probabilities from q and k (the saved lse is not needed by this formulation); fully masked
//    rows pass dout / Sk to every dv and nothing to dq or dk (their scores are constants).
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

namespace {

struct Geom {
  int64_t b = 0, hkv = 0, g = 0, sq = 0, sk = 0, d = 0;
  bool causal = false, pad = false;
  double scale = 1;
  DType dt = DType::f32;
};

Geom geom_of(const Spec& s) {
  Geom G;
  const Shape& q = s.in.at(0).shape;
  G.b = q.at(0);
  G.hkv = q.at(1);
  G.g = q.at(2);
  G.sq = q.at(3);
  G.d = q.at(4);
  G.sk = s.in.at(1).shape.at(2);
  G.causal = s.attrs.i("causal") != 0;
  G.pad = s.attrs.i("key_padding") != 0;
  G.scale = s.attrs.f("scale");
  G.dt = s.in[0].dtype;
  return G;
}

std::vector<double> load_all(const void* p, DType t, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = load(p, t, i);
  return v;
}

// The probabilities of query row i against all Sk keys of one head (qi: D values, kh: [Sk, D]).
// Returns false when the row sees no key (then p is uniform and lse is -inf).
bool probs_row(const Geom& G, const double* qi, const double* kh, const uint8_t* keep, int64_t i,
               std::vector<double>& p, double& lse) {
  const int64_t limit = G.causal ? std::clamp<int64_t>(i + G.sk - G.sq + 1, 0, G.sk) : G.sk;
  double m = -INFINITY;
  bool any = false;
  for (int64_t j = 0; j < G.sk; ++j) {
    const bool visible = j < limit && (!keep || keep[j]);
    if (!visible) {
      p[j] = -INFINITY;
      continue;
    }
    double s = 0;
    for (int64_t e = 0; e < G.d; ++e) s += qi[e] * kh[j * G.d + e];
    p[j] = s * G.scale;
    m = std::max(m, p[j]);
    any = true;
  }
  if (!any) {
    for (int64_t j = 0; j < G.sk; ++j) p[j] = 1.0 / static_cast<double>(G.sk);
    lse = -INFINITY;
    return false;
  }
  double sum = 0;
  for (int64_t j = 0; j < G.sk; ++j) {
    p[j] = std::exp(p[j] - m);  // exp(-inf) = 0 for masked keys
    sum += p[j];
  }
  for (int64_t j = 0; j < G.sk; ++j) p[j] /= sum;
  lse = m + std::log(sum);
  return true;
}

Kernel make_attention(const Spec& s) {
  const Geom G = geom_of(s);
  const int64_t qn = s.in[0].numel(), kvn = s.in[1].numel();
  const DType odt = s.out.at(0).dtype;
  return [G, qn, kvn, odt](const void* const* in, void* const* out) {
    const std::vector<double> q = load_all(in[0], G.dt, qn), k = load_all(in[1], G.dt, kvn),
                              v = load_all(in[2], G.dt, kvn);
    const uint8_t* pad = G.pad ? static_cast<const uint8_t*>(in[3]) : nullptr;
    std::vector<double> p(static_cast<size_t>(G.sk));
    for (int64_t bi = 0; bi < G.b; ++bi)
      for (int64_t h = 0; h < G.hkv; ++h) {
        const int64_t kv_off = (bi * G.hkv + h) * G.sk * G.d;
        for (int64_t gi = 0; gi < G.g; ++gi)
          for (int64_t i = 0; i < G.sq; ++i) {
            const int64_t row = ((bi * G.hkv + h) * G.g + gi) * G.sq + i;
            double lse = -INFINITY;
            if (G.sk > 0) probs_row(G, &q[row * G.d], &k[kv_off], pad ? pad + bi * G.sk : nullptr, i, p, lse);
            for (int64_t e = 0; e < G.d; ++e) {
              double o = 0;
              for (int64_t j = 0; j < G.sk; ++j) o += p[j] * v[kv_off + j * G.d + e];
              store(out[0], odt, row * G.d + e, o);
            }
            store(out[1], DType::f32, row, lse);
          }
      }
  };
}

Kernel make_attention_grad(const Spec& s) {
  const Geom G = geom_of(s);
  const int64_t qn = s.in[0].numel(), kvn = s.in[1].numel();
  const int dout_at = G.pad ? 5 : 4;
  const DType dq_t = s.out.at(0).dtype, dk_t = s.out.at(1).dtype, dv_t = s.out.at(2).dtype;
  return [=](const void* const* in, void* const* out) {
    const std::vector<double> q = load_all(in[0], G.dt, qn), k = load_all(in[1], G.dt, kvn),
                              v = load_all(in[2], G.dt, kvn), dout = load_all(in[dout_at], G.dt, qn);
    const uint8_t* pad = G.pad ? static_cast<const uint8_t*>(in[3]) : nullptr;
    std::vector<double> dq(static_cast<size_t>(qn), 0.0), dk(static_cast<size_t>(kvn), 0.0),
        dv(static_cast<size_t>(kvn), 0.0);
    std::vector<double> p(static_cast<size_t>(G.sk)), dp(static_cast<size_t>(G.sk));
    for (int64_t bi = 0; bi < G.b; ++bi)
      for (int64_t h = 0; h < G.hkv; ++h) {
        const int64_t kv_off = (bi * G.hkv + h) * G.sk * G.d;
        for (int64_t gi = 0; gi < G.g; ++gi)
          for (int64_t i = 0; i < G.sq; ++i) {
            if (G.sk == 0) continue;
            const int64_t qo = (((bi * G.hkv + h) * G.g + gi) * G.sq + i) * G.d;
            double lse = 0;
            const bool scores_matter = probs_row(G, &q[qo], &k[kv_off], pad ? pad + bi * G.sk : nullptr, i, p, lse);
            // o_i = sum_j p_j v_j: dv_j += p_j dout_i, and dp_j = dout_i . v_j.
            double pdp = 0;
            for (int64_t j = 0; j < G.sk; ++j) {
              double t = 0;
              for (int64_t e = 0; e < G.d; ++e) {
                dv[kv_off + j * G.d + e] += p[j] * dout[qo + e];
                t += dout[qo + e] * v[kv_off + j * G.d + e];
              }
              dp[j] = t;
              pdp += p[j] * t;
            }
            if (!scores_matter) continue;
            // Softmax backward to the scores, then through s_j = scale q_i . k_j.
            for (int64_t j = 0; j < G.sk; ++j) {
              const double ds = p[j] * (dp[j] - pdp) * G.scale;
              if (ds == 0.0) continue;  // masked keys (p = 0) take no part
              for (int64_t e = 0; e < G.d; ++e) {
                dq[qo + e] += ds * k[kv_off + j * G.d + e];
                dk[kv_off + j * G.d + e] += ds * q[qo + e];
              }
            }
          }
      }
    for (int64_t i = 0; i < qn; ++i) store(out[0], dq_t, i, dq[i]);
    for (int64_t i = 0; i < kvn; ++i) {
      store(out[1], dk_t, i, dk[i]);
      store(out[2], dv_t, i, dv[i]);
    }
  };
}

}  // namespace

void register_attention_kernels() {
  register_kernel(prims::attention(), make_attention);
  register_kernel(prims::attention_grad(), make_attention_grad);
}

}  // namespace px::ref
