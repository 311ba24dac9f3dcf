// The bench-gpt training step (forward, backward, AdamW) on one device vs the same step DDP and
// FSDP over cpu:2 (two virtual devices sharing the same cores): the overhead of partitioning and
// in-process collectives. Prints one JSON object: throughput ratios (target >= 0.9) and each
// strategy's planned and measured per-device peak (`<strategy>_peak_bytes_per_device[_measured]`).
//
//   build/bench/sharded_step [--steps 3] [--warmup 1] [--layers 6] [--d 512] [--batch 8] [--seq 256] ...
//       [--devices cpu:2] [--strategies ddp,fsdp,tp,auto] [--optimizer adamw|sgd] [--bucket_bytes N]
//       [--parallelism automatic|over_devices|within_kernels] [--verbose 1]
// DDP and FSDP split the batch over a 'data' axis of all the devices, TP the model over 'model';
// AUTO plans for the calibrated cpu cluster. Each strategy's predicted step time (cost model) is
// printed beside the measured one, with both rankings.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gpt_common.h"
#include "parallax/auto.h"
#include "parallax/plan.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "parallax/train.h"

using px::bench::seconds_since;

namespace {

struct Result {
  std::string name;
  double step_s = 0, compile_s = 0;
  float loss = 0;
  std::string comm = "null";
  int64_t peak_planned = 0, peak_measured = 0;  // bytes per device
  double predicted_s = 0;                       // the cost model's step time on the cpu cluster
};

// "auto<fsdp<ddp": names by ascending time.
std::string ranking(std::vector<std::pair<double, std::string>> v) {
  std::sort(v.begin(), v.end());
  std::string s;
  for (const auto& [t, name] : v) s += (s.empty() ? "" : "<") + name;
  return s;
}

// Whether a ran faster than b beyond the noise: over interleaved rounds (the same drift for
// both), a was faster in so many that a fair coin would give as many with probability <= 5%
// (a one-sided sign test; with 5 rounds, all 5; with 10, 9).
bool measured_faster(const std::vector<double>& a, const std::vector<double>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t wins = 0;
  for (size_t i = 0; i < n; ++i) wins += a[i] < b[i];
  double tail = 0, choose = 1;  // P(X >= wins), X ~ Binomial(n, 1/2)
  for (size_t k = 0; k <= n; ++k) {
    if (k > 0) choose = choose * static_cast<double>(n - k + 1) / static_cast<double>(k);
    if (k >= wins) tail += choose;
  }
  return n > 0 && wins > n / 2 && tail / std::pow(2.0, static_cast<double>(n)) <= 0.05;
}

struct Flags {
  std::string devices = "cpu:2", strategies = "ddp,fsdp", optimizer = "adamw", parallelism = "automatic";
  int64_t bucket_bytes = -1;
  bool verbose = false;
};

px::ShardingStrategy strategy_from(const std::string& s) {
  if (s == "ddp") return px::ShardingStrategy::DDP;
  if (s == "fsdp") return px::ShardingStrategy::FSDP;
  if (s == "tp") return px::ShardingStrategy::TP;
  if (s == "auto") return px::ShardingStrategy::AUTO;
  throw px::Error("[sharded_step] unknown strategy '" + s + "' in --strategies; use ddp, fsdp, tp, auto");
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  px::bench::GptArgs a = px::bench::parse_gpt_args(argc, argv, "sharded_step", {.steps = 3, .warmup = 1}, false,
                                                   [&](const std::string& k, const std::string& v) {
                                                     if (k == "--devices")
                                                       f.devices = v;
                                                     else if (k == "--strategies")
                                                       f.strategies = v;
                                                     else if (k == "--optimizer")
                                                       f.optimizer = v;
                                                     else if (k == "--parallelism")
                                                       f.parallelism = v;
                                                     else if (k == "--bucket_bytes")
                                                       f.bucket_bytes = std::atoll(v.c_str());
                                                     else if (k == "--verbose")
                                                       f.verbose = v != "0";
                                                     else
                                                       return false;
                                                     return true;
                                                   });
  try {
    px::nn::LmConfig cfg = a.config();
    px::nn::TransformerLm model(cfg);
    px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
    auto loss_fn = [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); };
    // --optimizer sgd: a state-free update, to separate the optimizer's cost from the rest.
    if (f.optimizer != "adamw" && f.optimizer != "sgd")
      throw px::Error("[sharded_step] --optimizer must be adamw or sgd, got '" + f.optimizer + "'");
    auto opt = f.optimizer == "sgd" ? px::optim::sgd({.lr = 3e-4}) : px::optim::adamw({.lr = 3e-4});
    std::vector<px::Array> batch = px::bench::gpt_batch(a);
    const px::DeviceSet devices = px::parse_devices(f.devices);

    std::vector<Result> r(1);
    r[0].name = "single";
    auto t0 = std::chrono::steady_clock::now();
    px::TrainStep single(model.store(), opt, loss_fn, {seq, seq});
    r[0].compile_s = seconds_since(t0);
    px::TrainState s0 = single.init(0);

    px::ShardingOptions so;
    if (f.bucket_bytes >= 0) so.bucket_bytes = f.bucket_bytes;
    so.device_parallelism = f.parallelism == "within_kernels" ? px::DeviceParallelism::within_kernels
                            : f.parallelism == "over_devices" ? px::DeviceParallelism::over_devices
                                                              : px::DeviceParallelism::automatic;
    std::vector<std::unique_ptr<px::TrainStep>> sharded;
    std::vector<px::TrainState> st;
    for (size_t pos = 0; pos <= f.strategies.size();) {
      size_t end = std::min(f.strategies.find(',', pos), f.strategies.size());
      std::string name = f.strategies.substr(pos, end - pos);
      pos = end + 1;
      px::ShardingStrategy strategy = strategy_from(name);
      px::Mesh mesh = px::Mesh::create({{strategy == px::ShardingStrategy::TP ? "model" : "data", -1}}, devices);
      // Memory first, with this step alone on the devices: the planned per-device peak and the
      // high-water mark the last device reaches in a steady-state step.
      // Less what the steps made before hold on that device (their params and state).
      int64_t planned = 0, measured = 0;
      const px::Placement last{mesh.device_ids().back()};
      const int64_t before = px::memory_stats(last).bytes_in_use;
      {
        px::TrainStep alone(model.store(), opt, loss_fn, {seq, seq},
                            {.mesh = mesh, .strategy = strategy, .sharding = so});
        px::TrainState sa = alone.init(0);
        alone(sa, batch);
        px::reset_peak_memory(last);
        alone(sa, batch);
        planned = alone.program().memory().peak_bytes;
        measured = px::memory_stats(last).peak_bytes_in_use - before;
      }
      t0 = std::chrono::steady_clock::now();
      sharded.push_back(
          std::make_unique<px::TrainStep>(model.store(), opt, loss_fn, std::vector<px::TensorType>{seq, seq},
                                          px::TrainStepOptions{.mesh = mesh, .strategy = strategy, .sharding = so}));
      r.push_back({});
      r.back().name = name;
      r.back().peak_planned = planned;
      r.back().peak_measured = measured;
      r.back().compile_s = seconds_since(t0);
      st.push_back(sharded.back()->init(0));
      // The prediction, by the cost model on this machine's calibrated cpu cluster.
      if (strategy == px::ShardingStrategy::AUTO) {
        r.back().predicted_s = sharded.back()->plan().predicted_step_s;
        if (f.verbose) std::fprintf(stderr, "%s", sharded.back()->plan().explanation.c_str());
      } else {
        px::StepSetup setup{.batch = a.batch, .seq = a.seq, .optimizer = opt};
        setup.sharding = so;
        px::Cluster cpu = px::cpu_cluster();
        auto c = px::cost_recipes(cfg, cpu.apply(mesh), cpu, setup, {strategy});
        if (!c.empty() && c[0].applies) r.back().predicted_s = c[0].cost.step_s;
      }
    }
    // Interleaved rounds (single, then each strategy) and the median of each: drift on a shared
    // machine (other processes, page faults of fresh buffers) hits all of them alike.
    const size_t n = r.size();
    auto run_one = [&](size_t k) { return k == 0 ? single(s0, batch).loss : (*sharded[k - 1])(st[k - 1], batch).loss; };
    for (int i = 0; i < a.warmup; ++i)
      for (size_t k = 0; k < n; ++k) run_one(k);
    for (auto& s : sharded) s->program().reset_stats();
    std::vector<std::vector<double>> times(n);
    for (int i = 0; i < a.steps; ++i)
      for (size_t k = 0; k < n; ++k) {
        t0 = std::chrono::steady_clock::now();
        r[k].loss = run_one(k);
        times[k].push_back(seconds_since(t0));
      }
    const std::vector<std::vector<double>> round_times = times;  // in round order
    for (size_t k = 0; k < n; ++k) {
      std::sort(times[k].begin(), times[k].end());
      r[k].step_s = times[k][times[k].size() / 2];
    }
    for (size_t k = 1; k < n; ++k) {
      const px::TrainStep& s = *sharded[k - 1];
      if (f.verbose) std::fprintf(stderr, "%s\n%s", s.table().c_str(), s.collectives_table().c_str());
      const px::CollectiveStats& stats = s.program().stats();
      int64_t calls = 0, bytes = 0;
      for (int c = 0; c < px::kNumCollectiveKinds; ++c) {
        auto e = stats.total(static_cast<px::CollectiveKind>(c));
        calls += e.calls;
        bytes += e.payload_bytes;
      }
      const int64_t per = std::max(a.steps, 1) * devices.count;
      r[k].comm = "{\"calls_per_step\": " + std::to_string(calls / per) +
                  ", \"payload_bytes_per_step\": " + std::to_string(bytes / per) +
                  ", \"collectives\": " + std::to_string(s.program().program().collectives.size()) + "}";
    }
    const double tokens = static_cast<double>(a.batch * a.seq);
    std::printf(
        "{\"bench\": \"sharded_step\", \"threads\": %d, \"devices\": \"%s\", \"params\": %lld, "
        "\"tokens_per_step\": %.0f, \"rounds\": %d",
        omp_get_max_threads(), devices.to_string().c_str(), static_cast<long long>(model.store().param_count()), tokens,
        a.steps);
    for (const Result& x : r)
      std::printf(
          ", \"%s\": {\"step_s\": %.4f, \"tokens_per_s\": %.1f, \"compile_s\": %.2f, \"loss\": %.5f, "
          "\"comm\": %s}",
          x.name.c_str(), x.step_s, tokens / x.step_s, x.compile_s, x.loss, x.comm.c_str());
    for (size_t k = 1; k < n; ++k)
      std::printf(
          ", \"%s_throughput_ratio\": %.3f, \"%s_peak_bytes_per_device\": %lld, "
          "\"%s_peak_bytes_per_device_measured\": %lld",
          r[k].name.c_str(), r[0].step_s / r[k].step_s, r[k].name.c_str(), static_cast<long long>(r[k].peak_planned),
          r[k].name.c_str(), static_cast<long long>(r[k].peak_measured));
    std::vector<std::pair<double, std::string>> measured, predicted;
    for (size_t k = 1; k < n; ++k) {
      measured.push_back({r[k].step_s, r[k].name});
      predicted.push_back({r[k].predicted_s, r[k].name});
      std::printf(", \"%s_predicted_step_s\": %.4f", r[k].name.c_str(), r[k].predicted_s);
    }
    std::printf(", \"measured_ranking\": \"%s\", \"predicted_ranking\": \"%s\"", ranking(measured).c_str(),
                ranking(predicted).c_str());
    // The pairs the rounds tell apart (the rest are within the noise), and whether the prediction
    // orders each of them the same way.
    std::string apart;
    bool agree = true;
    for (size_t i = 1; i < n; ++i)
      for (size_t j = 1; j < n; ++j) {
        if (i == j || !measured_faster(round_times[i], round_times[j])) continue;
        apart += (apart.empty() ? "" : ", ") + r[i].name + "<" + r[j].name;
        agree = agree && r[i].predicted_s < r[j].predicted_s;
      }
    std::printf(", \"measured_apart\": \"%s\", \"ranking_agrees\": %s", apart.c_str(), agree ? "true" : "false");
    std::printf(", \"target_ratio\": 0.9}\n");
  } catch (const px::Error& e) {
    std::fprintf(stderr, "sharded_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
