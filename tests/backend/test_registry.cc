// Every registered primitive can run on each built-in backend (cpu, ref): it has a kernel there (on
// the CPU, or an elementwise block function for the fused loops), the runtime runs it itself
// (collectives, transfers), or it has a decomposition into primitives. A primitive registered
// without any of these is named here, at test time, instead of when a program that uses it first
// compiles.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/cpu/kernel.h"
#include "backend/ref/ref.h"
#include "ir/primitive.h"
#include "runtime/schedule.h"
#include "sharding/prims.h"

namespace px {
namespace {

constexpr const char* kPlanted = "px_test_without_kernel";  // registered by the second test

std::vector<std::string> primitives_without_kernel(const std::string& platform, bool with_planted = false) {
  ensure_sharding_registered();
  std::vector<std::string> missing;
  for (const std::string& name : primitive_names()) {
    const Primitive& p = get_primitive(name);
    const bool has =
        platform == "cpu" ? cpu::find_kernel(&p) || cpu::find_eltwise(&p) : ref::find_kernel(&p) != nullptr;
    const bool runs = has || is_async_primitive(p) || static_cast<bool>(p.decompose);
    if (!runs && (with_planted || name != kPlanted)) missing.push_back(name);
  }
  return missing;
}

TEST(Registry, EveryPrimitiveRunsOnEachBackend) {
  for (const std::string platform : {"cpu", "ref"}) {
    std::string names;
    for (const std::string& n : primitives_without_kernel(platform)) names += " " + n;
    EXPECT_TRUE(names.empty()) << "registered primitives with no " << platform
                               << " kernel and no decomposition:" << names;
  }
}

TEST(Registry, APrimitiveWithoutAKernelIsNamed) {
  Primitive p;
  p.name = kPlanted;
  p.infer = [](const std::vector<TensorType>& in, const Attrs&) { return in; };
  register_primitive(std::move(p));
  for (const std::string platform : {"cpu", "ref"}) {
    const std::vector<std::string> missing = primitives_without_kernel(platform, true);
    EXPECT_NE(std::find(missing.begin(), missing.end(), kPlanted), missing.end()) << platform;
  }
}

}  // namespace
}  // namespace px
