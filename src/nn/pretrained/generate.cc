// Autoregressive decoding: a prefill program over the prompts and a one-token decode program, both
// over a key/value cache of fixed length, and host-side sampling of each next token. Each row keeps
// its own positions (prompts of different lengths are right-padded; no position is shifted), so a
// row in a batch computes what it computes alone.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "parallax/nn/pretrained.h"
#include "parallax/runtime.h"

namespace px::nn {

namespace {

// Cached attention where each row has its own positions: x [B, S, d] holds row b's positions
// positions[b, 0..S-1] (i32 [B, S]); the new keys and values go to those cache slots and each query
// attends to its row's slots <= its position (and within the window).
std::vector<Tensor> attend_rows(const CausalSelfAttention& a, const Tensor& x, const Tensor& positions,
                                const Tensor& k_cache, const Tensor& v_cache) {
  const AttentionConfig& cfg = a.config();
  const int64_t b = x.dim(0), s = x.dim(1), h = cfg.n_heads, hkv = cfg.kv_heads(), hd = cfg.head_dim();
  const int64_t len = k_cache.dim(2);
  const DType c = cfg.compute_dtype;
  auto project = [&](const Param& w, const Param& bias, int64_t n) {
    Tensor y = dense(x, w, c);
    if (bias.defined()) y = y + bias.value();
    return transpose(reshape(y, {b, s, n, hd}), {0, 2, 1, 3});  // [B, n, S, hd]
  };
  Tensor q = project(a.wq, a.bq, h), k = project(a.wk, a.bk, hkv), v = project(a.wv, a.bv, hkv);
  if (cfg.rope) {
    // Angle tables cos/sin[p, i] of (p * inv_freq[i]) for p < len, gathered at each row's positions.
    const std::vector<double> inv_freq = rope_inv_freq(hd, cfg.rope_theta, cfg.rope_scaling);
    const int64_t half = hd / 2;
    std::vector<float> ct(static_cast<size_t>(len * half)), st(ct.size());
    for (int64_t p = 0; p < len; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double ang = static_cast<double>(p) * inv_freq[i];
        ct[p * half + i] = static_cast<float>(std::cos(ang));
        st[p * half + i] = static_cast<float>(std::sin(ang));
      }
    auto rotate = [&](const Tensor& t) {
      const int64_t n = t.dim(1);
      Tensor cs = broadcast_in_dim(take(constant(Array::from_f32(ct, {len, half}, t.dtype())), positions),
                                   {b, n, s, half}, {0, 2, 3});
      Tensor sn = broadcast_in_dim(take(constant(Array::from_f32(st, {len, half}, t.dtype())), positions),
                                   {b, n, s, half}, {0, 2, 3});
      Tensor t1 = slice_axis(t, 3, 0, half), t2 = slice_axis(t, 3, half, hd);
      return concat({t1 * cs - t2 * sn, t2 * cs + t1 * sn}, 3);
    };
    q = rotate(q);
    k = rotate(k);
  }
  // Masked write: scatter[b, s, l] = (l == positions[b, s]); other slots keep their values.
  Tensor scatter = one_hot(positions, len, DType::f32);                    // [B, S, L]
  Tensor written = greater(sum(scatter, {1}), full({}, 0.5, DType::f32));  // [B, L]
  auto write = [&](const Tensor& cache, const Tensor& fresh) {
    Tensor placed = dot_general(fresh, scatter, DotDims{{2}, {1}, {0}, {0}});  // [B, Hkv, hd, L]
    placed = transpose(placed, {0, 1, 3, 2});
    return where(broadcast_in_dim(written, cache.shape(), {0, 2}), placed, cache);
  };
  Tensor k_new = write(k_cache, k), v_new = write(v_cache, v);
  // mask[b, s, l]: slot l holds one of row b's tokens at or before its query, within the window.
  Tensor row = broadcast_in_dim(positions, {b, s, len}, {0, 1});
  Tensor col = iota({b, s, len}, 2, DType::i32);
  Tensor mask = less_equal(col, row);
  if (cfg.sliding_window > 0)
    mask = logical_and(mask, greater(col, row - full({}, static_cast<double>(cfg.sliding_window), DType::i32)));
  Tensor qc = c != DType::f32 ? cast(q, c) : q, kc = c != DType::f32 ? cast(k_new, c) : k_new,
         vc = c != DType::f32 ? cast(v_new, c) : v_new;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Tensor q5 = reshape(qc, {b, hkv, h / hkv, s, hd});
  Tensor scores = dot_general(q5 * scale, kc, DotDims{{4}, {3}, {0, 1}, {0, 1}}, DType::f32);  // [B,Hkv,G,S,L]
  scores = where(broadcast_in_dim(mask, scores.shape(), {0, 3, 4}), scores, full({}, -1e30, DType::f32));
  Tensor probs = softmax(scores, -1);
  if (probs.dtype() != vc.dtype()) probs = cast(probs, vc.dtype());
  Tensor o = reshape(dot_general(probs, vc, DotDims{{4}, {2}, {0, 1}, {0, 1}}), {b, h, s, hd});
  if (o.dtype() != DType::f32) o = cast(o, DType::f32);
  o = reshape(transpose(o, {0, 2, 1, 3}), {b, s, h * hd});
  Tensor y = dense(o, a.wo, c);
  return {a.bo.defined() ? y + a.bo.value() : y, k_new, v_new};
}

// Logits at one token of each row and the updated caches (k, v per layer): tokens [B, S] at
// positions [B, S]; `last` i32[B] is the flat index (b * S + s) of the token whose logits are wanted.
std::vector<Tensor> lm_cached(const TransformerLm& m, const Tensor& tokens, const Tensor& positions, const Tensor& last,
                              const std::vector<Tensor>& caches) {
  const int64_t b = tokens.dim(0), s = tokens.dim(1);
  Tensor x = m.embed(tokens);
  if (m.pos_embed.table.defined()) x = x + take(m.pos_embed.table, positions);
  std::vector<Tensor> out{Tensor()};
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const TransformerBlock& blk = m.blocks[i];
    std::vector<Tensor> r = attend_rows(blk.attn, blk.ln1(x), positions, caches[2 * i], caches[2 * i + 1]);
    Tensor h = x + r[0];
    x = h + blk.mlp(blk.ln2(h));
    out.push_back(r[1]);
    out.push_back(r[2]);
  }
  Tensor h = m.final_norm(x);
  h = reshape(take(reshape(h, {b * s, h.dim(2)}), last), {b, 1, h.dim(2)});
  Tensor logits = m.head.w.defined() ? m.head(h) : m.embed.attend(h, m.config().compute_dtype);
  out[0] = reshape(logits, {b, m.config().vocab_size});
  return out;
}

// One compiled program; its inputs are the params followed by the batch.
struct Program {
  std::unique_ptr<Executable> exe;
  std::vector<Array> run(const std::vector<Array>& params, const std::vector<Array>& batch) const {
    std::vector<Array> in = params;
    in.insert(in.end(), batch.begin(), batch.end());
    return exe->run(in);
  }
};

Program compile_cached(const TransformerLm& m, int64_t batch, int64_t seq, int64_t len, const CompileOptions& o) {
  const LmConfig& c = m.config();
  std::vector<TensorType> types{{DType::i32, {batch, seq}}, {DType::i32, {batch, seq}}, {DType::i32, {batch}}};
  for (int64_t i = 0; i < 2 * c.n_layers; ++i) types.push_back({DType::f32, {batch, c.kv_heads(), len, c.head_dim()}});
  auto g = trace_with_params(
      m.store(),
      [&](const std::vector<Tensor>& in) {
        return lm_cached(m, in[0], in[1], in[2], std::vector<Tensor>(in.begin() + 3, in.end()));
      },
      types);
  return {Executable::compile(*g, o)};
}

Program compile_full(const TransformerLm& m, int64_t batch, int64_t len, const CompileOptions& o) {
  auto g =
      trace_with_params(m.store(), [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{m.logits(in[0])}; },
                        {{DType::i32, {batch, len}}});
  return {Executable::compile(*g, o)};
}

// Logits no token can be picked from are an error, never a silent token 0: a NaN (greedy's
// max_element and the sampler's weights are then meaningless), +inf, or a row that is all -inf.
void check_logits(const float* logits, int64_t vocab, int64_t row, int64_t k) {
  int64_t nan = 0, pos_inf = 0, neg_inf = 0, first = -1;
  for (int64_t v = 0; v < vocab; ++v) {
    const float x = logits[v];
    if (std::isfinite(x)) continue;
    (std::isnan(x) ? nan : x > 0 ? pos_inf : neg_inf) += 1;
    if (first < 0 && !(x < 0)) first = v;
  }
  if (nan == 0 && pos_inf == 0 && neg_inf < vocab) return;
  const std::string where = "[generate] the logits of new token " + std::to_string(k) + " of prompt " +
                            std::to_string(row) + " ";
  if (nan + pos_inf > 0)
    throw Error(where + "hold " + std::to_string(nan) + " NaN and " + std::to_string(pos_inf) + " +inf of " +
                std::to_string(vocab) + " (the first at token id " + std::to_string(first) +
                "): no token can be picked from them; the params are probably not finite (a diverged or damaged "
                "checkpoint, or weights read as another dtype): check the params for NaN and inf");
  throw Error(where + "are -inf for every token id: no token can be picked from them");
}

int32_t pick(const float* logits, int64_t vocab, const GenerateOptions& opt, std::mt19937_64& rng) {
  if (opt.temperature <= 0.0) return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  size_t keep = order.size();
  if (opt.top_k > 0) keep = std::min(keep, static_cast<size_t>(opt.top_k));
  std::vector<double> p(keep);
  const double top = logits[order[0]] / opt.temperature;
  double total = 0;
  for (size_t i = 0; i < keep; ++i) total += p[i] = std::exp(logits[order[i]] / opt.temperature - top);
  if (opt.top_p < 1.0) {  // the smallest prefix whose mass reaches top_p
    double acc = 0;
    size_t n = 0;
    while (n < keep && acc < opt.top_p * total) acc += p[n++];
    keep = std::max<size_t>(n, 1);
    p.resize(keep);
  }
  std::discrete_distribution<size_t> d(p.begin(), p.end());
  return order[d(rng)];
}

// The request checked: the sampling options, the prompts against the vocabulary, the lengths
// against the cache and the model, the params' count. Returns the longest prompt and the cache
// length (0 when nothing is to be generated).
struct Request {
  int64_t longest = 0, len = 0;
};

Request check_request(const TransformerLm& model, const std::vector<Array>& params,
                      const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opt) {
  const LmConfig& c = model.config();
  // Sampling options first: out of range they would be clamped or ignored below without a word.
  if (!(opt.temperature >= 0.0) || !std::isfinite(opt.temperature))
    throw UserError("[generate] temperature " + std::to_string(opt.temperature) +
                    " is out of range; use 0 for greedy decoding or a finite value > 0 to sample (1: the model's "
                    "distribution)");
  if (!(opt.top_p > 0.0 && opt.top_p <= 1.0))
    throw UserError("[generate] top_p " + std::to_string(opt.top_p) +
                    " is out of range; use a value in (0, 1] (1: no nucleus cut)");
  if (opt.top_k < 0)
    throw UserError("[generate] top_k " + std::to_string(opt.top_k) + " is out of range; use 0 (no cut) or k >= 1");
  if (opt.max_new_tokens < 0)
    throw UserError("[generate] max_new_tokens " + std::to_string(opt.max_new_tokens) + " is negative; use >= 0");
  if (opt.max_len < 0)
    throw UserError("[generate] max_len " + std::to_string(opt.max_len) +
                    " is negative; use 0 (the prompt plus max_new_tokens) or a cache length");
  if (prompts.empty()) throw Error("[generate] give at least one non-empty prompt");
  Request q;
  for (auto& pr : prompts) {
    if (pr.empty())
      throw Error("[generate] prompt " + std::to_string(&pr - prompts.data()) +
                  " is empty; every prompt needs at least one token (e.g. the BOS id)");
    q.longest = std::max(q.longest, static_cast<int64_t>(pr.size()));
    for (int32_t t : pr)
      if (t < 0 || t >= c.vocab_size)
        throw Error("[generate] token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                    std::to_string(c.vocab_size) + ")");
  }
  if (opt.max_new_tokens <= 0) return q;
  const int64_t p = q.longest;
  q.len = opt.max_len > 0 ? opt.max_len : p + opt.max_new_tokens;
  if (q.len < p + opt.max_new_tokens || q.len > c.max_seq_len)
    throw Error("[generate] the prompt (" + std::to_string(p) + ") plus max_new_tokens (" +
                std::to_string(opt.max_new_tokens) + ") must fit max_len " + std::to_string(q.len) +
                " and the model's max_seq_len " + std::to_string(c.max_seq_len));
  if (static_cast<int>(params.size()) != model.store().size())
    throw Error("[generate] " + std::to_string(params.size()) + " params given, the model has " +
                std::to_string(model.store().size()));
  return q;
}

}  // namespace

std::vector<std::vector<int32_t>> generate(const TransformerLm& model, const std::vector<Array>& params,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt) {
  const LmConfig& c = model.config();
  const Request q = check_request(model, params, prompts, opt);
  if (opt.max_new_tokens <= 0) return std::vector<std::vector<int32_t>>(prompts.size());
  const int64_t b = static_cast<int64_t>(prompts.size()), p = q.longest, len = q.len;

  std::vector<int32_t> eos = opt.eos_ids;
  if (opt.eos_id >= 0) eos.push_back(opt.eos_id);
  auto is_eos = [&](int32_t t) { return std::find(eos.begin(), eos.end(), t) != eos.end(); };
  std::vector<int64_t> plen(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) plen[r] = static_cast<int64_t>(prompts[r].size());

  // The programs run on device 0 of the platform, where the params are copied once.
  CompileOptions o;
  o.platform = opt.platform;
  std::vector<Array> on_device;
  for (const Array& a : params) on_device.push_back(a.to({0, MemoryKind::device, opt.platform}));

  std::mt19937_64 rng(opt.seed);
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<int32_t> seq(static_cast<size_t>(b * len), 0);  // the rows so far, padded on the right
  for (int64_t r = 0; r < b; ++r) std::copy(prompts[r].begin(), prompts[r].end(), seq.begin() + r * len);
  std::vector<bool> done(static_cast<size_t>(b), false);
  std::vector<int32_t> stop(static_cast<size_t>(b), -1);  // the EOS id each finished row emitted
  // logits f32[B, V] of the k-th new token (0-based) of every row; false once every row has stopped.
  auto emit = [&](const Array& device_logits, int64_t k) {
    const Array logits = device_logits.on_host();
    const float* l = logits.data<float>();
    bool all_done = true;
    for (int64_t r = 0; r < b; ++r) {
      if (!done[r]) check_logits(l + r * c.vocab_size, c.vocab_size, r, k);
      int32_t t = done[r] ? stop[r] : pick(l + r * c.vocab_size, c.vocab_size, opt, rng);
      if (!done[r] && is_eos(t)) done[r] = true, stop[r] = t;
      out[r].push_back(t);
      seq[r * len + plen[r] + k] = t;
      all_done = all_done && done[r];
    }
    return !all_done;
  };
  auto finish = [&] {  // rows that stopped repeat their EOS up to max_new_tokens
    for (int64_t r = 0; r < b; ++r) out[r].resize(static_cast<size_t>(opt.max_new_tokens), stop[r]);
    return out;
  };
  using clock = std::chrono::steady_clock;
  auto record = [&](clock::time_point t0) {
    if (opt.token_seconds) opt.token_seconds->push_back(std::chrono::duration<double>(clock::now() - t0).count());
  };

  if (!opt.use_cache) {
    Program full = compile_full(model, b, len, o);
    for (int64_t k = 0; k < opt.max_new_tokens; ++k) {
      auto t0 = clock::now();
      const Array all = full.run(on_device, {Array::from_i32(seq, {b, len})})[0].on_host();  // [B, L, V]
      Array last(DType::f32, {b, c.vocab_size});
      for (int64_t r = 0; r < b; ++r)
        std::copy_n(all.data<float>() + (r * len + plen[r] + k - 1) * c.vocab_size, c.vocab_size,
                    last.data<float>() + r * c.vocab_size);
      const bool more = emit(last, k);
      record(t0);
      if (!more) break;
    }
    return finish();
  }

  // Prefill: every row from position 0, right-padded to the longest prompt. A short row's padding
  // lands in cache slots past its prompt, which its mask hides until its own tokens overwrite them.
  Program prefill = compile_cached(model, b, p, len, o);
  std::vector<int32_t> toks(static_cast<size_t>(b * p), 0), pos(toks.size()), last(static_cast<size_t>(b));
  for (int64_t r = 0; r < b; ++r) {
    std::copy(prompts[r].begin(), prompts[r].end(), toks.begin() + r * p);
    std::iota(pos.begin() + r * p, pos.begin() + (r + 1) * p, 0);
    last[r] = static_cast<int32_t>(r * p + plen[r] - 1);
  }
  std::vector<Array> batch{Array::from_i32(toks, {b, p}), Array::from_i32(pos, {b, p}), Array::from_i32(last, {b})};
  for (int64_t i = 0; i < 2 * c.n_layers; ++i)
    batch.push_back(Array::zeros(DType::f32, {b, c.kv_heads(), len, c.head_dim()}));
  auto t0 = clock::now();
  std::vector<Array> res = prefill.run(on_device, batch);
  bool more = emit(res[0], 0);
  record(t0);
  if (!more || opt.max_new_tokens == 1) return finish();
  Program decode = compile_cached(model, b, 1, len, o);
  std::vector<int32_t> first(static_cast<size_t>(b));
  std::iota(first.begin(), first.end(), 0);  // S = 1: row r's token is flat index r
  batch[2] = Array::from_i32(first, {b});
  for (int64_t k = 1; k < opt.max_new_tokens; ++k) {
    t0 = clock::now();
    std::vector<int32_t> tok(static_cast<size_t>(b)), at(static_cast<size_t>(b));
    for (int64_t r = 0; r < b; ++r) {
      at[r] = static_cast<int32_t>(plen[r] + k - 1);  // the previous new token's position
      tok[r] = seq[r * len + at[r]];
    }
    batch[0] = Array::from_i32(tok, {b, 1});
    batch[1] = Array::from_i32(at, {b, 1});
    for (size_t i = 1; i < res.size(); ++i) batch[2 + i] = std::move(res[i]);
    res = decode.run(on_device, batch);
    more = emit(res[0], k);
    record(t0);
    if (!more) break;
  }
  return finish();
}

}  // namespace px::nn
