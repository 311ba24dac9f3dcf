// bench-gpt (DESIGN.md section 10): one full training step (forward, backward, AdamW) of the
// GPT-2 style model (or, with --flavour llama, the Llama flavour of equal size), in f32 and in bf16 mixed precision,
// against the machine's limits measured in the same run (bench/peak.h): the FMA-loop peak, the best oneDNN sgemm rate
// on large squares and on the step's own matmul shapes. Prints one JSON object per result.
//
//   build/bench/gpt_step [--flavour gpt2|llama] [--dtype f32|bf16|both] [--steps 5] [--warmup 2] [--layers 6] [--batch
//   8] ...
//   build/bench/gpt_step --size gpt2_small [--batch 2] ...   # GPT-2 small's shape (124M params, seq 1024)
//   build/bench/gpt_step --remat dots_saveable ...           # a remat policy (default none; include/parallax/remat.h)
// Each result names its shape (vocab, d, heads, kv_heads, layers, ff, seq, batch), which
// bench/gpt_vs_torch.sh hands to the PyTorch peer.
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpt_common.h"
#include "parallax/parallax.h"
#include "peak.h"

using px::bench::seconds_since;

namespace {

struct Limits {
  double gemm_gflops = 0, gemm_bf16_gflops = 0, gemm_step_gflops = 0, gemm_step_bf16_gflops = 0;
  px::bench::FmaPeak fma;
};

void run(const px::bench::GptArgs& a, px::RematPolicy remat, px::DType compute, const Limits& lim) {
  px::nn::LmConfig cfg = a.config();
  cfg.compute_dtype = compute;
  px::nn::TransformerLm model(cfg);
  px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
  auto t0 = std::chrono::steady_clock::now();
  px::TrainStep step(model.store(), px::optim::adamw({.lr = 3e-4}),
                     [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); },
                     {seq, seq}, {.remat = {.policy = remat}});
  double compile_s = seconds_since(t0);
  px::TrainState state = step.init(0);
  std::vector<px::Array> batch = px::bench::gpt_batch(a);
  for (int i = 0; i < a.warmup; ++i) step(state, batch);
  float loss = 0;
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < a.steps; ++i) loss = step(state, batch).loss;
  double dt = seconds_since(t0) / a.steps;
  double n = static_cast<double>(model.store().param_count());
  double tokens = static_cast<double>(a.batch * a.seq);
  // An untied input embedding is a gather, not a matmul: its params do no FLOPs (a tied one is
  // also the head, so it counts).
  const double matmul_n = n - (cfg.tied_embedding ? 0.0 : static_cast<double>(a.vocab * a.d));
  double flops = (6 * matmul_n + 12.0 * a.layers * a.d * a.seq) * tokens;
  double gflops = flops / dt / 1e9;
  // bf16 runs against the bf16 FMA peak (AMX or AVX-512 BF16) and the bf16 matmul rate where the CPU has them, else
  // against f32's.
  const bool bf16 = compute == px::DType::bf16;
  const double fma = bf16 && lim.fma.bf16_gflops > 0 ? lim.fma.bf16_gflops : lim.fma.f32_gflops;
  const double gemm_peak = bf16 && lim.gemm_bf16_gflops > 0 ? lim.gemm_bf16_gflops : lim.gemm_gflops;
  const double gemm_step = bf16 && lim.gemm_step_bf16_gflops > 0 ? lim.gemm_step_bf16_gflops : lim.gemm_step_gflops;
  std::printf(
      "{\"bench\": \"gpt_step\", \"flavour\": \"%s\", \"size\": \"%s\", \"vocab\": %lld, \"d\": %lld, "
      "\"heads\": %lld, \"kv_heads\": %lld, \"layers\": %lld, \"ff\": %lld, \"seq\": %lld, \"batch\": %lld, "
      "\"dtype\": \"%s\", \"remat\": \"%s\", \"threads\": %d, \"params\": %.0f, "
      "\"step_s\": %.4f, "
      "\"tokens_per_s\": %.1f, \"gflops\": %.1f, \"fma_peak_gflops\": %.1f, \"fraction_of_fma_peak\": %.3f, "
      "\"isa\": \"%s\", \"gemm_peak_gflops\": %.1f, \"fraction_of_peak\": %.3f, \"gemm_step_shapes_gflops\": %.1f, "
      "\"fraction_of_gemm_step_shapes\": %s, \"peak_bytes\": %lld, \"kernels\": %d, \"compile_s\": %.2f, "
      "\"loss\": %.4f}\n",
      a.flavour.c_str(), a.size.c_str(), static_cast<long long>(a.vocab), static_cast<long long>(a.d),
      static_cast<long long>(a.heads), static_cast<long long>(a.kv_heads), static_cast<long long>(a.layers),
      static_cast<long long>(a.d_ff()), static_cast<long long>(a.seq), static_cast<long long>(a.batch),
      compute == px::DType::f32 ? "f32" : "bf16", px::remat_policy_name(remat), omp_get_max_threads(), n, dt, tokens / dt, gflops,
      fma, gflops / fma, lim.fma.isa.c_str(), gemm_peak, gflops / gemm_peak, gemm_step,
      // Without native bf16 matmuls the shapes are timed in f32 only: a bf16 step has no fraction.
      !bf16 || lim.gemm_step_bf16_gflops > 0 ? std::to_string(gflops / gemm_step).c_str() : "null",
      static_cast<long long>(step.peak_bytes()), step.executable().num_steps(), compile_s, loss);
  std::fflush(stdout);
  if (std::getenv("PX_PROFILE")) std::fprintf(stderr, "%s", step.executable().profile_report(25).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  px::RematPolicy remat = px::RematPolicy::none;
  px::bench::GptArgs a = px::bench::parse_gpt_args(argc, argv, "gpt_step", {}, true, [&](const std::string& k, const std::string& v) {
    if (k != "--remat") return false;
    try {
      remat = px::parse_remat_policy(v);
    } catch (const px::Error& e) {
      std::fprintf(stderr, "gpt_step: --remat: %s\n", e.what());
      std::exit(2);
    }
    return true;
  });
  Limits lim;
  lim.fma = px::bench::fma_peak();
  lim.gemm_gflops = px::bench::gemm_square_gflops(false, {1024, 2048});
  if (a.dtype != "f32") lim.gemm_bf16_gflops = px::bench::gemm_square_gflops(true, {1024, 2048});
  lim.gemm_step_gflops = px::bench::gemm_step_shapes_gflops(a.batch * a.seq, a.linears());
  if (a.dtype != "f32") lim.gemm_step_bf16_gflops = px::bench::gemm_step_shapes_gflops(a.batch * a.seq, a.linears(), true);
  try {
    if (a.dtype != "bf16") run(a, remat, px::DType::f32, lim);
    if (a.dtype != "f32") run(a, remat, px::DType::bf16, lim);
  } catch (const px::Error& e) {
    std::fprintf(stderr, "gpt_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
