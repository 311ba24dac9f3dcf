// The recipes end to end: sharded AdamW training steps of small GPT-2 / Llama LMs equal the
// unsharded TrainStep; FSDP memory; DDP / FSDP communication; plan-time errors; MANUAL rules.
#include <gtest/gtest.h>

#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "recipe_check.h"
#include "testing.h"

namespace px {
namespace {

using namespace recipe_check;

// Each recipe on each mesh at least once, split over the two models to keep the binary fast.
TEST(Recipes, GptDdp) {
  check_equivalent(gpt_micro(), Mesh::cpu({{"data", 1}}), ShardingStrategy::DDP);
  check_equivalent(gpt_micro(), Mesh::cpu({{"data", 8}}), ShardingStrategy::DDP);
}
TEST(Recipes, GptFsdp) { check_equivalent(gpt_micro(), Mesh::cpu({{"data", 8}}), ShardingStrategy::FSDP); }
TEST(Recipes, GptTp) { check_equivalent(gpt_micro(), Mesh::cpu({{"model", 8}}), ShardingStrategy::TP); }
TEST(Recipes, GptFsdpTp) {
  check_equivalent(gpt_micro(), Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}}), ShardingStrategy::FSDP_TP);
}
TEST(Recipes, GptTpIsVocabParallelWithoutGathers) {
  // The tied table is split by rows: the lookup, the logits and the cross entropy all stay split
  // over 'model' (all-reduces only, as in Megatron); nothing is ever all-gathered.
  const Mesh mesh = Mesh::cpu({{"data", 2}, {"model", 4}});
  check_equivalent(gpt_micro(), mesh, ShardingStrategy::TP);
  Fixture f(gpt_micro());
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, {.mesh = mesh, .strategy = ShardingStrategy::TP});
  int gathers = 0;
  for (const CollectiveRecord& c : step.program().program().collectives)
    gathers += c.kind == CollectiveKind::all_gather || c.kind == CollectiveKind::all_to_all;
  EXPECT_EQ(gathers, 0) << step.program().program().summary();
}
TEST(Recipes, LlamaDdpTpFsdpTp) {
  check_equivalent(llama_micro(), Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}}), ShardingStrategy::DDP);
  check_equivalent(llama_micro(), Mesh::cpu({{"data", 4}, {"model", 2}}), ShardingStrategy::TP);
  check_equivalent(llama_micro(), Mesh::cpu({{"data", 2}, {"model", 4}}), ShardingStrategy::FSDP_TP);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TEST(Recipes, TpDerivesMegatronSplitsFromTheGraph) {
  for (const nn::LmConfig& cfg : {gpt_micro(), llama_micro()}) {
    Fixture f(cfg);
    auto fwd = nn::trace_with_params(
        f.model.store(), [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{f.loss(b)}; }, f.batch_types);
    ShardingPlan plan =
        plan_sharding(*fwd, f.model.store().paths(), Mesh::cpu({{"data", 2}, {"model", 4}}), ShardingStrategy::TP);
    int col = 0, row = 0;
    for (const auto& p : plan.params) {
      PartitionSpec want;
      for (const char* c : {"attn.wq", "attn.wk", "attn.wv", "mlp.fc.w", "mlp.gate.w", "mlp.up.w", "head.w"})
        if (ends_with(p.path, c)) want = {none, "model"}, ++col;
      for (const char* c : {"attn.bq", "attn.bk", "attn.bv", "mlp.fc.b"})
        if (ends_with(p.path, c)) want = {"model"}, ++col;
      for (const char* r : {"attn.wo", "mlp.proj.w", "mlp.down.w"})
        if (ends_with(p.path, r)) want = {"model", none}, ++row;
      if (p.path == "embed.table") want = {"model", none};  // vocab-parallel lookup (and GPT's tied logits)
      EXPECT_EQ(p.spec, want) << cfg.name << " " << p.path << " got " << p.spec.to_string() << " (" << p.reason << ")";
    }
    EXPECT_GE(col, 8) << cfg.name;
    EXPECT_GE(row, 4) << cfg.name;
    EXPECT_NE(plan.table().find("bytes/device"), std::string::npos);
  }
}

TEST(Recipes, FsdpOverEightHoldsAnEighthOfEachLargeParamAndItsAdamState) {
  Fixture f(gpt_micro());
  TrainStep step(
      f.model.store(), opt(), f.loss, f.batch_types,
      {.mesh = Mesh::cpu({{"data", 8}}), .strategy = ShardingStrategy::FSDP, .sharding = {.fsdp_min_bytes = 1024}});
  TrainState s = step.init(0);
  auto slots = opt()->state_slots(f.model.store().types());
  int large = 0;
  for (size_t i = 0; i < s.params.size(); ++i) {
    int64_t full = s.params[i].type().nbytes();
    int64_t want = full >= 1024 ? full / 8 : full;
    large += full >= 1024;
    EXPECT_EQ(s.params[i].bytes_per_device(), want) << f.model.store().spec(static_cast<int>(i)).path;
    EXPECT_EQ(step.plan().params[i].bytes_per_device, want);
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    int64_t pfull = s.params[slots[k].param].type().nbytes();
    if (slots[k].type.shape == s.params[slots[k].param].shape() && pfull >= 1024)
      EXPECT_EQ(s.opt_state[k].bytes_per_device(), s.opt_state[k].type().nbytes() / 8) << slots[k].name;
  }
  EXPECT_GE(large, 8);
  // The state stays sharded after a step.
  step(s, f.batch(0));
  for (size_t i = 0; i < s.params.size(); ++i)
    EXPECT_EQ(s.params[i].sharding(), step.program().in_sharding(static_cast<int>(i)));
}

// Any recipe: each param and each optimizer slot of the param's shape holds 1 / (product of the
// sizes of the axes its spec splits over) of its bytes on every device.
void check_memory(const nn::LmConfig& cfg, const Mesh& mesh, ShardingStrategy strategy) {
  Fixture f(cfg);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                 {.mesh = mesh, .strategy = strategy, .sharding = {.fsdp_min_bytes = 1024}});
  TrainState s = step.init(0);
  auto fraction = [&](const PartitionSpec& spec) {
    int64_t n = 1;
    for (const auto& a : spec.used_axes()) n *= mesh.axis_size(a);
    return n;
  };
  int split = 0;
  for (size_t i = 0; i < s.params.size(); ++i) {
    const PartitionSpec& spec = step.plan().params[i].spec;
    split += !spec.is_replicated();
    EXPECT_EQ(s.params[i].bytes_per_device(), s.params[i].type().nbytes() / fraction(spec))
        << step.plan().params[i].path;
  }
  auto slots = opt()->state_slots(f.model.store().types());
  for (size_t k = 0; k < slots.size(); ++k)
    if (slots[k].type.shape == s.params[slots[k].param].shape())
      EXPECT_EQ(s.opt_state[k].bytes_per_device(),
                s.opt_state[k].type().nbytes() / fraction(step.plan().params[slots[k].param].spec));
  EXPECT_GE(split, 8) << strategy_name(strategy);
}

TEST(Recipes, TpAndFsdpTpHoldTheirFractionOfParamsAndState) {
  check_memory(llama_micro(), Mesh::cpu({{"data", 2}, {"model", 4}}), ShardingStrategy::TP);
  check_memory(gpt_micro(), Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}}), ShardingStrategy::FSDP_TP);
}

int64_t grad_bytes(const nn::ParamStore& store) { return store.param_bytes(); }

TEST(Recipes, DdpAllReducesExactlyTheGradientBytesOncePerStep) {
  for (int64_t bucket : {int64_t{0}, int64_t{100000}, int64_t{25} << 20}) {
    Fixture f(gpt_micro());
    TrainStep step(
        f.model.store(), opt(), f.loss, f.batch_types,
        {.mesh = Mesh::cpu({{"data", 8}}), .strategy = ShardingStrategy::DDP, .sharding = {.bucket_bytes = bucket}});
    TrainState s = step.init(0);
    step.program().reset_stats();
    for (int i = 0; i < 2; ++i) step(s, f.batch(i));
    const CollectiveStats& st = step.program().stats();
    auto ar = st.total(CollectiveKind::all_reduce);
    // Every gradient once, plus two f32 scalars of the loss (its sum and its token count).
    EXPECT_EQ(ar.payload_bytes, 2 * 8 * (grad_bytes(f.model.store()) + 8)) << step.collectives_table();
    // Unbucketed: one call per gradient; 100 kB buckets: 4 for the 330 kB of gradients (greedy in
    // param order); 25 MiB: one.
    int64_t buckets = bucket == 0 ? f.model.store().size() : bucket == 100000 ? 4 : 1;
    EXPECT_EQ(ar.calls, 2 * 8 * (buckets + 2)) << "bucket_bytes " << bucket << "\n" << step.collectives_table();
    EXPECT_EQ(st.total(CollectiveKind::all_gather).calls, 0);
    EXPECT_EQ(st.total(CollectiveKind::reduce_scatter).calls, 0);
    EXPECT_EQ(st.total(CollectiveKind::all_to_all).calls, 0);
    EXPECT_NE(step.collectives_table().find("all_reduce over data"), std::string::npos) << step.collectives_table();
  }
}

TEST(Recipes, FsdpGathersParamsAndReduceScattersGradients) {
  Fixture f(gpt_micro());
  TrainStep step(
      f.model.store(), opt(), f.loss, f.batch_types,
      {.mesh = Mesh::cpu({{"data", 8}}), .strategy = ShardingStrategy::FSDP, .sharding = {.fsdp_min_bytes = 1024}});
  TrainState s = step.init(0);
  step.program().reset_stats();
  step(s, f.batch(0));
  int64_t sharded = 0, replicated = 0, lookup_only = 0, tied = 0;
  for (const auto& p : step.plan().params) {
    (p.spec.is_replicated() ? replicated : sharded) += p.type.nbytes();
    if (p.path == "pos_embed.table" && !p.spec.is_replicated()) lookup_only += p.type.nbytes();
    if (p.path == "embed.table" && !p.spec.is_replicated()) tied += p.type.nbytes();
  }
  ASSERT_GT(tied, 0);
  const CollectiveStats& st = step.program().stats();
  // ZeRO-3: each sharded param gathered for the forward pass and again for the backward pass
  // (payload = the gathered param), except the position table, which only a lookup reads (its
  // gradient is a scatter of the cotangents), and the tied embedding, gathered for the lookup,
  // again for the head (not held through the forward pass) and again for the head's backward
  // pass; each gradient reduce-scattered once (payload = the full gradient); replicated params'
  // gradients all-reduced, plus scalars.
  EXPECT_EQ(st.total(CollectiveKind::all_gather).payload_bytes, 8 * (2 * sharded - lookup_only + tied))
      << step.collectives_table();
  // GPT's tied embedding gradient has two summands (the lookup's scatter_add and the logits
  // matmul): they are added as partial sums and reduce-scattered once, like every other gradient.
  EXPECT_EQ(st.total(CollectiveKind::reduce_scatter).payload_bytes, 8 * sharded) << step.collectives_table();
  int64_t ar = st.total(CollectiveKind::all_reduce).payload_bytes / 8;
  EXPECT_GE(ar, replicated) << step.collectives_table();
  EXPECT_LE(ar, replicated + 64) << step.collectives_table();
}

// Sequence parallelism: the activations between blocks split over the sequence on the model axis
// (TP then reduce-scatters and all-gathers them instead of all-reducing); training is unchanged.
TEST(Recipes, SequenceParallelActivationRulesTrainLikeOneDevice) {
  for (const nn::LmConfig& cfg : {gpt_micro(), llama_micro()}) {
    ShardingOptions o;
    o.activation_rules = {{"layer_input", PartitionSpec{"data", "model", none}}};
    ShardingPlan plan =
        check_sharded(run_reference(cfg, 2), Mesh::cpu({{"data", 2}, {"model", 2}}), ShardingStrategy::TP, o);
    ASSERT_EQ(plan.activations.size(), 1u);
    Fixture f(cfg);
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                   px::testing::on_mesh(Mesh::cpu({{"data", 2}, {"model", 2}}), ShardingStrategy::TP, o));
    EXPECT_GT(step.program().program().collectives.size(), 0u);
    // Megatron's pattern: over 'model', activations are gathered over the sequence before the
    // column-parallel matmuls and the row-parallel sums reduce-scattered onto it; no weight is
    // gathered in their place and nothing is moved with all-to-alls.
    int gathers = 0, scatters = 0;
    for (const auto& c : step.program().program().collectives) {
      EXPECT_NE(c.kind, CollectiveKind::all_to_all) << c.to_string() << " " << c.reason;
      if (c.axes != std::vector<std::string>{"model"} || c.operand.rank() != 3) continue;
      if (c.kind == CollectiveKind::all_gather || c.kind == CollectiveKind::reduce_scatter) EXPECT_EQ(c.dim, 1) << c.to_string();
      gathers += c.kind == CollectiveKind::all_gather;
      scatters += c.kind == CollectiveKind::reduce_scatter;
    }
    EXPECT_GE(gathers, 2 * cfg.n_layers) << step.program().program().summary().substr(0, 4000);
    EXPECT_GE(scatters, 2 * cfg.n_layers) << step.program().program().summary().substr(0, 4000);
    for (const auto& c : step.program().program().collectives)
      if (c.kind == CollectiveKind::all_gather && c.axes == std::vector<std::string>{"model"})
        for (const auto& pp : plan.params)
          EXPECT_FALSE(c.reason.find("needs %" + std::to_string(&pp - plan.params.data()) + " as") !=
                           std::string::npos && !pp.spec.is_replicated())
              << "a tensor-parallel weight gathered: " << c.to_string() << " " << c.reason;
  }
  // A spec that does not fit the tagged value is named.
  Fixture f(gpt_micro());
  ShardingOptions bad;
  bad.activation_rules = {{"layer_input", PartitionSpec{none, none, none, "model"}}};
  try {
    TrainStep s(f.model.store(), opt(), f.loss, f.batch_types,
                px::testing::on_mesh(Mesh::cpu({{"data", 2}, {"model", 2}}), ShardingStrategy::TP, bad));
    FAIL() << "a rank-4 spec fit a rank-3 value";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tagged value 'layer_input'"), std::string::npos) << e.what();
  }
}

TEST(Recipes, ManualRulesOverrideAnyStrategy) {
  Fixture f(gpt_micro());
  Mesh mesh = Mesh::cpu({{"data", 2}, {"model", 4}});
  ShardingOptions o;
  o.rules = {{"*.mlp.fc.w", PartitionSpec{none, "model"}}, {"*.mlp.proj.w", PartitionSpec{"model", none}}};
  TrainStep manual(f.model.store(), opt(), f.loss, f.batch_types,
                   px::testing::on_mesh(mesh, ShardingStrategy::MANUAL, o));
  int hits = 0;
  for (const auto& p : manual.plan().params) {
    if (ends_with(p.path, "mlp.fc.w")) {
      EXPECT_EQ(p.spec, (PartitionSpec{none, "model"}));
      ++hits;
    } else if (ends_with(p.path, "mlp.proj.w")) {
      EXPECT_EQ(p.spec, (PartitionSpec{"model", none}));
      ++hits;
    } else {
      EXPECT_TRUE(p.spec.is_replicated()) << p.path;
    }
  }
  EXPECT_EQ(hits, 4);
  // An override on top of FSDP: keep the embedding replicated.
  ShardingOptions o2{.fsdp_min_bytes = 1024, .rules = {{"embed*", PartitionSpec{}}}};
  Fixture g(gpt_micro());
  auto fwd = nn::trace_with_params(
      g.model.store(), [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{g.loss(b)}; }, g.batch_types);
  ShardingPlan plan =
      plan_sharding(*fwd, g.model.store().paths(), Mesh::cpu({{"data", 8}}), ShardingStrategy::FSDP, o2);
  bool saw_rule = false;
  for (const auto& p : plan.params)
    if (p.reason.rfind("rule", 0) == 0) {
      saw_rule = true;
      EXPECT_TRUE(p.spec.is_replicated());
    }
  EXPECT_TRUE(saw_rule) << plan.table();
  check_equivalent(gpt_micro(), Mesh::cpu({{"data", 2}, {"model", 2}}), ShardingStrategy::MANUAL, o);
}

void expect_plan_error(const ShardingOptions& o, const Mesh& mesh, ShardingStrategy s,
                       const std::vector<std::string>& parts) {
  Fixture f(gpt_micro());
  auto fwd = nn::trace_with_params(
      f.model.store(), [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{f.loss(b)}; }, f.batch_types);
  try {
    plan_sharding(*fwd, f.model.store().paths(), mesh, s, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST(Recipes, BadSpecsAreReportedAtPlanTime) {
  Mesh mesh = Mesh::cpu({{"data", 2}, {"model", 4}});
  // Unknown axis: names the param and the mesh's axes.
  expect_plan_error({.rules = {{"*.mlp.fc.w", PartitionSpec{none, "tensor"}}}}, mesh, ShardingStrategy::MANUAL,
                    {"mlp.fc.w", "'tensor'", "'model'"});
  // Not divisible: gpt_micro's layer-norm scale has 64 entries; 3-way split fails.
  expect_plan_error({.rules = {{"*.mlp.fc.w", PartitionSpec{none, {"data", "model"}}}}},
                    Mesh::cpu({{"data", 3}, {"model", 4}}), ShardingStrategy::MANUAL,
                    {"mlp.fc.w", "dim 1", "divisible"});
  // Strategy needs an axis the mesh lacks.
  expect_plan_error({}, Mesh::cpu({{"data", 8}}), ShardingStrategy::TP, {"'model'", "TP"});
  expect_plan_error({}, Mesh::cpu({{"model", 8}}), ShardingStrategy::DDP, {"'data'", "DDP"});
}

TEST(Recipes, JitShardsAPlainFunctionWhoseFirstArgumentIsTheParams) {
  Array w1 = testing::random_array({16, 32}, DType::f32, 1), w2 = testing::random_array({32, 16}, DType::f32, 2);
  Array x = testing::random_array({8, 16}, DType::f32, 3);
  auto mlp = [](const std::vector<Tensor>& p, const std::vector<Tensor>& a) {
    return std::vector<Tensor>{sum(square(matmul(gelu(matmul(a[0], p[0])), p[1])))};
  };
  std::vector<Array> want;
  {
    auto g = trace(
        [&](const std::vector<Tensor>& in) {
          return mlp({in[0], in[1]}, {in[2]});
        },
        {w1.type(), w2.type(), x.type()});
    want = Executable::compile(*g)->run({w1, w2, x});
  }
  for (ShardingStrategy s : {ShardingStrategy::DDP, ShardingStrategy::FSDP, ShardingStrategy::TP,
                             ShardingStrategy::FSDP_TP, ShardingStrategy::AUTO}) {
    ShardingOptions o{.fsdp_min_bytes = 0};
    o.auto_cluster = "h100x8";
    auto f = jit(mlp, s, {w1.type(), w2.type()}, {"fc1", "fc2"}, {x.type()}, Mesh::cpu({{"data", 2}, {"model", 4}}), o);
    if (s == ShardingStrategy::AUTO) {
      EXPECT_EQ(f->plan().strategy, ShardingStrategy::AUTO);
      EXPECT_NE(f->plan().explanation.find("why: "), std::string::npos) << f->plan().explanation;
    }
    if (s == ShardingStrategy::TP) {
      EXPECT_EQ(f->plan().params[0].spec, (PartitionSpec{none, "model"}));
      EXPECT_EQ(f->plan().params[1].spec, (PartitionSpec{"model", none}));
    }
    std::vector<Array> got = (*f)({w1, w2}, {x});
    EXPECT_TRUE(testing::all_close(got[0].to_f32(), want[0].to_f32(), 1e-4, 1e-5)) << strategy_name(s);
  }
}

TEST(Recipes, ForwardFnOnAMeshGivesTheOneDeviceLogits) {
  Fixture f(llama_micro());
  TensorType tok = f.batch_types[0];
  auto fn = [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{f.model.logits(b[0])}; };
  std::vector<Array> params = f.model.init(0), batch = {f.batch(0)[0]};
  std::vector<Array> want = ForwardFn(f.model.store(), fn, {tok})(params, batch);
  ForwardFn sharded(f.model.store(), fn, {tok},
                    {.mesh = Mesh::cpu({{"data", 2}, {"model", 4}}),
                     .strategy = ShardingStrategy::FSDP_TP,
                     .sharding = {.fsdp_min_bytes = 1024}});
  std::vector<Array> got = sharded(params, batch);
  EXPECT_TRUE(testing::all_close(got[0].to_f32(), want[0].to_f32(), 1e-5, 1e-4));
  // The head is vocab-parallel: its logits come out split over 'model' on the last dim.
  EXPECT_EQ(sharded.sharded().executable().out_sharding(0).spec[2], std::vector<std::string>{"model"});
}

TEST(Recipes, GlobMatch) {
  EXPECT_TRUE(glob_match("*.mlp.*", "blocks.0.mlp.fc.w"));
  EXPECT_TRUE(glob_match("blocks.?.attn.wq", "blocks.1.attn.wq"));
  EXPECT_FALSE(glob_match("blocks.?.attn.wq", "blocks.10.attn.wq"));
  EXPECT_FALSE(glob_match("*.b", "blocks.0.mlp.fc.w"));
  EXPECT_TRUE(glob_match("*", ""));
}

}  // namespace
}  // namespace px
