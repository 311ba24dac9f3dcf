// Autoregressive decoding: a prefill program over the prompt and a one-token decode program, both
// over a key/value cache of fixed length, and host-side sampling of each next token.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>

#include "parallax/nn/pretrained.h"
#include "parallax/runtime.h"

namespace px::nn {

namespace {

// Logits of the last of tokens [B, S] at positions pos.. and the updated caches (k, v per layer).
std::vector<Tensor> lm_cached(const TransformerLm& m, const Tensor& tokens, const Tensor& pos,
                              const std::vector<Tensor>& caches) {
  const int64_t s = tokens.dim(1);
  Tensor x = m.embed(tokens);
  if (m.pos_embed.table.defined()) x = x + take(m.pos_embed.table, iota({s}, 0, DType::i32) + pos);
  std::vector<Tensor> out{Tensor()};
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    const TransformerBlock& b = m.blocks[i];
    std::vector<Tensor> r = b.attn.cached(b.ln1(x), pos, caches[2 * i], caches[2 * i + 1]);
    Tensor h = x + r[0];
    x = h + b.mlp(b.ln2(h));
    out.push_back(r[1]);
    out.push_back(r[2]);
  }
  Tensor h = slice_axis(m.final_norm(x), 1, s - 1, s);
  Tensor logits = m.head.w.defined() ? m.head(h) : m.embed.attend(h, m.config().compute_dtype);
  out[0] = reshape(logits, {tokens.dim(0), m.config().vocab_size});
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

Program compile_cached(const TransformerLm& m, int64_t batch, int64_t seq, int64_t len) {
  const LmConfig& c = m.config();
  std::vector<TensorType> types{{DType::i32, {batch, seq}}, {DType::i32, {}}};
  for (int64_t i = 0; i < 2 * c.n_layers; ++i) types.push_back({DType::f32, {batch, c.kv_heads(), len, c.head_dim()}});
  auto g = trace_with_params(
      m.store(),
      [&](const std::vector<Tensor>& in) {
        return lm_cached(m, in[0], in[1], std::vector<Tensor>(in.begin() + 2, in.end()));
      },
      types);
  return {Executable::compile(*g)};
}

Program compile_full(const TransformerLm& m, int64_t batch, int64_t len) {
  auto g =
      trace_with_params(m.store(), [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{m.logits(in[0])}; },
                        {{DType::i32, {batch, len}}});
  return {Executable::compile(*g)};
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

}  // namespace

std::vector<std::vector<int32_t>> generate(const TransformerLm& model, const std::vector<Array>& params,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt) {
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
  if (prompts.empty() || prompts[0].empty()) throw Error("[generate] give at least one non-empty prompt");
  const int64_t b = static_cast<int64_t>(prompts.size()), p = static_cast<int64_t>(prompts[0].size());
  for (auto& pr : prompts) {
    if (static_cast<int64_t>(pr.size()) != p)
      throw Error("[generate] prompts must share one length (" + std::to_string(p) + " and " +
                  std::to_string(pr.size()) + " given); pad or group them by length");
    for (int32_t t : pr)
      if (t < 0 || t >= c.vocab_size)
        throw Error("[generate] token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                    std::to_string(c.vocab_size) + ")");
  }
  if (opt.max_new_tokens <= 0) return std::vector<std::vector<int32_t>>(prompts.size());
  const int64_t len = opt.max_len > 0 ? opt.max_len : p + opt.max_new_tokens;
  if (len < p + opt.max_new_tokens || len > c.max_seq_len)
    throw Error("[generate] the prompt (" + std::to_string(p) + ") plus max_new_tokens (" +
                std::to_string(opt.max_new_tokens) + ") must fit max_len " + std::to_string(len) +
                " and the model's max_seq_len " + std::to_string(c.max_seq_len));
  if (static_cast<int>(params.size()) != model.store().size())
    throw Error("[generate] " + std::to_string(params.size()) + " params given, the model has " +
                std::to_string(model.store().size()));

  std::mt19937_64 rng(opt.seed);
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<int32_t> seq(static_cast<size_t>(b * len), 0);  // the rows so far, padded on the right
  for (int64_t r = 0; r < b; ++r) std::copy(prompts[r].begin(), prompts[r].end(), seq.begin() + r * len);
  std::vector<bool> done(static_cast<size_t>(b), false);
  auto emit = [&](const Array& logits, int64_t at) {  // logits f32[B, V]; writes position `at`
    const float* l = logits.data<float>();
    for (int64_t r = 0; r < b; ++r) {
      int32_t t = done[r] ? opt.eos_id : pick(l + r * c.vocab_size, c.vocab_size, opt, rng);
      done[r] = done[r] || (opt.eos_id >= 0 && t == opt.eos_id);
      out[r].push_back(t);
      seq[r * len + at] = t;
    }
  };
  using clock = std::chrono::steady_clock;
  auto record = [&](clock::time_point t0) {
    if (opt.token_seconds) opt.token_seconds->push_back(std::chrono::duration<double>(clock::now() - t0).count());
  };

  if (!opt.use_cache) {
    Program full = compile_full(model, b, len);
    for (int64_t at = p; at < p + opt.max_new_tokens; ++at) {
      auto t0 = clock::now();
      Array all = full.run(params, {Array::from_i32(seq, {b, len})})[0];  // [B, L, V]
      Array last(DType::f32, {b, c.vocab_size});
      for (int64_t r = 0; r < b; ++r)
        std::copy_n(all.data<float>() + (r * len + at - 1) * c.vocab_size, c.vocab_size,
                    last.data<float>() + r * c.vocab_size);
      emit(last, at);
      record(t0);
    }
    return out;
  }

  Program prefill = compile_cached(model, b, p, len);
  Program decode = compile_cached(model, b, 1, len);
  std::vector<int32_t> toks;
  for (auto& pr : prompts) toks.insert(toks.end(), pr.begin(), pr.end());
  std::vector<Array> batch{Array::from_i32(toks, {b, p}), Array::from_i32({0}, {})};
  for (int64_t i = 0; i < 2 * c.n_layers; ++i)
    batch.push_back(Array::zeros(DType::f32, {b, c.kv_heads(), len, c.head_dim()}));
  auto t0 = clock::now();
  std::vector<Array> res = prefill.run(params, batch);
  emit(res[0], p);
  record(t0);
  for (int64_t at = p + 1; at < p + opt.max_new_tokens; ++at) {
    t0 = clock::now();
    std::vector<int32_t> last(static_cast<size_t>(b));
    for (int64_t r = 0; r < b; ++r) last[r] = seq[r * len + at - 1];
    batch[0] = Array::from_i32(last, {b, 1});
    batch[1] = Array::from_i32({static_cast<int32_t>(at - 1)}, {});
    for (size_t i = 1; i < res.size(); ++i) batch[1 + i] = std::move(res[i]);
    res = decode.run(params, batch);
    emit(res[0], at);
    record(t0);
  }
  return out;
}

}  // namespace px::nn
