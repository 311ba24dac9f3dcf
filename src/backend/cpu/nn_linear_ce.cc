// CPU kernels of linear_cross_entropy and its gradient (src/ops/nn_linear_ce.cc): the logits of a
// block of rows and a block of the vocabulary at a time, by the sgemm that dot_general runs on
// (oneDNN), into a scratch block that stays in cache; nothing of size [rows, vocab] is written.
//
// One parallel region for all the blocks (the gradient adds a second for summing dh): the
// vocabulary blocks are dealt out to the threads, each running its sgemms on itself (inside a
// region oneDNN does not split a product further), so a call costs a fork and join or two rather
// than one per block, which on shared cores is a scheduler slice each (a first version with
// multithreaded sgemms per block ran the 50257-vocab step 3x slower at load 7 on 2 cores).
// The forward keeps a running max and sum of exponentials per row and thread (an online
// logsumexp), merged at the end, and the label's logit from the block that holds it. The gradient
// recomputes each block's logits, turns them into ct (softmax - onehot) with the saved
// logsumexp, and adds their products into the block's dw (the thread's own) and into the
// thread's f32 copy of dh, summed over the threads at the end. All math is f32; 16-bit h is
// widened once per call and a 16-bit block of w once per block; 16-bit results are rounded once.
//
// Scratch (the kernel's, planned with the program's buffers): per thread a
// logits block (2 MiB), the f32 block of w (16-bit w), the row statistics (forward) or an f32
// dh [rows, d] (gradient); and h in f32 (16-bit h).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/kernel.h"
#include "backend/cpu/vmath.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {

constexpr int64_t kRowBlock = 256;          // rows of one logits block
constexpr int64_t kVocabBlock = 2048;       // classes of one logits block: 2 MiB of f32 logits
constexpr double kParallelFlops = 1 << 22;  // below this many multiply-adds a call runs on one thread

struct Dims {
  int64_t rows = 0, d = 0, v = 0;
  int vocab_axis = 0;  // 0: w [v, d]; 1: w [d, v]
  DType dt = DType::f32;
  int64_t ignore = -100;
  int threads = 1;
  int64_t rb = 1, vb = 1;  // block sizes
  bool narrow() const { return dt != DType::f32; }
  int64_t blocks() const { return (v + vb - 1) / vb; }
  // Floats of scratch: h widened (shared), and per thread a block of w widened and a logits block.
  int64_t h_len() const { return narrow() ? rows * d : 0; }
  int64_t w_len() const { return narrow() ? vb * d : 0; }
  int64_t block_len() const { return w_len() + rb * vb; }
  // The gradient's per-thread dw block (16-bit w) and f32 dh.
  int64_t dw_len() const { return narrow() ? vb * d : 0; }
  int64_t dh_len() const { return rows * d; }
  // Per thread: the forward's [w block | logits block | max, sum, label logit of every row]; the
  // gradient's [w block | logits block | dw block | dh].
  int64_t per_thread(bool grad) const { return block_len() + (grad ? dw_len() + dh_len() : 3 * rows); }
  int64_t scratch_floats(bool grad) const { return h_len() + threads * per_thread(grad); }
};

Dims dims_of(const KernelSpec& spec) {
  Dims s;
  const TensorType &h = spec.in[0], &w = spec.in[1];
  s.d = h.shape.back();
  s.rows = spec.in[2].numel();
  s.vocab_axis = static_cast<int>(spec.attrs.i("vocab_axis"));
  s.v = w.shape[s.vocab_axis];
  s.dt = h.dtype;
  s.ignore = spec.attrs.i("ignore_index");
  const double work = static_cast<double>(s.rows) * static_cast<double>(s.d) * static_cast<double>(s.v);
  s.threads = work < kParallelFlops ? 1 : num_threads();
  s.rb = std::max<int64_t>(1, std::min(s.rows, kRowBlock));
  // At least 4 blocks a thread where the vocabulary allows (rounded to 64 classes), for balance.
  const int64_t balanced = (s.v + 4 * s.threads - 1) / (4 * s.threads);
  s.vb = std::max<int64_t>(1, std::min(s.v, std::clamp<int64_t>((balanced + 63) / 64 * 64, 256, kVocabBlock)));
  return s;
}

// The block [c0, c0 + n) of w's classes as an f32 matrix: a pointer and its leading dimension
// (the classes are rows of [v, d] or columns of [d, v]); 16-bit weights are widened into `buf`.
struct WBlock {
  const float* p;
  int64_t ld;
};
WBlock w_block(const Dims& s, const void* w, int64_t c0, int64_t n, float* buf) {
  if (!s.narrow())
    return s.vocab_axis == 0 ? WBlock{static_cast<const float*>(w) + c0 * s.d, s.d}
                             : WBlock{static_cast<const float*>(w) + c0, s.v};
  if (s.vocab_axis == 0) {
    load_f32(w, s.dt, c0 * s.d, buf, n * s.d);
    return {buf, s.d};
  }
  for (int64_t k = 0; k < s.d; ++k) load_f32(w, s.dt, k * s.v + c0, buf + k * n, n);
  return {buf, n};
}

// logits[m, n] = h[r0 : r0 + m] (f32, [rows, d]) times the block's classes.
void block_logits(std::atomic<int>& err, const Dims& s, const float* h, WBlock wb, int64_t m, int64_t n,
                  float* logits) {
  sgemm(err, 'N', s.vocab_axis == 0 ? 'T' : 'N', m, n, s.d, 1.0f, h, s.d, wb.p, wb.ld, 0.0f, logits, n);
}

const float* widened_h(const Dims& s, const void* h, float* buf) {
  if (!s.narrow()) return static_cast<const float*>(h);
  load_f32(h, s.dt, 0, buf, s.rows * s.d);
  return buf;
}

// body(thread, team size) on a team of `threads`, or on the calling thread alone (no OpenMP region:
// libgomp allocates a team even for a region whose `if` is false). Inside a device's thread of an
// outer team the region gets one thread.
template <class Body>
void run_team(int threads, const Body& body) {
  if (threads <= 1) {
    body(0, 1);
    return;
  }
#pragma omp parallel num_threads(threads)
  body(omp_get_thread_num(), omp_get_num_threads());
}

// The online logsumexp of one row over one block of its logits x[n] (classes c0...), with the
// label's logit kept when the block holds it.
void absorb_row(const float* x, int64_t n, int64_t c0, int64_t label, float& m, float& sum, float& t) {
  const float bm = vecmath::row_max(x, n);
  if (bm > m) {
    sum *= std::exp(m - bm);
    m = bm;
  }
  sum += vecmath::exp_shift_sum(x, m, nullptr, n);
  const int64_t rel = label - c0;
  if (rel >= 0 && rel < n) t = x[rel];
}

// Results: the loss and the logsumexp of each row.
Kernel forward_kernel(const Dims& s) {
  return [s](const void* const* in, void* const* out) {
    float* loss = static_cast<float*>(out[0]);
    float* lse = static_cast<float*>(out[1]);
    const int32_t* labels = static_cast<const int32_t*>(in[2]);
    if (s.rows == 0) return;
    const int64_t per = s.per_thread(false);
    float* base = scratch_of(out, 2);
    const float* h = widened_h(s, in[0], base);
    float* stats = base + s.h_len();
    std::atomic<int> err{0};
    std::atomic<int64_t> next{0};  // the next vocabulary block to take
    std::atomic<int> team{1};
    run_team(s.threads, [&](int tid, int nt) {
      if (tid == 0) team = nt;
      float* mine = stats + static_cast<int64_t>(tid) * per;
      float *m = mine + s.block_len(), *sum = m + s.rows, *t = sum + s.rows;
      std::fill(m, m + s.rows, -std::numeric_limits<float>::infinity());
      std::fill(sum, sum + 2 * s.rows, 0.0f);  // sum and t: t stays 0 where another thread has the label
      for (int64_t b = next++; b < s.blocks(); b = next++) {
        const int64_t c0 = b * s.vb, n = std::min(s.vb, s.v - c0);
        const WBlock wb = w_block(s, in[1], c0, n, mine);
        float* logits = mine + s.w_len();
        for (int64_t r0 = 0; r0 < s.rows; r0 += s.rb) {
          const int64_t mr = std::min(s.rb, s.rows - r0);
          block_logits(err, s, h + r0 * s.d, wb, mr, n, logits);
          for (int64_t i = 0; i < mr; ++i)
            absorb_row(logits + i * n, n, c0, labels[r0 + i], m[r0 + i], sum[r0 + i], t[r0 + i]);
        }
      }
    });
    throw_if_sgemm_failed(err, "linear_cross_entropy");
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t r = 0; r < s.rows; ++r) {
      float mx = -std::numeric_limits<float>::infinity(), sm = 0, t = 0;
      for (int k = 0; k < team; ++k) mx = std::max(mx, stats[k * per + s.block_len() + r]);
      for (int k = 0; k < team; ++k) {
        const float* mine = stats + k * per + s.block_len();
        if (mine[s.rows + r] > 0) sm += mine[s.rows + r] * std::exp(mine[r] - mx);
        t += mine[2 * s.rows + r];
      }
      const int64_t label = labels[r];
      lse[r] = mx + std::log(sm);
      loss[r] = label == s.ignore ? 0.0f : (label < 0 || label >= s.v) ? nan : lse[r] - t;
    }
  };
}

// The gradient block in place of its logits: ct (exp(x - lse) - onehot), 0 on ignored rows, NaN on
// rows with a label outside [0, v) (as softmax_cross_entropy_grad gives).
void grad_row(const Dims& s, float* x, int64_t n, int64_t c0, int64_t label, float lse, float ct) {
  if (label != s.ignore && (label < 0 || label >= s.v)) {
    std::fill(x, x + n, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  if (label == s.ignore || ct == 0.0f) {
    std::fill(x, x + n, 0.0f);
    return;
  }
  vecmath::exp_shift_sum(x, lse, x, n);
  vecmath::map(x, x, n, [ct](vecmath::V e) { return e * ct; });
  const int64_t rel = label - c0;
  if (rel >= 0 && rel < n) x[rel] -= ct;
}

// One vocabulary block of the gradient: dw's block (written whole) and its share of dh (added).
void grad_block(const Dims& s, const void* const* in, void* dw_out, float* mine, float* dh, int64_t b,
                std::atomic<int>& err) {
  const int32_t* labels = static_cast<const int32_t*>(in[2]);
  const float* lse = static_cast<const float*>(in[3]);
  const float* ct = static_cast<const float*>(in[4]);
  const float* h = s.narrow() ? static_cast<const float*>(in[5]) : static_cast<const float*>(in[0]);
  const int64_t c0 = b * s.vb, n = std::min(s.vb, s.v - c0);
  const WBlock wb = w_block(s, in[1], c0, n, mine);
  float* p = mine + s.w_len();
  // This block's dw: [n, d] (vocab_axis 0) or [d, n] (1), in the result or in f32 scratch.
  float* dw = p + s.rb * s.vb;
  int64_t ldw = s.vocab_axis == 0 ? s.d : n;
  if (!s.narrow()) {
    dw = static_cast<float*>(dw_out) + (s.vocab_axis == 0 ? c0 * s.d : c0);
    ldw = s.vocab_axis == 0 ? s.d : s.v;
  }
  for (int64_t r0 = 0; r0 < s.rows; r0 += s.rb) {
    const int64_t mr = std::min(s.rb, s.rows - r0);
    const float* hb = h + r0 * s.d;
    block_logits(err, s, hb, wb, mr, n, p);
    for (int64_t i = 0; i < mr; ++i) grad_row(s, p + i * n, n, c0, labels[r0 + i], lse[r0 + i], ct[r0 + i]);
    // dh[rows] += p w_block; dw_block = (sum over row blocks) p^T h (or h^T p).
    sgemm(err, 'N', s.vocab_axis == 0 ? 'N' : 'T', mr, s.d, n, 1.0f, p, n, wb.p, wb.ld, 1.0f, dh + r0 * s.d, s.d);
    const float beta = r0 == 0 ? 0.0f : 1.0f;
    if (s.vocab_axis == 0)
      sgemm(err, 'T', 'N', n, s.d, mr, 1.0f, p, n, hb, s.d, beta, dw, ldw);
    else
      sgemm(err, 'T', 'N', s.d, n, mr, 1.0f, hb, s.d, p, n, beta, dw, ldw);
  }
  if (!s.narrow()) return;
  if (s.vocab_axis == 0)
    store_f32(dw, dw_out, s.dt, c0 * s.d, n * s.d);
  else
    for (int64_t k = 0; k < s.d; ++k) store_f32(dw + k * n, dw_out, s.dt, k * s.v + c0, n);
}

// Results: dh (h's dtype) and dw (w's dtype).
Kernel grad_kernel(const Dims& s) {
  return [s](const void* const* in, void* const* out) {
    if (s.rows == 0 || s.v == 0 || s.d == 0) {
      std::memset(out[0], 0, static_cast<size_t>(s.rows * s.d * dtype_size(s.dt)));
      std::memset(out[1], 0, static_cast<size_t>(s.v * s.d * dtype_size(s.dt)));
      return;
    }
    const int64_t dw_len = s.dw_len(), dh_len = s.dh_len(), per = s.per_thread(true);
    float* base = scratch_of(out, 2);
    const void* args[6] = {in[0], in[1], in[2], in[3], in[4], widened_h(s, in[0], base)};
    float* scratch = base + s.h_len();
    std::atomic<int> err{0};
    std::atomic<int64_t> next{0};  // the next vocabulary block to take
    std::atomic<int> team{1};
    run_team(s.threads, [&](int tid, int nt) {
      if (tid == 0) team = nt;
      float* mine = scratch + static_cast<int64_t>(tid) * per;
      float* dh = mine + s.block_len() + dw_len;
      std::fill(dh, dh + dh_len, 0.0f);
      for (int64_t b = next++; b < s.blocks(); b = next++) grad_block(s, args, out[1], mine, dh, b, err);
    });
    // dh: the threads' sums added into thread 0's, in slices, and stored.
    const int64_t slices = (dh_len + 4095) / 4096;
    run_team(std::min<int64_t>(s.threads, slices), [&](int tid, int nt) {
      for (int64_t c = tid; c < slices; c += nt) {
        const int64_t lo = c * 4096, len = std::min<int64_t>(4096, dh_len - lo);
        float* acc = scratch + s.block_len() + dw_len + lo;
        for (int k = 1; k < team; ++k) {
          const float* other = scratch + k * per + s.block_len() + dw_len + lo;
          for (int64_t i = 0; i < len; ++i) acc[i] += other[i];
        }
        store_f32(acc, out[0], s.dt, lo, len);
      }
    });
    throw_if_sgemm_failed(err, "linear_cross_entropy_grad");
  };
}

Kernel lce_kernel(const KernelSpec& spec, bool grad) {
  const Dims s = dims_of(spec);
  return grad ? grad_kernel(s) : forward_kernel(s);
}

}  // namespace

void register_linear_ce_kernels() {
  for (bool grad : {false, true})
    register_kernel(grad ? prims::linear_cross_entropy_grad() : prims::linear_cross_entropy(),
                    [grad](const KernelSpec& spec) { return lce_kernel(spec, grad); },
                    [grad](const KernelSpec& spec) {
                      return dims_of(spec).scratch_floats(grad) * static_cast<int64_t>(sizeof(float));
                    });
}

}  // namespace px::cpu
