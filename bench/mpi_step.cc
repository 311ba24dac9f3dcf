// The bench-gpt training step DDP and FSDP over P processes of 1 device each (under mpirun)
// against 1 process of P devices, in the same run: step time, and the collective calls and bytes
// per device and step. Prints one JSON object (rank 0).
//
//   PX_DEVICES=cpu:1 OMP_NUM_THREADS=1 mpirun -np 2 --oversubscribe --allow-run-as-root \
//       --mca btl self,vader build/bench/mpi_step [--steps 5] [--warmup 2] [--layers 2] [--d 256] ...
//       [--strategies ddp,fsdp] [--single_threads N] [--timeline DIR]
// The one-process run happens on rank 0 while the others wait, with --single_threads OpenMP
// threads (default: OMP threads x P, the same cores as the P processes together). --timeline
// profiles the P-process steps (every kernel timed: a little slower) and writes each rank's last
// step as a Chrome trace, DIR/<strategy>_rank<r>.json, with the share of the collectives' time
// hidden behind compute in the JSON.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gpt_common.h"
#include "parallax/communicator.h"
#include "parallax/distributed.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "parallax/train.h"

using px::bench::seconds_since;

namespace {

struct Timed {
  double step_s = 0;
  float loss = 0;
  int64_t calls = 0, bytes = 0;  // per device and step
  px::Timeline timeline;         // the last step, when profiled
};

// The median step of `steps` after `warmup`, the collectives of one device per step, and (compiled
// with profiling) the last step's timeline.
Timed measure(px::TrainStep& step, const std::vector<px::Array>& batch, int warmup, int steps, bool profiled = false) {
  px::TrainState s = step.init(0);
  Timed t;
  for (int i = 0; i < warmup; ++i) step(s, batch);
  step.program().reset_stats();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    t.loss = step(s, batch).loss;
    times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  t.step_s = times[times.size() / 2];
  const px::CollectiveStats& st = step.program().stats();
  const int pos = step.program().positions().at(0);
  for (int k = 0; k < px::kNumCollectiveKinds; ++k) {
    const auto& e = st.at(pos, static_cast<px::CollectiveKind>(k));
    t.calls += e.calls;
    t.bytes += e.payload_bytes;
  }
  t.calls /= std::max(steps, 1);
  t.bytes /= std::max(steps, 1);
  if (profiled) t.timeline = step.program().executable().timeline();
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::string strategies = "ddp,fsdp", timeline_dir;
  int single_threads = 0;
  px::bench::GptArgs a =
      px::bench::parse_gpt_args(argc, argv, "mpi_step", {.steps = 5, .warmup = 2, .d = 256, .layers = 2, .seq = 128},
                                false, [&](const std::string& k, const std::string& v) {
                                  if (k == "--strategies")
                                    strategies = v;
                                  else if (k == "--single_threads")
                                    single_threads = std::atoi(v.c_str());
                                  else if (k == "--timeline")
                                    timeline_dir = v;
                                  else
                                    return false;
                                  return true;
                                });
  try {
    const px::ProcessWorld& w = px::process_world();
    if (!w.communicator || w.size < 2)
      throw px::Error("run it under mpirun with 2 or more processes (see the header of bench/mpi_step.cc)");
    px::nn::LmConfig cfg = a.config();
    px::nn::TransformerLm model(cfg);
    px::TensorType seq{px::DType::i32, {a.batch, a.seq}};
    auto loss_fn = [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); };
    auto opt = px::optim::adamw({.lr = 3e-4});
    const std::vector<px::Array> batch = px::bench::gpt_batch(a);
    const int threads = omp_get_max_threads();
    std::string json = "{\"bench\": \"mpi_step\", \"processes\": " + std::to_string(w.size) + ", \"devices\": \"" +
                       w.devices.to_string() + "\", \"threads_per_process\": " + std::to_string(threads) +
                       ", \"params\": " + std::to_string(model.store().param_count());
    for (size_t pos = 0; pos <= strategies.size();) {
      const size_t end = std::min(strategies.find(',', pos), strategies.size());
      const std::string name = strategies.substr(pos, end - pos);
      pos = end + 1;
      if (name != "ddp" && name != "fsdp") throw px::Error("--strategies takes ddp and fsdp, got '" + name + "'");
      const auto strategy = name == "ddp" ? px::ShardingStrategy::DDP : px::ShardingStrategy::FSDP;
      // One process of P devices, on rank 0 (the others wait at the barrier).
      Timed one;
      if (w.rank == 0) {
        omp_set_num_threads(single_threads > 0 ? single_threads : threads * w.size);
        px::Mesh m = px::Mesh::create({{"data", -1}}, px::DeviceSet{"cpu", w.devices.count, 1});
        px::TrainStep step(model.store(), opt, loss_fn, {seq, seq}, {.mesh = m, .strategy = strategy});
        one = measure(step, batch, a.warmup, a.steps);
        omp_set_num_threads(threads);
      }
      w.communicator->barrier();
      px::TrainStepOptions to{.mesh = px::Mesh::create({{"data", -1}}, w.devices), .strategy = strategy};
      to.sharding.communicator = w.communicator;
      to.compile.profile = !timeline_dir.empty();
      px::TrainStep step(model.store(), opt, loss_fn, {seq, seq}, to);
      Timed many = measure(step, batch, a.warmup, a.steps, to.compile.profile);
      if (!timeline_dir.empty()) {
        std::filesystem::create_directories(timeline_dir);
        const std::string path = timeline_dir + "/" + name + "_rank" + std::to_string(w.rank) + ".json";
        std::ofstream(path) << many.timeline.chrome_trace();
        const px::Timeline& t = many.timeline;
        json += ", \"" + name + "_timeline\": {\"trace\": \"" + path +
                "\", \"collectives\": " + std::to_string(t.in_flight.size()) +
                ", \"in_flight_s\": " + std::to_string(t.in_flight_s) +
                ", \"exposed_s\": " + std::to_string(t.exposed_s) + ", \"overlap\": " + std::to_string(t.overlap()) +
                ", \"step_s\": " + std::to_string(t.run_s) + "}";
      }
      char buf[512];
      std::snprintf(buf, sizeof buf,
                    ", \"%s\": {\"processes_step_s\": %.4f, \"one_process_step_s\": %.4f, \"ratio\": %.3f, "
                    "\"same_loss\": %s, \"collective_calls_per_device_step\": %lld, "
                    "\"collective_payload_bytes_per_device_step\": %lld}",
                    name.c_str(), many.step_s, one.step_s, one.step_s / many.step_s,
                    many.loss == one.loss ? "true" : "false", static_cast<long long>(many.calls),
                    static_cast<long long>(many.bytes));
      json += buf;
    }
    if (w.rank == 0) std::printf("%s}\n", json.c_str());
  } catch (const px::Error& e) {
    std::fprintf(stderr, "mpi_step: %s\n", e.what());
    return 1;
  }
  return 0;
}
