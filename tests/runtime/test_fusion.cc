// The fused-loop engine on real ops: fused and unfused runs agree bit for bit (16-bit, integer
// and bool intermediates, NaNs and infinities included), broadcasts of external operands fuse as strided loads,
// reductions join the loop that computes their operand, and
// the autocast pass gives bf16/f16 matmuls with f32 results.
#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>

#include "ir/primitive.h"
#include "parallax/passes.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::random_array;

CompileOptions with_fusion(bool on) {
  CompileOptions o;
  o.fuse_elementwise = on;
  return o;
}

struct Both {
  std::vector<Array> fused, unfused;
  std::unique_ptr<Executable> exe;  // the fused one
};

Both run_both(const TracedFn& fn, const std::vector<Array>& inputs) {
  auto g = trace(fn, testing::types_of(inputs));
  Both b;
  b.exe = Executable::compile(*g, with_fusion(true));
  b.fused = b.exe->run(inputs);
  b.unfused = Executable::compile(*g, with_fusion(false))->run(inputs);
  return b;
}

void expect_identical(const Both& b) {
  ASSERT_EQ(b.fused.size(), b.unfused.size());
  for (size_t i = 0; i < b.fused.size(); ++i) {
    EXPECT_EQ(b.fused[i].type(), b.unfused[i].type());
    ASSERT_EQ(b.fused[i].nbytes(), b.unfused[i].nbytes());
    EXPECT_EQ(std::memcmp(b.fused[i].raw(), b.unfused[i].raw(), static_cast<size_t>(b.fused[i].nbytes())), 0)
        << "output " << i << " differs";
  }
}

TEST(Fusion, SixteenBitIntermediatesAreRoundedInsideTheLoop) {
  for (DType half : {DType::bf16, DType::f16}) {
    Array x = random_array({3000}, DType::f32, 1, -4, 4);
    auto b = run_both(
        [half](const std::vector<Tensor>& in) {
          Tensor h = cast(in[0] * 3.0, half);            // rounded to 16 bits
          Tensor y = cast(h * h, DType::f32) + 1.0;     // the 16-bit product is rounded too
          return std::vector<Tensor>{y, h};
        },
        {x});
    expect_identical(b);
    EXPECT_EQ(b.exe->num_fused_groups(), 1) << b.exe->summary();
    std::vector<float> xs = x.to_f32(), got = b.fused[0].to_f32();
    auto round = [half](float v) {
      return half == DType::bf16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
    };
    for (size_t i = 0; i < xs.size(); ++i) {
      float h = round(xs[i] * 3.0f);
      ASSERT_EQ(got[i], round(h * h) + 1.0f) << i;
    }
    // A cast's own rounding is the value kept in the loop: ties, overflow to inf, subnormals, NaN.
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> special = {65504.0f, 65519.0f, 65520.0f, 1e5f,  -65520.0f, 3e-5f, 1e-7f, 2.9e-8f, 1e-39f,
                                  -1e-40f,  1.00390625f, 1.01171875f, 3.4e38f, inf, -inf, std::nanf("")};
    Array sx = Array::from_f32(special, {static_cast<int64_t>(special.size())});
    auto c = run_both([half](const std::vector<Tensor>& in) { return std::vector<Tensor>{cast(cast(in[0], half), DType::f32) + 0.0}; },
                      {sx});
    expect_identical(c);
    std::vector<float> cg = c.fused[0].to_f32();
    for (size_t i = 0; i < special.size(); ++i) {
      if (std::isnan(special[i])) {
        EXPECT_TRUE(std::isnan(cg[i]));
      } else {
        EXPECT_EQ(cg[i], round(special[i])) << special[i];
      }
    }
  }
}

// Casts between float types that the tile already holds are new names for it: a widening cast, and
// a narrowing one that is only stored (the store rounds). Their results keep the casts' bits,
// specials included, next to a narrowing cast that is read again and one of an operand read in place.
TEST(Fusion, CastsThatTheTileHoldsAreRenames) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {1.0f, -2.5f, 65519.0f, 65520.0f, 3e-5f, 1e-39f, 1.00390625f, 3.4e38f, inf, -inf, std::nanf("")};
  for (int i = 0; i < 200; ++i) v.push_back(std::sin(static_cast<float>(i)) * 70000.0f);
  const int64_t n = static_cast<int64_t>(v.size());
  Array x = Array::from_f32(v, {n}), b = Array::from_f32(v, {n}, DType::bf16);
  auto both = run_both(
      [](const std::vector<Tensor>& in) {
        Tensor y = in[0] * 2.0;
        return std::vector<Tensor>{cast(y, DType::bf16),                      // narrowing, only stored
                                   cast(y, DType::f16),                       // the same value to f16
                                   cast(in[1], DType::f32) * 3.0,             // widening, read again
                                   cast(cast(y, DType::bf16), DType::f32),    // narrowing, read again
                                   cast(in[0], DType::f16)};                  // of an operand read in place
      },
      {x, b});
  expect_identical(both);
  EXPECT_EQ(both.exe->num_fused_groups(), 1) << both.exe->summary();
  const std::vector<float> y2 = both.fused[0].to_f32(), h = both.fused[1].to_f32();
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(v[i])) continue;
    EXPECT_EQ(y2[i], bf16_to_f32(f32_to_bf16(v[i] * 2.0f))) << v[i];
    EXPECT_EQ(h[i], f16_to_f32(f32_to_f16(v[i] * 2.0f))) << v[i];
  }
}

TEST(Fusion, IntegerAndBoolIntermediates) {
  Array x = random_array({2500}, DType::f32, 2, -3, 3);
  auto b = run_both(
      [](const std::vector<Tensor>& in) {
        Tensor t = cast(cast(in[0] * 10.0, DType::i32), DType::f32);  // truncates toward zero
        Tensor pos = greater(in[0], zeros_like(in[0]));
        Tensor y = where(pos, t, in[0] * 0.5) + cast(pos, DType::f32);
        return std::vector<Tensor>{y, pos};
      },
      {x});
  expect_identical(b);
  std::vector<float> xs = x.to_f32(), y = b.fused[0].to_f32();
  for (size_t i = 0; i < xs.size(); ++i) {
    float want = xs[i] > 0 ? static_cast<float>(static_cast<int>(xs[i] * 10.0f)) + 1.0f : xs[i] * 0.5f;
    ASSERT_EQ(y[i], want) << i;
  }
  EXPECT_EQ(b.fused[1].dtype(), DType::boolean);
}

TEST(Fusion, BroadcastsOfExternalOperandsFuseAsStridedLoads) {
  struct Case {
    Shape x, other;
  };
  for (const Case& c : std::vector<Case>{{{37, 53}, {53}},         // bias add
                                         {{37, 53}, {37, 1}},      // per-row statistic
                                         {{37, 53}, {}},           // scalar
                                         {{4, 5, 6}, {5, 1}},      // middle dim
                                         {{4, 5, 6}, {4, 1, 6}},   // outer and inner kept
                                         {{3, 1, 7}, {2, 1}},      // both operands broadcast
                                         {{2, 4100}, {4100}},      // rows longer than a tile
                                         {{3, 4096}, {4096}},      // every tile read in place
                                         {{5000, 3}, {5000, 1}},   // short rows, many tiles
                                         {{0, 5}, {5}}}) {         // empty
    SCOPED_TRACE(shape_str(c.x) + " with " + shape_str(c.other));
    Array x = random_array(c.x, DType::f32, 3), o = random_array(c.other, DType::f32, 4);
    auto b = run_both([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tanh(in[0] * in[1] + in[1])}; },
                      {x, o});
    expect_identical(b);
    std::string s = b.exe->summary();
    EXPECT_EQ(s.find(": broadcast_in_dim"), std::string::npos) << "broadcast materialized:\n" << s;
    EXPECT_EQ(b.exe->num_steps(), 1) << s;
  }
}

TEST(Fusion, BroadcastReferenceAndDtypes) {
  Array x = random_array({6, 7}, DType::f32, 5), bias = random_array({7}, DType::bf16, 6),
        rows = random_array({6, 1}, DType::f32, 7);
  auto b = run_both(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{in[0] * in[2] + cast(in[1], DType::f32), in[1] + zeros_like(in[1])};
      },
      {x, bias, rows});
  expect_identical(b);
  std::vector<float> xs = x.to_f32(), bs = bias.to_f32(), rs = rows.to_f32(), want(42);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 7; ++j) want[i * 7 + j] = xs[i * 7 + j] * rs[i] + bs[j];
  EXPECT_TRUE(all_close(b.fused[0].to_f32(), want, 1e-6, 1e-6));
}

TEST(Fusion, BroadcastThatEscapesIsAlsoWrittenOut) {
  Array x = random_array({9, 11}, DType::f32, 8), v = random_array({11}, DType::f32, 9);
  auto b = run_both(
      [](const std::vector<Tensor>& in) {
        Tensor bv = broadcast_to(in[1], {9, 11});
        return std::vector<Tensor>{exp(in[0] + bv), bv, sum(bv, {0})};
      },
      {x, v});
  expect_identical(b);
  std::vector<float> vs = v.to_f32(), bv = b.fused[1].to_f32();
  for (int i = 0; i < 99; ++i) ASSERT_EQ(bv[i], vs[i % 11]);
}

TEST(Fusion, BroadcastOfAValueComputedInTheGroupIsNotFused) {
  // exp(v) has the group's element count, so it would join; its broadcast reads the group.
  Array v = random_array({1, 40}, DType::f32, 10), y = random_array({40, 1}, DType::f32, 11);
  auto b = run_both(
      [](const std::vector<Tensor>& in) {
        Tensor e = exp(reshape(in[0], {40}));
        return std::vector<Tensor>{broadcast_in_dim(e, {40, 1}, {0}) * in[1], e};
      },
      {v, y});
  expect_identical(b);
  std::vector<float> vs = v.to_f32(), ys = y.to_f32(), got = b.fused[0].to_f32();
  for (int i = 0; i < 40; ++i) ASSERT_NEAR(got[i], std::exp(vs[i]) * ys[i], 1e-6);
}

TEST(Fusion, ReshapesInsideAChainAreRenames) {
  Array x = random_array({6, 10}, DType::f32, 16), b = random_array({60}, DType::bf16, 17);
  auto r = run_both(
      [](const std::vector<Tensor>& in) {
        Tensor z = reshape(exp(in[0]), {60});                                    // renamed group value
        Tensor w = z * 2.0 + reshape(in[0], {60}) + cast(in[1], DType::f32);     // renamed operand
        Tensor v = reshape(cast(w, DType::bf16), {2, 30});                        // 16-bit, then renamed
        return std::vector<Tensor>{reshape(w, {3, 20}), z, v, sum(reshape(w, {6, 10}), {1})};
      },
      {x, b});
  expect_identical(r);
  std::string s = r.exe->summary();
  EXPECT_EQ(s.find(": reshape"), std::string::npos) << s;
  EXPECT_EQ(r.exe->num_steps(), 1) << s;  // one fused loop, the reduction in it
  std::vector<float> xs = x.to_f32(), bs = b.to_f32(), w = r.fused[0].to_f32();
  for (int i = 0; i < 60; ++i) ASSERT_NEAR(w[i], std::exp(xs[i]) * 2 + xs[i] + bs[i], 1e-5);
  EXPECT_EQ(r.fused[0].shape(), (Shape{3, 20}));
  EXPECT_EQ(r.fused[2].shape(), (Shape{2, 30}));
}

TEST(Fusion, ScalarConstantsFuseIntoTheChain) {
  Array x = random_array({1000}, DType::f32, 12);
  auto b = run_both(
      [](const std::vector<Tensor>& in) {
        Tensor t = in[0];
        for (int i = 0; i < 8; ++i) t = sigmoid(t * 1.5 - 0.25);
        return std::vector<Tensor>{t};
      },
      {x});
  expect_identical(b);
  EXPECT_EQ(b.exe->num_steps(), 1) << b.exe->summary();
  // No intermediate buffer: the arena holds only the loop's tiles (its kernel scratch).
  const int64_t tiles = b.exe->memory().arena_max_by_category[static_cast<int>(MemoryCategory::kernel_scratch)];
  EXPECT_LE(b.exe->peak_bytes() - tiles, 1000 * 4 + 64);
}

// ---- autocast --------------------------------------------------------------------------------

std::vector<Tensor> mlp(const std::vector<Tensor>& in) {
  const Tensor &x = in[0], &w1 = in[1], &w2 = in[2];
  Tensor h = gelu(matmul(x, w1));
  Tensor logits = matmul(h, w2);
  Tensor p = softmax(logits, -1);
  Tensor loss = mean(logsumexp(logits, -1) - sum(logits * p, {1}));
  std::vector<Tensor> d = gradients(loss, {w1, w2});
  return {p, loss, d[0], d[1]};
}

TEST(Fusion, LargeResultsWrittenWithStreamingStoresAreExact) {
  // Over 8 MiB of f32 per result the engine stores with non-temporal writes; an odd length leaves
  // an unaligned tail, and one result goes to a bf16 array (rounded as it streams) beside two f32
  // ones. A NaN operand gives a quiet NaN there.
  const int64_t n = (2 << 20) + 37;
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor y = tanh(in[0] * in[1] + 0.5);
    return std::vector<Tensor>{y, y * in[0], cast(y - in[1], DType::bf16)};
  };
  Array a = random_array({n}, DType::f32, 1), c = random_array({n}, DType::f32, 2);
  c.data<float>()[12345] = std::numeric_limits<float>::quiet_NaN();
  Both b = run_both(f, {a, c});
  expect_identical(b);
  const float* y = b.fused[0].data<float>();
  const uint16_t* h = b.fused[2].data<uint16_t>();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[i], f32_to_bf16(y[i] - c.data<float>()[i])) << i;
  // In place into the caller's arrays, which the runtime hands over aligned or not alike.
  std::vector<Array> out = b.fused;
  b.exe->run_into({a, c}, out);
  EXPECT_EQ(std::memcmp(out[1].raw(), b.unfused[1].raw(), static_cast<size_t>(out[1].nbytes())), 0);
}

// A reduction of a value computed in a fused loop joins the loop (FusionLimits::reductions): the
// loop feeds the reduction range by range, in the unfused kernel's order, so the result is the
// same bits; the reduced operand is written only where something else reads it.
TEST(Fusion, ReductionsJoinTheLoopThatFeedsThem) {
  struct Case {
    Shape x;
    std::vector<int64_t> axes;
  };
  for (const Case& c : std::vector<Case>{{{3000}, {}},                // one sum, one part
                                         {{300001}, {}},              // split into parts
                                         {{64, 300}, {1}},            // rows
                                         {{5000, 6}, {1}},            // short rows
                                         {{7, 70000}, {1}},           // few long rows: split
                                         {{4000, 37}, {0}},           // columns
                                         {{300, 5000}, {0}},          // column blocks
                                         {{3, 500, 40}, {0, 2}},      // alternating dims
                                         {{6, 50, 9}, {1}},           // a middle dim
                                         {{8, 1, 5}, {1, 2}}}) {      // a size-1 dim reduced too
    SCOPED_TRACE(shape_str(c.x));
    Array x = random_array(c.x, DType::f32, 5, -2, 2), b = random_array({c.x.back()}, DType::f32, 6);
    for (bool is_max : {false, true}) {
      auto both = run_both(
          [&](const std::vector<Tensor>& in) {
            Tensor y = square(in[0] + in[1]);  // bias add (a strided load), then the square
            return std::vector<Tensor>{is_max ? max(y, c.axes) : sum(y, c.axes)};
          },
          {x, b});
      expect_identical(both);
      EXPECT_EQ(both.exe->num_steps(), 1) << both.exe->summary();
    }
  }
}

TEST(Fusion, AReductionInTheLoopStillWritesWhatOthersRead) {
  Array x = random_array({513, 77}, DType::f32, 7, -3, 3);
  auto both = run_both(
      [](const std::vector<Tensor>& in) {
        Tensor y = in[0] * 3.0, z = square(y);
        return std::vector<Tensor>{sum(z, {0}), y, z + 1.0};
      },
      {x});
  expect_identical(both);
  auto alone = run_both([](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(square(in[0]), {1}), in[0] * 2.0}; },
                        {x});
  expect_identical(alone);
}

TEST(Fusion, SixteenBitOperandsOfAReductionInTheLoop) {
  for (DType half : {DType::bf16, DType::f16}) {
    Array x = random_array({900, 33}, half, 8, -4, 4);
    auto both = run_both(
        [half](const std::vector<Tensor>& in) {
          Tensor w = cast(cast(in[0], DType::f32) * 1.5, half);  // a narrowing cast read only by the sum
          return std::vector<Tensor>{sum(w, {1}), sum(cast(in[0], DType::f32), {0}), max(square(in[0]), {0, 1})};
        },
        {x});
    expect_identical(both);
  }
}

TEST(Fusion, AReductionOfAViewIsNotALoop) {
  Array x = random_array({40, 30}, DType::f32, 9);
  auto both = run_both([](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(reshape(in[0], {1200}))}; },
                       {x});
  expect_identical(both);
  EXPECT_EQ(both.exe->num_fused_groups(), 0) << both.exe->summary();
}

TEST(Autocast, Bf16ProgramMatchesF32WithinTolerance) {
  std::vector<Array> in = {random_array({8, 32}, DType::f32, 13), random_array({32, 64}, DType::f32, 14, -0.3f, 0.3f),
                           random_array({64, 16}, DType::f32, 15, -0.3f, 0.3f)};
  auto g = trace(mlp, testing::types_of(in));
  auto ref = Executable::compile(*g)->run(in);
  for (DType half : {DType::bf16, DType::f16}) {
    CompileOptions opt;
    opt.compute_dtype = half;
    auto exe = Executable::compile(*g, opt);
    auto got = exe->run(in);
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_EQ(got[i].dtype(), DType::f32) << "output " << i;  // results stay f32
      double tol = half == DType::bf16 ? 2e-2 : 4e-3;
      EXPECT_TRUE(all_close(got[i].to_f32(), ref[i].to_f32(), tol, 4 * tol)) << dtype_name(half) << " output " << i;
    }
    // The compiled graph shows the casts; every dot_general reads 16-bit operands.
    std::string text = exe->graph().to_string();
    std::string name = dtype_name(half);
    EXPECT_NE(text.find("= cast[dtype=" + name + "]"), std::string::npos) << text;
    int dots = 0;
    for (const Node& n : exe->graph().nodes()) {
      if (n.prim->name != "dot_general") continue;
      ++dots;
      EXPECT_EQ(exe->graph().type(n.inputs[0]).dtype, half);
      EXPECT_EQ(exe->graph().type(n.inputs[1]).dtype, half);
      EXPECT_EQ(exe->graph().type(n.outputs[0]).dtype, DType::f32);
    }
    EXPECT_GE(dots, 5);  // two forward, at least three backward
    // Reductions and softmax stay f32: nothing else produces 16-bit values.
    for (const Node& n : exe->graph().nodes())
      if (n.prim->name != "cast")
        for (int v : n.outputs)
          if (is_float(exe->graph().type(v).dtype)) EXPECT_EQ(exe->graph().type(v).dtype, DType::f32) << n.prim->name;
  }
}

// Compiles g under each 16-bit compute type and checks that the nodes of `prims` write their first
// result in that type (the others stay f32), with the bits of the program autocast alone makes
// where those results are also returned (so stored in f32 and cast, not narrowed).
void expect_narrowed_with_the_casts_bits(const Graph& g, const std::vector<Array>& in,
                                         const std::vector<std::string>& prims, int count) {
  auto listed = [&](const Node& n) { return std::find(prims.begin(), prims.end(), n.prim->name) != prims.end(); };
  for (DType half : {DType::bf16, DType::f16}) {
    CompileOptions opt;
    opt.compute_dtype = half;
    auto exe = Executable::compile(g, opt);
    int narrowed = 0;
    for (const Node& n : exe->graph().nodes()) {
      if (!listed(n)) continue;
      EXPECT_EQ(exe->graph().type(n.outputs[0]).dtype, half) << n.prim->name;
      for (size_t o = 1; o < n.outputs.size(); ++o) EXPECT_EQ(exe->graph().type(n.outputs[o]).dtype, DType::f32);
      ++narrowed;
    }
    EXPECT_EQ(narrowed, count) << exe->graph().to_string();
    std::unique_ptr<Graph> cast = autocast(g, half);
    std::vector<int> outs = cast->outputs();
    for (const Node& n : cast->nodes())
      if (listed(n)) outs.push_back(n.outputs[0]);
    cast->reset_ids(cast->nodes(), cast->values(), cast->inputs(), cast->input_names(), outs);
    auto ref = Executable::compile(*cast)->run(in);
    auto got = exe->run(in);
    ASSERT_EQ(got.size() + count, ref.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].type(), ref[i].type());
      EXPECT_EQ(std::memcmp(got[i].raw(), ref[i].raw(), static_cast<size_t>(got[i].nbytes())), 0)
          << dtype_name(half) << " output " << i;
    }
  }
}

// Under bf16 compute the head's gradient is written in bf16 by the cross-entropy gradient itself
// (its readers, the backward matmuls, cast it anyway): the same bits as the f32 gradient cast, and
// the f32 gradient is never stored.
TEST(Autocast, TheLossGradientIsWrittenInTheComputeTypeWithTheCastsBits) {
  auto loss = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{sum(softmax_cross_entropy(matmul(in[0], in[1]), in[2]))};
  };
  // The second size's gradient (over 2M elements) streams past the cache.
  for (auto [rows, vocab] : {std::pair<int64_t, int64_t>{6, 300}, {260, 8192}}) {
    const int64_t d = 16;
    auto g = trace(value_and_grad(loss, {0, 1}),
                   {{DType::f32, {rows, d}}, {DType::f32, {d, vocab}}, {DType::i32, {rows}}});
    std::vector<int32_t> labels(rows);
    for (int64_t r = 0; r < rows; ++r) labels[r] = static_cast<int32_t>((r * 97) % vocab);
    std::vector<Array> in = {random_array({rows, d}, DType::f32, 21), random_array({d, vocab}, DType::f32, 22),
                             Array::from_i32(labels, {rows})};
    expect_narrowed_with_the_casts_bits(*g, in, {"softmax_cross_entropy_grad"}, 1);
  }
  try {
    Graph h;
    Tensor logits = h.input({DType::f32, {2, 5}}), lab = h.input({DType::i32, {2}}), ct = h.input({DType::f32, {2}});
    h.emit(get_primitive("softmax_cross_entropy_grad"), {logits, lab, ct},
           Attrs{{"ignore_index", int64_t{-100}}, {"out_dtype", DType::i32}});
    FAIL() << "an integer out_dtype was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("out_dtype must be f32, bf16 or f16, got i32"), std::string::npos) << e.what();
  }
}

// A norm whose result only feeds the matmuls writes it in the compute type (out_dtype): the bits
// of the f32 result cast, and the f32 result is never stored.
TEST(Autocast, NormsWriteTheirResultInTheComputeTypeWithTheCastsBits) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{matmul(layer_norm(in[0], in[1], in[2]), in[3]),
                                   matmul(rms_norm(in[0], in[1]), in[3])};
      },
      {{DType::f32, {6, 40}}, {DType::f32, {40}}, {DType::f32, {40}}, {DType::f32, {40, 24}}});
  std::vector<Array> in = {random_array({6, 40}, DType::f32, 31, -3, 3), random_array({40}, DType::f32, 32),
                           random_array({40}, DType::f32, 33), random_array({40, 24}, DType::f32, 34)};
  expect_narrowed_with_the_casts_bits(*g, in, {"layer_norm", "rms_norm"}, 2);  // their statistics stay f32
  try {
    Graph h;
    Tensor x = h.input({DType::f32, {2, 5}}), gamma = h.input({DType::f32, {5}});
    h.emit(get_primitive("rms_norm"), {x, gamma}, Attrs{{"eps", 1e-5}, {"out_dtype", DType::i32}});
    FAIL() << "an integer out_dtype was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[rms_norm] out_dtype must be f32, bf16 or f16, got i32"), std::string::npos)
        << e.what();
  }
}

TEST(Autocast, PassLeavesNonF32MatmulsAndOtherOpsAlone) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor a = matmul(in[0], in[1]);                                   // f32: autocast
        Tensor b = matmul(cast(in[0], DType::bf16), cast(in[1], DType::bf16));  // already bf16: kept
        return std::vector<Tensor>{a, b, sum(in[0])};
      },
      {{DType::f32, {2, 3}}, {DType::f32, {3, 4}}});
  auto f32_copy = autocast(*g, DType::f32);
  EXPECT_EQ(f32_copy->to_string(), g->to_string());
  auto m = autocast(*g, DType::bf16);
  EXPECT_NO_THROW(m->verify());
  EXPECT_EQ(m->nodes().size(), g->nodes().size() + 2);
  EXPECT_EQ(m->type(m->outputs()[0]).dtype, DType::f32);
  EXPECT_EQ(m->type(m->outputs()[1]).dtype, DType::bf16);
  try {
    autocast(*g, DType::i32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[autocast] compute dtype must be f32, bf16 or f16, got i32"),
              std::string::npos);
  }
}

// Layout ops between 16-bit values and their f32 readers run on the 16-bit side: a narrowing cast
// of a transposed f32 value casts before the transpose (and fuses with the add), a transpose of a
// widened value moves the 16-bit value, and a narrowing cast of a value widened from that type is
// the value. The results keep every bit of the program without the pass (optimize off).
TEST(Autocast, LayoutOpsRunOnTheSixteenBitSideOfCasts) {
  for (DType half : {DType::bf16, DType::f16}) {
    std::vector<Array> in = {random_array({4, 6, 8}, DType::f32, 1, -2, 2), random_array({8}, DType::f32, 2, -1, 1)};
    auto exe = testing::compile_keeping_bits(
        [half](const std::vector<Tensor>& x) {
          Tensor h = x[0] * 3.0 + x[1];
          Tensor q = cast(transpose(reshape(h, {4, 6, 2, 4}), {0, 2, 1, 3}), half);  // cast moves up
          Tensor w = cast(q * q, DType::f32);                                        // widened, then moved
          Tensor back = reshape(transpose(w, {0, 2, 1, 3}), {4, 6, 8});
          Tensor again = cast(back, half);                                   // the 16-bit transpose itself
          Tensor wide = transpose(cast(q, DType::f32), {0, 1, 3, 2}) + 1.0;  // an f32 reader
          return std::vector<Tensor>{q, again, wide};
        },
        in);
    const Graph& cg = exe->graph();
    int transposes = 0;
    for (const Node& n : cg.nodes()) {
      if (n.prim->name == "transpose") {
        ++transposes;
        EXPECT_EQ(cg.type(n.outputs[0]).dtype, half) << cg.to_string();
      }
      // No narrowing cast reads a transpose: each moved above it.
      if (n.prim->name == "cast" && cg.type(n.outputs[0]).dtype == half) {
        int p = cg.values()[n.inputs[0]].producer;
        ASSERT_GE(p, 0);
        EXPECT_NE(cg.nodes()[p].prim->name, "transpose") << cg.to_string();
      }
    }
    EXPECT_EQ(transposes, 3) << cg.to_string();
  }
  // Three heads as attention's q, k and v: each narrowing cast is placed right after its add, so
  // all three join the adds' group although each head's transpose comes between them.
  std::vector<Array> in = {random_array({4, 6, 8}, DType::f32, 3, -2, 2), random_array({8}, DType::f32, 4, -1, 1)};
  auto exe = testing::compile_keeping_bits(
      [](const std::vector<Tensor>& x) {
        std::vector<Tensor> h, out;
        for (double s : {3.0, 5.0, 7.0}) h.push_back(x[0] * s + x[1]);  // the projections first
        for (const Tensor& t : h) out.push_back(cast(transpose(reshape(t, {4, 6, 2, 4}), {0, 2, 1, 3}), DType::bf16));
        return out;
      },
      in);
  std::string s = exe->summary();
  int lines_with_casts = 0;
  for (size_t at = 0, nl; at < s.size(); at = nl + 1) {
    nl = s.find('\n', at);
    if (nl == std::string::npos) nl = s.size();
    const std::string line = s.substr(at, nl - at);
    int casts = 0;  // members named cast (not broadcast_in_dim)
    for (const char* m : {"{cast", ",cast", " cast"})
      for (size_t c = line.find(m); c != std::string::npos; c = line.find(m, c + 1)) ++casts;
    if (casts == 0) continue;
    ++lines_with_casts;
    EXPECT_EQ(casts, 3) << line;  // all three in the adds' group
  }
  EXPECT_EQ(lines_with_casts, 1) << s;

  // A narrowing cast after another reader of its value (a bias gradient's sum) is placed next to
  // the producer, so that the reader does not close the group before the cast joins it.
  auto gexe = testing::compile_keeping_bits(
      [](const std::vector<Tensor>& x) {
        Tensor h = x[0] * 3.0 + x[1];
        return std::vector<Tensor>{sum(h, {0, 1}), cast(h, DType::bf16)};
      },
      in);
  EXPECT_NE(gexe->summary().find("add,cast"), std::string::npos) << gexe->summary();
}

}  // namespace
}  // namespace px

namespace px {
namespace {

// A 16-bit value widened for a reader near it and read again far after (what an activation's
// gradient does in the backward pass): the far reader widens the 16-bit value itself, in its own
// fused group, so the f32 copy is never stored and what stays alive in between is 16-bit. Every bit
// of the results equals the program compiled without optimization.
TEST(Autocast, AFarReaderOfAWidenedValueWidensItItself) {
  const Shape shape{64, 256};
  std::vector<Array> in = {random_array(shape, DType::bf16, 5, -2, 2), random_array({16}, DType::f32, 6, -1, 1)};
  auto exe = testing::compile_keeping_bits(
      [](const std::vector<Tensor>& x) {
        Tensor w = cast(x[0], DType::f32);
        Tensor near = tanh(w);
        Tensor z = x[1];
        for (int i = 0; i < 40; ++i) z = tanh(z);  // 40 nodes of something else in between
        return std::vector<Tensor>{near, w * sum(z)};
      },
      in);
  const Graph& cg = exe->graph();
  int widening = 0;
  for (const Node& n : cg.nodes()) {
    if (n.prim->name != "cast" || cg.type(n.outputs[0]).dtype != DType::f32) continue;
    ++widening;
    EXPECT_EQ(cg.type(n.inputs[0]).dtype, DType::bf16) << cg.to_string();
  }
  EXPECT_EQ(widening, 2) << cg.to_string();
  // The arena holds no f32 copy of the value (64 KiB) between its readers.
  EXPECT_LT(exe->peak_bytes(), numel(shape) * 4) << exe->summary();
}

// A sum of a widened 16-bit value (a bias gradient under bf16) reads the 16-bit value and writes
// the f32 sum: the f32 copy is never written, and the sums keep their bits.
TEST(Autocast, ASumOfAWidenedValueReadsItNarrow) {
  const Shape shape{64, 256};
  std::vector<Array> in = {random_array(shape, DType::bf16, 7, -2, 2)};
  auto exe = testing::compile_keeping_bits(
      [](const std::vector<Tensor>& x) {
        Tensor w = cast(x[0], DType::f32);
        return std::vector<Tensor>{sum(w, {0}), sum(w, {1})};
      },
      in);
  const Graph& cg = exe->graph();
  int sums = 0;
  for (const Node& n : cg.nodes()) {
    EXPECT_NE(n.prim->name, "cast") << cg.to_string();
    if (n.prim->name != "reduce_sum") continue;
    ++sums;
    EXPECT_EQ(cg.type(n.inputs[0]).dtype, DType::bf16) << cg.to_string();
    EXPECT_EQ(cg.type(n.outputs[0]).dtype, DType::f32) << cg.to_string();
  }
  EXPECT_EQ(sums, 2) << cg.to_string();
  EXPECT_LT(exe->peak_bytes(), numel(shape) * 4) << exe->summary();
}

}  // namespace
}  // namespace px
