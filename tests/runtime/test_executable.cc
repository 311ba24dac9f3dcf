// Executable mechanics on private primitives: fusion, the buffer plan, allocation-free runs,
// input/output checking, memory limits and edge-case graphs.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <random>

#include "ir/private_prims.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"
#include "testing.h"

// ---- allocation counting: every malloc-family call in this binary goes through these ------------
extern "C" {
void* __libc_malloc(size_t);
void* __libc_calloc(size_t, size_t);
void* __libc_realloc(void*, size_t);
void* __libc_memalign(size_t, size_t);
}
namespace {
std::atomic<long> g_allocs{0};
std::atomic<bool> g_counting{false};
void note() {
  if (g_counting.load(std::memory_order_relaxed)) g_allocs.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace
// Not under AddressSanitizer, which owns malloc: scripts/sanitize.sh excludes the counting tests.
#if !defined(__SANITIZE_ADDRESS__)
extern "C" {
void* malloc(size_t n) {
  note();
  return __libc_malloc(n);
}
void* calloc(size_t a, size_t b) {
  note();
  return __libc_calloc(a, b);
}
void* realloc(void* p, size_t n) {
  note();
  return __libc_realloc(p, n);
}
void* aligned_alloc(size_t al, size_t n) {
  note();
  return __libc_memalign(al, n);
}
void* memalign(size_t al, size_t n) {
  note();
  return __libc_memalign(al, n);
}
int posix_memalign(void** out, size_t al, size_t n) {
  note();
  *out = __libc_memalign(al, n);
  return *out ? 0 : 12;
}
}
#endif  // !__SANITIZE_ADDRESS__

namespace px {
namespace {

using namespace testprims;

class ExecutableTest : public ::testing::Test {
 protected:
  void SetUp() override { register_test_prims(); }
};

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

Array random(const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(static_cast<size_t>(numel(s)));
  for (auto& x : v) x = u(rng);
  return Array::from_f32(v, s);
}

using testing::error_of;

CompileOptions unfused() {
  CompileOptions o;
  o.fuse_elementwise = false;
  return o;
}

// A DAG mixing fusible ops, a plain kernel in the middle and a multi-output node.
std::vector<Tensor> mixed_dag(const std::vector<Tensor>& in) {
  Tensor a = scale(in[0], 1.5);
  Tensor b = add2(a, in[1]);
  Tensor c = effect(b);  // plain kernel: closes the open group
  Tensor d = add2(scale(c, -2.0), a);
  std::vector<Tensor> s = split2(d);
  Tensor e = add2(s[0], scale(s[1], 0.25));
  return {e, b, scale(e, 3.0)};
}

TEST_F(ExecutableTest, FusionOnAndOffGiveIdenticalResults) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{2048}, int64_t{3 * 2048 + 5}, int64_t{100003}}) {
    auto g = trace(mixed_dag, {f32({n}), f32({n})});
    std::vector<Array> in = {random({n}, 1), random({n}, 2)};
    auto fused = Executable::compile(*g)->run(in);
    auto plain = Executable::compile(*g, unfused())->run(in);
    ASSERT_EQ(fused.size(), 3u);
    for (size_t o = 0; o < fused.size(); ++o)
      EXPECT_EQ(fused[o].to_f32(), plain[o].to_f32()) << "n=" << n << " out " << o;
    // Against a reference computed here.
    std::vector<float> x = in[0].to_f32(), y = in[1].to_f32(), want(n);
    for (int64_t i = 0; i < n; ++i) {
      float a = 1.5f * x[i], b = a + y[i], d = -2.0f * b + a;
      want[i] = d + 0.25f * (2 * d);
    }
    std::vector<float> got = fused[0].to_f32();
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-5) << "n=" << n << " i=" << i;
  }
}

TEST_F(ExecutableTest, ChainCompilesToOneFusedGroup) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[0];
        for (int i = 0; i < 12; ++i) t = i % 3 == 2 ? add2(t, in[1]) : scale(t, 1.0 + 0.125 * i);
        return std::vector<Tensor>{t};
      },
      {f32({5000}), f32({5000})});
  auto exe = Executable::compile(*g);
  EXPECT_EQ(exe->num_fused_groups(), 1);
  EXPECT_EQ(exe->num_steps(), 1);
  EXPECT_NE(exe->summary().find("fused{test_scale,test_scale,test_add2"), std::string::npos) << exe->summary();
  auto off = Executable::compile(*g, unfused());
  EXPECT_EQ(off->num_steps(), 12);
  std::vector<Array> in = {random({5000}, 3), random({5000}, 4)};
  EXPECT_EQ(exe->run(in)[0].to_f32(), off->run(in)[0].to_f32());
  // Intermediates never leave the tiles: only the input and output would need buffers.
  EXPECT_LE(exe->peak_bytes(), 5000 * 4 + 64);
}

TEST_F(ExecutableTest, PlainNodeSplitsGroupsAtTheRightPlace) {
  auto g = trace(mixed_dag, {f32({64}), f32({64})});
  auto exe = Executable::compile(*g);
  // {scale, add2} | effect | {scale, add2} | split2 | {scale, add2, scale}
  EXPECT_EQ(exe->num_steps(), 5) << exe->summary();
  EXPECT_EQ(exe->num_fused_groups(), 3) << exe->summary();
}

TEST_F(ExecutableTest, BufferPlanReusesMemoryAndIsKnownBeforeRunning) {
  const int64_t n = 16384, bytes = n * 4;
  const int kOps = 24;
  auto g = trace(
      [&](const std::vector<Tensor>& in) {
        Tensor t = in[0];
        for (int i = 0; i < kOps; ++i) t = scale(t, 1.0 + i * 0.01);
        return std::vector<Tensor>{t};
      },
      {f32({n})});
  auto exe = Executable::compile(*g, unfused());
  int64_t peak = exe->peak_bytes();  // before any run
  EXPECT_GE(peak, 2 * bytes);        // one step's operand and result are live together
  EXPECT_LE(peak, 3 * bytes);        // far below the kOps * bytes of all intermediates
  exe->run({random({n}, 5)});
  EXPECT_EQ(exe->peak_bytes(), peak);
}

TEST_F(ExecutableTest, BufferPlanKeepsValuesLiveUntilTheirLastUse) {
  // x0 is read again at the very end: its buffer must not be reused in between.
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor x0 = effect(in[0]);
        Tensor t = x0;
        for (int i = 0; i < 6; ++i) t = effect(scale(t, 2.0));
        return std::vector<Tensor>{add2(t, x0)};
      },
      {f32({1000})});
  Array x = random({1000}, 6);
  std::vector<float> got = Executable::compile(*g, unfused())->run({x})[0].to_f32(), xs = x.to_f32();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(got[i], 64.0f * xs[i] + xs[i]) << i;
}

TEST_F(ExecutableTest, RunIntoPerformsNoAllocation) {
  const int64_t n = 50000;
  auto g = trace(mixed_dag, {f32({n}), f32({n})});
  for (bool fuse : {true, false}) {
    CompileOptions opt;
    opt.fuse_elementwise = fuse;
    auto exe = Executable::compile(*g, opt);
    std::vector<Array> in = {random({n}, 7), random({n}, 8)};
    std::vector<Array> out = exe->run(in);  // warm-up: starts the thread pool
    g_allocs = 0;
    g_counting = true;
    for (int i = 0; i < 3; ++i) exe->run_into(in, out);
    g_counting = false;
    EXPECT_EQ(g_allocs.load(), 0) << "fuse=" << fuse;
  }
  // The counter does see allocations.
  g_allocs = 0;
  g_counting = true;
  std::vector<float>* v = new std::vector<float>(10);
  g_counting = false;
  delete v;
  EXPECT_GE(g_allocs.load(), 2);
}

// oneDNN's primitive execute allocates internally (its argument maps), so matmuls are left out:
// this covers the project's own kernels of every other family a training step uses (small sizes:
// the serial paths, which must not enter an OpenMP region; see cpu::parallel_rows).
TEST_F(ExecutableTest, RunIntoOfATrainingStepPerformsNoAllocation) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        const Tensor &x = in[0], &w = in[1], &gamma = in[2];
        Tensor h = gelu(layer_norm(x * w + 0.1, gamma, Tensor()));
        Tensor logits = transpose(h, {1, 0});
        Tensor loss = mean(logsumexp(logits, -1) - sum(logits * softmax(logits, -1), {1}));
        std::vector<Tensor> d = gradients(loss, {w, gamma});
        return std::vector<Tensor>{loss, w - d[0] * 0.01, gamma - d[1] * 0.01};
      },
      {f32({64, 96}), f32({64, 96}), f32({96})}, {"a_rather_long_input_name_x", "w", "gamma"});
  auto exe = Executable::compile(*g);
  std::vector<Array> in = {random({64, 96}, 1), random({64, 96}, 2), random({96}, 3)};
  std::vector<Array> out = exe->run(in);
  g_allocs = 0;
  g_counting = true;
  for (int i = 0; i < 3; ++i) exe->run_into(in, out);
  g_counting = false;
  EXPECT_EQ(g_allocs.load(), 0) << exe->summary();
}

// A kernel's f32 copies of 16-bit operands live only while it runs, in scratch that the kernels a
// thread runs share: 32 f16 matmuls (no native f16 product: each converts both operands and its
// result) hold one set of copies, not 32 (24 MB here, and GBs in a bf16 step on a CPU without
// native bf16 products).
TEST_F(ExecutableTest, KernelScratchIsNotHeldPerNode) {
  const int64_t n = 256, layers = 32;
  auto g = trace(
      [&](const std::vector<Tensor>& in) {
        Tensor x = in[0];
        for (int64_t i = 0; i < layers; ++i) x = matmul(x, in[1]);
        return std::vector<Tensor>{x};
      },
      {{DType::f16, {n, n}}, {DType::f16, {n, n}}});
  std::vector<Array> in = {testing::random_array({n, n}, DType::f16, 1, -0.06f, 0.06f),
                           testing::random_array({n, n}, DType::f16, 2, -0.06f, 0.06f)};
  const size_t before = mallinfo2().uordblks;
  auto exe = Executable::compile(*g);
  exe->run(in);
  const size_t held = mallinfo2().uordblks - before;
  EXPECT_LT(held, size_t{8} << 20) << exe->summary();
}

// One executable run from 4 threads at once, 1,000 times each: every call either computes the
// right result or throws the documented "already running" error; never a wrong result.
TEST_F(ExecutableTest, ConcurrentRunsAreCorrectOrRefused) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{add2(in[0], scale(in[1], 2.0))}; },
                 {f32({256}), f32({256})});
  auto exe = Executable::compile(*g);
  std::atomic<int> wrong{0}, refused{0}, ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<Array> in = {random({256}, 10 + t), random({256}, 20 + t)};
      std::vector<float> a = in[0].to_f32(), b = in[1].to_f32();
      for (int i = 0; i < 1000; ++i) {
        try {
          std::vector<float> got = exe->run(in)[0].to_f32();
          bool same = true;
          for (size_t k = 0; k < got.size(); ++k) same = same && got[k] == a[k] + 2.0f * b[k];
          (same ? ok : wrong)++;
        } catch (const Error& e) {
          if (std::string(e.what()).find("already running on another thread") != std::string::npos) refused++;
          else wrong++;
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(ok.load() + refused.load(), 4000);
  EXPECT_GT(ok.load(), 0);
}

// The same array passed as two outputs would lose one result: refused with the fix.
TEST_F(ExecutableTest, OneArrayAsTwoOutputsIsAnError) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{scale(in[0], 2.0), scale(in[0], 3.0)}; },
                 {f32({4})});
  auto exe = Executable::compile(*g);
  Array out(DType::f32, {4});
  std::vector<Array> outs = {out, out};
  std::string msg = error_of([&] { exe->run_into({random({4}, 1)}, outs); });
  EXPECT_NE(msg.find("output arrays 0 and 1 share one buffer"), std::string::npos) << msg;
}

TEST_F(ExecutableTest, WrongInputsGiveClearErrors) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{add2(in[0], scale(in[1], 2.0))}; },
                 {f32({3}), f32({3})}, {"x", "w"});
  auto exe = Executable::compile(*g);
  EXPECT_EQ(error_of([&] { exe->run({random({3}, 1)}); }), "[run] expected 2 inputs, got 1");
  std::string msg = error_of([&] { exe->run({random({3}, 1), random({4}, 1)}); });
  EXPECT_EQ(msg, "[run] input 1 ('w') has type f32[4] but the graph was traced with f32[3]");
  msg = error_of([&] { exe->run({Array::zeros(DType::bf16, {3}), random({3}, 1)}); });
  EXPECT_EQ(msg, "[run] input 0 ('x') has type bf16[3] but the graph was traced with f32[3]");
  auto g2 = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{scale(in[0], 2.0)}; }, {f32({})});
  msg = error_of([&] { Executable::compile(*g2)->run({Array()}); });
  EXPECT_NE(msg.find("[run] input 0 is an empty px::Array"), std::string::npos) << msg;
  std::vector<Array> outs = {Array::zeros(DType::f32, {2})};
  msg = error_of([&] { exe->run_into({random({3}, 1), random({3}, 2)}, outs); });
  EXPECT_EQ(msg, "[run] output array 0 has type f32[2], expected f32[3]");
  outs.clear();
  msg = error_of([&] { exe->run_into({random({3}, 1), random({3}, 2)}, outs); });
  EXPECT_EQ(msg, "[run] expected 1 output arrays, got 0");
}

TEST_F(ExecutableTest, MemoryLimitReportsLargestLiveBuffers) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor big = effect(in[0]);    // f32[256,256] = 262144 bytes
        Tensor small = effect(in[1]);  // f32[8]
        return std::vector<Tensor>{add2(big, effect(big)), small};
      },
      {f32({256, 256}), f32({8})});
  CompileOptions opt;
  opt.memory_limit_bytes = 100000;
  std::string msg = error_of([&] { Executable::compile(*g, opt); });
  EXPECT_NE(msg.find("[compile] the program needs"), std::string::npos) << msg;
  EXPECT_NE(msg.find("over the limit of 100000 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("f32[256,256] 262144 bytes from test_effect"), std::string::npos) << msg;
  // The largest buffer is listed before the small one.
  EXPECT_LT(msg.find("f32[256,256]"), msg.find("f32[8]")) << msg;
  opt.memory_limit_bytes = 1 << 24;
  EXPECT_NO_THROW(Executable::compile(*g, opt));
  // Outputs count too, and are listed when they are what is large.
  auto big_out = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{scale(in[0], 2.0), in[1]};
      },
      {f32({512, 128}), f32({8})});
  auto exe = Executable::compile(*big_out);
  // The arena holds only the scaling loop's tiles (its kernel scratch, live while it runs).
  const int64_t tiles = exe->memory().arena_max_by_category[static_cast<int>(MemoryCategory::kernel_scratch)];
  EXPECT_EQ(exe->peak_bytes(), tiles);
  EXPECT_EQ(exe->output_bytes(), 512 * 128 * 4 + 32);
  opt.memory_limit_bytes = 100000;
  msg = error_of([&] { Executable::compile(*big_out, opt); });
  // Inputs and outputs count (they are in the caller's arrays, on the device), split by category.
  EXPECT_NE(msg.find("needs " + std::to_string(524352 + tiles) + " bytes per device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("inputs 262176, outputs 262176, arena " + std::to_string(tiles)), std::string::npos) << msg;
  EXPECT_NE(msg.find("kernel_scratch: " + std::to_string(tiles) + " bytes at the peak"), std::string::npos) << msg;
  EXPECT_NE(msg.find("output 0: %2 f32[512,128] 262144 bytes"), std::string::npos) << msg;
}

TEST_F(ExecutableTest, OutputsThatAreInputsRepeatedOutputsAndEmptyGraphs) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor a = scale(in[0], 2.0);
        return std::vector<Tensor>{in[1], a, a, in[0], in[1]};
      },
      {f32({4}), f32({2, 2})});
  Array x = random({4}, 9), y = random({2, 2}, 10);
  for (auto opt : {CompileOptions{}, unfused()}) {
    auto out = Executable::compile(*g, opt)->run({x, y});
    ASSERT_EQ(out.size(), 5u);
    EXPECT_EQ(out[0].to_f32(), y.to_f32());
    EXPECT_EQ(out[0].shape(), (Shape{2, 2}));
    EXPECT_EQ(out[1].to_f32(), out[2].to_f32());
    EXPECT_EQ(out[3].to_f32(), x.to_f32());
    EXPECT_NE(out[0].raw(), y.raw());  // outputs are copies, never aliases of inputs
    EXPECT_NE(out[1].raw(), out[2].raw());
  }
  auto empty = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; }, {f32({4})});
  auto exe = Executable::compile(*empty);
  EXPECT_EQ(exe->num_steps(), 0);
  EXPECT_EQ(exe->peak_bytes(), 0);
  EXPECT_EQ(exe->run({x})[0].to_f32(), x.to_f32());
  auto none = trace([](const std::vector<Tensor>&) { return std::vector<Tensor>{}; }, {});
  EXPECT_TRUE(Executable::compile(*none)->run({}).empty());
  auto consts = trace([](const std::vector<Tensor>&) { return std::vector<Tensor>{fill({2, 3}, 4.5)}; }, {});
  EXPECT_EQ(Executable::compile(*consts)->run({})[0].to_f32(), std::vector<float>(6, 4.5f));
}

TEST_F(ExecutableTest, OutputsAreWrittenInPlaceOfInputsWhenSafe) {
  // w' = w - 0.5 g: the last read of w is the step that writes w', so w's array can take it.
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{add2(in[0], scale(in[1], -0.5))}; },
                 {f32({1000}), f32({1000})});
  auto exe = Executable::compile(*g);
  Array w = random({1000}, 1), grad = random({1000}, 2);
  std::vector<float> w0 = w.to_f32(), g0 = grad.to_f32();
  std::vector<Array> outs = {w}, ins = {w, grad};
  g_allocs = 0;
  g_counting = true;
  exe->run_into(ins, outs);
  g_counting = false;
  EXPECT_EQ(g_allocs.load(), 0);  // no spill buffer was needed, not even on the first run
  std::vector<float> w1 = w.to_f32();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(w1[i], w0[i] - 0.5f * g0[i]);
  EXPECT_EQ(outs[0].raw(), w.raw());
}

TEST_F(ExecutableTest, InPlaceFusedGroupReadsOperandsBeforeWritingResults) {
  // One fused loop computes 2w (into w's array) and then 2w + w: the second must see the old w.
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor a = scale(in[0], 2.0);
        return std::vector<Tensor>{a, add2(a, in[0])};
      },
      {f32({5000})});
  auto exe = Executable::compile(*g);
  ASSERT_EQ(exe->num_steps(), 1);
  Array w = random({5000}, 5);
  std::vector<float> w0 = w.to_f32();
  std::vector<Array> outs = {w, Array::zeros(DType::f32, {5000})};
  exe->run_into({w}, outs);
  std::vector<float> a = w.to_f32(), b = outs[1].to_f32();
  for (int i = 0; i < 5000; ++i) {
    ASSERT_EQ(a[i], 2 * w0[i]);
    ASSERT_EQ(b[i], 3 * w0[i]);
  }
}

TEST_F(ExecutableTest, AliasedOutputsThatAreStillNeededAreSpilled) {
  // Output 0 (2w) aliases w, but w is read again by a later step, and returned as output 2.
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor twice = scale(in[0], 2.0);
        Tensor later = add2(effect(twice), in[0]);  // reads w after 2w exists
        return std::vector<Tensor>{twice, later, in[0]};
      },
      {f32({3000})});
  Array w = random({3000}, 3);
  std::vector<float> w0 = w.to_f32();
  auto exe = Executable::compile(*g);
  for (int rep = 0; rep < 2; ++rep) {  // the spill buffer is reused on the second run
    Array w_in = Array::from_f32(w0, {3000});
    std::vector<Array> outs = {w_in, Array::zeros(DType::f32, {3000}), Array::zeros(DType::f32, {3000})};
    exe->run_into({w_in}, outs);
    std::vector<float> a = outs[0].to_f32(), b = outs[1].to_f32(), c = outs[2].to_f32();
    for (int i = 0; i < 3000; ++i) {
      ASSERT_EQ(a[i], 2 * w0[i]);
      ASSERT_EQ(b[i], 3 * w0[i]);
      ASSERT_EQ(c[i], w0[i]);
    }
  }
}

TEST_F(ExecutableTest, ReshapesAreViews) {
  const int64_t n = 4096;
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor a = effect(in[0]);                      // f32[64,64]
        Tensor b = effect(reshape(a, {4096}));         // read through a view
        Tensor c = effect(reshape(in[0], {16, 256}));  // a view of a graph input
        return std::vector<Tensor>{add2(b, reshape(c, {4096})), reshape(a, {32, 128})};
      },
      {f32({64, 64})});
  auto exe = Executable::compile(*g);
  // No reshape runs as a step of its own: the two read by effects are views, and the fused loop
  // of the add writes the returned one (outputs never share storage).
  std::string summary = exe->summary();
  EXPECT_EQ(summary.find(": reshape"), std::string::npos) << summary;
  EXPECT_EQ(exe->num_steps(), 4) << summary;  // three effects and the fused add
  Array x = random({64, 64}, 4);
  auto out = exe->run({x});
  std::vector<float> xs = x.to_f32(), o0 = out[0].to_f32();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(o0[i], 2 * xs[i]);
  EXPECT_EQ(out[1].shape(), (Shape{32, 128}));
  EXPECT_EQ(out[1].to_f32(), xs);
  EXPECT_EQ(Executable::compile(*g, unfused())->run({x})[0].to_f32(), o0);
}

TEST_F(ExecutableTest, RunsRepeatedlyWithDifferentInputs) {
  auto g = trace(mixed_dag, {f32({300}), f32({300})});
  auto exe = Executable::compile(*g);
  for (uint32_t seed = 0; seed < 4; ++seed) {
    std::vector<Array> in = {random({300}, seed), random({300}, seed + 100)};
    EXPECT_EQ(exe->run(in)[2].to_f32(), Executable::compile(*g, unfused())->run(in)[2].to_f32());
  }
}

TEST_F(ExecutableTest, OptimizeRunsCseAndDce) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        effect(in[0]);  // dead, even though no_cse
        return std::vector<Tensor>{add2(scale(in[0], 2.0), scale(in[0], 2.0))};
      },
      {f32({3})});
  auto exe = Executable::compile(*g);
  EXPECT_EQ(exe->graph().nodes().size(), 2u) << exe->graph().to_string();
  CompileOptions raw;
  raw.optimize = false;
  EXPECT_EQ(Executable::compile(*g, raw)->graph().nodes().size(), 4u);
}

TEST_F(ExecutableTest, CompileRejectsPrimitivesWithoutKernels) {
  static std::once_flag once;
  std::call_once(once, [] {
    Primitive p;
    p.name = "test_nokernel";
    p.infer = [](const std::vector<TensorType>& in, const Attrs&) { return in; };
    register_primitive(p);
  });
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{emit1("test_nokernel", {in[0]})}; },
                 {f32({3})});
  EXPECT_EQ(error_of([&] { Executable::compile(*g); }), "[compile] no CPU kernel for primitive 'test_nokernel'");
}

}  // namespace
}  // namespace px
