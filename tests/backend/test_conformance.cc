// Backend conformance, in the style of ggml's test-backend-ops: the suite of
// include/parallax/testing/conformance.h (every primitive x dtype x a few shapes, forward and vjp,
// compared with the `ref` backend within a per-dtype tolerance) runs on every registered platform
// but `ref`, so a backend registered with px::register_backend is checked here without editing
// this file. Every registered primitive must appear in some case's graph (or be excluded with a
// reason), so a new primitive without a case fails here, by name. A summary table (primitive x
// dtype) is printed per platform. Then a tiny GPT and a tiny Llama train on each platform as on
// ref:1, and DDP and FSDP on ref:2 as on ref:1.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "ir/primitive.h"
#include "parallax/backend.h"
#include "parallax/nn.h"
#include "parallax/optim.h"
#include "parallax/sharding.h"
#include "parallax/spmd.h"
#include "parallax/testing/conformance.h"
#include "sharding/prims.h"
#include "testing.h"

namespace px {
namespace {

using namespace conformance;

// Primitives the backends' kernels never run: the runtime runs collectives through a
// communicator and transfers through the backend's copy stream.
const std::map<std::string, std::string> kExcluded = {
    {"all_gather", "collective: run by the runtime's communicator, not a backend kernel"},
    {"all_reduce", "collective: run by the runtime's communicator, not a backend kernel"},
    {"all_to_all", "collective: run by the runtime's communicator, not a backend kernel"},
    {"collective_permute", "collective: run by the runtime's communicator, not a backend kernel"},
    {"reduce_scatter", "collective: run by the runtime's communicator, not a backend kernel"},
    {"transfer", "memory-kind copy: run by the backend's copy stream, not a kernel"},
    {"local_slice",
     "emitted only by the SPMD partitioner into per-device programs (it reads the device's mesh coordinates): "
     "checked on a 2-device mesh by BackendConformance.LocalSliceRunsAsOnRef"},
};

// Cases that emit a primitive with attributes no public op sets (emit1, an internal call), so they
// are not in the installed suite: run here as well.
const std::vector<Case>& internal_cases() {
  using D = DType;
  const Shape s357{3, 5, 7};
  static const std::vector<Case> table = {
      // The f32 sum of 16-bit values that compile makes of a bias gradient under bf16.
      {"reduce_sum_out_dtype",
       {D::bf16, D::f16},
       {{x(s357)}},
       [](const Ts& a, DType) -> Ts {
         return {emit1("reduce_sum", {a[0]}, Attrs{{"axes", std::vector<int64_t>{1}}, {"out_dtype", D::f32}}),
                 emit1("reduce_sum", {a[0]}, Attrs{{"axes", std::vector<int64_t>{0, 2}}, {"out_dtype", D::f32}})};
       },
       "reduce_sum"},
  };
  return table;
}

std::vector<Case> all_cases() {
  std::vector<Case> all = cases();
  all.insert(all.end(), internal_cases().begin(), internal_cases().end());
  return all;
}

// The platforms under test: every registered one but the reference (read when the tests are
// listed, so a backend registered before then, e.g. by a static initializer, is one of them).
std::vector<std::string> platforms_under_test() {
  std::vector<std::string> p = backend_platforms();
  p.erase(std::remove(p.begin(), p.end(), std::string("ref")), p.end());
  return p;
}

// The primitives the cases' forward and vjp graphs contain (tracing only, nothing runs).
std::set<std::string> traced_primitives() {
  std::set<std::string> seen;
  for (const Case& c : all_cases())
    for (DType dt : c.dtypes)
      for (const auto& v : c.variants) {
        std::vector<TensorType> types;
        for (const In& in : v) types.push_back({in.dtype.value_or(dt), in.shape});
        try {
          auto fwd = trace([&](const std::vector<Tensor>& a) { return c.fn(a, dt); }, types);
          add_prims(*fwd, seen);
          std::vector<TensorType> ct;
          if (auto bwd = vjp_graph(c, dt, types, *fwd, &ct)) add_prims(*bwd, seen);
        } catch (const std::exception&) {
          // reported by the forward/vjp test
        }
      }
  return seen;
}

// The registered primitives that neither `seen` nor the excluded list holds.
std::string uncovered(const std::set<std::string>& seen) {
  ensure_sharding_registered();
  std::string missing;
  for (const std::string& name : primitive_names())
    if (!seen.count(name) && !kExcluded.count(name)) missing += " " + name;
  return missing;
}

TEST(Conformance, EveryPrimitiveHasACaseOrIsExcluded) {
  const std::set<std::string> seen = traced_primitives();
  const std::string missing = uncovered(seen);
  EXPECT_TRUE(missing.empty()) << "registered primitives that no conformance case exercises (add a case to "
                                  "include/parallax/testing/conformance.h, or exclude them with a reason):"
                               << missing;
  for (const auto& [name, why] : kExcluded) {
    EXPECT_FALSE(seen.count(name)) << name << " is excluded but a case uses it";
    std::cout << "excluded: " << name << ": " << why << "\n";
  }
}

// The checks themselves: a primitive without a case is named; a difference beyond the tolerance
// is caught; ref programs really run on the ref backend (which never fuses) and cpu ones do not.
TEST(Conformance, TheChecksCatchWhatTheyShould) {
  std::set<std::string> seen = traced_primitives();
  seen.erase("softmax");
  EXPECT_EQ(uncovered(seen), " softmax");

  Array want = Array::from_f32({1.0f, 2.0f, -3.0f}, {3});
  EXPECT_EQ(compare(want, want.clone(), 1), "");
  EXPECT_NE(compare(Array::from_f32({1.0f, 2.0f, -3.0001f}, {3}), want, 1), "");
  EXPECT_EQ(compare(Array::from_f32({1.0f, 2.0f, -3.01f}, {3}, DType::bf16), want.astype(DType::bf16), 1), "");
  EXPECT_NE(compare(Array::from_f32({1.0f, 2.0f, -3.1f}, {3}, DType::bf16), want.astype(DType::bf16), 1), "");
  EXPECT_NE(compare(Array::from_i32({1, 2, 4}, {3}), Array::from_i32({1, 2, 3}, {3}), 1), "");

  auto g = trace([](const std::vector<Tensor>& a) { return std::vector<Tensor>{exp(a[0]) * 2.0 + 1.0}; },
                 {{DType::f32, {3, 5}}});
  CompileOptions o;
  EXPECT_GT(Executable::compile(*g, o)->num_fused_groups(), 0);
  o.platform = "ref";
  EXPECT_EQ(Executable::compile(*g, o)->num_fused_groups(), 0);
}

// A backend of one's own, as a third party's test checks it: the CPU's kernels behind another
// platform name, optionally with every f32 result off by one in its first element.
class WrappedCpu final : public Backend {
 public:
  explicit WrappedCpu(bool wrong) : wrong_(wrong) {}
  std::string name() const override { return wrong_ ? "cpu_wrong" : "cpu_wrapped"; }
  bool can_fuse(const Graph& g, const Node& n) const override { return cpu_backend().can_fuse(g, n); }
  bool has_kernel(const Primitive* p) const override { return cpu_backend().has_kernel(p); }
  Kernel make_kernel(const Graph& g, const Unit& unit, const Placement& device) override {
    Kernel k = cpu_backend().make_kernel(g, unit, device);
    if (!wrong_ || unit.nodes.empty()) return k;
    // The unit's first result (a node's results in its order; a fused group's in out_values').
    const std::vector<int>& outs = unit.kind == Unit::Kind::fused ? unit.out_values : g.nodes()[unit.nodes[0]].outputs;
    const TensorType t = g.type(outs[0]);
    if (t.dtype != DType::f32 || t.numel() == 0) return k;
    return [k](const void* const* in, void* const* out) {
      k(in, out);
      static_cast<float*>(out[0])[0] += 1.0f;
    };
  }
  int64_t scratch_bytes(const Graph& g, const Unit& unit, const Placement& device) const override {
    return cpu_backend().scratch_bytes(g, unit, device);
  }
  Event copy(std::vector<CopyJob> jobs) override { return cpu_backend().copy(std::move(jobs)); }
  int num_threads() const override { return cpu_backend().num_threads(); }
  FusionLimits fusion() const override { return cpu_backend().fusion(); }

 private:
  bool wrong_;
};

TEST(Conformance, ABackendOfOnesOwnRunsTheInstalledSuite) {
  static WrappedCpu right(false), wrong(true);
  if (!has_backend("cpu_wrapped")) register_backend("cpu_wrapped", []() -> Backend& { return right; });
  if (!has_backend("cpu_wrong")) register_backend("cpu_wrong", []() -> Backend& { return wrong; });
  Options only;
  only.filter = [](const Case& c) { return c.name == "exp" || c.name == "dot_general"; };
  const Report ok = check_backend("cpu_wrapped", only);
  EXPECT_TRUE(ok.ok()) << ok.failures.front();
  EXPECT_GT(ok.passed, 0);
  EXPECT_TRUE(ok.ran.count("exp") && ok.ran.count("dot_general"));
  EXPECT_NE(ok.table().find("| exp | fwd 3/3, vjp 3/3 |"), std::string::npos) << ok.table();

  const Report bad = check_backend("cpu_wrong", only);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.failures.front().find("cpu_wrong"), std::string::npos) << bad.failures.front();
  EXPECT_NE(bad.table().find("FAIL"), std::string::npos) << bad.table();
  EXPECT_THROW(check_backend("no_such_platform"), Error);
}

class BackendConformance : public ::testing::TestWithParam<std::string> {};

TEST_P(BackendConformance, MatchesRefForwardAndVjp) {
  ensure_sharding_registered();
  const auto t0 = std::chrono::steady_clock::now();
  const Report r = run_cases(all_cases(), GetParam());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (const std::string& f : r.failures) ADD_FAILURE() << f;
  std::cout << "\n" << r.table() << "\n(" << s << " s)\n";
  // Traced primitives that compilation removes or rewrites (CSE/DCE, identities), so that no kernel
  // of theirs ran: informational, the traced graph is what the coverage test counts.
  std::string not_run;
  for (const std::string& p : r.traced)
    if (!r.ran.count(p)) not_run += " " + p;
  std::cout << "traced but never reached a " << GetParam()
            << " kernel (removed or rewritten by compile):" << (not_run.empty() ? " none" : not_run) << "\n";
}

// local_slice: a replicated value constrained to a split over 'data' makes the partitioner take
// each device's block with local_slice; the platform's two devices give the same blocks as ref:2.
TEST_P(BackendConformance, LocalSliceRunsAsOnRef) {
  for (DType dt : {DType::f32, DType::bf16, DType::i32, DType::boolean}) {
    auto g = trace(
        [](const std::vector<Tensor>& a) {
          return std::vector<Tensor>{with_sharding_constraint(a[0], PartitionSpec{"data"}),
                                     with_sharding_constraint(a[0], PartitionSpec{none, "data"})};
        },
        {{dt, {6, 4}}});
    Array in = make_input(In{{6, 4}, -3, 3}, dt, seed_of("local_slice"));
    std::vector<std::vector<Array>> outs;
    for (const std::string& platform : {GetParam(), std::string("ref")}) {
      auto exe = ShardedExecutable::compile(*g, Mesh::create({{"data", 2}}, DeviceSet{platform, 2}), {PartitionSpec{}});
      std::set<std::string> prims;
      add_prims(*exe->program().local, prims);
      EXPECT_TRUE(prims.count("local_slice")) << platform << ": the local program has no local_slice\n"
                                              << exe->program().summary();
      outs.push_back(exe->run_full({in}));
    }
    for (size_t o = 0; o < outs[0].size(); ++o)
      EXPECT_EQ(compare(outs[0][o], outs[1][o], 1, GetParam()), "")
          << "local_slice " << dtype_name(dt) << " output " << o;
  }
}

// ---- models ----------------------------------------------------------------------------------

Array random_tokens(const Shape& s, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(numel(s)));
  for (auto& t : v) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return Array::from_i32(v, s);
}

nn::LmConfig gpt_conf() { return nn::gpt2_config("gpt_conformance", 64, 32, 2, 2, 64, 8); }
nn::LmConfig llama_conf() { return nn::llama_config("llama_conformance", 64, 32, 4, 2, 2, 64, 8); }
constexpr int kSteps = 5;
constexpr int64_t kBatch = 4;

// Losses and gradient norms of kSteps AdamW steps on `mesh` with `strategy`.
std::vector<StepMetrics> train(const nn::LmConfig& cfg, const Mesh& mesh, ShardingStrategy strategy) {
  nn::TransformerLm model(cfg);
  std::vector<TensorType> batch_types{{DType::i32, {kBatch, cfg.max_seq_len}}, {DType::i32, {kBatch, cfg.max_seq_len}}};
  TrainStep::LossFn loss = [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); };
  ShardingOptions sopt;
  sopt.fsdp_min_bytes = 256;  // split every matrix and embedding
  auto opt = optim::adamw({.lr = 1e-2, .eps = 1e-5, .weight_decay = 0.1});
  TrainStep step(model.store(), opt, loss, batch_types, testing::on_mesh(mesh, strategy, sopt));
  TrainState st = step.init(0);
  // The ref backend never fuses (cpu does): the step really runs on the mesh's platform.
  if (!backend_for(mesh.platform()).fusion().enabled)
    EXPECT_EQ(step.executable().num_fused_groups(), 0) << cfg.name << " on " << mesh.to_string();
  else if (mesh.platform() == "cpu")
    EXPECT_GT(step.executable().num_fused_groups(), 0) << cfg.name << " on " << mesh.to_string();
  if (mesh.size() > 1) {
    std::set<std::string> prims;
    add_prims(step.executable().graph(), prims);
    std::string list;
    for (const auto& p : prims) list += " " + p;
    std::cout << cfg.name << " " << strategy_name(strategy) << " on " << mesh.to_string() << " runs:" << list << "\n";
    int split = 0;
    for (const auto& p : step.plan().params) split += !p.spec.is_replicated();
    if (strategy == ShardingStrategy::FSDP) EXPECT_GT(split, 0) << cfg.name << ": FSDP split no param";
  }
  std::vector<StepMetrics> m;
  for (int i = 0; i < kSteps; ++i)
    m.push_back(step(st, {random_tokens(batch_types[0].shape, cfg.vocab_size, 10 + 2 * i),
                          random_tokens(batch_types[1].shape, cfg.vocab_size, 11 + 2 * i)}));
  return m;
}

void expect_same_losses(const std::vector<StepMetrics>& want, const std::vector<StepMetrics>& got,
                        const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got[i].loss)) << what << " step " << i;
    EXPECT_NEAR(want[i].loss, got[i].loss, 1e-5 * std::abs(want[i].loss)) << what << " step " << i;
    EXPECT_NEAR(want[i].grad_norm, got[i].grad_norm, 1e-4 * std::abs(want[i].grad_norm)) << what << " step " << i;
  }
}

// The losses on ref:1, trained once per model.
const std::vector<StepMetrics>& on_ref1(const nn::LmConfig& cfg) {
  static std::map<std::string, std::vector<StepMetrics>> done;
  auto it = done.find(cfg.name);
  if (it == done.end())
    it = done.emplace(cfg.name, train(cfg, Mesh::create({{"data", 1}}, DeviceSet{"ref", 1}), ShardingStrategy::DDP))
             .first;
  return it->second;
}

// The model trains on platform:1 as on ref:1.
void check_model(const nn::LmConfig& cfg, const std::string& platform) {
  const auto& ref1 = on_ref1(cfg);
  const auto got = train(cfg, Mesh::create({{"data", 1}}, DeviceSet{platform, 1}), ShardingStrategy::DDP);
  expect_same_losses(got, ref1, cfg.name + ": ref:1 vs " + platform + ":1");
  std::cout.precision(9);
  for (size_t i = 0; i < ref1.size(); ++i)
    std::cout << cfg.name << " step " << i << ": loss " << platform << ":1 " << got[i].loss << ", ref:1 "
              << ref1[i].loss << "\n";
}

// DDP and FSDP on ref:2 as on ref:1.
void check_model_sharded_on_ref(const nn::LmConfig& cfg) {
  const auto& ref1 = on_ref1(cfg);
  const Mesh ref2 = Mesh::create({{"data", 2}}, DeviceSet{"ref", 2});
  expect_same_losses(ref1, train(cfg, ref2, ShardingStrategy::DDP), cfg.name + ": DDP on ref:2 vs ref:1");
  expect_same_losses(ref1, train(cfg, ref2, ShardingStrategy::FSDP), cfg.name + ": FSDP on ref:2 vs ref:1");
}

class ConformanceModels : public ::testing::TestWithParam<std::string> {};

TEST_P(ConformanceModels, TinyGptTrainsAsOnRef) { check_model(gpt_conf(), GetParam()); }
TEST_P(ConformanceModels, TinyLlamaTrainsAsOnRef) { check_model(llama_conf(), GetParam()); }
TEST(ConformanceModelsOnRef, TinyGptShardedOnRef2AsOnRef1) { check_model_sharded_on_ref(gpt_conf()); }
TEST(ConformanceModelsOnRef, TinyLlamaShardedOnRef2AsOnRef1) { check_model_sharded_on_ref(llama_conf()); }

std::string param_name(const ::testing::TestParamInfo<std::string>& info) { return info.param; }
INSTANTIATE_TEST_SUITE_P(Registered, BackendConformance, ::testing::ValuesIn(platforms_under_test()), param_name);
INSTANTIATE_TEST_SUITE_P(Registered, ConformanceModels, ::testing::ValuesIn(platforms_under_test()), param_name);

}  // namespace
}  // namespace px
