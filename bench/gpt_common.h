// Flags, batch and timing shared by the bench-gpt benchmarks (gpt_step, sharded_step).
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "parallax/nn.h"

namespace px::bench {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// bench-gpt (DESIGN.md section 10) unless overridden: --steps --warmup --vocab --d --heads
// --layers --ff --seq --batch, and --dtype f32|bf16|both where the benchmark takes it; each flag
// as "--flag value" or "--flag=value".
// --flavour llama gives the Llama flavour of equal size (RMSNorm, SwiGLU, rotary positions, untied
// head, no biases, --kv_heads 2; SwiGLU's d_ff = 2/3 of 4d rounded up to a multiple of 256, 1536
// at d 512, so that its three matrices hold about what GELU's two of 4d do).
// --size gpt2_small sets GPT-2 small's shape first (124M params: vocab 50257, d 768, 12 heads, 12
// layers, d_ff 3072, seq 1024; the Llama flavour with 4 kv heads and d_ff 2048) at batch 2 (2048
// tokens a step, seconds on a 2-core machine); the other flags then override it. --size bench
// (the default) is the bench-gpt shape above.
struct GptArgs {
  std::string dtype = "both";
  std::string flavour = "gpt2";  // gpt2 | llama
  std::string size = "bench";    // bench | gpt2_small
  int steps = 5, warmup = 2;
  int64_t vocab = 8192, d = 512, heads = 8, kv_heads = 2, layers = 6, ff = 0, seq = 256, batch = 8;
  int64_t d_ff() const { return ff > 0 ? ff : flavour == "llama" ? (8 * d / 3 + 255) / 256 * 256 : 4 * d; }
  nn::LmConfig config() const {
    if (flavour == "llama") return nn::llama_config("bench-llama", vocab, d, heads, kv_heads, layers, d_ff(), seq);
    return nn::gpt2_config("bench-gpt", vocab, d, heads, layers, d_ff(), seq);
  }
  // (in, out) of the matmuls of one block and the head, for the GEMM rate on the step's shapes.
  std::vector<std::pair<int64_t, int64_t>> linears() const {
    if (flavour == "llama") {
      const int64_t kv = kv_heads * (d / heads);
      return {{d, d}, {d, kv}, {d, kv}, {d, d}, {d, d_ff()}, {d, d_ff()}, {d_ff(), d}, {d, vocab}};
    }
    return {{d, 3 * d}, {d, d}, {d, d_ff()}, {d_ff(), d}, {d, vocab}};
  }
};

// `extra` takes a benchmark's own flags: it returns false for a flag it does not know.
using ExtraFlag = std::function<bool(const std::string& flag, const std::string& value)>;

inline GptArgs parse_gpt_args(int argc, char** argv, const char* prog, GptArgs a, bool takes_dtype,
                              const ExtraFlag& extra = nullptr) {
  auto fail = [&](const std::string& msg) {
    std::fprintf(stderr, "%s: %s (see the header of bench/%s.cc)\n", prog, msg.c_str(), prog);
    std::exit(2);
  };
  // "--flag value" or "--flag=value".
  std::vector<std::pair<std::string, std::string>> flags;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    if (size_t eq = k.find('='); k.rfind("--", 0) == 0 && eq != std::string::npos) {
      flags.emplace_back(k.substr(0, eq), k.substr(eq + 1));
      continue;
    }
    if (i + 1 >= argc) fail("flag " + k + " needs a value");
    flags.emplace_back(k, argv[++i]);
  }
  for (const auto& [k, v] : flags)
    if (k == "--size") {
      a.size = v;
      if (a.size == "gpt2_small") {
        a.vocab = 50257, a.d = 768, a.heads = 12, a.kv_heads = 4, a.layers = 12, a.seq = 1024, a.batch = 2;
      } else if (a.size != "bench") {
        fail("--size must be bench or gpt2_small, not '" + a.size + "'");
      }
    }
  for (const auto& [k, v] : flags) {
    int64_t n = std::atoll(v.c_str());
    if (k == "--size") continue;  // applied above, before the flags that override it
    if (k == "--dtype" && takes_dtype)
      a.dtype = v;
    else if (k == "--flavour")
      a.flavour = v;
    else if (k == "--kv_heads")
      a.kv_heads = n;
    else if (k == "--steps")
      a.steps = static_cast<int>(n);
    else if (k == "--warmup")
      a.warmup = static_cast<int>(n);
    else if (k == "--vocab")
      a.vocab = n;
    else if (k == "--d")
      a.d = n;
    else if (k == "--heads")
      a.heads = n;
    else if (k == "--layers")
      a.layers = n;
    else if (k == "--ff")
      a.ff = n;
    else if (k == "--seq")
      a.seq = n;
    else if (k == "--batch")
      a.batch = n;
    else if (!extra || !extra(k, v))
      fail("unknown flag " + k);
  }
  if (a.dtype != "f32" && a.dtype != "bf16" && a.dtype != "both") fail("--dtype must be f32, bf16 or both");
  if (a.flavour != "gpt2" && a.flavour != "llama") fail("--flavour must be gpt2 or llama");
  if (a.steps < 1 || a.warmup < 0) fail("--steps must be >= 1 and --warmup >= 0");
  return a;
}

// A fixed pseudo-random batch of tokens and targets, i32[batch, seq].
inline std::vector<Array> gpt_batch(const GptArgs& a) {
  std::vector<int32_t> tok(static_cast<size_t>(a.batch * a.seq)), tgt(tok.size());
  uint64_t x = 12345;
  for (size_t i = 0; i < tok.size(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    tok[i] = static_cast<int32_t>((x >> 33) % a.vocab);
    tgt[i] = static_cast<int32_t>((x >> 13) % a.vocab);
  }
  return {Array::from_i32(tok, {a.batch, a.seq}), Array::from_i32(tgt, {a.batch, a.seq})};
}

}  // namespace px::bench
