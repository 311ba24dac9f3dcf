// Constants (constant, full, iota, *_like) and broadcast_in_dim / broadcast_to: values in every
// dtype, fused and unfused, gradients of broadcasts, sharding rules and errors.
#include "ir/primitive.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::check_grads;
using testing::eval;
using testing::eval1;
using testing::random_array;
using testing::throws_error;

const CompileOptions kUnfused{.fuse_elementwise = false};
const std::vector<DType> kAllDtypes = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean};

// Evaluates a function of no inputs (constants are emitted into the current trace).
std::vector<Array> eval0(const TracedFn& fn, const CompileOptions& opt = {}) { return eval(fn, {}, opt); }

TEST(Constants, ConstantReturnsTheArrayInEveryDtype) {
  for (DType dt : kAllDtypes) {
    Array a = random_array({3, 7}, dt == DType::boolean ? DType::i32 : dt, 5, -4, 4).astype(dt);
    Array y = eval0([&](const std::vector<Tensor>&) { return std::vector<Tensor>{constant(a)}; })[0];
    ASSERT_EQ(y.type(), a.type()) << dtype_name(dt);
    EXPECT_EQ(std::memcmp(y.raw(), a.raw(), static_cast<size_t>(a.nbytes())), 0) << dtype_name(dt);
  }
  // Scalars, empty arrays, and i32 values that floats cannot hold.
  Array s = Array::scalar(2.5f);
  Array e = Array::zeros(DType::f32, {0, 4});
  Array big = Array::from_i32({16777217, -2147483647}, {2});
  auto r = eval0([&](const std::vector<Tensor>&) { return std::vector<Tensor>{constant(s), constant(e), constant(big)}; });
  EXPECT_EQ(r[0].to_f32(), std::vector<float>{2.5f});
  EXPECT_EQ(r[1].shape(), (Shape{0, 4}));
  EXPECT_EQ(r[2].to_i32(), (std::vector<int32_t>{16777217, -2147483647}));
}

TEST(Constants, ConstantCopiesTheCallersBuffer) {
  Array a = Array::from_f32({1, 2, 3}, {3});
  auto g = trace([&](const std::vector<Tensor>&) { return std::vector<Tensor>{constant(a)}; }, {});
  a.data<float>()[0] = 100;  // after tracing: the graph keeps the traced value
  auto exe = Executable::compile(*g);
  EXPECT_EQ(exe->run({})[0].to_f32(), (std::vector<float>{1, 2, 3}));
}

TEST(Constants, ConstantCombinesWithInputs) {
  Array w = random_array({4, 5}, DType::f32, 3);
  Array x = random_array({4, 5}, DType::f32, 4);
  for (const CompileOptions& opt : {CompileOptions{}, kUnfused}) {
    Array y = eval1([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * constant(w) + 1.0}; }, {x},
                    opt);
    std::vector<float> xv = x.to_f32(), wv = w.to_f32(), want;
    for (size_t i = 0; i < xv.size(); ++i) want.push_back(xv[i] * wv[i] + 1);
    EXPECT_TRUE(all_close(y.to_f32(), want));
  }
}

TEST(Constants, FullInEveryDtypeAndShape) {
  for (DType dt : kAllDtypes)
    for (const Shape& s : std::vector<Shape>{{}, {7, 13}, {0, 3}, {1}, {50001}}) {
      SCOPED_TRACE(type_str({dt, s}));
      double v = dt == DType::boolean ? 1 : dt == DType::i32 ? -7 : 1.5;
      for (const CompileOptions& opt : {CompileOptions{}, kUnfused}) {
        Array y = eval0([&](const std::vector<Tensor>&) { return std::vector<Tensor>{full(s, v, dt)}; }, opt)[0];
        ASSERT_EQ(y.type(), (TensorType{dt, s}));
        EXPECT_TRUE(all_close(y.to_f32(), std::vector<float>(static_cast<size_t>(numel(s)), static_cast<float>(v)), 0,
                              0));
      }
    }
  // 16-bit floats round the value; large i32 values stay exact.
  auto r = eval0([](const std::vector<Tensor>&) {
    return std::vector<Tensor>{full({2}, 1.0 / 3.0, DType::bf16), full({2}, 16777217, DType::i32),
                               full({2}, -2147483647, DType::i32)};
  });
  EXPECT_EQ(r[0].to_f32()[0], Array::scalar(1.0f / 3.0f, DType::bf16).to_f32()[0]);
  EXPECT_EQ(r[1].to_i32(), (std::vector<int32_t>{16777217, 16777217}));
  EXPECT_EQ(r[2].to_i32(), (std::vector<int32_t>{-2147483647, -2147483647}));
}

TEST(Constants, LikeFunctionsFollowTheOperand) {
  Array x = random_array({3, 4}, DType::bf16, 1);
  auto r = eval([](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{zeros_like(in[0]), ones_like(in[0]), full_like(in[0], -2.5)};
  }, {x});
  for (const Array& y : r) EXPECT_EQ(y.type(), x.type());
  EXPECT_EQ(r[0].to_f32(), std::vector<float>(12, 0.0f));
  EXPECT_EQ(r[1].to_f32(), std::vector<float>(12, 1.0f));
  EXPECT_EQ(r[2].to_f32(), std::vector<float>(12, -2.5f));
}

TEST(Constants, ScalarConstantsFuseIntoTheirConsumer) {
  // x * 2 + 1 runs as one pass: the scalars are not materialized as separate steps.
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 2.0 + 1.0}; },
                 {{DType::f32, {64, 64}}});
  auto exe = Executable::compile(*g);
  EXPECT_EQ(exe->num_steps(), 1) << exe->summary();
  Array x = random_array({64, 64}, DType::f32, 2);
  std::vector<float> got = exe->run({x})[0].to_f32(), xv = x.to_f32();
  for (size_t i = 0; i < xv.size(); ++i) ASSERT_EQ(got[i], xv[i] * 2.0f + 1.0f);
}

TEST(Constants, Iota) {
  for (DType dt : {DType::i32, DType::f32, DType::bf16, DType::f16})
    for (int axis : {0, 1, 2, -1}) {
      Shape s = {3, 5, 4};
      Array y = eval0([&](const std::vector<Tensor>&) { return std::vector<Tensor>{iota(s, axis, dt)}; })[0];
      ASSERT_EQ(y.type(), (TensorType{dt, s}));
      int a = axis < 0 ? axis + 3 : axis;
      std::vector<float> got = y.to_f32();
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 5; ++j)
          for (int k = 0; k < 4; ++k) {
            int want = a == 0 ? i : a == 1 ? j : k;
            ASSERT_EQ(got[(i * 5 + j) * 4 + k], want) << dtype_name(dt) << " axis " << axis;
          }
    }
  // Long axes: exact i32 positions (a common use: position ids and masks).
  Array y = eval0([](const std::vector<Tensor>&) { return std::vector<Tensor>{iota({2, 70000}, 1)}; })[0];
  std::vector<int32_t> v = y.to_i32();
  for (int64_t i = 0; i < 140000; ++i) ASSERT_EQ(v[i], i % 70000);
  Array e = eval0([](const std::vector<Tensor>&) { return std::vector<Tensor>{iota({0, 3}, 1)}; })[0];
  EXPECT_EQ(e.shape(), (Shape{0, 3}));
}

TEST(Constants, IotaBuildsACausalMask) {
  Array m = eval0([](const std::vector<Tensor>&) {
    Tensor i = iota({4, 4}, 0), j = iota({4, 4}, 1);
    return std::vector<Tensor>{greater_equal(i, j)};
  })[0];
  EXPECT_EQ(m.to_i32(), (std::vector<int32_t>{1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}));
}

// ---- broadcast_in_dim -----------------------------------------------------------------------

// Reference: result[idx] = x[idx restricted to dims, 0 where the operand dim is 1].
std::vector<float> broadcast_ref(const std::vector<float>& x, const Shape& xs, const Shape& s,
                                 const std::vector<int64_t>& dims) {
  // Operand stride of every result dim (0 where broadcast).
  std::vector<int64_t> stride(s.size(), 0);
  int64_t st = 1;
  for (int i = static_cast<int>(xs.size()) - 1; i >= 0; --i) {
    if (xs[i] != 1) stride[dims[i]] = st;
    st *= xs[i];
  }
  std::vector<float> out(static_cast<size_t>(numel(s)));
  for (int64_t flat = 0; flat < numel(s); ++flat) {
    int64_t rem = flat, src = 0;
    for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
      src += (rem % s[d]) * stride[d];
      rem /= s[d];
    }
    out[flat] = x[src];
  }
  return out;
}

struct BroadcastCase {
  Shape from, to;
  std::vector<int64_t> dims;
};

const std::vector<BroadcastCase> kBroadcasts = {
    {{}, {7, 13}, {}},                   // scalar -> tensor
    {{13}, {7, 13}, {1}},                // row vector
    {{7, 1}, {7, 13}, {0, 1}},           // column
    {{7}, {7, 13}, {0}},                 // column without the size-1 dim
    {{2, 1, 3}, {2, 4, 3}, {0, 1, 2}},   // middle dim
    {{3}, {2, 3, 4}, {1}},               // into the middle of a higher rank
    {{1, 1}, {3, 1, 5}, {0, 2}},         // all broadcast, with a size-1 result dim
    {{5, 1}, {5, 0}, {0, 1}},            // empty result
    {{4, 2}, {4, 2}, {0, 1}},            // identity
    {{300}, {400, 300}, {1}},            // large: parallel rows
    {{400, 1}, {400, 300}, {0, 1}},      // large column fill
    {{}, {123457}, {}},                  // one long fill split into chunks
    {{2, 3}, {2, 5, 3, 7}, {0, 2}},      // interleaved
};

TEST(BroadcastInDim, MatchesReferenceInEveryDtype) {
  for (const BroadcastCase& c : kBroadcasts)
    for (DType dt : kAllDtypes) {
      SCOPED_TRACE(type_str({dt, c.from}) + " -> " + shape_str(c.to));
      Array x = random_array(c.from, dt == DType::boolean ? DType::i32 : dt, 9, -3, 3).astype(dt);
      std::vector<float> want = broadcast_ref(x.to_f32(), c.from, c.to, c.dims);
      for (const CompileOptions& opt : {CompileOptions{}, kUnfused}) {
        // Alone (its own kernel) and feeding an elementwise consumer (which may fuse it).
        auto r = eval(
            [&](const std::vector<Tensor>& in) {
              Tensor b = broadcast_in_dim(in[0], c.to, c.dims);
              Tensor same = dt == DType::boolean ? logical_not(logical_not(b)) : b + zeros_like(b);
              return std::vector<Tensor>{b, same};
            },
            {x}, opt);
        ASSERT_EQ(r[0].type(), (TensorType{dt, c.to}));
        EXPECT_TRUE(all_close(r[0].to_f32(), want, 0, 0));
        EXPECT_TRUE(all_close(r[1].to_f32(), want, 0, 0));
      }
    }
}

TEST(BroadcastInDim, BroadcastToAlignsTrailingDims) {
  Array x = random_array({3, 1}, DType::f32, 2);
  Array y = eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{broadcast_to(in[0], {2, 3, 4})}; }, {x});
  EXPECT_TRUE(all_close(y.to_f32(), broadcast_ref(x.to_f32(), {3, 1}, {2, 3, 4}, {1, 2}), 0, 0));
  // Same shape: the tensor itself.
  trace(
      [](const std::vector<Tensor>& in) {
        EXPECT_EQ(broadcast_to(in[0], {3, 1}).id(), in[0].id());
        EXPECT_EQ(broadcast_in_dim(in[0], {3, 1}, {0, 1}).id(), in[0].id());
        return std::vector<Tensor>{in[0]};
      },
      {{DType::f32, {3, 1}}});
}

TEST(BroadcastInDim, Gradients) {
  for (const BroadcastCase& c : kBroadcasts) {
    if (numel(c.to) > 200) continue;  // finite differences per element
    SCOPED_TRACE(shape_str(c.from) + " -> " + shape_str(c.to));
    Array x = random_array(c.from, DType::f32, 4);
    EXPECT_TRUE(check_grads(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{broadcast_in_dim(in[0], c.to, c.dims)}; },
        {x}));
  }
  // bf16 cotangents keep their dtype through the reduction.
  trace(
      [](const std::vector<Tensor>& in) {
        Tensor y = cast(broadcast_to(in[0], {4, 3}), DType::f32);
        Tensor d = gradients(sum(y), {in[0]})[0];
        EXPECT_EQ(d.type(), in[0].type());
        return std::vector<Tensor>{d};
      },
      {{DType::bf16, {3}}});
}

TEST(BroadcastInDim, ShardingRule) {
  const Primitive& p = get_primitive("broadcast_in_dim");
  TensorType x{DType::f32, {3, 1}}, y{DType::f32, {2, 3, 4}};
  Attrs attrs{{"shape", std::vector<int64_t>{2, 3, 4}}, {"dims", std::vector<int64_t>{1, 2}}};
  ShardingRule r = sharding_of(p, {x}, {y}, attrs);
  // The kept dim shares the result's factor; the broadcast size-1 dim takes no part.
  EXPECT_EQ(r.to_string(), "b1->abc");
  EXPECT_EQ(cost_of(p, {x}, {y}, attrs).bytes_written, 96);
}

TEST(BroadcastInDim, Errors) {
  auto bcast = [](Shape s, std::vector<int64_t> dims) {
    return [s, dims](const std::vector<Tensor>& in) { return std::vector<Tensor>{broadcast_in_dim(in[0], s, dims)}; };
  };
  EXPECT_TRUE(throws_error(bcast({4, 3}, {0}), {{DType::f32, {2, 3}}},
                           {"[broadcast_in_dim]", "f32[2,3]", "[4,3]", "one entry per operand dim"}));
  EXPECT_TRUE(throws_error(bcast({4, 3}, {0, 1}), {{DType::f32, {2, 3}}},
                           {"[broadcast_in_dim]", "operand dim 0 has size 2", "result dim 0 has size 4"}));
  EXPECT_TRUE(throws_error(bcast({3, 2}, {1, 0}), {{DType::f32, {2, 3}}}, {"[broadcast_in_dim]", "strictly increasing"}));
  EXPECT_TRUE(throws_error(bcast({2, 3}, {0, 5}), {{DType::f32, {2, 3}}}, {"[broadcast_in_dim]", "out of range"}));
  EXPECT_TRUE(throws_error(bcast({2, -3}, {0, 1}), {{DType::f32, {2, 3}}}, {"[broadcast_in_dim]", "negative"}));
}

TEST(Constants, Errors) {
  auto no_inputs = std::vector<TensorType>{};
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>&) { return std::vector<Tensor>{iota({2, 3}, 2)}; }, no_inputs,
                           {"iota", "2"}));
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>&) { return std::vector<Tensor>{iota({2, 3}, 0, DType::boolean)}; }, no_inputs,
      {"[iota]", "bool"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>&) { return std::vector<Tensor>{full({2, -1}, 0.0)}; },
                           no_inputs, {"[full]", "negative", "[2,-1]"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>&) { return std::vector<Tensor>{constant(Array())}; }, no_inputs,
                           {"[constant]", "undefined"}));
  // Outside a trace there is no graph to emit into.
  try {
    full({2}, 1.0);
    ADD_FAILURE() << "no error outside a trace";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[full]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace px
