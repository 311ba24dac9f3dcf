// Offload on a 12-layer bench-gpt-width model at seq 1024 (one device, f32, AdamW): per setting the
// planned and measured device peak, the params fetched into device memory at once against one
// layer's params, the bytes moved between memory kinds, and the step time against keeping
// everything on the device (target: all params offloaded with prefetch at most 10% slower; the
// timed steps of all settings are interleaved). One JSON line per setting.
//
//   build/bench/offload [--layers 12] [--seq 1024] [--batch 1] [--steps 3] [--warmup 1] [--d 512] ...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpt_common.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/train.h"

using px::bench::seconds_since;

int main(int argc, char** argv) {
  px::bench::GptArgs a = px::bench::parse_gpt_args(
      argc, argv, "offload", {.steps = 3, .warmup = 1, .layers = 12, .seq = 1024, .batch = 1}, false);
  try {
    px::nn::LmConfig cfg = a.config();
    px::nn::TransformerLm model(cfg);
    px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
    auto loss_fn = [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); };
    auto opt = px::optim::adamw({.lr = 3e-4});
    std::vector<px::Array> batch = px::bench::gpt_batch(a);
    // One layer's params: the largest block.
    std::map<std::string, int64_t> block_bytes;
    const std::vector<std::string> paths = model.store().paths();
    const std::vector<px::TensorType> types = model.store().types();
    for (size_t i = 0; i < paths.size(); ++i)
      if (paths[i].rfind("blocks.", 0) == 0) block_bytes[paths[i].substr(0, paths[i].find('.', 7))] += types[i].nbytes();
    int64_t layer_bytes = 0;
    for (auto& [k, v] : block_bytes) layer_bytes = std::max(layer_bytes, v);

    struct Setting {
      const char* name;
      px::OffloadOptions o;
    };
    const Setting settings[] = {
        {"none", {}},
        {"params, no prefetch", {{"*"}, false, 0}},
        {"params, prefetch 1", {{"*"}, false, 1}},
        {"params, prefetch 2", {{"*"}, false, 2}},
        {"optimizer state", {{}, true, 1}},
        {"params and optimizer state, prefetch 1", {{"*"}, true, 1}},
    };
    // Memory first, one setting at a time (the device counters are per process); the steps stay
    // alive, and then their timed steps are interleaved, one of each setting per round, so that
    // the machine's drift falls on all of them alike.
    struct Run {
      std::unique_ptr<px::TrainStep> step;
      px::TrainState state;
      px::MemoryReport m;
      int64_t measured_dev = 0, measured_host = 0;
      std::vector<double> times;
      float loss = 0;
    };
    std::vector<Run> runs;
    for (const Setting& st : settings) {
      px::TrainStepOptions o;
      o.offload = st.o;
      Run r;
      px::Placement dev{0}, host{0, px::MemoryKind::pinned_host};
      // Device: above the bytes in use before this step existed, plus the batch its plan counts (as
      // bench/remat; the step counter and metrics are planned but alive only during a step).
      const int64_t dev_base = px::memory_stats(dev).bytes_in_use - batch[0].nbytes() - batch[1].nbytes();
      r.step = std::make_unique<px::TrainStep>(model.store(), opt, loss_fn, std::vector<px::TensorType>{seq, seq}, o);
      r.state = r.step->init(0);
      // Allocated so far by this step on the host: its arena and output arrays (the state moves there
      // on the first step).
      const px::MemoryReport planned = r.step->executable().memory();
      const int64_t host_base =
          px::memory_stats(host).bytes_in_use - planned.host_arena_bytes - planned.host_output_bytes;
      px::reset_peak_memory(dev);
      px::reset_peak_memory(host);
      for (int i = 0; i < std::max(a.warmup, 1); ++i) r.loss = (*r.step)(r.state, batch).loss;
      r.m = r.step->executable().memory();
      // The high-water marks above what other settings' steps hold.
      r.measured_dev = px::memory_stats(dev).peak_bytes_in_use - dev_base;
      r.measured_host = px::memory_stats(host).peak_bytes_in_use - host_base;
      runs.push_back(std::move(r));
    }
    for (int i = 0; i < a.steps; ++i)
      for (Run& r : runs) {
        auto t0 = std::chrono::steady_clock::now();
        r.loss = (*r.step)(r.state, batch).loss;
        r.times.push_back(seconds_since(t0));
      }
    double none_s = 0;
    for (size_t k = 0; k < runs.size(); ++k) {
      Run& r = runs[k];
      const Setting& st = settings[k];
      std::sort(r.times.begin(), r.times.end());
      const double t = r.times[r.times.size() / 2];
      if (k == 0) none_s = t;
      const px::MemoryReport& m = r.m;
      const int64_t fetched = m.arena_max_by_category[static_cast<int>(px::MemoryCategory::params)];
      std::printf(
          "{\"bench\": \"offload\", \"setting\": \"%s\", \"prefetch_depth\": %d, \"layers\": %lld, \"seq\": %lld, "
          "\"planned_device_peak_bytes\": %lld, \"measured_device_peak_bytes\": %lld, \"planned_host_bytes\": %lld, "
          "\"measured_host_peak_bytes\": %lld, \"params_on_device_at_once_bytes\": %lld, \"layer_params_bytes\": %lld, "
          "\"params_on_device_in_layers\": %.2f, \"transfer_bytes\": %lld, \"step_s\": %.3f, \"time_overhead\": %.3f, "
          "\"loss\": %.6f}\n",
          st.name, st.o.prefetch_depth, static_cast<long long>(a.layers), static_cast<long long>(a.seq),
          static_cast<long long>(m.peak_bytes), static_cast<long long>(r.measured_dev),
          static_cast<long long>(m.host_peak_bytes()), static_cast<long long>(r.measured_host),
          static_cast<long long>(fetched), static_cast<long long>(layer_bytes),
          static_cast<double>(fetched) / static_cast<double>(layer_bytes), static_cast<long long>(m.transfer_bytes), t,
          t / none_s - 1.0, r.loss);
      std::fflush(stdout);
    }
  } catch (const px::Error& e) {
    std::fprintf(stderr, "offload: %s\n", e.what());
    return 1;
  }
  return 0;
}
