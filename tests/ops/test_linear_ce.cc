// linear_cross_entropy (the fused LM head and loss): the loss and its gradients equal the unfused
// ops (dot_general, then softmax_cross_entropy) within f32 rounding, in f32 and with bf16 operands,
// for both weight layouts and sizes that span several row and vocabulary blocks; ignored and
// out-of-range labels; shape errors; and a mesh with the rows split and the weight split over its
// vocabulary gives the unsplit values.
#include <cmath>
#include <limits>

#include "parallax/spmd.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::eval;
using testing::random_array;
using testing::throws_error;

// The logits of the unfused head: h [..., D] against w [V, D] (vocab_axis 0) or [D, V] (1), f32.
Tensor unfused_logits(const Tensor& h, const Tensor& w, int vocab_axis) {
  return dot_general(h, w, {{h.rank() - 1}, {1 - vocab_axis}, {}, {}}, DType::f32);
}

// Random labels in [0, v) with every 7th row ignored (-100).
Array labels_for(int64_t rows, int64_t v, uint32_t seed) {
  Array a = random_array({rows}, DType::i32, seed, 0.0f, static_cast<float>(v));
  std::vector<float> l = a.to_f32();
  for (int64_t r = 0; r < rows; r += 7) l[r] = -100;
  return Array::from_f32(l, {rows}, DType::i32);
}

// The scale of an output, for tolerances relative to it.
double scale_of(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, static_cast<double>(std::fabs(v)));
  return std::max(m, 1e-30);
}

// [loss, per-row losses, dh, dw] of the mean weighted loss, fused or not; h and w are cast to `dt`.
TracedFn head_loss(bool fused, int vocab_axis, DType dt) {
  return [=](const std::vector<Tensor>& in) {
    Tensor h = cast(in[0], dt), w = cast(in[1], dt);
    Tensor rows = fused ? linear_cross_entropy(h, w, in[2], vocab_axis)
                        : softmax_cross_entropy(unfused_logits(h, w, vocab_axis), in[2]);
    Tensor loss = fused ? linear_cross_entropy_loss(h, w, in[2], vocab_axis, in[3])
                        : cross_entropy_loss(unfused_logits(h, w, vocab_axis), in[2], in[3]);
    std::vector<Tensor> g = gradients(loss, {in[0], in[1]});
    return std::vector<Tensor>{loss, rows, g[0], g[1]};
  };
}

// 300 rows and 5000 classes: two row blocks and three vocabulary blocks, the last ones partial.
TEST(LinearCrossEntropy, EqualsTheUnfusedHeadAndLossInF32AndBf16) {
  const int64_t rows = 300, d = 33, v = 5000;
  for (int vocab_axis : {0, 1})
    for (DType dt : {DType::f32, DType::bf16}) {
      const Shape ws = vocab_axis == 0 ? Shape{v, d} : Shape{d, v};
      std::vector<Array> x = {random_array({rows, d}, DType::f32, 1, -2, 2), random_array(ws, DType::f32, 2, -1, 1),
                              labels_for(rows, v, 3), random_array({rows}, DType::f32, 4, 0, 2)};
      std::vector<Array> got = eval(head_loss(true, vocab_axis, dt), x);
      std::vector<Array> want = eval(head_loss(false, vocab_axis, dt), x);
      const std::string what = std::string(dtype_name(dt)) + " vocab_axis " + std::to_string(vocab_axis);
      // The losses are f32 from f32 logits of the same operands: f32 rounding, either dtype. The
      // gradients are rounded to the operands' dtype once (bf16: within 2 ulps of its scale).
      for (int o = 0; o < 4; ++o) {
        std::vector<float> g = got[o].to_f32(), w = want[o].to_f32();
        const double tol = o < 2 || dt == DType::f32 ? 2e-5 : 1e-2;
        EXPECT_TRUE(all_close(g, w, tol * scale_of(w), tol)) << what << " output " << o;
      }
      const std::vector<float> per_row = got[1].to_f32();
      EXPECT_EQ(per_row[0], 0.0f) << "an ignored row's loss is 0";
      EXPECT_GT(per_row[1], 1.0f) << "a real row's loss is about log(v)";
    }
}

TEST(LinearCrossEntropy, OutOfRangeLabelsGiveNaNAndIgnoredRowsNoGradient) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor rows = linear_cross_entropy(in[0], in[1], in[2], 0);
    std::vector<Tensor> g = gradients(sum(rows * in[3]), {in[0]});
    return std::vector<Tensor>{rows, g[0]};
  };
  std::vector<Array> x = {random_array({4, 3}), random_array({5, 3}, DType::f32, 2),
                          Array::from_i32({1, 5, -100, -1}, {4}), random_array({4}, DType::f32, 3, 1, 2)};
  std::vector<Array> r = eval(f, x);
  std::vector<float> loss = r[0].to_f32(), dh = r[1].to_f32();
  EXPECT_FALSE(std::isnan(loss[0]));
  EXPECT_TRUE(std::isnan(loss[1]) && std::isnan(loss[3]));
  EXPECT_EQ(loss[2], 0.0f);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(dh[2 * 3 + k], 0.0f) << "ignored row";
    EXPECT_TRUE(std::isnan(dh[1 * 3 + k])) << "bad label";
    EXPECT_NE(dh[k], 0.0f);
  }
}

TEST(LinearCrossEntropy, ShapeErrorsNameTheProblem) {
  auto op = [](int vocab_axis) {
    return [vocab_axis](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{linear_cross_entropy(in[0], in[1], in[2], vocab_axis)};
    };
  };
  const TensorType h{DType::f32, {4, 8}}, lab{DType::i32, {4}};
  EXPECT_TRUE(
      throws_error(op(0), {h, {DType::f32, {8, 10}}, lab}, {"[linear_cross_entropy]", "is vocab_axis 0 right?"}));
  EXPECT_TRUE(throws_error(op(2), {h, {DType::f32, {10, 8}}, lab}, {"vocab_axis must be 0", "or 1"}));
  EXPECT_TRUE(throws_error(op(0), {h, {DType::bf16, {10, 8}}, lab}, {"must have one dtype; cast"}));
  EXPECT_TRUE(throws_error(op(1), {h, {DType::f32, {8, 10}}, {DType::i32, {5}}}, {"leading shape [4]"}));
  EXPECT_TRUE(throws_error(op(1), {h, {DType::f32, {8, 10}}, {DType::f32, {4}}}, {"labels must be i32"}));
}

// Rows split over 'data' and the weight over its vocabulary ('model'): the weight arrives whole,
// the weight gradient is summed over the row blocks, and the values are the unsplit ones.
TEST(LinearCrossEntropy, ASplitWeightOrSplitRowsGiveTheUnsplitValues) {
  for (int vocab_axis : {0, 1}) {
    TracedFn f = [vocab_axis](const std::vector<Tensor>& in) {
      Tensor loss = linear_cross_entropy_loss(in[0], in[1], in[2], vocab_axis);
      std::vector<Tensor> g = gradients(loss, {in[0], in[1]});
      return std::vector<Tensor>{loss, linear_cross_entropy(in[0], in[1], in[2], vocab_axis), g[0], g[1]};
    };
    const int64_t v = 24, d = 8;
    std::vector<Array> x = {random_array({16, d}, DType::f32, 5),
                            random_array(vocab_axis == 0 ? Shape{v, d} : Shape{d, v}), labels_for(16, v, 6)};
    auto g = trace(f, testing::types_of(x));
    std::vector<Array> want = Executable::compile(*g)->run(x);
    Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
    const PartitionSpec w_split = vocab_axis == 0 ? PartitionSpec{"model", none} : PartitionSpec{none, "model"};
    for (const PartitionSpec& ws : {w_split, PartitionSpec{}}) {
      auto exe = ShardedExecutable::compile(*g, m, {{"data"}, ws, {"data"}});
      std::vector<Array> got = exe->run_full(x);
      for (size_t o = 0; o < want.size(); ++o)
        EXPECT_TRUE(all_close(got[o].to_f32(), want[o].to_f32(), 1e-5, 1e-5))
            << "output " << o << " vocab_axis " << vocab_axis << "\n"
            << exe->program().summary();
    }
  }
}

}  // namespace
}  // namespace px
