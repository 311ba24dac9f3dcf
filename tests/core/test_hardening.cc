// Hardening of the core: error categories, checked shape arithmetic, the one glob syntax, the
// environment, and registries written while other threads read them.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <tuple>
#include <type_traits>

#include "backend/cpu/kernel.h"
#include "core/env.h"
#include "core/log.h"
#include "ir/primitive.h"
#include "parallax/ops.h"
#include "parallax/optim.h"
#include "parallax/runtime.h"
#include "parallax/sharding.h"
#include "testing.h"

namespace px {
namespace {

using px::testing::error_of;
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ErrorCategories, AreErrorsAndSayWhatTheyAre) {
  // Existing `catch (const px::Error&)` sites see every category.
  EXPECT_THROW(throw UserError("x"), Error);
  EXPECT_THROW(throw IoError("x"), Error);
  EXPECT_THROW(throw InternalError("x"), Error);
  std::string internal = InternalError("[cpu] broken").what();
  EXPECT_TRUE(has(internal, "[cpu] broken")) << internal;
  EXPECT_TRUE(has(internal, "bug in parallax")) << internal;
  EXPECT_TRUE(has(internal, "report")) << internal;
}

TEST(ErrorCategories, FailedCheckThrowsInternalErrorNotFromADestructor) {
  // A throwing destructor terminates the program when it runs during unwinding.
  EXPECT_TRUE(std::is_nothrow_destructible_v<detail::CheckFailure>);
  int v = 3;
  try {
    PX_CHECK(v == 4) << "value " << v << " is odd";
    FAIL() << "no error";
  } catch (const InternalError& e) {
    std::string m = e.what();
    EXPECT_TRUE(has(m, "check failed")) << m;
    EXPECT_TRUE(has(m, "v == 4")) << m;
    EXPECT_TRUE(has(m, "value 3 is odd")) << m;
    EXPECT_TRUE(has(m, "please report")) << m;
  }
  PX_CHECK(v == 3) << "never built";
}

TEST(CheckedShapes, ElementAndByteCountsNeverWrap) {
  const int64_t big = int64_t{1} << 62;
  EXPECT_EQ(numel({big, 0}), 0);
  EXPECT_EQ(numel({3, 4}), 12);
  EXPECT_TRUE(has(error_of([&] { numel({big, 4}); }), "[4611686018427387904,4]"));
  EXPECT_THROW(numel({big, 4}), UserError);
  EXPECT_TRUE(has(error_of([&] { numel({-3, 4}); }), "negative"));
  TensorType t{DType::f32, {big}};  // 2^62 elements fit; 2^64 bytes do not
  EXPECT_EQ(t.numel(), big);
  EXPECT_TRUE(has(error_of([&] { (void)t.nbytes(); }), "f32[4611686018427387904]"));
}

TEST(CheckedShapes, HugeArraysAreAnErrorNotACrash) {
  const int64_t big = int64_t{1} << 62;
  EXPECT_THROW(Array(DType::f32, {big}), UserError);
  EXPECT_THROW(Array::zeros(DType::f32, {big}), UserError);
  EXPECT_THROW(Array::zeros(DType::i32, {big, big}), UserError);
  // Fits in int64 but not in memory: a px::Error naming the array, not std::bad_alloc.
  std::string m = error_of([] { Array(DType::f32, {int64_t{1} << 60}); });
  EXPECT_TRUE(has(m, "f32[1152921504606846976]")) << m;
  Array a = Array::zeros(DType::f32, {4, 4});
  EXPECT_THROW(a.reshape({int64_t{1} << 62, 4}), UserError);
  EXPECT_THROW(a.reshape({-4, -4}), UserError);
}

TEST(CheckedShapes, TracedShapesAreChecked) {
  const int64_t big = int64_t{1} << 62;
  // A graph input with a negative dim, or one whose byte size overflows.
  std::string m = error_of([] {
    trace([](const std::vector<Tensor>& in) { return in; }, {{DType::f32, {-3, 4}}});
  });
  EXPECT_TRUE(has(m, "[trace] input 0") && has(m, "negative")) << m;
  EXPECT_THROW(trace([](const std::vector<Tensor>& in) { return in; }, {{DType::f32, {big}}}), UserError);
  // full() of 2^62 f32 elements: 2^64 bytes.
  m = error_of([&] {
    Graph g;
    TraceScope s(&g);
    full({big}, 1.0);
  });
  EXPECT_TRUE(has(m, "[full]") || has(m, "[broadcast")) << m;
  EXPECT_TRUE(has(m, "4611686018427387904")) << m;
  // A reshape whose wrapped count equals the input's (2^60 + 1) * 16 = 16 mod 2^64.
  m = error_of([&] {
    trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{reshape(in[0], {(int64_t{1} << 60) + 1, 16})}; },
          {{DType::f32, {16}}});
  });
  EXPECT_TRUE(has(m, "reshape")) << m;
  m = error_of([&] {
    trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{reshape(in[0], {int64_t{1} << 62, 8, -1})}; },
          {{DType::f32, {16}}});
  });
  EXPECT_TRUE(has(m, "reshape")) << m;
}

TEST(CheckedShapes, MeshSizesAreChecked) {
  const int64_t big = int64_t{1} << 32;
  std::string m = error_of([&] { Mesh::cpu({{"a", big}, {"b", big}}); });
  EXPECT_TRUE(has(m, "[mesh]") && has(m, "a: 4294967296")) << m;
  EXPECT_THROW(Mesh::cpu({{"a", 1 << 20}}), UserError);
  EXPECT_EQ(Mesh::cpu({{"a", 4}, {"b", 2}}).size(), 8);
}

TEST(Glob, OneSyntaxForMasksAndRules) {
  EXPECT_TRUE(glob_match("*.b", "blocks.0.attn.b"));
  EXPECT_TRUE(glob_match("blocks.?.w", "blocks.3.w"));
  EXPECT_FALSE(glob_match("blocks.?.w", "blocks.12.w"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("?", ""));
  EXPECT_TRUE(glob_match("a*b*c", "a_x_b_y_c"));
  EXPECT_FALSE(glob_match("a*b*c", "a_x_b_y_d"));
  // '*' in the text is an ordinary character; '*' in the pattern is always a wildcard.
  EXPECT_TRUE(glob_match("*x", "*yx"));
  // Optimizer masks follow the same rules: '?' is a wildcard there too.
  optim::ParamFilter f = optim::exclude_paths({"blocks.?.b"});
  EXPECT_FALSE(f("blocks.1.b", {DType::f32, {2}}));
  EXPECT_TRUE(f("blocks.11.b", {DType::f32, {2}}));
}

TEST(Env, BadDevicesBreakOnlyDeviceUse) {
  auto get = [](const char* name) -> const char* {
    if (std::string(name) == "PX_DEVICES") return "cpu:banana";
    if (std::string(name) == "PX_NUM_THREADS") return "2";
    return nullptr;
  };
  EnvConfig c = parse_env(get, /*cores=*/64);  // no throw: plain compiles need no devices
  EXPECT_EQ(c.num_threads, 2);
  EXPECT_TRUE(has(c.devices_error, "PX_DEVICES='cpu:banana'")) << c.devices_error;
  EXPECT_THROW(parse_env([](const char* n) -> const char* {
                 return std::string(n) == "PX_NUM_THREADS" ? "many" : nullptr;
               }),
               Error);
}

TEST(Registries, RegisterWhileOtherThreadsLookUp) {
  std::atomic<bool> stop{false};
  std::atomic<int> lookups{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r)
    readers.emplace_back([&] {
      while (!stop.load()) {
        if (get_primitive("add").name != "add") std::abort();
        if (!cpu::find_kernel(&get_primitive("dot_general"))) std::abort();
        (void)primitive_names();
        lookups.fetch_add(1);
      }
    });
  while (lookups.load() < 3) std::this_thread::yield();  // the readers are running
  for (int i = 0; i < 400; ++i) {
    Primitive p;
    p.name = "hardening_test_prim_" + std::to_string(i);
    p.infer = [](const std::vector<TensorType>& in, const Attrs&) { return in; };
    register_primitive(std::move(p));
    cpu::register_kernel(&get_primitive("hardening_test_prim_" + std::to_string(i)),
                         [](const cpu::KernelSpec&) -> cpu::Kernel { return [](const void* const*, void* const*) {}; });
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_GT(lookups.load(), 0);
  EXPECT_EQ(get_primitive("hardening_test_prim_399").name, "hardening_test_prim_399");
}

TEST(Sgemm, AFailingStatusIsAnInternalErrorNotAWrongResult) {
  std::atomic<int> err{0};
  std::vector<float> a(4, 1.0f), b(4, 1.0f), c(4, 0.0f);
  cpu::sgemm(err, 'N', 'N', 2, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
  EXPECT_NO_THROW(cpu::throw_if_sgemm_failed(err, "test"));
  EXPECT_EQ(c[0], 2.0f);
  // lda = 1 < k = 2 is invalid for a row-major, non-transposed A: oneDNN refuses it.
  cpu::sgemm(err, 'N', 'N', 2, 2, 2, 1.0f, a.data(), 1, b.data(), 2, 0.0f, c.data(), 2);
  std::string m = error_of([&] { cpu::throw_if_sgemm_failed(err, "dot_general"); });
  EXPECT_TRUE(has(m, "dot_general") && has(m, "dnnl_sgemm failed") && has(m, "bug")) << m;
  EXPECT_NO_THROW(cpu::throw_if_sgemm_failed(err, "test"));  // cleared
}

}  // namespace
}  // namespace px

namespace px {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(TensorLifetime, ATensorOfADestroyedGraphIsAnErrorNotGarbage) {
  Tensor t;
  {
    Graph g;
    t = g.input({DType::f32, {2, 3}});
    EXPECT_TRUE(t.alive());
    EXPECT_EQ(t.shape(), (Shape{2, 3}));
  }
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(t.alive());
  std::string m = testing::error_of([&] { (void)t.shape(); });
  EXPECT_TRUE(contains(m, "destroyed") && contains(m, "keep the graph")) << m;
  EXPECT_THROW((void)t.type(), UserError);
  // A moved-from graph's tensors point at the old object: also an error.
  Graph g;
  Tensor u = g.input({DType::f32, {4}});
  Graph h = std::move(g);
  EXPECT_THROW((void)u.shape(), UserError);
  EXPECT_EQ(h.type(0).shape, (Shape{4}));
}

TEST(TensorLifetime, ShapesStayValidWhileTheGraphGrows) {
  // shape() used to return a reference into the graph's value table, which every traced op can
  // reallocate (dropout read freed memory this way).
  Graph g;
  TraceScope scope(&g);
  Tensor x = g.input({DType::f32, {3, 5}});
  const Shape& s = x.shape();
  for (int i = 0; i < 200; ++i) x = x + 1.0f;
  EXPECT_EQ(s, (Shape{3, 5}));
}

TEST(EmptyDims, AttentionWithNoQueriesOrNoKeysRuns) {
  for (auto [sq, sk, d] : {std::tuple<int64_t, int64_t, int64_t>{0, 3, 4}, {2, 0, 4}, {2, 3, 0}, {0, 0, 0}}) {
    std::vector<Array> in = {testing::random_array({1, 2, sq, d}, DType::f32, 1),
                             testing::random_array({1, 2, sk, d}, DType::f32, 2),
                             testing::random_array({1, 2, sk, d}, DType::f32, 3)};
    auto fn = [](const std::vector<Tensor>& x) {
      Tensor o = dot_product_attention(x[0], x[1], x[2], {.causal = false});
      std::vector<Tensor> g = gradients(sum(o), {x[0], x[1], x[2]});
      return std::vector<Tensor>{o, g[0], g[1], g[2]};
    };
    std::vector<Array> out = testing::eval(fn, in);
    for (float v : out[0].to_f32()) EXPECT_EQ(v, 0.0f) << sq << " " << sk << " " << d;
    EXPECT_EQ(out[0].shape(), (Shape{1, 2, sq, d}));
  }
}

}  // namespace
}  // namespace px
