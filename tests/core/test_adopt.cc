// Array::adopt: an Array over memory another library allocated, without a copy. The owner lives
// as long as any Array shares the buffer; memory_stats neither counts nor frees the memory; an
// adopted array is a program input like any other, its buffer is never written unless donated
// explicitly, and a read-only one is never written at all.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "../sharding/recipe_check.h"
#include "parallax/graph.h"
#include "parallax/nn.h"
#include "parallax/ops.h"
#include "parallax/parallel.h"
#include "parallax/runtime.h"
#include "parallax/spmd.h"
#include "parallax/train.h"
#include "testing.h"

namespace px {
namespace {

// Foreign memory: a vector, and a flag that turns true when its owner is released.
struct Foreign {
  std::shared_ptr<std::vector<float>> values;
  std::shared_ptr<bool> released = std::make_shared<bool>(false);
  explicit Foreign(std::vector<float> v) : values(std::make_shared<std::vector<float>>(std::move(v))) {}
  // The owner handed to adopt: keeps `values` alive and marks the release.
  std::shared_ptr<void> owner() const {
    auto released_flag = released;
    auto keep = values;
    return std::shared_ptr<void>(values.get(), [released_flag, keep](void*) { *released_flag = true; });
  }
  Array adopt(const Shape& shape, bool read_only = false) const {
    return Array::adopt(values->data(), {DType::f32, shape}, owner(), read_only);
  }
};

TEST(Adopt, ViewsTheMemoryWithoutACopyAndReleasesTheOwnerWithTheLastArray) {
  Foreign f({1, 2, 3, 4, 5, 6});
  {
    Array a = f.adopt({2, 3});
    EXPECT_EQ(a.raw(), f.values->data());
    EXPECT_EQ(a.to_f32(), *f.values);
    EXPECT_TRUE(a.adopted());
    EXPECT_FALSE(a.read_only());
    (*f.values)[0] = 10;  // the same memory: a write on either side shows on the other
    EXPECT_EQ(a.to_f32()[0], 10.0f);
    Array b = a.reshape({3, 2});  // a view shares the buffer and the owner
    EXPECT_TRUE(b.adopted());
    a = Array();
    EXPECT_FALSE(*f.released) << "b still shares the buffer";
    EXPECT_EQ(b.to_f32()[0], 10.0f);
  }
  EXPECT_TRUE(*f.released);
  // A copy of its own is not adopted.
  Foreign g({1, 2});
  Array c = g.adopt({2}).clone();
  EXPECT_FALSE(c.adopted());
  EXPECT_NE(c.raw(), g.values->data());
  EXPECT_TRUE(*g.released);
}

TEST(Adopt, IsNotCountedOrFreedByTheMemoryStats) {
  const Placement host{};
  const MemoryStats before = memory_stats(host);
  Foreign f(std::vector<float>(1 << 16, 1.0f));
  {
    Array a = f.adopt({1 << 16});
    EXPECT_EQ(memory_stats(host).bytes_in_use, before.bytes_in_use);
    EXPECT_EQ(memory_stats(host).allocations, before.allocations);
  }
  // Released without free_bytes: the count did not drop below where it was.
  EXPECT_TRUE(*f.released);
  EXPECT_EQ(memory_stats(host).bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(f.values->size(), size_t{1} << 16);  // and the memory is still the vector's
}

TEST(Adopt, MisalignedOrNullMemoryIsAUserErrorAndEmptyShapesNeedNoMemory) {
  std::vector<float> v(8);
  void* odd = reinterpret_cast<char*>(v.data()) + 1;
  EXPECT_FALSE(Array::adoptable(odd, DType::f32));
  EXPECT_TRUE(Array::adoptable(odd, DType::boolean));  // one-byte elements: any address
  std::string err = px::testing::error_of([&] { Array::adopt(odd, {DType::f32, {4}}, nullptr); });
  EXPECT_NE(err.find("not aligned to 4 bytes"), std::string::npos) << err;
  EXPECT_THROW(Array::adopt(odd, {DType::f32, {4}}, nullptr), UserError);
  EXPECT_THROW(Array::adopt(nullptr, {DType::f32, {4}}, nullptr), UserError);
  EXPECT_THROW(Array::adopt(v.data(), {DType::f32, {-1}}, nullptr), UserError);
  EXPECT_EQ(Array::adopt(nullptr, {DType::f32, {0, 3}}, nullptr).shape(), (Shape{0, 3}));
}

TEST(Adopt, IsAProgramInputAndNeverTheOutputBufferUnlessDonated) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0 + 1.0}; },
                 {{DType::f32, {2, 3}}});
  auto exe = Executable::compile(*g);
  Foreign f({0, 1, 2, 3, 4, 5});
  Array a = f.adopt({2, 3});
  std::vector<Array> out = exe->run({a});
  EXPECT_EQ(out[0].to_f32(), (std::vector<float>{1, 3, 5, 7, 9, 11}));
  EXPECT_EQ(a.to_f32(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  // Nobody else in Parallax holds `a`, but its library does: it is not the sole owner.
  EXPECT_FALSE(a.sole_owner());
  // A read-only array cannot be an output.
  Array ro = f.adopt({2, 3}, /*read_only=*/true);
  std::vector<Array> outs{ro};
  std::string err = px::testing::error_of([&] { exe->run_into({a}, outs); });
  EXPECT_NE(err.find("read-only"), std::string::npos) << err;
  EXPECT_EQ(ro.to_f32(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

TEST(Adopt, AnExecutorReusesACallersOutputArrayOnlyWhenParallaxAloneHoldsIt) {
  const TensorType t{DType::f32, {4, 8}};
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] - 0.5 * in[1]}; }, {t, t});
  auto exe = ShardedExecutable::compile(*g, Mesh::cpu({{"data", 1}}), {PartitionSpec{}, PartitionSpec{}});
  auto sharded = [&](const Array& a, const Sharding& s) { return ShardedArray(t, s, {a}); };
  const std::vector<ShardedArray> in{
      sharded(Array::from_f32(std::vector<float>(32, 1.0f), t.shape), exe->in_sharding(0)),
      sharded(Array::from_f32(std::vector<float>(32, 2.0f), t.shape), exe->in_sharding(1))};
  // An array of Parallax's own that the caller alone holds takes the result in place.
  std::vector<ShardedArray> out{sharded(Array::zeros(DType::f32, t.shape), exe->out_sharding(0))};
  const void* own = out[0].shards()[0].raw();
  exe->run_into(in, out);
  EXPECT_EQ(out[0].shards()[0].raw(), own);
  EXPECT_EQ(out[0].shards()[0].to_f32()[0], 0.0f);
  // An adopted one, held by nothing else in Parallax either, does not: its library holds the memory.
  Foreign f(std::vector<float>(32, 7.0f));
  out = {sharded(f.adopt(t.shape), exe->out_sharding(0))};
  exe->run_into(in, out);
  EXPECT_NE(out[0].shards()[0].raw(), f.values->data());
  EXPECT_EQ(out[0].shards()[0].to_f32()[0], 0.0f);
  EXPECT_EQ(*f.values, std::vector<float>(32, 7.0f));
}

TEST(Adopt, ExplicitDonationWritesIntoAWritableArrayAndRejectsAReadOnlyOne) {
  const TensorType t{DType::f32, {4, 8}};
  auto fn = [](const std::vector<Tensor>& params, const std::vector<Tensor>& args) {
    return std::vector<Tensor>{params[0] - 0.5 * args[0]};
  };
  ForwardOptions d;
  d.donate = {0};
  ShardedFunction donating(fn, {t}, {"w"}, {t}, d);
  std::vector<Array> g{Array::from_f32(std::vector<float>(32, 2.0f), t.shape)};
  Foreign f(std::vector<float>(32, 1.0f));
  // Writable: donated means given away, so the result is written into the foreign memory.
  std::vector<Array> w{f.adopt(t.shape)};
  std::vector<Array> out = donating(w, g);
  EXPECT_EQ(out[0].raw(), f.values->data());
  EXPECT_EQ((*f.values)[0], 0.0f);
  EXPECT_FALSE(w[0].defined());
  // Read-only: a UserError naming the argument, and the memory is untouched.
  Foreign r(std::vector<float>(32, 1.0f));
  std::vector<Array> ro{r.adopt(t.shape, /*read_only=*/true)};
  EXPECT_TRUE(ro[0].read_only());
  std::string err = px::testing::error_of([&] { donating(ro, g); });
  EXPECT_NE(err.find("argument 0 ('w')"), std::string::npos) << err;
  EXPECT_NE(err.find("read-only"), std::string::npos) << err;
  EXPECT_THROW(donating(ro, g), UserError);
  EXPECT_EQ((*r.values)[0], 1.0f);
  // Executable::run with a read-only donor writes the result into an array of its own.
  auto gr = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + 1.0}; }, {{DType::f32, {2}}});
  CompileOptions c;
  c.output_donors = {0};
  auto exe = Executable::compile(*gr, c);
  Foreign s({1, 2});
  Array in = s.adopt({2}, /*read_only=*/true);
  out = exe->run({in});
  EXPECT_NE(out[0].raw(), s.values->data());
  EXPECT_EQ(out[0].to_f32(), (std::vector<float>{2, 3}));
  EXPECT_EQ(*s.values, (std::vector<float>{1, 2}));
}

TEST(Adopt, ATrainStepFromAdoptedParamsTrainsLikeOneFromItsOwnAndLeavesThemUntouched) {
  recipe_check::Fixture fx(recipe_check::gpt_micro());
  TrainStep step(fx.model.store(), optim::adamw({.lr = 1e-3}), fx.loss, fx.batch_types);
  const std::vector<Array> own = step.gather_params(step.init(0));
  // The same values in foreign memory: vectors, adopted read-only.
  std::vector<Foreign> foreign;
  std::vector<Array> adopted;
  foreign.reserve(own.size());
  for (const Array& p : own) {
    foreign.emplace_back(p.to_f32());
    adopted.push_back(foreign.back().adopt(p.shape(), /*read_only=*/true));
  }
  TrainState a = step.init(own), b = step.init(adopted);
  adopted.clear();  // init placed copies in the state
  for (int i = 0; i < 2; ++i) {
    StepMetrics ma = step(a, fx.batch(i)), mb = step(b, fx.batch(i));
    EXPECT_EQ(ma.loss, mb.loss) << "step " << i;
  }
  const std::vector<Array> pa = step.gather_params(a), pb = step.gather_params(b);
  for (size_t k = 0; k < own.size(); ++k) {
    EXPECT_EQ(pa[k].to_f32(), pb[k].to_f32()) << k;
    EXPECT_EQ(*foreign[k].values, own[k].to_f32()) << "param " << k << " was written";
  }
  // The step let go of the adopted params (its state holds its own arrays now).
  for (const Foreign& f : foreign) EXPECT_TRUE(*f.released);
}

}  // namespace
}  // namespace px
