// A build without an optional part (-DPX_WITH_AUTO=OFF, -DPX_WITH_MPI=OFF; CMakeLists.txt): where
// the library calls into the part left out, a px::UserError names the option to rebuild with,
// and a one-device step still trains. tests/CMakeLists.txt defines PX_TEST_WITH_AUTO and
// PX_TEST_WITH_MPI (0 or 1) for this file and runs the process_world() test once more as if
// launched by mpirun when MPI is left out.
#include <gtest/gtest.h>

#include <string>

#include "../sharding/recipe_check.h"
#include "core/env.h"
#include "parallax/distributed.h"
#include "parallax/parallel.h"
#include "parallax/train.h"
#include "testing.h"

namespace px {
namespace {

using recipe_check::Fixture;
using recipe_check::gpt_micro;
using recipe_check::opt;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(OptionalParts, OneDeviceStepTrains) {
  Fixture f(gpt_micro(), 4);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, {});
  TrainState s = step.init(0);
  const float first = step(s, f.batch(0)).loss;
  float last = first;
  for (int i = 0; i < 4; ++i) last = step(s, f.batch(0)).loss;
  EXPECT_LT(last, first);
}

TEST(OptionalParts, AutoWithoutItFailsNamingTheOption) {
  if (PX_TEST_WITH_AUTO) GTEST_SKIP() << "built with AUTO (-DPX_WITH_AUTO=ON)";
  Fixture f(gpt_micro(), 8);
  const std::string e = testing::error_of([&] {
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                   testing::on_mesh(Mesh::cpu({{"data", 2}}), ShardingStrategy::AUTO));
  });
  EXPECT_TRUE(has(e, "-DPX_WITH_AUTO=ON")) << e;
}

// Not launched: one process, with or without MPI. Launched by mpirun (the test's second entry sets
// mpirun's variables) in a build without MPI: the error names the option.
TEST(OptionalParts, ProcessWorld) {
  if (env().launch_size == 0) {
    const ProcessWorld& w = process_world();
    EXPECT_EQ(w.rank, 0);
    EXPECT_EQ(w.size, 1);
    EXPECT_EQ(w.communicator, nullptr);
    EXPECT_EQ(w.devices.count, default_devices().count);
    return;
  }
  if (PX_TEST_WITH_MPI) GTEST_SKIP() << "launched, in a build with MPI: the MPI tests cover it";
  const std::string e = testing::error_of([] { process_world(); });
  EXPECT_TRUE(has(e, "-DPX_WITH_MPI=ON")) << e;
  EXPECT_TRUE(has(e, "mpirun")) << e;
}

}  // namespace
}  // namespace px
