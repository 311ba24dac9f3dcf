// bench-gpt (DESIGN.md section 10): one full training step (forward, backward, AdamW) of the
// GPT-2 style model (or, with --flavour llama, the Llama flavour of equal size), in f32 and in bf16 mixed precision,
// against the machine's limits measured in the same run (bench/peak.h): the FMA-loop peak, the best oneDNN sgemm rate
// on large squares and on the step's own matmul shapes. Prints one JSON object per result.
//
//   build/bench/gpt_step [--flavour gpt2|llama] [--dtype f32|bf16|both] [--steps 5] [--warmup 2] [--layers 6] [--batch
//   8] ...
//   build/bench/gpt_step --size gpt2_small [--batch 2] ...   # GPT-2 small's shape (124M params, seq 1024)
//   build/bench/gpt_step --remat dots_saveable ...           # a remat policy (default none; include/parallax/remat.h)
//   build/bench/gpt_step --profile_top 20 ...                # the step's 20 costliest kernels (stderr)
//   build/bench/gpt_step --matmuls 0 ...                     # no step_vs_matmuls (at GPT-2 small the
//                                                            # matmuls' own program holds GBs and doubles the time)
// Each result names its shape (vocab, d, heads, kv_heads, layers, ff, seq, batch), which
// bench/gpt_vs_torch.sh hands to the PyTorch peer.
// step_vs_matmuls: the step's time over the time of its matmuls alone. The dot_general nodes of the
// program the step runs (its compiled graph, after autocast: the same shapes, dtypes and layouts)
// are compiled as a program of their own (each operand its own array) and run after each timed
// step, so each of the --steps rounds times one step and then the matmuls alone; step_ms and
// matmul_ms are the medians, step_vs_matmuls the median of the rounds' ratios (with its range).
// The rest of the step (attention, norms, elementwise passes, reductions, the optimizer) is what
// the ratio measures; --profile_top N prints where it went.
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <memory>
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

// The step's matmuls alone: every dot_general node of the compiled step (`step_graph`, the program
// the step runs), with its operand types and attributes, compiled as one program whose results are
// its outputs; each operand has an array of its own (pseudo-random values), as in the step.
struct Matmuls {
  std::unique_ptr<px::Executable> exe;
  std::vector<px::Array> inputs, outputs;
  int count = 0;
  double flops = 0;  // 2 * result elements * contracted elements, summed

  Matmuls(const px::Graph& step_graph, bool profile) {
    px::Graph g;
    std::vector<px::Tensor> results;
    std::map<std::string, px::Array> filled;  // one random fill per operand type, cloned per operand
    uint64_t x = 88172645463325252ull;
    for (const px::Node& n : step_graph.nodes()) {
      if (px::primitive_name(n) != "dot_general") continue;
      std::vector<px::Tensor> ops;
      for (int v : n.inputs) {
        const px::TensorType& t = step_graph.type(v);
        ops.push_back(g.input(t));
        auto [it, fresh] = filled.try_emplace(px::type_str(t));
        if (fresh) {
          std::vector<float> vals(static_cast<size_t>(t.numel()));
          for (float& f : vals) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            f = static_cast<float>(static_cast<double>(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
          }
          it->second = px::Array::from_f32(vals, t.shape, t.dtype);
        }
        inputs.push_back(it->second.clone());
      }
      const px::TensorType& lhs = step_graph.type(n.inputs[0]);
      double contracted = 1;
      for (int64_t d : n.attrs.ints("lhs_contract")) contracted *= static_cast<double>(lhs.shape[d]);
      for (px::Tensor& r : g.emit(*n.prim, ops, n.attrs)) {
        flops += 2.0 * static_cast<double>(r.numel()) * contracted;
        outputs.emplace_back(r.dtype(), r.shape());
        results.push_back(r);
      }
      ++count;
    }
    if (count == 0) throw px::Error("the step's compiled program has no dot_general: nothing to time its matmuls by");
    g.set_outputs(results);
    px::CompileOptions opt;
    opt.profile = profile;
    exe = px::Executable::compile(g, opt);
  }
  double run() {
    auto t0 = std::chrono::steady_clock::now();
    exe->run_into(inputs, outputs);
    return seconds_since(t0);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Per round: one step, then the step's matmuls alone.
struct Rounds {
  std::vector<double> step_s, matmul_s, ratio;
  float loss = 0;
  double step_mean() const {
    double t = 0;
    for (double s : step_s) t += s;
    return t / static_cast<double>(step_s.size());
  }
  std::string ratio_json() const {
    return fmt_field("step_vs_matmuls", median(ratio)) + ", " +
           fmt_field("step_vs_matmuls_min", *std::min_element(ratio.begin(), ratio.end())) + ", " +
           fmt_field("step_vs_matmuls_max", *std::max_element(ratio.begin(), ratio.end()));
  }
  static std::string fmt_field(const char* k, double v) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "\"%s\": %.3f", k, v);
    return buf;
  }
};

// mm null (--matmuls 0): the steps alone.
Rounds time_rounds(const px::bench::GptArgs& a, px::TrainStep& step, px::TrainState& state,
                   const std::vector<px::Array>& batch, Matmuls* mm) {
  for (int i = 0; i < a.warmup; ++i) {
    step(state, batch);
    if (mm) mm->run();
  }
  if (a.warmup < 1 && mm) mm->run();  // the results' pages are mapped before the first timed run
  Rounds r;
  for (int i = 0; i < a.steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    r.loss = step(state, batch).loss;
    r.step_s.push_back(seconds_since(t0));
    if (!mm) continue;
    r.matmul_s.push_back(mm->run());
    r.ratio.push_back(r.step_s.back() / r.matmul_s.back());
  }
  return r;
}

// The step's matmuls and step_vs_matmuls as JSON fields (none without them).
std::string matmul_fields(const Rounds& r, const Matmuls* mm) {
  if (!mm) return "";
  char buf[160];
  std::snprintf(buf, sizeof buf, "\"matmul_ms\": %.2f, \"matmuls\": %d, \"matmul_gflops\": %.1f, ",
                1e3 * median(r.matmul_s), mm->count, mm->flops / median(r.matmul_s) / 1e9);
  return buf + r.ratio_json() + ", ";
}

void run(const px::bench::GptArgs& a, px::RematPolicy remat, int profile_top, bool matmuls, px::DType compute,
         const Limits& lim) {
  px::nn::LmConfig cfg = a.config();
  cfg.compute_dtype = compute;
  px::nn::TransformerLm model(cfg);
  px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
  auto t0 = std::chrono::steady_clock::now();
  px::TrainStepOptions opt;
  opt.remat.policy = remat;
  opt.compile.profile = profile_top > 0;
  px::TrainStep step(
      model.store(), px::optim::adamw({.lr = 3e-4}),
      [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); }, {seq, seq}, opt);
  double compile_s = seconds_since(t0);
  std::optional<Matmuls> mm;
  if (matmuls) mm.emplace(step.executable().graph(), profile_top > 0);
  px::TrainState state = step.init(0);
  std::vector<px::Array> batch = px::bench::gpt_batch(a);
  const Rounds rounds = time_rounds(a, step, state, batch, mm ? &*mm : nullptr);
  const float loss = rounds.loss;
  const double dt = rounds.step_mean();
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
      "\"fraction_of_gemm_step_shapes\": %s, \"step_ms\": %.2f, %s\"peak_bytes\": %lld, \"kernels\": %d, \"compile_s\": %.2f, "
      "\"loss\": %.4f}\n",
      a.flavour.c_str(), a.size.c_str(), static_cast<long long>(a.vocab), static_cast<long long>(a.d),
      static_cast<long long>(a.heads), static_cast<long long>(a.kv_heads), static_cast<long long>(a.layers),
      static_cast<long long>(a.d_ff()), static_cast<long long>(a.seq), static_cast<long long>(a.batch),
      compute == px::DType::f32 ? "f32" : "bf16", px::remat_policy_name(remat), omp_get_max_threads(), n, dt,
      tokens / dt, gflops, fma, gflops / fma, lim.fma.isa.c_str(), gemm_peak, gflops / gemm_peak, gemm_step,
      // Without native bf16 matmuls the shapes are timed in f32 only: a bf16 step has no fraction.
      !bf16 || lim.gemm_step_bf16_gflops > 0 ? std::to_string(gflops / gemm_step).c_str() : "null",
      1e3 * median(rounds.step_s), matmul_fields(rounds, mm ? &*mm : nullptr).c_str(), static_cast<long long>(step.peak_bytes()), step.executable().num_steps(), compile_s,
      loss);
  std::fflush(stdout);
  if (profile_top > 0 || std::getenv("PX_PROFILE")) {
    std::fprintf(stderr, "gpt_step %s, the step's kernels:\n%s", compute == px::DType::f32 ? "f32" : "bf16",
                 step.executable().profile_report(profile_top > 0 ? profile_top : 25).c_str());
    // Its first line: the matmuls alone, in their kernels (against the step's dot_general row above).
    if (mm) {
      const std::string mm_report = mm->exe->profile_report(1);
      std::fprintf(stderr, "the step's %d matmuls alone, %s", mm->count,
                   mm_report.substr(0, mm_report.find('\n') + 1).c_str());
    }
    std::fflush(stderr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  px::RematPolicy remat = px::RematPolicy::none;
  int profile_top = 0;
  bool matmuls = true;
  px::bench::GptArgs a =
      px::bench::parse_gpt_args(argc, argv, "gpt_step", {}, true, [&](const std::string& k, const std::string& v) {
        if (k == "--profile_top") {
          profile_top = std::atoi(v.c_str());
          if (profile_top < 1) {
            std::fprintf(stderr, "gpt_step: --profile_top takes a number of kernels >= 1, not '%s'\n", v.c_str());
            std::exit(2);
          }
          return true;
        }
        if (k == "--matmuls") {
          if (v != "0" && v != "1") {
            std::fprintf(stderr, "gpt_step: --matmuls takes 1 (time the step's matmuls alone too) or 0, not '%s'\n",
                         v.c_str());
            std::exit(2);
          }
          matmuls = v == "1";
          return true;
        }
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
  if (a.dtype != "f32")
    lim.gemm_step_bf16_gflops = px::bench::gemm_step_shapes_gflops(a.batch * a.seq, a.linears(), true);
  try {
    if (a.dtype != "bf16") run(a, remat, profile_top, matmuls, px::DType::f32, lim);
    if (a.dtype != "f32") run(a, remat, profile_top, matmuls, px::DType::bf16, lim);
  } catch (const px::Error& e) {
    std::fprintf(stderr, "gpt_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
