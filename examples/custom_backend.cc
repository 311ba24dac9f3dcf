// A backend of your own, in one file: the platform "tiny" runs f32 add, mul and neg with plain
// loops over host memory and registers itself with px::register_backend. A program compiled for
// "tiny" runs its kernels; one that needs a primitive tiny lacks fails at compile time, naming it.
// Built in tree (examples/) and out of tree against an installed prefix with parallax::core only
// (tests/e2e/find_package_core). docs/adding-a-backend.md walks through it.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "parallax/backend.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"

namespace {

using Loop = void (*)(const float* a, const float* b, float* out, int64_t n);

// The kernels by primitive: handles looked up once by name (px::primitive_handle), then found by
// a node's `prim`.
const std::map<const px::Primitive*, Loop>& loops() {
  static const std::map<const px::Primitive*, Loop> table = {
      {px::primitive_handle("add"),
       [](const float* a, const float* b, float* o, int64_t n) {
         for (int64_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
       }},
      {px::primitive_handle("mul"),
       [](const float* a, const float* b, float* o, int64_t n) {
         for (int64_t i = 0; i < n; ++i) o[i] = a[i] * b[i];
       }},
      {px::primitive_handle("neg"),
       [](const float* a, const float*, float* o, int64_t n) {
         for (int64_t i = 0; i < n; ++i) o[i] = -a[i];
       }},
  };
  return table;
}

class TinyBackend final : public px::Backend {
 public:
  std::string name() const override { return "tiny"; }
  // Device memory is host memory here (Backend's default), counted by px per placement
  // (px::memory_stats). A GPU backend would return cudaMalloc'd memory.
  void* allocate(const px::Placement& p, int64_t bytes) override {
    ++allocations;
    return px::Backend::allocate(p, bytes);
  }
  int allocations = 0;
  bool can_fuse(const px::Graph&, const px::Node&) const override { return false; }
  bool has_kernel(const px::Primitive* primitive) const override { return loops().count(primitive) != 0; }
  px::Kernel make_kernel(const px::Graph& g, const px::Unit& unit, const px::Placement&) override {
    const px::Node& n = g.nodes()[unit.nodes.at(0)];
    auto it = loops().find(n.prim);
    if (it == loops().end() || g.type(n.outputs[0]).dtype != px::DType::f32)
      throw px::Error("[tiny] no kernel for '" + px::primitive_name(n) + "' on " + px::type_str(g.type(n.outputs[0])));
    const Loop loop = it->second;
    const int64_t count = g.type(n.outputs[0]).numel();
    const bool binary = n.inputs.size() == 2;
    return [loop, count, binary](const void* const* in, void* const* out) {
      loop(static_cast<const float*>(in[0]), binary ? static_cast<const float*>(in[1]) : nullptr,
           static_cast<float*>(out[0]), count);
    };
  }
  px::Event copy(std::vector<px::CopyJob> jobs) override {  // done at once: the event is complete
    for (const px::CopyJob& j : jobs) std::memmove(j.dst, j.src, static_cast<size_t>(j.bytes));
    return px::Event();
  }
  int num_threads() const override { return 1; }
  px::FusionLimits fusion() const override { return {.enabled = false}; }
};

}  // namespace

int main() {
  static TinyBackend tiny;
  px::register_backend("tiny", []() -> px::Backend& { return tiny; });

  // (x * y + x) * -y on "tiny".
  auto g = px::trace(
      [](const std::vector<px::Tensor>& in) { return std::vector<px::Tensor>{(in[0] * in[1] + in[0]) * -in[1]}; },
      {{px::DType::f32, {2, 3}}, {px::DType::f32, {2, 3}}});
  px::CompileOptions options;
  options.platform = "tiny";
  auto exe = px::Executable::compile(*g, options);
  const std::vector<float> x = {1, 2, 3, 4, 5, 6}, y = {0.5f, -1, 2, 0, 1.5f, -2};
  const std::vector<float> got = exe->run({px::Array::from_f32(x, {2, 3}), px::Array::from_f32(y, {2, 3})})[0].to_f32();
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = (x[i] * y[i] + x[i]) * -y[i];
    if (std::fabs(got[i] - want) > 1e-6f) {
      std::printf("custom_backend: element %zu is %g, expected %g\n", i, got[i], want);
      return 1;
    }
  }
  std::printf("custom_backend: (x*y + x) * -y ran on the 'tiny' backend\n");
  // The program's arena, its inputs' copies and its result are tiny's memory.
  const px::MemoryStats mem = px::memory_stats({0, px::MemoryKind::device, "tiny"});
  if (tiny.allocations == 0 || mem.allocations != tiny.allocations) {
    std::printf("custom_backend: %d allocations by tiny, %lld counted on tiny:0/device\n", tiny.allocations,
                static_cast<long long>(mem.allocations));
    return 1;
  }

  // A program with a primitive tiny has no kernel for fails when it compiles, naming it.
  auto needs_exp = px::trace([](const std::vector<px::Tensor>& in) { return std::vector<px::Tensor>{px::exp(in[0])}; },
                             {{px::DType::f32, {4}}});
  try {
    px::Executable::compile(*needs_exp, options);
    std::printf("custom_backend: exp compiled on 'tiny', which has no kernel for it\n");
    return 1;
  } catch (const px::Error& e) {
    std::printf("custom_backend: as expected: %s\n", e.what());
  }
  return 0;
}
