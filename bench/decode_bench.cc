// Decoding with the key/value cache: seconds per new token near the 32nd and the 256th (each new
// token runs the same one-token program over a fixed cache length, so the two should match), and
// one recomputation of the whole sequence (what each token would cost without the cache).
//   ./build/bench/decode_bench [--quick]
#include "bench_util.h"
#include "parallax/nn/pretrained.h"

using namespace px;

int main(int argc, char** argv) {
  bench::Flags flags = bench::parse_flags(argc, argv);
  nn::LmConfig c = nn::llama_config("decode_bench", 8192, flags.quick ? 128 : 512, 8, 4, flags.quick ? 2 : 6,
                                    flags.quick ? 384 : 1408, 288);
  nn::TransformerLm m(c);
  std::vector<Array> params = m.init(0);
  const int64_t prompt = 16, steps = 272;  // new tokens 1..272: positions 16..287
  std::vector<std::vector<int32_t>> prompts{std::vector<int32_t>(prompt)};
  for (int64_t i = 0; i < prompt; ++i) prompts[0][i] = static_cast<int32_t>(i * 37 % c.vocab_size);
  std::vector<double> secs;
  nn::GenerateOptions opt;
  opt.max_new_tokens = steps;
  opt.token_seconds = &secs;
  nn::generate(m, params, prompts, opt);
  // Median over 9 tokens around the n-th new token.
  auto around = [&](int64_t n) {
    std::vector<double> w(secs.begin() + (n - 5), secs.begin() + (n + 4));
    std::nth_element(w.begin(), w.begin() + 4, w.end());
    return w[4];
  };
  const double t32 = around(32), t256 = around(256);
  // Without the cache every token reruns the whole sequence: time one such run at the full length.
  std::vector<double> full;
  nn::GenerateOptions no_cache;
  no_cache.max_new_tokens = 3;
  no_cache.max_len = 288;
  no_cache.use_cache = false;
  no_cache.token_seconds = &full;
  nn::generate(m, params, prompts, no_cache);
  std::sort(full.begin(), full.end());
  bench::Json()
      .s("bench", "decode")
      .s("model", c.name)
      .i("d_model", c.d_model)
      .i("layers", c.n_layers)
      .i("cache_len", 288)
      .n("prefill_ms", secs[0] * 1e3)
      .n("ms_token_32", t32 * 1e3)
      .n("ms_token_256", t256 * 1e3)
      .n("ratio_256_vs_32", t256 / t32)
      .n("ms_full_recompute_288", full[full.size() / 2] * 1e3)
      .i("threads", bench::threads())
      .print();
  return 0;
}
