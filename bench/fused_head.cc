// The fused LM head and loss (LmConfig::fused_head, linear_cross_entropy) against the unfused head
// (logits, then softmax_cross_entropy) on one device, AdamW: per setting the planned peak of the
// training step, its measured peak, the loss of every step (the two runs start from the same
// params and see the same batch, so their losses agree within f32 rounding, bf16 rounding of the
// logits in bf16), and the step time; the timed steps of the two alternate (one of each per
// round, the first one of a round alternating too), and the ratio fused / unfused of every round
// is printed with its median. One JSON line per setting and one for the comparison.
//
//   build/bench/fused_head [--vocab 50257] [--d 256] [--layers 2] [--seq 512] [--batch 2] [--steps 5]
//                          [--warmup 1] [--dtype f32|bf16] [--size gpt2_small] [--flavour llama] ...
//                          [--run 0]   (the planned peaks, [unfused, fused], and no step: GPT-2 small in seconds)
//
// The default is a small GPT with GPT-2's vocabulary, where the head is most of the step: the
// logits are batch * seq * 50257 * 4 bytes (206 MB at 2 x 512), their gradient as many.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpt_common.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/train.h"

using px::bench::seconds_since;

int main(int argc, char** argv) {
  bool run = true;  // --run 0: the planned peaks only (no step is run)
  px::bench::GptArgs a = px::bench::parse_gpt_args(
      argc, argv, "fused_head",
      {.dtype = "f32",
       .steps = 5,
       .warmup = 1,
       .vocab = 50257,
       .d = 256,
       .heads = 4,
       .layers = 2,
       .seq = 512,
       .batch = 2},
      true, [&](const std::string& k, const std::string& v) { return k == "--run" && ((run = v != "0"), true); });
  if (a.dtype == "both") a.dtype = "f32";
  try {
    std::vector<px::Array> batch = px::bench::gpt_batch(a);
    px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
    struct Run {
      bool fused = false;
      std::unique_ptr<px::nn::TransformerLm> model;
      std::unique_ptr<px::TrainStep> step;
      px::TrainState state;
      int64_t planned = 0, measured = 0;
      std::vector<float> losses;
      std::vector<double> times;
    };
    std::vector<Run> runs(2);
    for (int k = 0; k < 2; ++k) {
      Run& r = runs[k];
      r.fused = k == 1;
      px::nn::LmConfig cfg = a.config();
      cfg.compute_dtype = a.dtype == "bf16" ? px::DType::bf16 : px::DType::f32;
      cfg.fused_head = r.fused;
      r.model = std::make_unique<px::nn::TransformerLm>(cfg);
      px::nn::TransformerLm* m = r.model.get();
      auto loss_fn = [m](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(*m, b[0], b[1]); };
      px::Placement dev{0};
      const int64_t before = px::memory_stats(dev).bytes_in_use;
      r.step = std::make_unique<px::TrainStep>(m->store(), px::optim::adamw({.lr = 3e-4}), loss_fn,
                                               std::vector<px::TensorType>{seq, seq});
      r.state = r.step->init(0);
      r.planned = r.step->peak_bytes();
      if (!run) continue;
      px::reset_peak_memory(dev);
      // Every step of the run, warmup included, so that the two runs' losses pair up step by step.
      for (int i = 0; i < std::max(a.warmup, 1); ++i) r.losses.push_back((*r.step)(r.state, batch).loss);
      r.measured = px::memory_stats(dev).peak_bytes_in_use - before + batch[0].nbytes() + batch[1].nbytes();
    }
    std::vector<double> ratios;
    if (!run) {
      std::printf(
          "{\"bench\": \"fused_head\", \"dtype\": \"%s\", \"vocab\": %lld, \"d\": %lld, \"layers\": %lld, "
          "\"seq\": %lld, \"batch\": %lld, \"logits_bytes\": %lld, \"planned_peak_bytes\": [%lld, %lld], "
          "\"planned_peak_saved_bytes\": %lld}\n",
          a.dtype.c_str(), static_cast<long long>(a.vocab), static_cast<long long>(a.d),
          static_cast<long long>(a.layers), static_cast<long long>(a.seq), static_cast<long long>(a.batch),
          static_cast<long long>(a.batch * a.seq * a.vocab * 4), static_cast<long long>(runs[0].planned),
          static_cast<long long>(runs[1].planned), static_cast<long long>(runs[0].planned - runs[1].planned));
      return 0;
    }
    // A round: A B B A (the first setting alternating), so that neither gains from going first.
    for (int i = 0; i < a.steps; ++i) {
      double spent[2] = {0, 0};
      for (int j : {0, 1, 1, 0}) {
        Run& r = runs[(i + j) % 2];
        auto t0 = std::chrono::steady_clock::now();
        r.losses.push_back((*r.step)(r.state, batch).loss);
        r.times.push_back(seconds_since(t0));
        spent[(i + j) % 2] += r.times.back();
      }
      ratios.push_back(spent[1] / spent[0]);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    float max_rel = 0;
    for (size_t i = 0; i < runs[0].losses.size(); ++i)
      max_rel = std::max(max_rel, std::abs(runs[1].losses[i] - runs[0].losses[i]) / std::abs(runs[0].losses[i]));
    for (const Run& r : runs) {
      std::string losses;
      for (float l : r.losses) losses += (losses.empty() ? "" : ", ") + std::to_string(l);
      std::printf(
          "{\"bench\": \"fused_head\", \"fused\": %s, \"dtype\": \"%s\", \"vocab\": %lld, \"d\": %lld, "
          "\"layers\": %lld, \"seq\": %lld, \"batch\": %lld, \"planned_peak_bytes\": %lld, "
          "\"measured_peak_bytes\": %lld, \"step_s\": %.4f, \"losses\": [%s]}\n",
          r.fused ? "true" : "false", a.dtype.c_str(), static_cast<long long>(a.vocab), static_cast<long long>(a.d),
          static_cast<long long>(a.layers), static_cast<long long>(a.seq), static_cast<long long>(a.batch),
          static_cast<long long>(r.planned), static_cast<long long>(r.measured), median(r.times), losses.c_str());
    }
    std::string rs;
    for (double x : ratios) rs += (rs.empty() ? "" : ", ") + std::to_string(x);
    const long long logits = static_cast<long long>(a.batch * a.seq * a.vocab * 4);
    std::printf(
        "{\"bench\": \"fused_head\", \"compare\": true, \"logits_bytes\": %lld, \"planned_peak_saved_bytes\": %lld, "
        "\"measured_peak_saved_bytes\": %lld, \"max_loss_rel_diff\": %.3g, \"time_ratio_median\": %.3f, "
        "\"time_ratio_min\": %.3f, \"time_ratio_max\": %.3f, \"time_ratios\": [%s]}\n",
        logits, static_cast<long long>(runs[0].planned - runs[1].planned),
        static_cast<long long>(runs[0].measured - runs[1].measured), max_rel, median(ratios),
        *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()), rs.c_str());
  } catch (const px::Error& e) {
    std::fprintf(stderr, "fused_head: %s\n", e.what());
    return 1;
  }
  return 0;
}
