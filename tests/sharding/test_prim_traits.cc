// The partitioner and the TP recipe take what they know of a primitive from its declaration
// (SpmdTraits, TpTraits): private primitives that differ only in those fields get different
// collectives and different TP plans.
#include <gtest/gtest.h>

#include <mutex>

#include "ir/primitive.h"
#include "ops/local_form.h"
#include "parallax/parallel.h"
#include "parallax/spmd.h"
#include "sharding/prims.h"
#include "sharding/spmd_internal.h"
#include "testing.h"

namespace px {
namespace {

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

// A same-shaped elementwise op with `arity` operands, with the given traits.
Primitive eltwise_prim(const std::string& name, size_t arity, Linearity linear, TpTraits tp = {}) {
  Primitive p;
  p.name = name;
  p.infer = [name, arity](const std::vector<TensorType>& in, const Attrs&) {
    if (in.size() != arity) throw Error("[" + name + "] takes " + std::to_string(arity) + " operands");
    for (auto& t : in)
      if (t != in[0]) throw Error("[" + name + "] operands differ");
    return std::vector<TensorType>{in[0]};
  };
  p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return elementwise_rule(in, out);
  };
  p.elementwise = true;
  p.spmd.linear = linear;
  p.tp = tp;
  return p;
}

// x[m, k] -> y[m], reducing k, whose partial results combine as `partial` says.
Primitive row_reduce_prim(const std::string& name, PartialReduce partial) {
  Primitive p;
  p.name = name;
  p.infer = [name](const std::vector<TensorType>& in, const Attrs&) {
    if (in.size() != 1 || in[0].rank() != 2) throw Error("[" + name + "] takes one rank-2 operand");
    return std::vector<TensorType>{{in[0].dtype, {in[0].shape[0]}}};
  };
  p.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    ShardingRule r;
    r.operands = {{0, 1}};
    r.results = {{0}};
    r.factor_sizes = {in[0].shape[0], in[0].shape[1]};
    r.factor_kinds = {ShardingRule::Kind::parallel, ShardingRule::Kind::reduction};
    return r;
  };
  p.spmd.partial = partial;
  return p;
}

// y[i] = x[i] + i over a rank-1 x: a split needs the block's offset, which only its local form
// knows (there is no kernel for the primitive itself).
Primitive add_position_prim() {
  Primitive p = eltwise_prim("test_add_position", 1, {});
  p.elementwise = false;
  p.spmd.positional.factors = [](const ShardingRule& r, const Attrs&) { return r.results.at(0); };
  p.spmd.local_form = [](const spmd::LocalContext& c, const LocalFormArgs& a) {
    const std::vector<int>& axes = a.factor_axes.at(a.rule.results[0][0]);
    const int64_t block = a.want[0].shape[0];
    Tensor index = iota({block}, 0, DType::i32) + local_form::block_start(c, axes, block);
    return std::vector<Tensor>{a.inputs[0] + cast(index, DType::f32)};
  };
  return p;
}

void register_trait_prims() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_primitive(eltwise_prim("test_lin_add", 2, kLinearJointly));  // a + b, declared linear
    register_primitive(eltwise_prim("test_plain_add", 2, {}));            // the same op, declared nothing
    register_primitive(row_reduce_prim("test_rowmax", PartialReduce::max));
    register_primitive(row_reduce_prim("test_rowsum", PartialReduce::sum));
    register_primitive(row_reduce_prim("test_rowplain", PartialReduce::none));
    TpTraits mix;
    mix.mixes_features = true;
    register_primitive(eltwise_prim("test_mix", 1, {}, mix));
    register_primitive(eltwise_prim("test_keep", 1, {}));
    TpTraits view;
    view.view = TpTraits::View::same_dims;
    register_primitive(eltwise_prim("test_view", 1, {}, view));
    register_primitive(add_position_prim());
  });
}

const Mesh kMesh = Mesh::cpu({{"data", 2}, {"model", 2}});

SpmdProgram part(const TracedFn& fn, const std::vector<TensorType>& types, const std::vector<PartitionSpec>& specs) {
  auto g = trace(fn, types);
  std::vector<Sharding> s;
  for (auto& spec : specs) s.emplace_back(kMesh, spec);
  return partition(*g, kMesh, s);
}

std::vector<std::string> collectives(const SpmdProgram& p) {
  std::vector<std::string> out;
  for (auto& c : p.collectives) out.push_back(c.to_string());
  return out;
}

// The primitive that produced the operand of each all_reduce of the local program.
std::vector<std::string> all_reduce_sources(const SpmdProgram& p) {
  std::vector<std::string> out;
  const Graph& g = *p.local;
  for (const Node& n : g.nodes())
    if (n.prim->name == "all_reduce") out.push_back(g.nodes()[g.values()[n.inputs[0]].producer].prim->name);
  return out;
}

// Two matmuls with their contracting dims split over 'model' give two partial sums; `add` adds them.
SpmdProgram two_partial_sums(const std::string& add) {
  TracedFn f = [add](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{emit1(add, {matmul(in[0], in[1]), matmul(in[2], in[3])})};
  };
  PartitionSpec cols{none, "model"}, rows{"model", none};
  return part(f, {f32({8, 32}), f32({32, 16}), f32({8, 32}), f32({32, 16})}, {cols, rows, cols, rows});
}

TEST(PrimTraits, PartialSumsFlowThroughAPrimitiveDeclaredLinear) {
  register_trait_prims();
  // Declared linear in all operands: the partial sums are added first, then one all-reduce.
  SpmdProgram lin = two_partial_sums("test_lin_add");
  EXPECT_EQ(collectives(lin), (std::vector<std::string>{"all_reduce(sum) over 'model' of f32[8,16]"}));
  EXPECT_EQ(all_reduce_sources(lin), (std::vector<std::string>{"test_lin_add"}));
  // The same op without the declaration: each operand is reduced before it.
  SpmdProgram plain = two_partial_sums("test_plain_add");
  EXPECT_EQ(collectives(plain), (std::vector<std::string>{"all_reduce(sum) over 'model' of f32[8,16]",
                                                          "all_reduce(sum) over 'model' of f32[8,16]"}));
  EXPECT_EQ(all_reduce_sources(plain), (std::vector<std::string>{"dot_general", "dot_general"}));
}

TEST(PrimTraits, ASplitReductionCombinesAsThePrimitiveDeclares) {
  register_trait_prims();
  auto reduce_cols = [](const std::string& prim) {
    TracedFn f = [prim](const std::vector<Tensor>& in) { return std::vector<Tensor>{emit1(prim, {in[0]})}; };
    return part(f, {f32({8, 6})}, {{none, "model"}});
  };
  EXPECT_EQ(collectives(reduce_cols("test_rowmax")), (std::vector<std::string>{"all_reduce(max) over 'model' of f32[8]"}));
  EXPECT_EQ(collectives(reduce_cols("test_rowsum")), (std::vector<std::string>{"all_reduce(sum) over 'model' of f32[8]"}));
  // No declared way to combine partial results: the reduced dim is gathered first instead.
  SpmdProgram plain = reduce_cols("test_rowplain");
  ASSERT_EQ(plain.collectives.size(), 1u) << plain.summary();
  EXPECT_EQ(plain.collectives[0].kind, CollectiveKind::all_gather);
  EXPECT_EQ(plain.collectives[0].dim, 1);
  EXPECT_EQ(plain.local->type(plain.local->outputs()[0]), f32({8}));
}

TEST(PrimTraits, ASplitPositionalFactorIsEmittedByThePrimitivesLocalForm) {
  register_trait_prims();
  TracedFn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{emit1("test_add_position", {in[0]})}; };
  SpmdProgram p = part(f, {f32({8})}, {PartitionSpec{{"data", "model"}}});
  EXPECT_TRUE(p.collectives.empty()) << p.summary();
  for (const Node& n : p.local->nodes()) EXPECT_NE(n.prim->name, "test_add_position");
  EXPECT_EQ(p.local->type(p.local->outputs()[0]), f32({2}));
  // Run on the 4 devices: each block adds its own global positions.
  std::vector<float> xv{10, 20, 30, 40, 50, 60, 70, 80};
  auto exe = ShardedExecutable::compile(std::move(p));
  std::vector<Array> out = exe->run_full({Array::from_f32(xv, {8})});
  EXPECT_EQ(out.at(0).to_f32(), (std::vector<float>{10, 21, 32, 43, 54, 65, 76, 87}));
}

// x @ w1 -> mid -> @ w2, planned with TP on a 'model' axis of 2.
ShardingPlan tp_plan(const std::string& mid, const std::string& w1_view = "") {
  TracedFn f = [mid, w1_view](const std::vector<Tensor>& in) {
    Tensor w1 = w1_view.empty() ? in[0] : emit1(w1_view, {in[0]});
    return std::vector<Tensor>{matmul(emit1(mid, {matmul(in[2], w1)}), in[1])};
  };
  auto g = trace(f, {f32({16, 32}), f32({32, 16}), f32({4, 16})});
  return plan_sharding(*g, {"w1", "w2"}, Mesh::cpu({{"model", 2}}), ShardingStrategy::TP);
}

TEST(PrimTraits, TpPairingStopsAtAPrimitiveThatMixesFeatures) {
  register_trait_prims();
  ShardingPlan keep = tp_plan("test_keep");
  EXPECT_EQ(keep.params[0].reason, "column (feeds w2)");
  EXPECT_EQ(keep.params[1].reason, "row (fed by w1)");
  EXPECT_EQ(keep.params[0].spec.to_string(), "P(None, 'model')");
  // Marked as mixing a row's features: the column split cannot reach w2, so nothing is paired.
  ShardingPlan mix = tp_plan("test_mix");
  EXPECT_EQ(mix.params[0].reason, "vocab-parallel logits");
  EXPECT_EQ(mix.params[1].reason, "vocab-parallel logits");
}

TEST(PrimTraits, TpSeesAParamThroughASameDimsPrimitive) {
  register_trait_prims();
  // w1 reaches its matmul through test_view (same dims): still a weight matmul.
  EXPECT_EQ(tp_plan("test_keep", "test_view").params[0].reason, "column (feeds w2)");
  // Through test_keep (opaque to the analysis) it is not: only w2 is a weight matmul.
  ShardingPlan opaque = tp_plan("test_keep", "test_keep");
  EXPECT_EQ(opaque.params[0].reason, "replicated");
  EXPECT_EQ(opaque.params[1].reason, "vocab-parallel logits");
}

TEST(PrimTraits, BuiltInPrimitivesDeclareHowTheyAreSplit) {
  ensure_sharding_registered();
  auto prim = [](const char* name) -> const Primitive& { return get_primitive(name); };
  using In = Linearity::In;
  for (const char* name : {"dot_general", "reduce_sum", "scatter_add", "take"})
    EXPECT_EQ(prim(name).spmd.partial, PartialReduce::sum) << name;
  EXPECT_EQ(prim("reduce_max").spmd.partial, PartialReduce::max);
  EXPECT_EQ(prim("softmax").spmd.partial, PartialReduce::none);
  for (const char* name : {"add", "sub", "concat", "neg", "reshape", "transpose", "broadcast_in_dim", "reduce_sum",
                           "tag", "stop_gradient"}) {
    EXPECT_EQ(prim(name).spmd.linear.in, In::all_operands) << name;
    EXPECT_TRUE(prim(name).spmd.linear.cheap) << name;
  }
  EXPECT_EQ(prim("mul").spmd.linear.in, In::any_one);
  EXPECT_EQ(prim("dot_general").spmd.linear.in, In::any_one);
  EXPECT_EQ(prim("div").spmd.linear.in, In::first);
  EXPECT_FALSE(prim("div").spmd.linear.cheap);
  EXPECT_EQ(prim("cast").spmd.linear.in, In::none);  // rounding partial sums is not rounding their sum
  for (const char* name : {"take", "scatter_add", "softmax_cross_entropy", "softmax_cross_entropy_grad",
                           "random_uniform", "random_normal"}) {
    EXPECT_TRUE(prim(name).spmd.positional.factors) << name;
    EXPECT_TRUE(prim(name).spmd.local_form) << name;
  }
  EXPECT_EQ(prim("take").spmd.positional.split_as, ShardingRule::Kind::reduction);
  EXPECT_TRUE(prim("take").spmd.positional.late);
  const std::pair<const char*, CollectiveKind> collectives[] = {
      {"all_reduce", CollectiveKind::all_reduce}, {"all_gather", CollectiveKind::all_gather},
      {"reduce_scatter", CollectiveKind::reduce_scatter}, {"all_to_all", CollectiveKind::all_to_all},
      {"collective_permute", CollectiveKind::permute}};
  for (auto [name, kind] : collectives) EXPECT_EQ(prim(name).spmd.collective, kind) << name;
  EXPECT_FALSE(prim("local_slice").spmd.collective);
  for (const char* name : {"reduce_sum", "reduce_max", "layer_norm", "rms_norm", "softmax", "log_softmax",
                           "softmax_cross_entropy"})
    EXPECT_TRUE(prim(name).tp.mixes_features) << name;
  EXPECT_FALSE(prim("gelu").tp.mixes_features);
  for (const char* name : {"cast", "tag", "stop_gradient", "sharding_constraint"})
    EXPECT_EQ(prim(name).tp.view, TpTraits::View::same_dims) << name;
  EXPECT_EQ(prim("reshape").tp.view, TpTraits::View::layout);
  EXPECT_EQ(prim("broadcast_in_dim").tp.view, TpTraits::View::layout);
  EXPECT_EQ(prim("transpose").tp.view, TpTraits::View::opaque);
}

}  // namespace
}  // namespace px
