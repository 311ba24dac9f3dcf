// Sharding never changes the result beyond floating-point reduction order: small programs run
// sharded on many meshes give what the unsharded run gives.
#include <gtest/gtest.h>

#include <cmath>

#include "parallax/spmd.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::random_array;

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

std::vector<Mesh> meshes() {
  return {Mesh::cpu({{"data", 1}}),
          Mesh::cpu({{"data", 8}}),
          Mesh::cpu({{"data", 4}, {"model", 2}}),
          Mesh::cpu({{"data", 2}, {"model", 4}}),
          Mesh::cpu({{"model", 8}}),
          Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}})};
}

// The batch goes over every axis but 'model'; hidden dims over 'model'.
PartitionSpec::Dim batch_axes(const Mesh& m) {
  std::vector<std::string> a;
  for (auto& ax : m.axes())
    if (ax.name != "model") a.push_back(ax.name);
  return PartitionSpec::Dim(a);
}
PartitionSpec::Dim model_axis(const Mesh& m) {
  return m.axis_index("model") >= 0 ? PartitionSpec::Dim("model") : PartitionSpec::Dim();
}

// Runs fn unsharded and sharded and compares every output.
void expect_same(const TracedFn& fn, const std::vector<Array>& inputs, const Mesh& mesh,
                 const std::vector<PartitionSpec>& specs, double tol = 1e-5, const PartitionOptions& opt = {},
                 DeviceParallelism par = DeviceParallelism::automatic) {
  auto g = trace(fn, testing::types_of(inputs));
  std::vector<Array> want = Executable::compile(*g)->run(inputs);
  auto exe = ShardedExecutable::compile(*g, mesh, specs, opt, {}, par);
  std::vector<Array> got = exe->run_full(inputs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < want.size(); ++o) {
    ASSERT_EQ(got[o].type(), want[o].type()) << "output " << o;
    EXPECT_TRUE(all_close(got[o].to_f32(), want[o].to_f32(), tol, tol))
        << "output " << o << " on " << mesh.to_string() << "\n"
        << exe->program().summary();
  }
}

TEST(SpmdEquivalence, MatmulChain) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{matmul(matmul(matmul(in[0], in[1]), in[2]), in[3])};
  };
  std::vector<Array> x = {random_array({16, 24}, DType::f32, 1), random_array({24, 32}, DType::f32, 2),
                          random_array({32, 16}, DType::f32, 3), random_array({16, 8}, DType::f32, 4)};
  for (const Mesh& m : meshes()) {
    auto b = batch_axes(m), h = model_axis(m);
    expect_same(f, x, m, {{b}, {none, h}, {h}, {}});
    expect_same(f, x, m, {{none, h}, {h}, {none, b}, {b}});  // contracting dims split
  }
}

TracedFn mlp_step = [](const std::vector<Tensor>& in) {
  const Tensor &x = in[0], &y = in[1], &w1 = in[2], &b1 = in[3], &w2 = in[4];
  Tensor h = gelu(matmul(x, w1) + b1);
  Tensor loss = mean(square(matmul(h, w2) - y));
  std::vector<Tensor> d = gradients(loss, {w1, b1, w2});
  return std::vector<Tensor>{loss, d[0], d[1], d[2]};
};

std::vector<Array> mlp_inputs() {
  return {random_array({16, 8}, DType::f32, 5), random_array({16, 8}, DType::f32, 6),
          random_array({8, 32}, DType::f32, 7), random_array({32}, DType::f32, 8),
          random_array({32, 8}, DType::f32, 9)};
}

TEST(SpmdEquivalence, MlpForwardAndBackward) {
  for (const Mesh& m : meshes()) {
    auto b = batch_axes(m), h = model_axis(m);
    // Data parallel, tensor parallel (Megatron) and both at once.
    expect_same(mlp_step, mlp_inputs(), m, {{b}, {b}, {}, {}, {}});
    expect_same(mlp_step, mlp_inputs(), m, {{}, {}, {none, h}, {h}, {h}});
    expect_same(mlp_step, mlp_inputs(), m, {{b}, {b}, {none, h}, {h}, {h}});
    // Both ways of sharing the cores between devices.
    for (auto par : {DeviceParallelism::over_devices, DeviceParallelism::within_kernels})
      expect_same(mlp_step, mlp_inputs(), m, {{b}, {b}, {none, h}, {h}, {h}}, 1e-5, {}, par);
  }
}

TEST(SpmdEquivalence, FsdpStyleShardedParamsAndGradients) {
  // Params stored split over the batch axes, gathered where used; gradients come back split.
  for (const Mesh& m : meshes()) {
    auto b = batch_axes(m);
    PartitionOptions opt;
    opt.out_shardings = {std::nullopt, Sharding(m, {b}), Sharding(m, {b}), Sharding(m, {b})};
    expect_same(mlp_step, mlp_inputs(), m, {{b}, {b}, {b}, {b}, {b}}, 1e-5, opt);
  }
}

TEST(SpmdEquivalence, SoftmaxAndReductions) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    const Tensor& x = in[0];
    return std::vector<Tensor>{softmax(x, -1), log_softmax(x, 0), sum(x, {0, 1}),
                               max(x, {1}),    mean(x, {0}),      layer_norm(x, in[1], in[2])};
  };
  std::vector<Array> x = {random_array({16, 24}, DType::f32, 10), random_array({24}, DType::f32, 11),
                          random_array({24}, DType::f32, 12)};
  for (const Mesh& m : meshes()) {
    auto b = batch_axes(m), h = model_axis(m);
    expect_same(f, x, m, {{b, h}, {h}, {}});
    expect_same(f, x, m, {{h, b}, {}, {h}});
  }
}

TEST(SpmdEquivalence, CrossEntropyWithIntegerLabels) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor logits = matmul(in[0], in[1]);
    Tensor loss = cross_entropy_loss(logits, in[2]);
    return std::vector<Tensor>{loss, gradients(loss, {in[1]})[0]};
  };
  Array labels = Array::from_i32({0, 3, 5, 7, 1, 2, -100, 4, 6, 7, 0, 1, 2, 3, 4, 5}, {16});
  std::vector<Array> x = {random_array({16, 8}, DType::f32, 13), random_array({8, 8}, DType::f32, 14), labels};
  for (const Mesh& m : meshes()) {
    auto b = batch_axes(m), h = model_axis(m);
    expect_same(f, x, m, {{b}, {}, {b}});
    expect_same(f, x, m, {{b}, {none, h}, {b}});  // vocab split over 'model'
  }
}

TEST(SpmdEquivalence, VocabParallelLookupAndItsGradient) {
  // Out-of-range indices clamp to the first / last row in both runs.
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor e = take(in[0], in[1]);
    Tensor loss = sum(square(e) * in[2]);
    return std::vector<Tensor>{e, gradients(loss, {in[0]})[0]};
  };
  Array idx = Array::from_i32({0, 3, 15, 7, -3, 40, 8, 8, 1, 2, 9, 14, 5, 6, 11, 12}, {8, 2});
  std::vector<Array> x = {random_array({16, 8}, DType::f32, 16), idx, random_array({8, 2, 8}, DType::f32, 17)};
  for (const Mesh& m : meshes()) {
    auto b = batch_axes(m), h = model_axis(m);
    expect_same(f, x, m, {{h}, {b}, {b}});
    expect_same(f, x, m, {{h, b}, {}, {}});
  }
}

TEST(SpmdEquivalence, CrossEntropyOverSplitClasses) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor loss = cross_entropy_loss(in[0], in[1]);
    return std::vector<Tensor>{loss, softmax_cross_entropy(in[0], in[1]), gradients(loss, {in[0]})[0]};
  };
  Array labels = Array::from_i32({0, 3, 5, 7, 1, 2, -100, 4, 6, 7, 0, 1, 2, 3, 4, 5}, {16});
  for (DType dt : {DType::f32, DType::bf16}) {
    std::vector<Array> x = {random_array({16, 8}, dt, 18), labels};
    for (const Mesh& m : meshes()) {
      auto b = batch_axes(m), h = model_axis(m);
      expect_same(f, x, m, {{b, h}, {b}}, dt == DType::f32 ? 1e-5 : 1e-2);
      expect_same(f, x, m, {{none, h}, {}}, dt == DType::f32 ? 1e-5 : 1e-2);
    }
  }
}

TEST(SpmdEquivalence, OutOfRangeLabelsGiveNaNInTheSameRows) {
  TracedFn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{softmax_cross_entropy(in[0], in[1])}; };
  std::vector<Array> x = {random_array({4, 8}, DType::f32, 19), Array::from_i32({1, 8, -1, 3}, {4})};
  auto g = trace(f, testing::types_of(x));
  std::vector<float> want = Executable::compile(*g)->run(x)[0].to_f32();
  Mesh m = Mesh::cpu({{"model", 4}});
  std::vector<float> got = ShardedExecutable::compile(*g, m, {{none, "model"}, {}})->run_full(x)[0].to_f32();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(std::isnan(got[i]), std::isnan(want[i])) << "row " << i;
    if (!std::isnan(want[i])) EXPECT_NEAR(got[i], want[i], 1e-5) << "row " << i;
  }
  EXPECT_TRUE(std::isnan(want[1]) && std::isnan(want[2]));
}

TEST(SpmdEquivalence, IotaAndRandomValuesDoNotDependOnSharding) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor pos = cast(iota({16, 8}, 0, DType::i32), DType::f32);
    Tensor noise = random_uniform(random_key(7), {16, 8});
    return std::vector<Tensor>{in[0] + pos, dropout(random_key(3), in[0], 0.5), in[0] * noise};
  };
  std::vector<Array> x = {random_array({16, 8}, DType::f32, 15)};
  for (const Mesh& m : meshes()) {
    auto b = batch_axes(m), h = model_axis(m);
    expect_same(f, x, m, {{b, h}}, 0.0);
  }
}

TEST(SpmdEquivalence, RunsAreBitwiseDeterministic) {
  Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
  auto g = trace(mlp_step, testing::types_of(mlp_inputs()));
  auto exe = ShardedExecutable::compile(*g, m, {{"data"}, {"data"}, {none, "model"}, {"model"}, {"model"}});
  auto a = exe->run_full(mlp_inputs());
  auto b = exe->run_full(mlp_inputs());
  for (size_t o = 0; o < a.size(); ++o) EXPECT_EQ(a[o].to_f32(), b[o].to_f32());
}

TEST(SpmdEquivalence, DataParallelStepMovesExactlyTheGradientBytes) {
  Mesh m = Mesh::cpu({{"data", 8}});
  auto g = trace(mlp_step, testing::types_of(mlp_inputs()));
  auto exe = ShardedExecutable::compile(*g, m, {{"data"}, {"data"}, {}, {}, {}});
  exe->run_full(mlp_inputs());
  // Gradients of w1 [8,32], b1 [32], w2 [32,8] plus the scalar loss, all-reduced once each.
  const int64_t grad_bytes = (8 * 32 + 32 + 32 * 8) * 4 + 4;
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(exe->stats().at(p, CollectiveKind::all_reduce).payload_bytes, grad_bytes) << exe->program().summary();
    EXPECT_EQ(exe->stats().at(p, CollectiveKind::all_reduce).wire_bytes, grad_bytes * 2 * 7 / 8);
  }
  EXPECT_EQ(exe->stats().total(CollectiveKind::all_gather).calls, 0);
}

TEST(SpmdEquivalence, ShardedArraysInAndOut) {
  Mesh m = Mesh::cpu({{"data", 2}, {"model", 2}});
  TracedFn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{tanh(matmul(in[0], in[1]))}; };
  auto g = trace(f, {f32({4, 6}), f32({6, 8})});
  auto exe = ShardedExecutable::compile(*g, m, {{"data"}, {none, "model"}});
  Array x = random_array({4, 6}, DType::f32, 1), w = random_array({6, 8}, DType::f32, 2);
  auto out = exe->run({shard(x, exe->in_sharding(0)), shard(w, exe->in_sharding(1))});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].sharding().to_string(), "P('data', 'model')");
  EXPECT_EQ(out[0].shard(3).shape(), (Shape{2, 4}));
  EXPECT_TRUE(all_close(gather(out[0]).to_f32(), Executable::compile(*g)->run({x, w})[0].to_f32()));
  // An input with another sharding is refused with the fix in the message.
  try {
    exe->run({shard(x, Sharding(m, {})), shard(w, exe->in_sharding(1))});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("input 0 is sharded as P()"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace px
