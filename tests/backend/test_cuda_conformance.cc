// The conformance suite (include/parallax/testing/conformance.h) on the CUDA backend against the
// ref backend, forward and vjp, for every case whose primitives the backend has kernels for; the
// cases it cannot run yet are listed with the primitives they lack. Skips without a GPU: it has
// never run (scripts/gpu_check.sh runs it first on a machine with one). Built only with PX_WITH_CUDA.
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <set>
#include <string>

#include "backend/cuda/backend.h"
#include "parallax/testing/conformance.h"

namespace px {
namespace {

// The primitives of a case's forward and vjp graphs (every dtype and variant) that `be` has no
// kernel for.
std::set<std::string> missing_kernels(const conformance::Case& c, const Backend& be) {
  std::set<std::string> missing;
  auto scan = [&](const Graph& g) {
    for (const Node& n : g.nodes())
      if (!be.has_kernel(n.prim)) missing.insert(primitive_name(n));
  };
  for (DType dt : c.dtypes)
    for (const auto& v : c.variants) {
      std::vector<TensorType> types;
      for (const conformance::In& in : v) types.push_back({in.dtype.value_or(dt), in.shape});
      try {
        auto fwd = trace([&](const std::vector<Tensor>& a) { return c.fn(a, dt); }, types);
        scan(*fwd);
        std::vector<TensorType> ct;
        if (auto bwd = conformance::vjp_graph(c, dt, types, *fwd, &ct)) scan(*bwd);
      } catch (const std::exception&) {
        // run_cases reports a case that does not trace
      }
    }
  return missing;
}

TEST(CudaConformance, EveryCaseWithKernelsEqualsTheRefBackend) {
  if (cuda::visible_devices() == 0) GTEST_SKIP() << "no CUDA device visible: this test has never run on a GPU";
  ASSERT_TRUE(cuda::register_cuda_backend());
  const Backend& be = backend_for("cuda");
  std::map<std::string, std::set<std::string>> skipped;  // case -> the primitives it lacks
  conformance::Options o;
  o.filter = [&](const conformance::Case& c) {
    std::set<std::string> m = missing_kernels(c, be);
    if (m.empty()) return true;
    skipped[c.name] = std::move(m);
    return false;
  };
  const conformance::Report r = conformance::check_backend("cuda", o);
  std::cout << r.table();
  for (const auto& [name, prims] : skipped) {
    std::string list;
    for (const std::string& p : prims) list += " " + p;
    std::cout << "not run on cuda (no kernel):" << list << ": " << name << "\n";
  }
  EXPECT_GT(r.passed, 0);
  for (const std::string& f : r.failures) ADD_FAILURE() << f;
}

}  // namespace
}  // namespace px
