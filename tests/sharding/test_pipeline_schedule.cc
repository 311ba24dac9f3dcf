// Pipeline schedules: every kind is a valid order (each action once, no deadlock) over a grid of
// devices and microbatches; the simulated bubble and held activations are what the kinds promise.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "parallax/core.h"
#include "parallax/pipeline.h"

namespace px::pipeline {
namespace {

// fn throws a px::Error whose message holds every fragment.
::testing::AssertionResult throws_error(const std::function<void()>& fn, const std::vector<std::string>& fragments) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& f : fragments)
      if (msg.find(f) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << f << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no px::Error was thrown";
}

TEST(PipelineSchedule, OneFOneBReadsAsThePaperDrawsIt) {
  Schedule s = make_schedule(Kind::one_f_one_b, 4, 8);
  EXPECT_EQ(s.to_string(),
            "1f1b: 4 devices, 4 stages, 8 microbatches\n"
            "device 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7\n"
            "device 1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7\n"
            "device 2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7\n"
            "device 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7\n");
}

TEST(PipelineSchedule, EveryKindIsValidAndMeetsItsBubble) {
  for (int D : {1, 2, 3, 4, 8})
    for (int M : {1, 2, 4, 8, 12, 16}) {
      SCOPED_TRACE("D=" + std::to_string(D) + " M=" + std::to_string(M));
      // GPipe and 1F1B: (D-1)/(M+D-1) exactly, with uniform stages and free messages.
      Simulation g = simulate(make_schedule(Kind::gpipe, D, M));
      Simulation f = simulate(make_schedule(Kind::one_f_one_b, D, M));
      EXPECT_NEAR(g.bubble, bubble_theory(Kind::gpipe, D, M), 1e-12);
      EXPECT_NEAR(f.bubble, bubble_theory(Kind::one_f_one_b, D, M), 1e-12);
      // Activations: GPipe holds every microbatch; 1F1B at most D - d on device d.
      for (int d = 0; d < D; ++d) {
        EXPECT_EQ(g.peak_activations[d], M);
        EXPECT_EQ(f.peak_activations[d], std::min(M, D - d));
      }
      // ZB-H1: no device holds more than 1F1B's first, the bubble of the theory, a third of 1F1B's.
      Simulation z = simulate(make_schedule(Kind::zero_bubble, D, M));
      for (int d = 0; d < D; ++d) EXPECT_LE(z.peak_activations[d], std::min(M, D));
      EXPECT_LE(z.bubble, f.bubble + 1e-12);
      if (D > 1 && M >= D) {
        EXPECT_LT(z.bubble, f.bubble);
        EXPECT_NEAR(z.bubble, bubble_theory(Kind::zero_bubble, D, M), 1e-12);
      }
      // Interleaved: V stages per device, a smaller bubble than 1F1B.
      if (M % D == 0)
        for (int V : {2, 3}) {
          SCOPED_TRACE("V=" + std::to_string(V));
          Simulation v = simulate(make_schedule(Kind::interleaved, D, M, V), Costs{1.0 / V, 1.0 / V, 1.0 / V, 0.0});
          if (D > 1) EXPECT_LT(v.bubble, f.bubble);
          EXPECT_NEAR(v.bubble, bubble_theory(Kind::interleaved, D, M, V), 0.03);
        }
    }
}

TEST(PipelineSchedule, MessagesBetweenDevicesWidenTheBubble) {
  Schedule s = make_schedule(Kind::one_f_one_b, 4, 8);
  Simulation free_msgs = simulate(s), slow = simulate(s, Costs{1, 1, 1, 0.5});
  EXPECT_GT(slow.bubble, free_msgs.bubble);
  EXPECT_GT(slow.makespan, free_msgs.makespan);
}

// Whether the stage programs split each backward pass is read off the actions, not the kind: an
// action list with I and W splits whatever kind it is labelled with.
TEST(PipelineSchedule, SplitBackwardIsWhatTheActionsSay) {
  for (Kind k : {Kind::gpipe, Kind::one_f_one_b}) EXPECT_FALSE(make_schedule(k, 4, 8).splits_backward());
  EXPECT_FALSE(make_schedule(Kind::interleaved, 2, 4, 2).splits_backward());
  Schedule zb = make_schedule(Kind::zero_bubble, 4, 8);
  EXPECT_TRUE(zb.splits_backward());
  zb.kind = Kind::one_f_one_b;  // a hand-made list under another label
  EXPECT_TRUE(zb.splits_backward());
  Schedule one = make_schedule(Kind::one_f_one_b, 2, 2);
  for (auto& dev : one.per_device)
    for (Action& a : dev)
      if (a.op == Op::backward) a.op = Op::backward_input;
  EXPECT_TRUE(one.splits_backward());
}

TEST(PipelineSchedule, InvalidOrdersAreNamed) {
  // Device 0 waits for B0's gradient before sending F0 on: a deadlock.
  Schedule s = make_schedule(Kind::one_f_one_b, 2, 2);
  std::swap(s.per_device[0][0], s.per_device[0][2]);
  EXPECT_TRUE(throws_error([&] { simulate(s); }, {"deadlocks", "device 0 waits at B0"}));
  Schedule dup = make_schedule(Kind::gpipe, 2, 2);
  dup.per_device[1].push_back(dup.per_device[1][0]);
  EXPECT_TRUE(throws_error([&] { simulate(dup); }, {"listed twice"}));
  Schedule missing = make_schedule(Kind::gpipe, 2, 2);
  missing.per_device[1].pop_back();
  EXPECT_TRUE(throws_error([&] { simulate(missing); }, {"microbatch 1 of stage 1", "exactly once"}));
  Schedule wrong = make_schedule(Kind::gpipe, 2, 2);
  wrong.per_device[0][0].stage = 1;
  EXPECT_TRUE(throws_error([&] { simulate(wrong); }, {"device 0 lists F0 of stage 1"}));
}

TEST(PipelineSchedule, BadSettingsAreUserErrors) {
  EXPECT_TRUE(throws_error([] { make_schedule(Kind::one_f_one_b, 0, 4); }, {"devices (0)", "at least 1"}));
  EXPECT_TRUE(throws_error([] { make_schedule(Kind::gpipe, 2, 0); }, {"microbatches (0)"}));
  EXPECT_TRUE(throws_error([] { make_schedule(Kind::one_f_one_b, 2, 4, 2); }, {"1f1b has one stage per device"}));
  EXPECT_TRUE(throws_error([] { make_schedule(Kind::interleaved, 4, 6, 2); },
                           {"multiple of the devices (4)", "use 8 microbatches"}));
  EXPECT_TRUE(throws_error([] { parse_kind("1F1B-interleaved"); }, {"unknown schedule", "gpipe, 1f1b"}));
  EXPECT_EQ(parse_kind("zero_bubble"), Kind::zero_bubble);
}

}  // namespace
}  // namespace px::pipeline
