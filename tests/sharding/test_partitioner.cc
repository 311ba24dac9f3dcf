// Partitioner unit tests in the style of XLA's: small programs with given input shardings, checked
// for the exact collectives inserted and the local shapes, without running any device.
#include <gtest/gtest.h>

#include "ir/primitive.h"
#include "parallax/spmd.h"
#include "testing.h"

namespace px {
namespace {

TensorType f32(Shape s) { return {DType::f32, std::move(s)}; }

std::vector<std::string> collectives(const SpmdProgram& p) {
  std::vector<std::string> out;
  for (auto& c : p.collectives) out.push_back(c.to_string());
  return out;
}

SpmdProgram part(const TracedFn& fn, const std::vector<TensorType>& types, const Mesh& mesh,
                 const std::vector<PartitionSpec>& specs, const PartitionOptions& opt = {}) {
  auto g = trace(fn, types);
  std::vector<Sharding> s;
  for (auto& spec : specs) s.emplace_back(mesh, spec);
  return partition(*g, mesh, s, opt);
}

TensorType local_out(const SpmdProgram& p, int i) { return p.local->type(p.local->outputs().at(i)); }

const Mesh kMesh = Mesh::cpu({{"data", 4}, {"model", 2}});

TracedFn matmul_fn = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; };

TEST(Partitioner, ContractingDimShardedGivesOneAllReduce) {
  // matmul with the contracting dim split over 'model' -> one all_reduce over 'model' of f32[8,16].
  auto p = part(matmul_fn, {f32({8, 32}), f32({32, 16})}, kMesh, {{none, "model"}, {"model", none}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"all_reduce(sum) over 'model' of f32[8,16]"}));
  EXPECT_EQ(local_out(p, 0), f32({8, 16}));
  EXPECT_EQ(p.out_shardings[0].to_string(), "P(None, None)");
}

TEST(Partitioner, BatchSplitNeedsNoCommunication) {
  auto p = part(matmul_fn, {f32({8, 32}), f32({32, 16})}, kMesh, {{"data"}, {}});
  EXPECT_TRUE(p.collectives.empty()) << p.summary();
  EXPECT_EQ(local_out(p, 0), f32({2, 16}));
  EXPECT_EQ(p.out_shardings[0].to_string(), "P('data', None)");
}

TEST(Partitioner, MegatronMlpNeedsOneAllReduce) {
  // Column-parallel then row-parallel: the hidden activation stays split over 'model'.
  TracedFn mlp = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{matmul(tanh(matmul(in[0], in[1])), in[2])};
  };
  auto p = part(mlp, {f32({8, 16}), f32({16, 64}), f32({64, 16})}, kMesh, {{"data"}, {none, "model"}, {"model"}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"all_reduce(sum) over 'model' of f32[2,16]"}));
  EXPECT_EQ(p.value_shardings[4].to_string(), "P('data', 'model')");  // %4 = tanh(x @ w1)
}

TEST(Partitioner, ReductionsOverSplitDims) {
  TracedFn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(in[0], {0}), max(in[0], {1})}; };
  auto p = part(f, {f32({8, 6})}, kMesh, {{"data", "model"}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"all_reduce(sum) over 'data' of f32[3]",
                                                      "all_reduce(max) over 'model' of f32[2]"}));
  EXPECT_EQ(p.out_shardings[0].to_string(), "P('model')");
  EXPECT_EQ(p.out_shardings[1].to_string(), "P('data')");
}

TEST(Partitioner, PartialResultWantedSplitBecomesReduceScatter) {
  PartitionOptions opt;
  opt.out_shardings = {Sharding(kMesh, {"model"})};
  auto p = part(matmul_fn, {f32({8, 32}), f32({32, 16})}, kMesh, {{none, "model"}, {"model"}}, opt);
  EXPECT_EQ(collectives(p),
            (std::vector<std::string>{"reduce_scatter(sum) over 'model' dim 0 of f32[8,16] -> f32[4,16]"}));
  EXPECT_EQ(local_out(p, 0), f32({4, 16}));
}

TEST(Partitioner, ConstraintMovingAnAxisIsAnAllToAll) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{with_sharding_constraint(in[0] * 2.0, {none, "data"})};
  };
  auto p = part(f, {f32({8, 12})}, kMesh, {{"data"}});
  EXPECT_EQ(collectives(p),
            (std::vector<std::string>{"all_to_all over 'data' split 1 concat 0 of f32[2,12] -> f32[8,3]"}));
}

TEST(Partitioner, GatherAndLocalSlice) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{with_sharding_constraint(in[0], {none, none}),
                               with_sharding_constraint(in[1], {"model"})};
  };
  auto p = part(f, {f32({8, 12}), f32({6, 4})}, kMesh, {{"data"}, {}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"all_gather over 'data' dim 0 of f32[2,12] -> f32[8,12]",
                                                      "local_slice over 'model' dim 0 of f32[6,4] -> f32[3,4]"}));
}

TEST(Partitioner, ConstraintPropagatesBackwardToTheInputs) {
  // tanh runs on the local block: the slice moves to the replicated input, before the compute.
  TracedFn f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{with_sharding_constraint(tanh(in[0]), {"data"})};
  };
  auto p = part(f, {f32({8, 12})}, kMesh, {{}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"local_slice over 'data' dim 0 of f32[8,12] -> f32[2,12]"}));
  bool tanh_local = false;
  for (auto& n : p.local->nodes())
    if (n.prim->name == "tanh") tanh_local = p.local->type(n.outputs[0]) == f32({2, 12});
  EXPECT_TRUE(tanh_local) << p.summary();
}

TEST(Partitioner, DataParallelGradientsAreAllReducedOnce) {
  TracedFn step = [](const std::vector<Tensor>& in) {
    Tensor loss = mean(square(matmul(in[0], in[1])));
    return std::vector<Tensor>{loss, gradients(loss, {in[1]})[0]};
  };
  auto p = part(step, {f32({16, 8}), f32({8, 4})}, kMesh, {{"data"}, {}});
  int weight_reduces = 0, other = 0;
  for (auto& c : p.collectives) {
    if (c.kind == CollectiveKind::all_reduce && c.axes == std::vector<std::string>{"data"} && c.operand == f32({8, 4}))
      ++weight_reduces;
    else if (!(c.kind == CollectiveKind::all_reduce && c.operand.numel() == 1))
      ++other;
  }
  EXPECT_EQ(weight_reduces, 1) << p.summary();
  EXPECT_EQ(other, 0) << p.summary();
  EXPECT_EQ(p.out_shardings[1].to_string(), "P(None, None)");
}

TEST(Partitioner, ReshapeMergingASplitMajorDimStaysLocal) {
  TracedFn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{reshape(in[0], {32, 6})}; };
  auto p = part(f, {f32({8, 4, 6})}, kMesh, {{"data"}});
  EXPECT_TRUE(p.collectives.empty()) << p.summary();
  EXPECT_EQ(local_out(p, 0), f32({8, 6}));
  // A split minor dim cannot stay split through the merge: gather it first.
  auto q = part(f, {f32({8, 4, 6})}, kMesh, {{none, "model"}});
  EXPECT_EQ(collectives(q), (std::vector<std::string>{"all_gather over 'model' dim 1 of f32[8,2,6] -> f32[8,4,6]"}));
}

TEST(Partitioner, ShardedIotaSlicesOnlyTheLineAlongItsAxis) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0] + cast(iota({16, 8}, 0, DType::i32), DType::f32)};
  };
  auto p = part(f, {f32({16, 8})}, kMesh, {{"data", "model"}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"local_slice over 'data' dim 0 of i32[16] -> i32[4]"}));
}

TEST(Partitioner, PartialSumsFlowThroughLinearOps) {
  // (x1 @ w1 + x2 @ w2) * 0.5 with contracting dims split: one all-reduce, after the linear ops.
  TracedFn f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{tanh((matmul(in[0], in[1]) + matmul(in[2], in[3])) * 0.5)};
  };
  auto p = part(f, {f32({8, 32}), f32({32, 16}), f32({8, 32}), f32({32, 16})}, kMesh,
                {{none, "model"}, {"model"}, {none, "model"}, {"model"}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"all_reduce(sum) over 'model' of f32[8,16]"}));
  // A non-linear op needs the sum first.
  TracedFn g = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{matmul(in[0], in[1]) * matmul(in[2], in[3])};
  };
  auto q = part(g, {f32({8, 32}), f32({32, 16}), f32({8, 32}), f32({32, 16})}, kMesh,
                {{none, "model"}, {"model"}, {none, "model"}, {"model"}});
  EXPECT_EQ(q.collectives.size(), 2u) << q.summary();
}

TEST(Partitioner, DeadValuesCostNoCollectives) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor unused = sum(in[0]);  // would need an all-reduce over 'data'
    (void)unused;
    return std::vector<Tensor>{in[0] * 2.0};
  };
  auto p = part(f, {f32({8, 4})}, kMesh, {{"data"}});
  EXPECT_TRUE(p.collectives.empty()) << p.summary();
}

TEST(Partitioner, PartialInputsAreReducedWhereUsed) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{exp(in[0])}; }, {f32({8, 4})});
  auto p = partition(*g, kMesh, {Sharding(kMesh, {"data"}, {"model"})});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"all_reduce(sum) over 'model' of f32[2,4]"}));
}

TEST(Partitioner, AxesOfSizeOneNeedNoCollectives) {
  Mesh m = Mesh::cpu({{"data", 1}, {"model", 2}});
  auto p = part(matmul_fn, {f32({8, 32}), f32({32, 16})}, m, {{none, "data"}, {"data", none}});
  EXPECT_TRUE(p.collectives.empty()) << p.summary();
}

TensorType i32(Shape s) { return {DType::i32, std::move(s)}; }

bool has_node(const SpmdProgram& p, const std::string& prim, const TensorType& out) {
  for (auto& n : p.local->nodes())
    if (n.prim->name == prim && p.local->type(n.outputs[0]) == out) return true;
  return false;
}

TEST(Partitioner, VocabParallelLookupIsMaskedAndAllReduced) {
  // A row-split table is never gathered: each device looks up its rows, one all-reduce adds them.
  TracedFn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{take(in[0], in[1])}; };
  auto p = part(f, {f32({16, 6}), i32({8, 5})}, kMesh, {{"model"}, {"data"}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"all_reduce(sum) over 'model' of f32[2,5,6]"}));
  EXPECT_TRUE(has_node(p, "take", f32({2, 5, 6}))) << p.summary();
  // The indices keep the data axis even when the table's rows are split over it too: the table
  // is gathered instead of the (usually larger) batch.
  auto q = part(f, {f32({16, 6}), i32({8, 5})}, kMesh, {{"data"}, {"data"}});
  EXPECT_EQ(collectives(q), (std::vector<std::string>{"all_gather over 'data' dim 0 of f32[4,6] -> f32[16,6]"}));
}

TEST(Partitioner, ScatterAddIntoSplitRowsKeepsItsRows) {
  // The table gradient of a vocab-parallel lookup: each device adds the updates of its rows.
  TracedFn f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{with_sharding_constraint(scatter_add(in[0], in[1], 16), {"model"})};
  };
  auto p = part(f, {i32({8}), f32({8, 6})}, kMesh, {{"data"}, {"data"}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{"all_reduce(sum) over 'data' of f32[8,6]"}));
  EXPECT_TRUE(has_node(p, "scatter_add", f32({8, 6}))) << p.summary();
}

TEST(Partitioner, CrossEntropyOverSplitClassesReducesRowStatistics) {
  // Two small all-reduces per row block (max, then the two sums) instead of gathering the logits.
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor loss = softmax_cross_entropy(in[0], in[1]);
    return std::vector<Tensor>{loss, gradients(sum(loss), {in[0]})[0]};
  };
  auto p = part(f, {f32({8, 16}), i32({8})}, kMesh, {{"data", "model"}, {"data"}});
  EXPECT_EQ(collectives(p), (std::vector<std::string>{
                                "all_reduce(max) over 'model' of f32[2]", "all_reduce(sum) over 'model' of f32[2,2]",
                                "all_reduce(max) over 'model' of f32[2]", "all_reduce(sum) over 'model' of f32[2]"}));
  EXPECT_EQ(p.out_shardings[1].to_string(), "P('data', 'model')");
}

TEST(Partitioner, TiedEmbeddingGradientIsReduceScatteredOnce) {
  // Two partial gradients of one table (lookup and logits): added first, reduce-scattered once.
  TracedFn f = [](const std::vector<Tensor>& in) {
    Tensor g = scatter_add(in[0], in[1], 16) + matmul(transpose(in[2], {1, 0}), in[3]);
    return std::vector<Tensor>{with_sharding_constraint(g, {"data"})};
  };
  auto p = part(f, {i32({8}), f32({8, 6}), f32({8, 16}), f32({8, 6})}, kMesh, {{"data"}, {"data"}, {"data"}, {"data"}});
  EXPECT_EQ(collectives(p),
            (std::vector<std::string>{"reduce_scatter(sum) over 'data' dim 0 of f32[16,6] -> f32[4,6]"}));
}

TEST(Partitioner, SplitRandomDrawsComputeOnlyTheLocalBlock) {
  TracedFn f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{in[0] * random_normal(random_key(1), {16, 8})};
  };
  auto p = part(f, {f32({16, 8})}, kMesh, {{"data", "model"}});
  EXPECT_TRUE(p.collectives.empty()) << p.summary();
  EXPECT_TRUE(has_node(p, "random_normal", f32({4, 4}))) << p.summary();
}

struct Recorder : CollectiveEmitter {
  std::vector<std::string> calls;
  Tensor all_reduce(const Tensor& x, const std::vector<std::string>& axes, const std::string& reduce) override {
    calls.push_back("all_reduce " + axes.at(0) + " " + type_str(x.type()));
    return CollectiveEmitter::all_reduce(x, axes, reduce);
  }
};

TEST(Partitioner, EmitterIsInjected) {
  Recorder rec;
  PartitionOptions opt;
  opt.emitter = &rec;
  part(matmul_fn, {f32({8, 32}), f32({32, 16})}, kMesh, {{none, "model"}, {"model", none}}, opt);
  EXPECT_EQ(rec.calls, (std::vector<std::string>{"all_reduce model f32[8,16]"}));
}

TEST(Partitioner, BadInputShardingsNameTheInput) {
  auto g = trace(matmul_fn, {f32({8, 30}), f32({30, 16})}, {"x", "w"});
  try {
    partition(*g, kMesh, {Sharding(kMesh, {}), Sharding(kMesh, {"data"})});
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("input 1 ('w') f32[30,16]"), std::string::npos) << m;
    EXPECT_NE(m.find("dim 0 has size 30, not divisible by 4"), std::string::npos) << m;
    EXPECT_NE(m.find("'model'(2)"), std::string::npos) << m;
  }
  EXPECT_THROW(partition(*g, kMesh, {Sharding(kMesh, {})}), Error);
  EXPECT_THROW(partition(*g, kMesh, {Sharding(Mesh::cpu({{"data", 8}}), {}), Sharding(kMesh, {})}), Error);
  TracedFn bad = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{with_sharding_constraint(in[0], {"batch"})};
  };
  auto g2 = trace(bad, {f32({8})});
  try {
    partition(*g2, kMesh, {Sharding(kMesh, {})});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown mesh axis 'batch'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace px
