// optim primitives: adamw_update against a reference loop (f32, bf16 and f16 params and grads,
// with and without weight decay, empty and size-1 shapes, a size large enough to run on several
// threads), bit for bit against the elementwise ops it replaces, written over its own operands,
// and bad input.
#include <cmath>

#include "ir/primitive.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::eval;
using testing::random_array;
using testing::throws_error;

constexpr double kB1 = 0.9, kB2 = 0.95, kEps = 1e-6;

Attrs adam_attrs(bool decay) { return {{"beta1", kB1}, {"beta2", kB2}, {"eps", kEps}, {"decay", int64_t{decay}}}; }

// p, g, m, v, then the scalars step_size, inv_sqrt_bc2 and (decay) lr * weight_decay.
std::vector<Array> adam_inputs(const Shape& s, DType pt, DType gt, bool decay) {
  std::vector<Array> in{random_array(s, pt, 1),
                        random_array(s, gt, 2),
                        random_array(s, DType::f32, 3, -0.1f, 0.1f),
                        random_array(s, DType::f32, 4, 0.0f, 0.05f),
                        Array::from_f32({0.03f}, {}),
                        Array::from_f32({1.7f}, {})};
  if (decay) in.push_back(Array::from_f32({0.002f}, {}));
  return in;
}

TracedFn adam_fn(bool decay) {
  return [decay](const std::vector<Tensor>& x) { return emit("adamw_update", x, adam_attrs(decay)); };
}

TEST(AdamwUpdate, MatchesReferenceForEveryDtypeAndShape) {
  const std::vector<Shape> shapes = {{7, 13}, {5}, {1}, {0, 5}, {3, 4, 5}, {40000}};
  for (const Shape& s : shapes)
    for (DType pt : {DType::f32, DType::bf16, DType::f16})
      for (DType gt : {DType::f32, DType::bf16})
        for (bool decay : {false, true}) {
          std::vector<Array> in = adam_inputs(s, pt, gt, decay);
          std::vector<Array> out = eval(adam_fn(decay), in);
          ASSERT_EQ(out.size(), 3u);
          EXPECT_EQ(out[0].type(), in[0].type());
          EXPECT_EQ(out[1].type(), (TensorType{DType::f32, s}));
          EXPECT_EQ(out[2].type(), (TensorType{DType::f32, s}));
          std::vector<float> p = in[0].to_f32(), g = in[1].to_f32(), m = in[2].to_f32(), v = in[3].to_f32();
          const double step = 0.03, isb = 1.7, wd = decay ? 0.002 : 0.0;
          std::vector<float> rp(p.size()), rm(p.size()), rv(p.size());
          for (size_t i = 0; i < p.size(); ++i) {
            double mi = m[i] * kB1 + g[i] * (1 - kB1), vi = v[i] * kB2 + double(g[i]) * g[i] * (1 - kB2);
            rm[i] = static_cast<float>(mi);
            rv[i] = static_cast<float>(vi);
            rp[i] = static_cast<float>(p[i] - mi * step / (std::sqrt(vi) * isb + kEps) - p[i] * wd);
          }
          const double tol = pt == DType::f32 ? 1e-6 : pt == DType::bf16 ? 1e-2 : 2e-3;
          std::string what = type_str(in[0].type()) + " g " + dtype_name(gt) + (decay ? " decay" : "");
          EXPECT_TRUE(all_close(out[0].to_f32(), rp, tol, tol)) << what;
          EXPECT_TRUE(all_close(out[1].to_f32(), rm, 1e-7, 1e-6)) << what;
          EXPECT_TRUE(all_close(out[2].to_f32(), rv, 1e-7, 1e-6)) << what;
        }
}

// Its decomposition is the elementwise chain px::optim::adamw emitted before the primitive (the
// offload pass splits an update with it): the primitive rounds exactly as that chain did, so
// training runs are unchanged to the bit.
TEST(AdamwUpdate, EqualsItsElementwiseDecompositionBitForBit) {
  const Primitive& prim = get_primitive("adamw_update");
  ASSERT_TRUE(prim.decompose);
  for (DType pt : {DType::f32, DType::bf16})
    for (bool decay : {false, true}) {
      std::vector<Array> in = adam_inputs({513, 67}, pt, DType::f32, decay);
      std::vector<Array> fused = eval(adam_fn(decay), in);
      std::vector<Array> chain =
          eval([&](const std::vector<Tensor>& x) { return prim.decompose(x, adam_attrs(decay)); }, in);
      for (int k = 0; k < 3; ++k) {
        EXPECT_EQ(fused[k].type(), chain[k].type());
        std::vector<float> a = fused[k].to_f32(), b = chain[k].to_f32();
        ASSERT_EQ(a.size(), b.size());
        size_t diff = 0;
        for (size_t i = 0; i < a.size(); ++i) diff += a[i] != b[i];
        EXPECT_EQ(diff, 0u) << "result " << k << " " << dtype_name(pt) << (decay ? " with decay" : "");
      }
    }
}

// p', m' and v' written over p, m and v (an update in place) equal the update into new arrays.
TEST(AdamwUpdate, WritesOverItsOwnOperands) {
  std::vector<Array> in = adam_inputs({40000}, DType::f32, DType::f32, true);
  auto g = trace(adam_fn(true), testing::types_of(in));
  auto exe = Executable::compile(*g);
  std::vector<Array> fresh = exe->run(in);
  std::vector<Array> same{in[0], in[2], in[3]};
  exe->run_into(in, same);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(same[k].to_f32(), fresh[k].to_f32()) << "result " << k;
}

// A bf16 gradient widened for the update (what a bf16 step's weight gradient is) is read as bf16:
// the compiled update takes the 16-bit value, no f32 copy of it is kept, and every bit of the
// results equals the program compiled without the pass (optimize off). The widening cast stays
// where something else reads it (here a sum of squares, as gradient clipping takes).
TEST(AdamwUpdate, ReadsANarrowGradientWithoutItsF32Copy) {
  std::vector<Array> in = adam_inputs({64, 33}, DType::f32, DType::bf16, true);
  for (bool also_squared : {false, true}) {
    auto exe = testing::compile_keeping_bits(
        [also_squared](const std::vector<Tensor>& x) {
          std::vector<Tensor> ops = x;
          ops[1] = cast(x[1], DType::f32);
          std::vector<Tensor> r = emit("adamw_update", ops, adam_attrs(true));
          if (also_squared) r.push_back(sum(ops[1] * ops[1]));
          return r;
        },
        in);
    const Graph& cg = exe->graph();
    int updates = 0, f32_copies = 0;
    for (const Node& n : cg.nodes()) {
      if (n.prim->name == "adamw_update") {
        ++updates;
        EXPECT_EQ(cg.type(n.inputs[1]).dtype, DType::bf16) << cg.to_string();
      }
      if (n.prim->name == "cast" && cg.type(n.outputs[0]).dtype == DType::f32) ++f32_copies;
    }
    EXPECT_EQ(updates, 1);
    EXPECT_EQ(f32_copies, also_squared ? 1 : 0) << cg.to_string();
  }
}

TEST(AdamwUpdate, BadInputIsNamed) {
  const TensorType w{DType::f32, {2, 3}}, s{DType::f32, {}};
  auto fn = [](bool decay) { return adam_fn(decay); };
  EXPECT_TRUE(throws_error(fn(false), {w, w, w, w, s}, {"[adamw_update]", "expects 6 operands", "got 5"}));
  EXPECT_TRUE(throws_error(fn(true), {w, w, w, w, s, s}, {"[adamw_update]", "expects 7 operands", "decay"}));
  EXPECT_TRUE(
      throws_error(fn(false), {w, {DType::f32, {3, 2}}, w, w, s, s}, {"[adamw_update]", "g has type f32[3,2]"}));
  EXPECT_TRUE(
      throws_error(fn(false), {w, w, {DType::bf16, {2, 3}}, w, s, s}, {"[adamw_update]", "m has type bf16[2,3]"}));
  EXPECT_TRUE(throws_error(fn(false), {w, w, w, w, {DType::f32, {1}}, s}, {"[adamw_update]", "operand 4", "f32[1]"}));
  EXPECT_TRUE(throws_error(fn(false), {{DType::i32, {2, 3}}, w, w, w, s, s}, {"[adamw_update]", "must be float"}));
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>& x) {
        return emit("adamw_update", x, {{"beta1", 1.0}, {"beta2", kB2}, {"eps", kEps}, {"decay", int64_t{0}}});
      },
      {w, w, w, w, s, s}, {"[adamw_update]", "beta1 must be in [0, 1)"}));
}

}  // namespace
}  // namespace px
