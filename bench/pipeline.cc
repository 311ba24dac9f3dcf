// Pipeline schedules on a GPT (f32, AdamW; a small vocabulary by default, so that the stages, one of
// which holds the head, cost about the same): per schedule the step time, the bubble measured from
// the timeline (idle fraction of the devices over the schedule) against its theory with unit
// costs, and each device's planned and measured peak; first, one device running the same
// microbatches. One JSON line per row. The devices are threads of this process sharing its cores:
// with more devices than cores the busy time of an action includes waiting for a core.
//
//   build/bench/pipeline [--devices 4] [--microbatches 8] [--layers 8] [--d 256] [--seq 128] [--vocab 256]
//                        [--batch 16] [--steps 3] [--schedules gpipe,1f1b,interleaved,zero_bubble]
//                        [--layers_per_stage 3,2,2,1 | --balance 1] [--trace_dir DIR]  (a chrome trace per schedule)
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "parallax/nn.h"
#include "parallax/train.h"

namespace {

std::vector<px::Array> batch_of(int64_t batch, int64_t seq, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<px::Array> out;
  for (int k = 0; k < 2; ++k) {
    std::vector<int32_t> v(static_cast<size_t>(batch * seq));
    for (auto& t : v) t = static_cast<int32_t>(rng() % vocab);
    out.push_back(px::Array::from_i32(v, {batch, seq}));
  }
  return out;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return "[" + s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  int devices = 4, microbatches = 8, layers = 8, steps = 3;
  int64_t d = 256, seq = 128, batch = 16, vocab = 256;
  std::string schedules = "gpipe,1f1b,interleaved,zero_bubble", trace_dir;
  std::vector<int> layers_per_stage;
  bool balance = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--devices") devices = std::stoi(v);
    else if (f == "--microbatches") microbatches = std::stoi(v);
    else if (f == "--layers") layers = std::stoi(v);
    else if (f == "--d") d = std::stoll(v);
    else if (f == "--vocab") vocab = std::stoll(v);
    else if (f == "--seq") seq = std::stoll(v);
    else if (f == "--batch") batch = std::stoll(v);
    else if (f == "--steps") steps = std::stoi(v);
    else if (f == "--schedules") schedules = v;
    else if (f == "--trace_dir") trace_dir = v;
    else if (f == "--balance") balance = v == "1" || v == "true";
    else if (f == "--layers_per_stage") {
      std::stringstream list(v);
      for (std::string k; std::getline(list, k, ',');) layers_per_stage.push_back(std::stoi(k));
    }
    else {
      std::fprintf(stderr, "pipeline: unknown flag %s\n", f.c_str());
      return 2;
    }
  }
  const px::nn::LmConfig cfg = px::nn::gpt2_config("pipeline_bench", vocab, d, 4, layers, 4 * d, seq);
  px::nn::TransformerLm model(cfg);
  const std::vector<px::TensorType> types{{px::DType::i32, {batch, seq}}, {px::DType::i32, {batch, seq}}};
  auto loss = [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1]); };
  auto run = [&](const std::string& name, px::TrainStepOptions o) {
    px::TrainStep step(model.store(), px::optim::adamw({.lr = 1e-3}), loss, types, o);
    px::TrainState s = step.init(0);
    step(s, batch_of(batch, seq, cfg.vocab_size, 1));  // warm up
    double best = 1e30;
    float last = 0;
    for (int k = 0; k < steps; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      last = step(s, batch_of(batch, seq, cfg.vocab_size, 2 + k)).loss;
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::ostringstream os;
    os << "{\"schedule\":\"" << name << "\",\"devices\":" << (step.pipelined() ? devices : 1)
       << ",\"microbatches\":" << microbatches << ",\"step_s\":" << best << ",\"loss\":" << last;
    if (step.pipelined()) {
      const px::PipelineReport& r = step.pipeline_report();
      std::vector<int64_t> planned, measured;
      for (int k = 0; k < r.schedule.devices; ++k) planned.push_back(r.planned_peak(k)), measured.push_back(r.measured_peak(k));
      os << ",\"stages\":" << r.schedule.stages() << ",\"bubble_measured\":" << r.bubble_measured()
         << ",\"bubble_theory\":" << r.bubble_theory() << ",\"schedule_s\":" << r.schedule_s
         << ",\"peak_bytes_planned\":" << join(planned) << ",\"peak_bytes_measured\":" << join(measured)
         << ",\"messages\":" << r.messages << ",\"message_bytes\":" << r.message_bytes;
      if (!trace_dir.empty()) {
        std::ofstream(trace_dir + "/pipeline_" + name + ".json") << r.chrome_trace();
      }
    } else {
      os << ",\"peak_bytes_planned\":[" << step.peak_bytes() << "]";
    }
    os << "}";
    std::printf("%s\n", os.str().c_str());
    std::fflush(stdout);
  };
  px::TrainStepOptions one;
  one.microbatches = microbatches;
  run("one_device", one);
  std::stringstream list(schedules);
  for (std::string name; std::getline(list, name, ',');) {
    px::TrainStepOptions o;
    o.mesh = px::Mesh({{"stage", devices}});
    o.microbatches = microbatches;
    o.pipeline.schedule = px::pipeline::parse_kind(name);
    o.pipeline.virtual_stages = o.pipeline.schedule == px::pipeline::Kind::interleaved ? 2 : 1;
    if (o.pipeline.virtual_stages == 1) o.pipeline.layers_per_stage = layers_per_stage;
    o.pipeline.balance = balance && o.pipeline.virtual_stages == 1;
    run(name, o);
  }
  return 0;
}
