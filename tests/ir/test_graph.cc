// Graph IR: tracing, printing, the verifier, DCE, CSE and tracing errors, on private primitives.
#include <gtest/gtest.h>

#include "ir/private_prims.h"
#include "parallax/graph.h"
#include "testing.h"

namespace px {
namespace {

using namespace testprims;

class GraphTest : public ::testing::Test {
 protected:
  void SetUp() override { register_test_prims(); }
};

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

using testing::error_of;

TEST_F(GraphTest, PrintsExactText) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor a = scale(in[0], 2.0);
        Tensor b = add2(a, in[1]);
        std::vector<Tensor> s = split2(b);
        return std::vector<Tensor>{s[1], a};
      },
      {f32({2, 3}), f32({2, 3})}, {"x"});
  EXPECT_EQ(g->to_string(),
            "graph(%0: f32[2,3] \"x\", %1: f32[2,3]) {\n"
            "  %2: f32[2,3] = test_scale[k=2] %0\n"
            "  %3: f32[2,3] = test_add2 %2 %1\n"
            "  %4: f32[2,3], %5: f32[2,3] = test_split2 %3\n"
            "  return %5, %2\n"
            "}\n");
}

TEST_F(GraphTest, TraceRecordsProducersAndTypes) {
  auto g = trace([](const std::vector<Tensor>& in) { return split2(scale(in[0], 0.5)); }, {f32({4})});
  ASSERT_EQ(g->nodes().size(), 2u);
  EXPECT_EQ(g->inputs(), (std::vector<int>{0}));
  EXPECT_EQ(g->outputs(), (std::vector<int>{2, 3}));
  EXPECT_EQ(g->values()[3].producer, 1);
  EXPECT_EQ(g->values()[3].output_index, 1);
  EXPECT_EQ(g->values()[0].producer, -1);
  EXPECT_EQ(g->nodes()[0].attrs.f("k"), 0.5);
  EXPECT_EQ(type_str(g->type(2)), "f32[4]");
}

TEST_F(GraphTest, AttrsPrintCanonically) {
  auto arr = std::make_shared<const Array>(Array::zeros(DType::bf16, {2}));
  Attrs a{{"z", std::vector<int64_t>{0, 1}}, {"a", int64_t{3}}, {"d", DType::bf16},
          {"s", std::string("hi")},          {"c", arr},        {"f", 0.25}};
  EXPECT_EQ(a.to_string(), "[a=3 c=<bf16[2]> d=bf16 f=0.25 s=\"hi\" z=(0,1)]");
  EXPECT_EQ(Attrs{}.to_string(), "");
  EXPECT_EQ(a.f("a"), 3.0);  // ints read as floats
  EXPECT_NE(error_of([&] { a.i("missing"); }).find("missing attribute 'missing'"), std::string::npos);
  EXPECT_NE(error_of([&] { a.ints("a"); }).find("'a' is not an integer list"), std::string::npos);
}

TEST_F(GraphTest, NodeNamesArePrinted) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{scale(in[0], 3.0)}; }, {f32({})});
  g->mutable_nodes()[0].name = "block0.act";
  EXPECT_NE(g->to_string().find("%1: f32[] = test_scale[k=3] %0  # block0.act\n"), std::string::npos);
}

// Graphs built by hand through reset_ids, so that they can be broken on purpose.
struct RawGraph {
  std::vector<Node> nodes;
  std::vector<ValueInfo> values;
  std::vector<int> inputs, outputs;
  std::unique_ptr<Graph> build() {
    auto g = std::make_unique<Graph>();
    g->reset_ids(nodes, values, inputs, std::vector<std::string>(inputs.size()), outputs);
    return g;
  }
};

RawGraph two_scales() {
  // %0 input; %1 = scale %0; %2 = scale %1; return %2
  const Primitive* p = &get_primitive("test_scale");
  RawGraph r;
  r.values = {{f32({3}), -1, 0}, {f32({3}), 0, 0}, {f32({3}), 1, 0}};
  r.nodes = {Node{p, {{"k", 2.0}}, {0}, {1}, ""}, Node{p, {{"k", 3.0}}, {1}, {2}, ""}};
  r.inputs = {0};
  r.outputs = {2};
  return r;
}

TEST_F(GraphTest, VerifierAcceptsWellFormedGraph) { EXPECT_NO_THROW(two_scales().build()->verify()); }

TEST_F(GraphTest, VerifierCatchesUseBeforeDef) {
  RawGraph r = two_scales();
  std::swap(r.nodes[0], r.nodes[1]);  // node 0 now reads %1, which node 1 defines
  r.values[1].producer = 1;
  r.values[2].producer = 0;
  std::string msg = error_of([&] { r.build()->verify(); });
  EXPECT_NE(msg.find("[verify] node 0 (test_scale) uses %1 before it is defined"), std::string::npos) << msg;
}

TEST_F(GraphTest, VerifierCatchesWrongRecordedType) {
  RawGraph r = two_scales();
  r.values[2].type = {DType::bf16, {3}};
  std::string msg = error_of([&] { r.build()->verify(); });
  EXPECT_NE(msg.find("node 1 (test_scale) output %2 has type bf16[3] but its rule gives f32[3]"), std::string::npos)
      << msg;
}

TEST_F(GraphTest, VerifierCatchesWrongOutputCount) {
  RawGraph r;
  r.values = {{f32({3}), -1, 0}, {f32({3}), 0, 0}};
  r.nodes = {Node{&get_primitive("test_split2"), {}, {0}, {1}, ""}};
  r.inputs = {0};
  r.outputs = {1};
  std::string msg = error_of([&] { r.build()->verify(); });
  EXPECT_NE(msg.find("node 0 (test_split2) has 1 outputs, its rule gives 2"), std::string::npos) << msg;
}

TEST_F(GraphTest, VerifierCatchesShapeRuleFailureAndBadOutputs) {
  RawGraph r = two_scales();
  r.values[0].type = f32({4});  // the rule now gives f32[4] for %1, recorded f32[3]
  EXPECT_NE(error_of([&] { r.build()->verify(); }).find("output %1 has type f32[3] but its rule gives f32[4]"),
            std::string::npos);
  r = two_scales();
  r.nodes[1].attrs = {};  // test_scale requires k: the attributes are checked before the shape rule
  EXPECT_NE(error_of([&] { r.build()->verify(); }).find("node 1 (test_scale): [test_scale] missing attribute 'k'"),
            std::string::npos);
  r = two_scales();
  r.outputs = {7};
  EXPECT_NE(error_of([&] { r.build()->verify(); }).find("graph output %7 is not defined"), std::string::npos);
  r = two_scales();
  r.values[2].producer = 0;
  EXPECT_NE(error_of([&] { r.build()->verify(); }).find("records the wrong producer"), std::string::npos);
  r = two_scales();
  r.nodes[1].outputs = {1};  // %1 defined twice
  EXPECT_NE(error_of([&] { r.build()->verify(); }).find("defined twice"), std::string::npos);
  r = two_scales();
  r.inputs = {0, 0};
  EXPECT_NE(error_of([&] { r.build()->verify(); }).find("[verify] graph input %0"), std::string::npos);
}

TEST_F(GraphTest, DceDropsUnusedNodesAndKeepsMultiOutputNodes) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        scale(in[0], 5.0);                                  // dead
        Tensor dead_chain = scale(scale(in[1], 1.0), 2.0);  // dead
        (void)dead_chain;
        std::vector<Tensor> s = split2(in[0]);  // only output 1 is used
        return std::vector<Tensor>{scale(s[1], 3.0)};
      },
      {f32({2}), f32({2})});
  auto d = dce(*g);
  EXPECT_NO_THROW(d->verify());
  EXPECT_EQ(d->to_string(),
            "graph(%0: f32[2], %1: f32[2]) {\n"
            "  %2: f32[2], %3: f32[2] = test_split2 %0\n"
            "  %4: f32[2] = test_scale[k=3] %3\n"
            "  return %4\n"
            "}\n");
  EXPECT_EQ(d->inputs().size(), 2u);  // unused inputs stay: the signature does not change
}

TEST_F(GraphTest, DceKeepsOutputsThatAreInputs) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{in[1], in[0], in[1]};
      },
      {f32({1}), f32({2})});
  auto d = dce(*g);
  EXPECT_TRUE(d->nodes().empty());
  EXPECT_EQ(d->outputs(), (std::vector<int>{1, 0, 1}));
}

TEST_F(GraphTest, CseMergesIdenticalNodesTransitively) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor a = scale(in[0], 2.0), b = scale(in[0], 2.0);  // identical
        Tensor c = add2(a, in[1]), d = add2(b, in[1]);        // identical once a == b
        return std::vector<Tensor>{c, d};
      },
      {f32({3}), f32({3})});
  auto c = cse(*g);
  EXPECT_NO_THROW(c->verify());
  EXPECT_EQ(c->to_string(),
            "graph(%0: f32[3], %1: f32[3]) {\n"
            "  %2: f32[3] = test_scale[k=2] %0\n"
            "  %3: f32[3] = test_add2 %2 %1\n"
            "  return %3, %3\n"
            "}\n");
}

TEST_F(GraphTest, CseKeepsDistinctAttrsOperandsAndNoCse) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{scale(in[0], 2.0),  scale(in[0], 2.5), scale(in[1], 2.0), add2(in[0], in[1]),
                                   add2(in[1], in[0]), effect(in[0]),     effect(in[0])};
      },
      {f32({3}), f32({3})});
  auto c = cse(*g);
  EXPECT_EQ(c->nodes().size(), 7u);
  // Multi-output nodes merge output by output.
  auto g2 = trace(
      [](const std::vector<Tensor>& in) {
        auto a = split2(in[0]), b = split2(in[0]);
        return std::vector<Tensor>{a[0], b[1], a[1]};
      },
      {f32({3})});
  auto c2 = cse(*g2);
  ASSERT_EQ(c2->nodes().size(), 1u);
  EXPECT_EQ(c2->outputs(), (std::vector<int>{1, 2, 2}));
}

TEST_F(GraphTest, CseKeepsConstantsWithDifferentBuffers) {
  auto a1 = std::make_shared<const Array>(Array::zeros(DType::f32, {2}));
  auto a2 = std::make_shared<const Array>(Array::zeros(DType::f32, {2}));
  Attrs x{{"c", a1}}, y{{"c", a1}}, z{{"c", a2}};
  EXPECT_TRUE(x == y);
  EXPECT_FALSE(x == z);
  EXPECT_EQ(x.hash(), y.hash());
}

TEST_F(GraphTest, CloneIsIndependent) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{scale(in[0], 2.0)}; }, {f32({3})});
  auto c = g->clone();
  c->mutable_nodes()[0].attrs.set("k", 4.0);
  EXPECT_EQ(g->nodes()[0].attrs.f("k"), 2.0);
  EXPECT_EQ(c->to_string().find("k=4") != std::string::npos, true);
}

TEST_F(GraphTest, MixingTensorsFromTwoTracesIsAnError) {
  auto g1 = std::make_unique<Graph>();
  Tensor outer = g1->input(f32({3}));
  std::string msg = error_of([&] {
    trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{add2(in[0], outer)}; }, {f32({3})});
  });
  EXPECT_NE(msg.find("[test_add2] operand 1 belongs to a different graph"), std::string::npos) << msg;
  // A unary op on a captured tensor must not silently append to the other graph.
  msg = error_of([&] {
    trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{scale(outer, 2.0)}; }, {f32({3})});
  });
  EXPECT_NE(msg.find("[test_scale] operand 0 belongs to a different graph"), std::string::npos) << msg;
  EXPECT_TRUE(g1->nodes().empty());
  // Returning a tensor of another graph.
  msg = error_of([&] { trace([&](const std::vector<Tensor>&) { return std::vector<Tensor>{outer}; }, {f32({3})}); });
  EXPECT_NE(msg.find("[trace] output 0 belongs to another graph"), std::string::npos) << msg;
}

TEST_F(GraphTest, OpsOutsideATraceAreAnError) {
  ASSERT_EQ(current_graph(), nullptr);
  std::string msg = error_of([] { fill({2}, 1.0); });
  EXPECT_NE(msg.find("[test_fill] called outside of a trace"), std::string::npos) << msg;
  msg = error_of([] { scale(Tensor(), 1.0); });
  EXPECT_NE(msg.find("[test_scale] operand 0 is an undefined tensor"), std::string::npos) << msg;
}

TEST_F(GraphTest, TraceScopesNestAndRestore) {
  auto outer = trace(
      [](const std::vector<Tensor>& in) {
        Graph* mine = current_graph();
        auto inner = trace([](const std::vector<Tensor>& x) { return std::vector<Tensor>{fill({1}, 2.0)}; }, {});
        EXPECT_EQ(inner->nodes().size(), 1u);
        EXPECT_EQ(current_graph(), mine);
        return std::vector<Tensor>{add2(in[0], fill({1}, 3.0))};
      },
      {f32({1})});
  EXPECT_EQ(current_graph(), nullptr);
  EXPECT_EQ(outer->nodes().size(), 2u);
  // The scope is restored when the traced function throws.
  EXPECT_THROW(trace([](const std::vector<Tensor>& in) -> std::vector<Tensor> { throw Error("boom"); }, {}), Error);
  EXPECT_EQ(current_graph(), nullptr);
}

TEST_F(GraphTest, ShapeRuleErrorsSurfaceAtTraceTime) {
  std::string msg = error_of([] {
    trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{add2(in[0], in[1])}; }, {f32({2}), f32({3})});
  });
  EXPECT_NE(msg.find("[test_add2] operands differ: f32[2] vs f32[3]"), std::string::npos) << msg;
  msg = error_of([] { trace([](const std::vector<Tensor>&) { return std::vector<Tensor>{Tensor()}; }, {}); });
  EXPECT_NE(msg.find("[trace] output 0 is an undefined tensor"), std::string::npos) << msg;
}

TEST_F(GraphTest, TensorAccessors) {
  Graph g;
  Tensor t = g.input({DType::bf16, {2, 5, 7}});
  EXPECT_EQ(t.dim(-1), 7);
  EXPECT_EQ(t.numel(), 70);
  EXPECT_EQ(t.rank(), 3);
  EXPECT_NE(error_of([&] { t.dim(3); }).find("[Tensor::dim] axis 3 is out of range for rank 3"), std::string::npos);
  EXPECT_NE(error_of([] { Tensor().shape(); }).find("undefined tensor"), std::string::npos);
}

TEST_F(GraphTest, UnknownPrimitive) {
  EXPECT_NE(error_of([] { get_primitive("no_such_op"); }).find("unknown primitive 'no_such_op'"), std::string::npos);
  Primitive p;
  p.name = "test_scale";
  p.infer = [](const std::vector<TensorType>& in, const Attrs&) { return in; };
  EXPECT_NE(error_of([&] { register_primitive(p); }).find("registered twice"), std::string::npos);
}

}  // namespace
}  // namespace px
