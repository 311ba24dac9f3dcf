// Profiled runs as timelines: every kernel in run order with its times, every collective in flight
// from its start to the end of its wait, the share of that hidden behind compute, and a Chrome
// trace that parses.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "../sharding/recipe_check.h"
#include "parallax/ops.h"
#include "parallax/parallel.h"
#include "parallax/runtime.h"
#include "testing.h"

namespace px {
namespace {

using namespace recipe_check;

void expect_ordered(const Timeline& t) {
  double last_end = 0;
  for (const Timeline::Span& s : t.device) {
    EXPECT_LE(s.begin_s, s.end_s) << s.name;
    EXPECT_GE(s.begin_s, last_end) << s.name;  // one thread: spans follow each other
    last_end = s.end_s;
  }
  EXPECT_DOUBLE_EQ(t.run_s, last_end);
}

TEST(Timeline, AProfiledRunListsEveryKernelInOrderAndTheTraceParses) {
  const TensorType m{DType::f32, {64, 64}};
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{exp(matmul(in[0], in[1])) + 1.0, transpose(in[0], {1, 0})};
      },
      {m, m});
  CompileOptions o;
  o.profile = true;
  auto exe = Executable::compile(*g, o);
  EXPECT_NE(testing::error_of([&] { exe->timeline(); }).find("no run profiled yet"), std::string::npos);
  Array a = Array::from_f32(std::vector<float>(64 * 64, 0.01f), {64, 64});
  Array b = Array::from_f32(std::vector<float>(64 * 64, 0.02f), {64, 64});
  exe->run({a, b});
  exe->run({a, b});
  const Timeline t = exe->timeline();
  ASSERT_EQ(static_cast<int>(t.device.size()), exe->num_steps());
  expect_ordered(t);
  EXPECT_TRUE(t.in_flight.empty());
  EXPECT_EQ(t.overlap(), 0.0);
  const nlohmann::json j = nlohmann::json::parse(t.chrome_trace());
  int spans = 0;
  for (const auto& e : j["traceEvents"]) spans += e["ph"] == "X";
  EXPECT_EQ(spans, exe->num_steps());

  auto plain = Executable::compile(*g);
  plain->run({a, b});
  EXPECT_NE(testing::error_of([&] { plain->timeline(); }).find("PX_PROFILE=1"), std::string::npos);
}

// DDP on 2 devices: every gradient all-reduce is in flight between its start and its wait, and the
// device's own time in them is part of that.
TEST(Timeline, ShowsEveryCollectiveInFlightAndTheShareOverlappedWithCompute) {
  Fixture f(nn::gpt2_tiny());
  TrainStepOptions o;
  o.compile.profile = true;
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                 px::testing::on_mesh(Mesh::cpu({{"data", 2}}), ShardingStrategy::DDP, {}, o));
  TrainState s = step.init(0);
  step(s, f.batch(0));
  const Timeline t = step.program().executable().timeline();
  expect_ordered(t);
  ASSERT_FALSE(t.in_flight.empty());
  double in_flight = 0;
  for (const Timeline::Span& s : t.in_flight) {
    EXPECT_EQ(s.name.rfind("all_reduce", 0), 0u) << s.name;
    EXPECT_GT(s.bytes, 0);
    EXPECT_LE(s.begin_s, s.end_s);
    EXPECT_LE(s.end_s, t.run_s);
    in_flight += s.end_s - s.begin_s;
  }
  EXPECT_DOUBLE_EQ(t.in_flight_s, in_flight);
  EXPECT_LE(t.exposed_s, t.in_flight_s);
  EXPECT_GE(t.overlap(), 0.0);
  EXPECT_LE(t.overlap(), 1.0);
  const nlohmann::json j = nlohmann::json::parse(t.chrome_trace());
  size_t on_track_1 = 0;
  for (const auto& e : j["traceEvents"]) on_track_1 += e["ph"] == "X" && e["tid"] == 1;
  EXPECT_EQ(on_track_1, t.in_flight.size());
  EXPECT_NE(step.program().executable().profile_report().find("% overlapped with compute"), std::string::npos);
}

}  // namespace
}  // namespace px
