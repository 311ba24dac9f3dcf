// Remat policies on a 12-layer bench-gpt-width model at seq 1024 (one device, f32, AdamW): per
// policy the planned peak and activation peak, the measured peak, the recomputed FLOPs against
// the step's, the floor (MemoryReport::floor_bytes) and the peak over it, and the step time against `none` (targets:
// full at most 35% slower, dots_saveable at most 10%); last, auto with a budget halfway between the planned peaks of
// none and full. The timed steps of all policies are interleaved. One JSON line per policy.
//
//   build/bench/remat [--layers 12] [--seq 1024] [--batch 1] [--steps 3] [--warmup 1] [--d 512] ...
//                     [--policies none,offload]   (a subset, in the order above; auto needs none and full)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpt_common.h"
#include "ir/primitive.h"
#include "runtime/program.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/train.h"
#include "train/steps.h"

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
  std::string only;  // --policies: comma-separated names; empty = all
  px::bench::GptArgs a = px::bench::parse_gpt_args(
      argc, argv, "remat", {.steps = 3, .warmup = 1, .layers = 12, .seq = 1024, .batch = 1}, false,
      [&](const std::string& k, const std::string& v) { return k == "--policies" && !(only = "," + v + ",").empty(); });
  auto wanted = [&](px::RematPolicy p) {
    return only.empty() || only.find(std::string(",") + px::remat_policy_name(p) + ",") != std::string::npos;
  };
  try {
    for (size_t i = 1; i < only.size(); i = only.find(',', i) + 1) {
      const std::string name = only.substr(i, only.find(',', i) - i);
      if (!name.empty()) px::parse_remat_policy(name);  // a clear error naming the policies
    }
    if (wanted(px::RematPolicy::automatic) && !(wanted(px::RematPolicy::none) && wanted(px::RematPolicy::full))) {
      std::fprintf(stderr, "remat: --policies with auto needs none and full too (its budget is halfway between them)\n");
      return 2;
    }
    px::nn::LmConfig cfg = a.config();
    px::nn::TransformerLm model(cfg);
    px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
    auto loss_fn = [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); };
    auto opt = px::optim::adamw({.lr = 3e-4});
    std::vector<px::Array> batch = px::bench::gpt_batch(a);
    const double step_flops =
        graph_flops(*px::trace_train_step(model.store(), *opt, loss_fn, {seq, seq}, 0).graph);

    // Memory first, one policy at a time (auto's budget needs the peaks of none and full); the steps
    // stay alive, and then their timed steps are interleaved, one of each policy per round, so that
    // the machine's drift falls on all of them alike.
    struct Run {
      px::RematOptions ro;
      std::string name;
      double recomputed = 0;
      std::unique_ptr<px::TrainStep> step;
      px::TrainState state;
      px::MemoryReport m;
      int64_t measured = 0;
      std::vector<double> times;
      float loss = 0;
    };
    std::vector<Run> runs;
    int64_t none_peak = 0, full_peak = 0;
    for (px::RematPolicy p : {px::RematPolicy::none, px::RematPolicy::dots_saveable,
                              px::RematPolicy::dots_with_no_batch_dims_saveable, px::RematPolicy::full,
                              px::RematPolicy::nothing_saveable, px::RematPolicy::offload,
                              px::RematPolicy::automatic}) {
      if (!wanted(p)) continue;
      Run r;
      // auto: a budget halfway between the planned peaks of none and full.
      r.ro = {p, {}, -1, p == px::RematPolicy::automatic ? (none_peak + full_peak) / 2 : 0};
      r.name = px::remat_policy_name(p);
      if (p == px::RematPolicy::automatic) {
        // What auto settles on, planned by the same buffer planner the step uses.
        px::RematOptions chosen;
        auto peak_of = [](const px::StepProgram& sp) {
          px::CompileOptions c;
          // As TrainStep compiles it: the new params and optimizer state donated into the old ones.
          c.output_donors.assign(sp.graph->outputs().size(), -1);
          for (size_t k = 0; k < sp.n_params + sp.n_state; ++k) c.output_donors[3 + k] = static_cast<int>(k);
          return px::plan_program(*sp.graph, c, nullptr).report.peak_bytes;
        };
        px::remat_automatic(px::trace_train_step(model.store(), *opt, loss_fn, {seq, seq}, 0), r.ro.budget_bytes,
                            peak_of, &chosen);
        px::remat_step(px::trace_train_step(model.store(), *opt, loss_fn, {seq, seq}, 0), chosen, &r.recomputed);
        r.name = std::string("auto: ") + px::remat_policy_name(chosen.policy) +
                 (chosen.layers >= 0 ? " on the first " + std::to_string(chosen.layers) + " layers" : "");
      } else {
        px::remat_step(px::trace_train_step(model.store(), *opt, loss_fn, {seq, seq}, 0), r.ro, &r.recomputed);
      }
      px::TrainStepOptions o;
      o.remat = r.ro;
      // The high-water mark of this step's bytes: above what was in use before it existed (the other
      // policies' steps and the batch), plus the batch, which its plan counts as an input. (Not
      // bytes in use after init less the planned peak: the step counter and the metrics the plan
      // counts exist only while a step runs, which put 16 bytes of the 8,212 above the plan.)
      px::Placement dev{0};
      const int64_t before = px::memory_stats(dev).bytes_in_use;
      r.step = std::make_unique<px::TrainStep>(model.store(), opt, loss_fn, std::vector<px::TensorType>{seq, seq}, o);
      r.state = r.step->init(0);
      r.m = r.step->executable().memory();
      px::reset_peak_memory(dev);  // after init, whose temporaries are not the step's
      for (int i = 0; i < std::max(a.warmup, 1); ++i) r.loss = (*r.step)(r.state, batch).loss;
      r.measured = px::memory_stats(dev).peak_bytes_in_use - before + batch[0].nbytes() + batch[1].nbytes();
      if (p == px::RematPolicy::none) none_peak = r.m.peak_bytes;
      if (p == px::RematPolicy::full) full_peak = r.m.peak_bytes;
      runs.push_back(std::move(r));
    }
    for (int i = 0; i < a.steps; ++i)
      for (Run& r : runs) {
        auto t0 = std::chrono::steady_clock::now();
        r.loss = (*r.step)(r.state, batch).loss;
        r.times.push_back(seconds_since(t0));
      }
    double none_s = 0;
    for (Run& r : runs) {
      std::sort(r.times.begin(), r.times.end());
      const double t = r.times.empty() ? 0.0 : r.times[r.times.size() / 2];
      if (r.ro.policy == px::RematPolicy::none) none_s = t;
      const px::MemoryReport& m = r.m;
      std::printf(
          "{\"bench\": \"remat\", \"policy\": \"%s\", \"budget_bytes\": %lld, \"layers\": %lld, \"seq\": %lld, "
          "\"batch\": %lld, "
          "\"planned_peak_bytes\": %lld, \"planned_activation_bytes\": %lld, \"measured_peak_bytes\": %lld, "
          "\"recomputed_flops\": %.4g, \"step_flops\": %.4g, \"recompute_overhead\": %.3f, \"step_s\": %.3f, "
          "\"time_overhead\": %.3f, \"host_bytes\": %lld, \"floor_bytes\": %lld, \"peak_over_floor\": %.4f, "
          "\"loss\": %.6f}\n",
          r.name.c_str(), static_cast<long long>(r.ro.budget_bytes), static_cast<long long>(a.layers),
          static_cast<long long>(a.seq), static_cast<long long>(a.batch), static_cast<long long>(m.peak_bytes),
          static_cast<long long>(m.arena_max_by_category[static_cast<int>(px::MemoryCategory::activations)]),
          static_cast<long long>(r.measured), r.recomputed, step_flops, r.recomputed / step_flops, t, none_s > 0 ? t / none_s - 1.0 : 0.0,
          static_cast<long long>(m.host_peak_bytes()), static_cast<long long>(m.floor_bytes), m.peak_over_floor(),
          r.loss);
      std::fflush(stdout);
    }
  } catch (const px::Error& e) {
    std::fprintf(stderr, "remat: %s\n", e.what());
    return 1;
  }
  return 0;
}
