// A step allocates nothing outside its plan: the working memory its kernels need (the f32 copies
// of 16-bit operands, gathered operands, per-thread tiles, the fused head's logits blocks and dh
// partials, attention's partials, oneDNN's scratchpad) is planned with the program's buffers and
// handed to them (Backend::scratch_bytes). This binary counts every C++ heap allocation (operator
// new) made while a kernel runs, on any of its threads, through a backend that wraps the CPU's
// kernels and names the kernel that allocated more than a library's few hundred bytes. Before issue 52's item 6 the CPU kernels grew
// per-thread scratch of their own during the first step (thread_scratch), outside the plan.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "parallax/backend.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/optim.h"
#include "parallax/sharding.h"
#include "parallax/train.h"

// Under AddressSanitizer, which replaces operator new itself, nothing is counted and the count
// test skips (the suite's Release run counts).
#if defined(__SANITIZE_ADDRESS__)
#define PX_COUNTS_ALLOCATIONS 0
#else
#define PX_COUNTS_ALLOCATIONS 1
#endif

namespace {
std::atomic<bool> counting{false};
std::atomic<int64_t> counted_bytes{0};

[[maybe_unused]] void* counted(std::size_t n, std::size_t align) noexcept {
  if (counting.load(std::memory_order_relaxed)) counted_bytes += static_cast<int64_t>(n);
  const std::size_t size = std::max<std::size_t>(n, 1);
  return align > alignof(std::max_align_t) ? std::aligned_alloc(align, (size + align - 1) / align * align)
                                           : std::malloc(size);
}
[[maybe_unused]] void* counted_or_throw(std::size_t n, std::size_t align) {
  void* p = counted(n, align);
  if (!p) throw std::bad_alloc();
  return p;
}
}  // namespace

#if PX_COUNTS_ALLOCATIONS
// Every form of operator new and delete, so that each allocation and its release pair up.
void* operator new(std::size_t n) { return counted_or_throw(n, 0); }
void* operator new[](std::size_t n) { return counted_or_throw(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return counted_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return counted_or_throw(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return counted(n, 0); }
void* operator new(std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted(n, static_cast<std::size_t>(a));
}
void* operator new[](std::size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { std::free(p); }
#endif

namespace px {
namespace {

// What a kernel run may allocate: oneDNN's sgemm makes a small descriptor per call (192 bytes
// here); its packing buffers come from malloc and are freed before it returns.
constexpr int64_t kLibraryBytes = 1024;

// The CPU backend with every kernel run counted: the most bytes a run of a unit allocated beyond
// kLibraryBytes, by unit label.
class CountedCpu final : public Backend {
 public:
  std::string name() const override { return "cpu_counted"; }
  bool can_fuse(const Graph& g, const Node& n) const override { return cpu_backend().can_fuse(g, n); }
  bool has_kernel(const Primitive* p) const override { return cpu_backend().has_kernel(p); }
  int64_t scratch_bytes(const Graph& g, const Unit& unit, const Placement& device) const override {
    return cpu_backend().scratch_bytes(g, unit, device);
  }
  Kernel make_kernel(const Graph& g, const Unit& unit, const Placement& device) override {
    Kernel k = cpu_backend().make_kernel(g, unit, device);
    return [this, k, label = unit.label](const void* const* in, void* const* out) {
      counted_bytes = 0;
      counting = true;
      k(in, out);
      counting = false;
      if (const int64_t bytes = counted_bytes.load(); bytes > kLibraryBytes) {
        std::lock_guard<std::mutex> l(m);
        allocated[label] = std::max(allocated[label], bytes);
      }
    };
  }
  Event copy(std::vector<CopyJob> jobs) override { return cpu_backend().copy(std::move(jobs)); }
  void copy_boxes(const std::vector<BoxCopy>& jobs) override { cpu_backend().copy_boxes(jobs); }
  int num_threads() const override { return cpu_backend().num_threads(); }
  FusionLimits fusion() const override { return cpu_backend().fusion(); }

  std::string report() {
    std::lock_guard<std::mutex> l(m);
    std::string s;
    for (const auto& [label, bytes] : allocated) s += "\n  " + label + ": " + std::to_string(bytes) + " bytes in one run";
    allocated.clear();
    return s;
  }
  std::mutex m;
  std::map<std::string, int64_t> allocated;
};

CountedCpu& counted_cpu() {
  static CountedCpu b;
  if (!has_backend("cpu_counted")) register_backend("cpu_counted", []() -> Backend& { return b; });
  return b;
}

struct Planned {
  int64_t peak = 0, scratch = 0;  // the planned peak, and the most kernel scratch live at once
};

// Three steps of a small GPT of width d at `dtype`, with the fused head or the unfused one, on one
// device of the counting backend.
Planned run_steps(DType dtype, bool fused_head, int64_t d) {
  counted_cpu();
  nn::LmConfig cfg = nn::gpt2_config("step-allocations", 8 * d, d, 4, 2, 2 * d, 64);
  cfg.fused_head = fused_head;
  nn::TransformerLm model(cfg);
  const int64_t b = 4, s = 64, v = 8 * d;
  const TensorType seq{DType::i32, {b, s}};
  auto loss_fn = [&](const std::vector<Tensor>& x) { return nn::next_token_loss(model, x[0], x[1]); };
  std::vector<int32_t> tok(b * s), tgt(b * s);
  for (int64_t i = 0; i < b * s; ++i)
    tok[i] = static_cast<int32_t>((i * 7) % v), tgt[i] = static_cast<int32_t>((i * 7 + 1) % v);
  const std::vector<Array> batch{Array::from_i32(tok, {b, s}), Array::from_i32(tgt, {b, s})};
  TrainStepOptions o;
  o.compile.compute_dtype = dtype;
  o.mesh = Mesh::create({{"data", 1}}, DeviceSet{"cpu_counted", 1});
  TrainStep step(model.store(), optim::adamw({.lr = 1e-3}), loss_fn, {seq, seq}, o);
  TrainState state = step.init(0);
  for (int i = 0; i < 3; ++i) step(state, batch);
  const MemoryReport& report = step.executable().memory();
  return {report.peak_bytes, report.arena_max_by_category[static_cast<int>(MemoryCategory::kernel_scratch)]};
}

TEST(StepAllocations, KernelsAllocateNothingWhileTheyRun) {
  if (!PX_COUNTS_ALLOCATIONS) GTEST_SKIP() << "AddressSanitizer replaces operator new: nothing is counted here";
  // The process's one-time set-up first (oneDNN's jit code, OpenMP's threads), on a narrower model:
  // a kernel that grew scratch of its own would grow it again for the wider one.
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool fused : {false, true}) run_steps(dtype, fused, 32);
  counted_cpu().report();
  for (DType dtype : {DType::f32, DType::bf16})
    for (bool fused : {false, true}) {
      const Planned p = run_steps(dtype, fused, 64);
      const std::string what = std::string(dtype_name(dtype)) + (fused ? ", fused head" : ", unfused head");
      const std::string allocated = counted_cpu().report();
      EXPECT_TRUE(allocated.empty()) << what << ": kernels allocated while they ran (first step included):" << allocated;
      // Their working memory is in the plan instead.
      EXPECT_GT(p.scratch, 0) << what;
      EXPECT_LT(p.scratch, p.peak) << what;
    }
}

// The kernel scratch is a category of the memory report.
TEST(StepAllocations, KernelScratchIsItsOwnCategoryInTheReport) {
  nn::TransformerLm model(nn::gpt2_config("scratch-report", 64, 32, 2, 2, 64, 16));
  const TensorType seq{DType::i32, {2, 16}};
  auto loss_fn = [&](const std::vector<Tensor>& x) { return nn::next_token_loss(model, x[0], x[1]); };
  TrainStep step(model.store(), optim::adamw({.lr = 1e-3}), loss_fn, {seq, seq});
  const std::string text = step.executable().memory().to_string();
  EXPECT_NE(text.find("kernel_scratch: "), std::string::npos) << text;
}

}  // namespace
}  // namespace px
