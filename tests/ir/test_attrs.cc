// Typed primitive attributes (Primitive::attrs, checked when Graph::emit builds a node): an unknown
// name, a value of another type and a missing attribute are errors naming the primitive and what it
// takes; the annotations of passes go on any primitive; and a typical use of every registered
// primitive passes the check.
#include <gtest/gtest.h>

#include <set>

#include "ir/primitive.h"
#include "parallax/autodiff.h"
#include "parallax/memory.h"
#include "parallax/ops.h"
#include "parallax/optim.h"
#include "parallax/remat.h"
#include "parallax/sharding.h"
#include "parallax/spmd.h"
#include "sharding/prims.h"
#include "testing.h"

namespace px {
namespace {

using testing::error_of;
using Ints = std::vector<int64_t>;
using V = std::vector<Tensor>;

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

// The error of emitting `prim` with `attrs` on operands of these types ("<no error>" when it passes).
std::string emit_error(const std::string& prim, const Attrs& attrs, const std::vector<TensorType>& in = {f32({2, 3})}) {
  Graph g;
  TraceScope scope(&g);
  V xs;
  for (const TensorType& t : in) xs.push_back(g.input(t));
  return error_of([&] { emit(prim, xs, attrs); });
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(PrimitiveAttrs, UnknownAttributeNamesThePrimitiveAndWhatItTakes) {
  std::string msg = emit_error("reduce_sum", {{"axes", Ints{0}}, {"keepdims", int64_t{1}}});
  EXPECT_TRUE(has(msg, "[reduce_sum] unknown attribute 'keepdims'")) << msg;
  EXPECT_TRUE(has(msg, "it takes axes (an integer list)")) << msg;
  // A primitive without attributes says so.
  msg = emit_error("neg", {{"k", 2.0}});
  EXPECT_TRUE(has(msg, "[neg] unknown attribute 'k'; it takes no attributes")) << msg;
}

TEST(PrimitiveAttrs, WrongTypeNamesTheAttributeAndItsKind) {
  std::string msg = emit_error("reduce_sum", {{"axes", std::string("0")}});
  EXPECT_TRUE(has(msg, "[reduce_sum] attribute 'axes' must be an integer list")) << msg;
  EXPECT_TRUE(has(msg, "it takes axes (an integer list)")) << msg;
  msg = emit_error("concat", {{"axis", 1.0}}, {f32({2, 3}), f32({2, 3})});
  EXPECT_TRUE(has(msg, "[concat] attribute 'axis' must be an integer")) << msg;
  msg = emit_error("cast", {{"dtype", std::string("bf16")}});
  EXPECT_TRUE(has(msg, "[cast] attribute 'dtype' must be a dtype")) << msg;
  // Optional attributes are checked too, and listed as optional.
  msg = emit_error("slice", {{"starts", Ints{0, 0}}, {"limits", Ints{2, 3}}, {"strides", int64_t{1}}});
  EXPECT_TRUE(has(msg, "[slice] attribute 'strides' must be an integer list")) << msg;
  EXPECT_TRUE(has(msg, "strides (an integer list, optional)")) << msg;
}

TEST(PrimitiveAttrs, MissingRequiredAttributeIsNamed) {
  std::string msg = emit_error("cast", {});
  EXPECT_TRUE(has(msg, "[cast] missing attribute 'dtype' (a dtype)")) << msg;
  EXPECT_TRUE(has(msg, "it takes dtype (a dtype)")) << msg;
  msg = emit_error("slice", {{"starts", Ints{0, 0}}});
  EXPECT_TRUE(has(msg, "[slice] missing attribute 'limits' (an integer list)")) << msg;
  EXPECT_TRUE(has(msg, "it takes starts (an integer list), limits (an integer list), strides")) << msg;
  // The check runs before the shape rule, which would fail with a less helpful message.
  msg = emit_error("transpose", {{"perms", Ints{1, 0}}});
  EXPECT_TRUE(has(msg, "[transpose] unknown attribute 'perms'")) << msg;
}

TEST(PrimitiveAttrs, NumbersTakeIntegersAndOptionalAttributesMayBeLeftOut) {
  EXPECT_EQ(emit_error("full", {{"shape", Ints{2}}, {"value", int64_t{1}}, {"dtype", DType::f32}}, {}), "<no error>");
  EXPECT_EQ(emit_error("slice", {{"starts", Ints{0, 1}}, {"limits", Ints{2, 3}}}), "<no error>");
  EXPECT_EQ(emit_error("pad", {{"lo", Ints{0, 1}}, {"hi", Ints{1, 0}}}), "<no error>");
  EXPECT_EQ(emit_error("dot_general", {{"lhs_contract", Ints{1}}, {"rhs_contract", Ints{0}}, {"lhs_batch", Ints{}},
                                       {"rhs_batch", Ints{}}},
                       {f32({2, 3}), f32({3, 4})}),
            "<no error>");
  // But an integer is not a number's only stand-in: a string is still refused.
  std::string msg = emit_error("layer_norm", {{"eps", std::string("1e-5")}}, {f32({2, 3}), f32({3})});
  EXPECT_TRUE(has(msg, "[layer_norm] attribute 'eps' must be a number")) << msg;
}

TEST(PrimitiveAttrs, AnnotationsOfPassesGoOnAnyPrimitive) {
  EXPECT_EQ(emit_error("neg", {{"remat", int64_t{1}}}), "<no error>");
  EXPECT_EQ(emit_error("reduce_sum", {{"axes", Ints{1}}, {"remat", int64_t{1}}}), "<no error>");
  // Typed like any other attribute.
  std::string msg = emit_error("neg", {{"remat", std::string("first")}});
  EXPECT_TRUE(has(msg, "[neg] attribute 'remat' must be an integer")) << msg;
}

TEST(PrimitiveAttrs, EveryPrimitiveDeclaresDistinctNames) {
  ensure_sharding_registered();
  for (const std::string& name : primitive_names()) {
    std::set<std::string> seen;
    for (const AttrSpec& a : get_primitive(name).attrs) {
      EXPECT_TRUE(seen.insert(a.name).second) << name << " declares '" << a.name << "' twice";
      // An annotation of passes is declared there, for every primitive.
      EXPECT_NE(a.name, "remat") << name;
    }
  }
}

// A typical use of every registered primitive, through the public functions (and the passes'
// emitters) that build its nodes: each must pass the attribute check, and together they must use
// every primitive (a new primitive adds its use here).
struct Use {
  const char* what;
  std::vector<TensorType> in;
  TracedFn fn;
};

std::vector<Use> typical_uses() {
  const TensorType x3 = f32({3}), x23 = f32({2, 3}), b3{DType::boolean, {3}};
  return {
      {"constants", {}, [](const V&) {
         return V{constant(Array::from_f32({1, 2}, {2})), full({2}, 1.5), iota({2, 3}, 1, DType::f32)};
       }},
      {"elementwise", {x3, x3, b3}, [](const V& in) {
         const Tensor &x = in[0], &y = in[1], &b = in[2];
         return V{add(x, y), sub(x, y), mul(x, y), div(x, y), pow(x, y), maximum(x, y), minimum(x, y), neg(x), exp(x),
                  log(x), tanh(x), sqrt(x), rsqrt(x), abs(x), sigmoid(x), equal(x, y), not_equal(x, y), less(x, y),
                  less_equal(x, y), greater(x, y), greater_equal(x, y), logical_and(b, b), logical_or(b, b),
                  logical_not(b), where(b, x, y), stop_gradient(x), cast(x, DType::bf16), tag(x, "h"),
                  broadcast_in_dim(x, {2, 3}, {1})};
       }},
      {"remat region tags", {x3}, [](const V& in) {
         return remat([](const V& a) { return V{tanh(a[0])}; }, RematPolicy::names, {"h"})(in);
       }},
      {"shape", {x23, x23}, [](const V& in) {
         const Tensor& x = in[0];
         return V{reshape(x, {3, 2}), transpose(x, {1, 0}), slice(x, {0, 0}, {2, 3}, {1, 2}),
                  pad(x, {0, 1}, {1, 0}, 2.0), concat({x, in[1]}, 0)};
       }},
      {"slice's gradient pads", {x23}, [](const V& in) { return gradients(sum(slice_axis(in[0], 1, 1, 3)), {in[0]}); }},
      {"reduce", {x23}, [](const V& in) { return V{sum(in[0], {1}), max(in[0], {0}, true)}; }},
      {"reduce_max's gradient", {x23}, [](const V& in) { return gradients(sum(max(in[0], {1})), {in[0]}); }},
      {"matmul", {x23, f32({3, 4}), {DType::bf16, {2, 3}}, {DType::bf16, {3, 4}}}, [](const V& in) {
         return V{matmul(in[0], in[1]), dot_general(in[2], in[3], DotDims{{1}, {0}, {}, {}}, DType::f32)};
       }},
      {"nn", {x23, x3, x3}, [](const V& in) {
         const Tensor& x = in[0];
         return V{softmax(x), log_softmax(x, 0), layer_norm(x, in[1], in[2]), rms_norm(x, in[1]), gelu(x, true),
                  gelu(x, false), silu(x)};
       }},
      {"gelu's gradient", {x3}, [](const V& in) { return gradients(sum(gelu(in[0])), {in[0]}); }},
      {"the norms' gradients",
       {x23, x3, x3},
       [](const V& in) {
         return gradients(sum(layer_norm(in[0], in[1], in[2])) + sum(rms_norm(in[0], in[1])), {in[0], in[1]});
       }},
      {"cross entropy and its gradient",
       {x23, {DType::i32, {2}}},
       [](const V& in) {
         Tensor loss = softmax_cross_entropy(in[0], in[1]);
         return V{loss, gradients(sum(loss), {in[0]})[0]};
       }},
      {"the fused head and loss and its gradient",
       {x23, f32({5, 3}), {DType::i32, {2}}},
       [](const V& in) {
         Tensor loss = linear_cross_entropy(in[0], in[1], in[2], 0);
         return gradients(sum(loss), {in[0], in[1]});
       }},
      {"attention and its gradient",
       {f32({1, 2, 3, 4}), f32({1, 1, 3, 4}), f32({1, 1, 3, 4}), {DType::boolean, {1, 3}}},
       [](const V& in) {
         AttentionOptions opt;
         opt.key_padding = in[3];
         Tensor o = dot_product_attention(in[0], in[1], in[2], opt);
         return V{o, gradients(sum(o), {in[0]})[0]};
       }},
      {"index", {f32({5, 3}), {DType::i32, {2}}}, [](const V& in) {
         Tensor rows = take(in[0], in[1]);
         return V{rows, gradients(sum(rows), {in[0]})[0], one_hot(in[1], 5)};
       }},
      {"rng", {}, [](const V&) {
         Tensor key = fold_in(random_key(7), 3);
         return V{random_uniform(key, {2, 3}, DType::f32, -1.0, 1.0), random_normal(key, {4})};
       }},
      {"adamw", {x3, x3, x3, x3, {DType::i32, {}}}, [](const V& in) {
         optim::Update u = optim::adamw()->apply({in[0]}, {in[1]}, {in[2], in[3]}, in[4]);
         V out = u.params;
         out.insert(out.end(), u.state.begin(), u.state.end());
         return out;
       }},
      {"transfer", {x3}, [](const V& in) { return V{to_memory(in[0], MemoryKind::pinned_host, "blocks.0")}; }},
      {"sharding constraints", {x23}, [](const V& in) {
         // As the user writes one, and as the sharding decision writes one for some readers.
         const PartitionSpec spec{"x"};
         Tensor c = with_sharding_constraint(in[0], spec);
         return V{c, emit1("sharding_constraint", {in[0]},
                           {{"spec", spec.to_string()}, {"reads", int64_t{1}}, {"regather", int64_t{1}}})};
       }},
      {"collectives", {f32({4, 6}), {DType::i32, {1}}}, [](const V& in) {
         static const Mesh mesh = Mesh::cpu({{"x", 2}});
         CollectiveEmitter em;
         em.bind(&mesh, in[1]);
         const Tensor& x = in[0];
         return V{em.all_reduce(x, {"x"}, "sum"), em.all_gather(x, {"x"}, 0), em.reduce_scatter(x, {"x"}, 1, "max"),
                  em.all_to_all(x, {"x"}, 0, 1), em.local_slice(x, {"x"}, 1),
                  emit1("collective_permute", {x},
                        {{"axes", std::string("x")}, {"group", int64_t{2}}, {"pairs", Ints{0, 1, 1, 0}}})};
       }},
  };
}

TEST(PrimitiveAttrs, TypicalUseOfEveryPrimitivePasses) {
  ensure_sharding_registered();
  std::set<std::string> used;
  for (const Use& u : typical_uses()) {
    std::unique_ptr<Graph> g;
    EXPECT_EQ(error_of([&] { g = trace(u.fn, u.in); }), "<no error>") << u.what;
    if (!g) continue;
    for (const Node& n : g->nodes()) {
      used.insert(n.prim->name);
      EXPECT_NO_THROW(check_attrs(*n.prim, n.attrs)) << u.what << ": " << n.prim->name << n.attrs.to_string();
    }
  }
  std::string unused;
  for (const std::string& name : primitive_names())
    if (!used.count(name) && !has(name, "test")) unused += " " + name;
  EXPECT_TRUE(unused.empty()) << "primitives with no typical use in this test:" << unused;
}

}  // namespace
}  // namespace px
