// Remat policies on a 12-layer bench-gpt-width model at seq 1024 (one device, f32, AdamW): per
// policy the planned peak and activation peak, the measured peak, the recomputed FLOPs against
// the step's, and the step time against `none` (targets: full at most 35% slower, dots_saveable
// at most 10%); last, auto with a budget halfway between the planned peaks of none and full. One
// JSON line per policy.
//
//   build/bench/remat [--layers 12] [--seq 1024] [--batch 1] [--steps 3] [--warmup 1] [--d 512] ...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "gpt_common.h"
#include "ir/primitive.h"
#include "runtime/program.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/train.h"

using px::bench::seconds_since;

namespace {

double graph_flops(const px::Graph& g) {
  double f = 0;
  for (const px::Node& n : g.nodes()) {
    std::vector<px::TensorType> ins, outs;
    for (int v : n.inputs) ins.push_back(g.type(v));
    for (int v : n.outputs) outs.push_back(g.type(v));
    f += px::cost_of(*n.prim, ins, outs, n.attrs).flops;
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  px::bench::GptArgs a = px::bench::parse_gpt_args(
      argc, argv, "remat", {.steps = 3, .warmup = 1, .layers = 12, .seq = 1024, .batch = 1}, false);
  try {
    px::nn::LmConfig cfg = a.config();
    px::nn::TransformerLm model(cfg);
    px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
    auto loss_fn = [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); };
    auto opt = px::optim::adamw({.lr = 3e-4});
    std::vector<px::Array> batch = px::bench::gpt_batch(a);
    const double step_flops =
        graph_flops(*px::trace_train_step(model.store(), *opt, loss_fn, {seq, seq}, 0).graph);

    double none_s = 0;
    int64_t none_peak = 0, full_peak = 0;
    for (px::RematPolicy p : {px::RematPolicy::none, px::RematPolicy::dots_saveable,
                              px::RematPolicy::dots_with_no_batch_dims_saveable, px::RematPolicy::full,
                              px::RematPolicy::nothing_saveable, px::RematPolicy::offload,
                              px::RematPolicy::automatic}) {
      // auto: a budget halfway between the planned peaks of none and full.
      px::RematOptions ro{p, {}, -1, p == px::RematPolicy::automatic ? (none_peak + full_peak) / 2 : 0};
      double recomputed = 0;
      std::string chosen_text = px::remat_policy_name(p);
      if (p == px::RematPolicy::automatic) {
        // What auto settles on, planned by the same buffer planner the step uses.
        px::RematOptions chosen;
        auto peak_of = [](const px::StepProgram& sp) {
          px::CompileOptions c;
          c.value_categories = sp.categories;
          return px::plan_program(*sp.graph, c, nullptr).report.peak_bytes;
        };
        px::remat_automatic(px::trace_train_step(model.store(), *opt, loss_fn, {seq, seq}, 0), ro.budget_bytes,
                            peak_of, &chosen);
        px::remat_step(px::trace_train_step(model.store(), *opt, loss_fn, {seq, seq}, 0), chosen, &recomputed);
        chosen_text = std::string("auto: ") + px::remat_policy_name(chosen.policy) +
                      (chosen.layers >= 0 ? " on the first " + std::to_string(chosen.layers) + " layers" : "");
      } else {
        px::remat_step(px::trace_train_step(model.store(), *opt, loss_fn, {seq, seq}, 0), ro, &recomputed);
      }
      px::TrainStepOptions o;
      o.remat = ro;
      px::TrainStep step(model.store(), opt, loss_fn, {seq, seq}, o);
      px::TrainState s = step.init(0);
      for (int i = 0; i < a.warmup; ++i) step(s, batch);
      px::Placement dev{0};
      px::reset_peak_memory(dev);
      std::vector<double> times;
      float loss = 0;
      for (int i = 0; i < a.steps; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        loss = step(s, batch).loss;
        times.push_back(seconds_since(t0));
      }
      std::sort(times.begin(), times.end());
      const double t = times[times.size() / 2];
      if (p == px::RematPolicy::none) none_s = t;
      const px::MemoryReport m = step.executable().memory();
      if (p == px::RematPolicy::none) none_peak = m.peak_bytes;
      if (p == px::RematPolicy::full) full_peak = m.peak_bytes;
      std::printf(
          "{\"bench\": \"remat\", \"policy\": \"%s\", \"budget_bytes\": %lld, \"layers\": %lld, \"seq\": %lld, \"batch\": %lld, "
          "\"planned_peak_bytes\": %lld, \"planned_activation_bytes\": %lld, \"measured_peak_bytes\": %lld, "
          "\"recomputed_flops\": %.4g, \"step_flops\": %.4g, \"recompute_overhead\": %.3f, \"step_s\": %.3f, "
          "\"time_overhead\": %.3f, \"host_bytes\": %lld, \"loss\": %.6f}\n",
          chosen_text.c_str(), static_cast<long long>(ro.budget_bytes), static_cast<long long>(a.layers), static_cast<long long>(a.seq),
          static_cast<long long>(a.batch), static_cast<long long>(m.peak_bytes),
          static_cast<long long>(m.arena_max_by_category[static_cast<int>(px::MemoryCategory::activations)]),
          static_cast<long long>(px::memory_stats(dev).peak_bytes_in_use), recomputed, step_flops,
          recomputed / step_flops, t, t / none_s - 1.0, static_cast<long long>(m.host_peak_bytes()), loss);
      std::fflush(stdout);
    }
  } catch (const px::Error& e) {
    std::fprintf(stderr, "remat: %s\n", e.what());
    return 1;
  }
  return 0;
}
