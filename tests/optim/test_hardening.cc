// Training steps on bad input: optimizer options, checkpoints that do not fit, steps past the
// traced counter, non-finite losses and out-of-range labels.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "parallax/checkpoint.h"
#include "parallax/io.h"
#include "parallax/nn.h"
#include "parallax/train.h"
#include "testing.h"

namespace px {
namespace {

using testing::error_of;
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// A classifier with `layers` Linear layers over 4 features and 3 classes.
struct Model {
  nn::Scope root;
  std::vector<nn::Linear> layers;
  explicit Model(int n) {
    for (int i = 0; i < n; ++i) layers.emplace_back(root.sub("l").sub(i), i == 0 ? 4 : 3, 3);
  }
  TrainStep::LossFn loss() {
    return [this](const std::vector<Tensor>& b) {
      Tensor h = b[0];
      for (auto& l : layers) h = l(h);
      return cross_entropy_loss(h, b[1]);
    };
  }
};
const std::vector<TensorType> kBatch = {{DType::f32, {2, 4}}, {DType::i32, {2}}};
std::vector<Array> batch(float scale = 1.0f, int32_t label = 1) {
  Array x = testing::random_array({2, 4}, DType::f32, 3);
  std::vector<float> v = x.to_f32();
  for (auto& e : v) e *= scale;
  return {Array::from_f32(v, {2, 4}), Array::from_i32({0, label}, {2})};
}

std::string read_text_file(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
void write_text_file(const std::string& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

std::string tmp(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("px_hardening_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST(OptimizerOptions, NegativeLearningRatesAreRejected) {
  EXPECT_TRUE(has(error_of([] { optim::sgd({.lr = -0.1}); }), "must be >= 0"));
  EXPECT_THROW(optim::adamw({.lr = -1e-3}), UserError);
  EXPECT_THROW(optim::warmup_cosine(-3e-4, 10, 100), UserError);
  EXPECT_THROW(optim::linear_warmup(-1, 10), UserError);
  EXPECT_NO_THROW(optim::sgd({.lr = 0.0}));
}

TEST(OptimizerOptions, ClipNormMustBeFiniteAndNonNegative) {
  Model m(1);
  for (double c : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    std::string e = error_of([&] { TrainStep(m.root.store(), optim::sgd({}), m.loss(), kBatch, {.clip_norm = c}); });
    EXPECT_TRUE(has(e, "clip_norm must be a finite number >= 0")) << c << ": " << e;
  }
  EXPECT_NO_THROW(TrainStep(m.root.store(), optim::sgd({}), m.loss(), kBatch, {.clip_norm = 0.0}));
}

TEST(Checkpoint, ExtraTensorsAreRejected) {
  Model three(3), two(2);
  TrainStep big(three.root.store(), optim::sgd({.lr = 0.1, .momentum = 0.9}), three.loss(), kBatch);
  TrainStep small(two.root.store(), optim::sgd({.lr = 0.1, .momentum = 0.9}), two.loss(), kBatch);
  for (std::string p : {tmp("three"), tmp("three.safetensors")}) {  // a checkpoint, and the export
    big.save(p, big.init(1));
    std::string e = error_of([&] { small.load(p); });
    EXPECT_TRUE(has(e, p + ": has 4 tensors") && has(e, "'l.2.w'") && has(e, "do not have")) << e;
    EXPECT_THROW(small.load(p), UserError);
    EXPECT_NO_THROW(big.load(p));
    std::filesystem::remove_all(p);
  }
}

TEST(Checkpoint, StepIsParsedStrictlyAndNeverTruncated) {
  Model m(1);
  TrainStep step(m.root.store(), optim::sgd({.lr = 0.1}), m.loss(), kBatch);
  TrainState s = step.init(1);
  // A safetensors state (save's export, or a file of the single-file format) carries the step as text.
  std::string p = tmp("step.safetensors");
  std::vector<std::string> names = m.root.store().paths();
  for (std::string bad : {"12abc", "-7", "", " 3", "+3", "99999999999999999999", "0x10"}) {
    save_safetensors(p, names, step.gather_params(s), {{"step", bad}, {"optimizer", step.optimizer().name()}});
    std::string e = error_of([&] { step.load(p); });
    EXPECT_TRUE(has(e, "the metadata's step '" + bad + "' is not a step")) << "'" << bad << "': " << e;
  }
  save_safetensors(p, names, step.gather_params(s), {{"step", "2147483647"}, {"optimizer", step.optimizer().name()}});
  std::string e = error_of([&] { step.load(p); });
  EXPECT_TRUE(has(e, p + ": [TrainStep::load] the state's step is 2147483647; it must be in [0, 2147483646]")) << e;
  save_safetensors(p, names, step.gather_params(s), {{"step", "2147483646"}, {"optimizer", step.optimizer().name()}});
  EXPECT_EQ(step.load(p).step, 2147483646);
  std::filesystem::remove(p);
  // A checkpoint directory holds it as a JSON integer: the same limits on load.
  const std::string dir = tmp("step");
  s.step = 2147483647;
  step.save(dir, s);
  e = error_of([&] { step.load(dir); });
  EXPECT_TRUE(has(e, dir + ": [TrainStep::load] the state's step is 2147483647")) << e;
  s.step = 2147483646;
  step.save(dir, s);  // replaces the committed checkpoint there
  EXPECT_EQ(step.load(dir).step, 2147483646);
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, DamagedOrMisplacedCheckpointsAreClearErrors) {
  Model m(2);
  TrainStep step(m.root.store(), optim::sgd({.lr = 0.1, .momentum = 0.9}), m.loss(), kBatch);
  TrainState s = step.init(1);
  step(s, batch());
  const std::string dir = tmp("damaged");
  std::filesystem::remove_all(dir);
  step.save(dir, s);
  const std::string chunk = dir + "/l.1.w/c/0/0";
  ASSERT_TRUE(std::filesystem::exists(chunk));

  // A corrupt chunk: the checksum fails, naming the array and the chunk file.
  std::string bytes = read_text_file(chunk);
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x20;
  write_text_file(chunk, flipped);
  std::string e = error_of([&] { step.load(dir); });
  EXPECT_TRUE(has(e, "array 'l.1.w' chunk c/0/0 (file " + chunk + "): checksum mismatch")) << e;
  // A truncated chunk, then a missing one.
  write_text_file(chunk, bytes.substr(0, bytes.size() / 2));
  e = error_of([&] { step.load(dir); });
  EXPECT_TRUE(has(e, "array 'l.1.w' chunk c/0/0 (file " + chunk + "): checksum mismatch")) << e;
  std::filesystem::remove(chunk);
  e = error_of([&] { step.load(dir); });
  EXPECT_TRUE(has(e, "the chunk file is missing")) << e;
  // Truncated metadata.
  step.save(dir, s);
  const std::string meta = dir + "/metadata.json";
  write_text_file(meta, read_text_file(meta).substr(0, 40));
  e = error_of([&] { step.load(dir); });
  EXPECT_TRUE(has(e, meta + ": not valid JSON (truncated?)")) << e;
  // No commit marker: a save that did not finish.
  step.save(dir, s);
  std::filesystem::remove(dir + "/COMMITTED");
  e = error_of([&] { step.load(dir); });
  EXPECT_TRUE(has(e, "is not a committed checkpoint")) << e;
  // ... which save does not delete (nor any other directory or file that is not a checkpoint).
  e = error_of([&] { step.save(dir, s); });
  EXPECT_TRUE(has(e, dir + " exists and is not a committed checkpoint")) << e;
  EXPECT_TRUE(std::filesystem::exists(dir + "/metadata.json"));
  std::filesystem::remove_all(dir);
  // A file that is not a checkpoint directory, and a path with nothing there.
  write_text_file(dir, "x");
  e = error_of([&] { step.load(dir); });
  EXPECT_TRUE(has(e, "is a file, not a checkpoint directory") && has(e, ".safetensors")) << e;
  std::filesystem::remove(dir);
  e = error_of([&] { step.load(dir + ".missing"); });
  EXPECT_TRUE(has(e, dir + ".missing")) << e;
  // Intact again: loads equal to the state saved.
  step.save(dir, s);
  TrainState l = step.load(dir);
  EXPECT_EQ(l.step, 1);
  for (size_t i = 0; i < s.params.size(); ++i) EXPECT_EQ(l.params[i].shards()[0].to_f32(), s.params[i].shards()[0].to_f32());
  for (size_t i = 0; i < s.opt_state.size(); ++i)
    EXPECT_EQ(l.opt_state[i].shards()[0].to_f32(), s.opt_state[i].shards()[0].to_f32());
  std::filesystem::remove_all(dir);
}

TEST(TrainSteps, StepsThatDoNotFitTheTracedCounterAreAnError) {
  Model m(1);
  TrainStep step(m.root.store(), optim::sgd({.lr = 0.1}), m.loss(), kBatch);
  TrainState s = step.init(1);
  s.step = int64_t{1} << 31;  // used to wrap to a negative step: negative lr, NaN params
  std::string e = error_of([&] { step(s, batch()); });
  EXPECT_TRUE(has(e, "[TrainStep]") && has(e, "2147483648")) << e;
  s.step = -1;
  EXPECT_THROW(step(s, batch()), UserError);
  s.step = 2147483646;
  EXPECT_NO_THROW(step(s, batch()));
}

TEST(NonFinite, MetricsSayWhenTheLossIsNotFinite) {
  Model m(1);
  TrainStep step(m.root.store(), optim::sgd({.lr = 0.1}), m.loss(), kBatch);
  TrainState s = step.init(1);
  StepMetrics ok = step(s, batch());
  EXPECT_TRUE(ok.finite);
  EXPECT_FALSE(ok.skipped);
  StepMetrics bad = step(s, batch(std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(bad.finite);
  EXPECT_FALSE(bad.skipped);  // not asked to skip: the update ran (and the params are NaN now)
  EXPECT_EQ(s.step, 2);
}

TEST(NonFinite, SkipNonFiniteKeepsParamsAndStateAndCountsTheSkip) {
  Model m(2);
  TrainStep step(m.root.store(), optim::adamw({.lr = 1e-2}), m.loss(), kBatch, {.skip_nonfinite = true});
  TrainState s = step.init(1);
  step(s, batch());
  std::vector<std::vector<float>> params, state;
  for (auto& p : step.gather_params(s)) params.push_back(p.to_f32());
  for (auto& o : step.gather_opt_state(s)) state.push_back(o.to_f32());
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e30f}) {
    StepMetrics mt = step(s, batch(bad));
    EXPECT_FALSE(mt.finite) << bad;
    EXPECT_TRUE(mt.skipped) << bad;
    for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(step.gather_params(s)[i].to_f32(), params[i]) << bad;
    for (size_t i = 0; i < state.size(); ++i) EXPECT_EQ(step.gather_opt_state(s)[i].to_f32(), state[i]) << bad;
  }
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(s.skipped, 3);
  StepMetrics again = step(s, batch());  // training goes on from the last good state
  EXPECT_TRUE(again.finite && !again.skipped);
  EXPECT_EQ(s.step, 2);
  for (auto& p : step.gather_params(s))
    for (float v : p.to_f32()) EXPECT_TRUE(std::isfinite(v));
}

TEST(NonFinite, OutOfRangeLabelsAreRefusedBeforeTheStepRuns) {
  // A label outside the classes would be NaN in the loss (or, as a token, read a clamped row): the
  // step checks every batch input used as an index and refuses the batch, naming the value.
  Model m(1);
  TrainStep step(m.root.store(), optim::sgd({.lr = 0.1}), m.loss(), kBatch, {.skip_nonfinite = true});
  TrainState s = step.init(1);
  std::vector<float> before = step.gather_params(s)[0].to_f32();
  for (int32_t label : {3, -5, 1000}) {
    try {
      step(s, batch(1.0f, label));
      ADD_FAILURE() << "label " << label << " was accepted";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("holds " + std::to_string(label)), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("outside [0, 3)"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(step.gather_params(s)[0].to_f32(), before);
  EXPECT_EQ(s.step, 0);
  EXPECT_EQ(s.skipped, 0);
}

}  // namespace
}  // namespace px

namespace px {
namespace {

// One training step called from 4 threads at once, each thread with its own state: every call
// either updates that state exactly as a serial run would, or throws the documented error and
// leaves the state as it was; never a wrong result.
TEST(Concurrency, OneTrainStepFromFourThreadsIsCorrectOrRefused) {
  Model m(2);
  TrainStep step(m.root.store(), optim::adamw({.lr = 1e-2}), m.loss(), kBatch);
  const std::vector<Array> b = batch();
  const int kSteps = 250;        // 4 x 250 = 1,000 calls
  std::vector<float> reference;  // the loss of step k of a serial run from init(1)
  {
    TrainState s = step.init(1);
    for (int k = 0; k < kSteps; ++k) reference.push_back(step(s, b).loss);
  }
  std::atomic<int> wrong{0}, refused{0}, ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      TrainState s = step.init(1);
      for (int i = 0; i < kSteps; ++i) {
        const int64_t k = s.step;
        try {
          float loss = step(s, b).loss;
          (loss == reference[k] && s.step == k + 1 ? ok : wrong)++;
        } catch (const Error& e) {
          (has(e.what(), "already running on another thread") && s.step == k ? refused : wrong)++;
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(ok.load() + refused.load(), 4 * kSteps);
  EXPECT_GT(ok.load(), 0);
}

}  // namespace
}  // namespace px
