// The bench-gpt training step (forward, backward, AdamW) on one device vs the same step DDP and
// FSDP over cpu:2 (two virtual devices sharing the same cores): the overhead of partitioning and
// in-process collectives. Prints one JSON object; the target is throughput ratios >= 0.85.
//
//   build/bench/sharded_step [--steps 3] [--warmup 1] [--layers 6] [--d 512] [--batch 8] [--seq 256] ...
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gpt_common.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"

using px::bench::seconds_since;

namespace {

struct Result {
  double step_s = 0, compile_s = 0;
  float loss = 0;
};

}  // namespace

int main(int argc, char** argv) {
  px::bench::GptArgs a = px::bench::parse_gpt_args(argc, argv, "sharded_step", {.steps = 3, .warmup = 1}, false);
  try {
    px::nn::LmConfig cfg = a.config();
    px::nn::TransformerLm model(cfg);
    px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
    auto loss_fn = [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); };
    // PX_BENCH_OPTIMIZER=sgd: a state-free update, to separate the optimizer's cost from the rest.
    const char* on = std::getenv("PX_BENCH_OPTIMIZER");
    auto opt = on && std::string(on) == "sgd" ? px::optim::sgd({.lr = 3e-4}) : px::optim::adamw({.lr = 3e-4});
    std::vector<px::Array> batch = px::bench::gpt_batch(a);

    auto t0 = std::chrono::steady_clock::now();
    px::TrainStep single(model.store(), opt, loss_fn, {seq, seq});
    Result r[3];
    r[0].compile_s = seconds_since(t0);
    px::TrainState s0 = single.init(0);

    const char* nd = std::getenv("PX_BENCH_DEVICES");  // default 2: cpu:2
    px::Mesh mesh = px::Mesh::cpu({{"data", nd ? std::atoll(nd) : 2}});
    px::ShardingOptions so;
    if (const char* b = std::getenv("PX_BENCH_BUCKET_BYTES")) so.bucket_bytes = std::atoll(b);
    if (const char* d = std::getenv("PX_BENCH_DEVICE_PARALLELISM"))
      so.device_parallelism = std::string(d) == "within_kernels" ? px::DeviceParallelism::within_kernels
                              : std::string(d) == "over_devices" ? px::DeviceParallelism::over_devices
                                                                 : px::DeviceParallelism::automatic;
    std::unique_ptr<px::ShardedTrainStep> sharded[2];
    px::ShardedTrainState st[2];
    const px::ShardingStrategy strategies[2] = {px::ShardingStrategy::DDP, px::ShardingStrategy::FSDP};
    for (int k = 0; k < 2; ++k) {
      t0 = std::chrono::steady_clock::now();
      sharded[k] = std::make_unique<px::ShardedTrainStep>(
          model.store(), opt, loss_fn, std::vector<px::TensorType>{seq, seq}, mesh, strategies[k], so);
      r[k + 1].compile_s = seconds_since(t0);
      st[k] = sharded[k]->init(0);
    }
    // Interleaved rounds (single, DDP, FSDP) and the median of each: drift on a shared machine
    // (other processes, page faults of fresh buffers) hits all three alike.
    auto run_one = [&](int k) { return k == 0 ? single(s0, batch).loss : (*sharded[k - 1])(st[k - 1], batch).loss; };
    for (int i = 0; i < a.warmup; ++i)
      for (int k = 0; k < 3; ++k) run_one(k);
    for (int k = 0; k < 2; ++k) sharded[k]->executable().reset_stats();
    std::vector<double> times[3];
    for (int i = 0; i < a.steps; ++i)
      for (int k = 0; k < 3; ++k) {
        t0 = std::chrono::steady_clock::now();
        r[k].loss = run_one(k);
        times[k].push_back(seconds_since(t0));
      }
    for (int k = 0; k < 3; ++k) {
      std::sort(times[k].begin(), times[k].end());
      r[k].step_s = times[k][times[k].size() / 2];
    }
    std::string comm[2];
    for (int k = 0; k < 2; ++k) {
      if (std::getenv("PX_BENCH_VERBOSE"))
        std::fprintf(stderr, "%s\n%s", sharded[k]->table().c_str(), sharded[k]->collectives_table().c_str());
      const px::CollectiveStats& stats = sharded[k]->executable().stats();
      int64_t calls = 0, bytes = 0;
      for (int c = 0; c < px::kNumCollectiveKinds; ++c) {
        auto e = stats.total(static_cast<px::CollectiveKind>(c));
        calls += e.calls;
        bytes += e.payload_bytes;
      }
      const int64_t n = std::max(a.steps, 1) * mesh.size();
      comm[k] = "{\"calls_per_step\": " + std::to_string(calls / n) +
                ", \"payload_bytes_per_step\": " + std::to_string(bytes / n) +
                ", \"segments\": " + std::to_string(sharded[k]->executable().num_segments()) + "}";
    }
    double tokens = static_cast<double>(a.batch * a.seq);
    std::printf(
        "{\"bench\": \"sharded_step\", \"threads\": %d, \"devices\": %lld, \"params\": %lld, "
        "\"tokens_per_step\": %.0f, \"rounds\": %d, "
        "\"single\": {\"step_s\": %.4f, \"tokens_per_s\": %.1f, \"compile_s\": %.2f, \"loss\": %.5f}, "
        "\"ddp\": {\"step_s\": %.4f, \"tokens_per_s\": %.1f, \"compile_s\": %.2f, \"loss\": %.5f, \"comm\": %s}, "
        "\"fsdp\": {\"step_s\": %.4f, \"tokens_per_s\": %.1f, \"compile_s\": %.2f, \"loss\": %.5f, \"comm\": %s}, "
        "\"ddp_throughput_ratio\": %.3f, \"fsdp_throughput_ratio\": %.3f, \"target_ratio\": 0.85}\n",
        omp_get_max_threads(), static_cast<long long>(mesh.size()), static_cast<long long>(model.store().param_count()),
        tokens, a.steps, r[0].step_s, tokens / r[0].step_s, r[0].compile_s, r[0].loss, r[1].step_s,
        tokens / r[1].step_s, r[1].compile_s, r[1].loss, comm[0].c_str(), r[2].step_s, tokens / r[2].step_s,
        r[2].compile_s, r[2].loss, comm[1].c_str(), r[0].step_s / r[1].step_s, r[0].step_s / r[2].step_s);
  } catch (const px::Error& e) {
    std::fprintf(stderr, "sharded_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
