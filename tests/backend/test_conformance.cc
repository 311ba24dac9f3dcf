// Backend conformance, in the style of ggml's test-backend-ops: every primitive x dtype x a few
// shapes runs on the `cpu` backend and on the `ref` backend (src/backend/ref/ref.h: plain loops in
// double, rounded to the dtype) and the results are compared within a per-dtype tolerance, forward and
// vjp. Every registered primitive must appear in some case's graph (or be excluded with a reason),
// so a new primitive without a case fails here, by name. A summary table (primitive x dtype) is
// printed at the end. Then a tiny GPT and a tiny Llama train on ref:1 as on cpu:1, and DDP and
// FSDP on ref:2 as on ref:1.
//
// Tolerances (|cpu - ref| <= atol * max(1, max|ref|) + rtol * |ref|, elementwise; NaN == NaN and
// equal infinities pass; max|ref| is over the whole output, so an entry that cancels to ~0 in a
// 16-bit result is judged against the output's scale, not its own):
//   f32   atol 1e-5, rtol 1e-5    (cpu's vectorized exp/tanh/... are a few ulps off; sums reorder)
//   bf16  atol 1e-2, rtol 1e-2    (~1 bf16 ulp = 2^-8 .. 2^-7 relative: both round once, from f32
//                                  on cpu and from double on ref, which may differ by one ulp)
//   f16   atol 2e-3, rtol 2e-3    (~1-2 f16 ulps, 2^-11 .. 2^-10 relative)
//   i32, bool: exact.
// Cases with long reductions (sums over >= 100 terms, matmuls) scale the float tolerances by
// Case::tol. VJP graphs chain several primitives, each rounding to the dtype, so their float
// tolerances are 4x the forward ones (4 roundings' worth).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "conformance_cases.h"
#include "ir/primitive.h"
#include "parallax/nn.h"
#include "parallax/optim.h"
#include "parallax/sharding.h"
#include "parallax/spmd.h"
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
     "checked on a 2-device mesh by Conformance.LocalSliceRunsOnRefAsOnCpu"},
};

// ---- tolerances ----------------------------------------------------------------------------

struct Tol {
  double atol = 0, rtol = 0;
};
Tol tolerance(DType d, double scale) {
  switch (d) {
    case DType::f32:
      return {1e-5 * scale, 1e-5 * scale};
    case DType::bf16:
      return {1e-2 * scale, 1e-2 * scale};
    case DType::f16:
      return {2e-3 * scale, 2e-3 * scale};
    default:
      return {0, 0};
  }
}
constexpr double kVjpTolFactor = 4;

// ---- inputs --------------------------------------------------------------------------------

uint32_t seed_of(const std::string& s) {
  uint32_t h = 2166136261u;  // FNV-1a: stable across runs and platforms
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

// Deterministic pseudo-random values of `in`'s dtype (dflt when In::dtype is unset).
Array make_input(const In& in, DType dflt, uint32_t seed) {
  const DType dt = in.dtype.value_or(dflt);
  std::mt19937 rng(seed);
  const int64_t n = numel(in.shape);
  if (dt == DType::boolean || dt == DType::i32) {
    std::uniform_int_distribution<int32_t> u(static_cast<int32_t>(std::ceil(in.lo)),
                                             static_cast<int32_t>(std::floor(in.hi)));
    std::bernoulli_distribution b(0.5);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (auto& x : v) x = dt == DType::boolean ? static_cast<int32_t>(b(rng)) : u(rng);
    Array a = Array::from_i32(v, in.shape);
    return dt == DType::boolean ? a.astype(DType::boolean) : a;
  }
  std::uniform_real_distribution<double> u(in.lo, in.hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<float>(in.integral ? std::round(u(rng)) : u(rng));
  return Array::from_f32(v, in.shape, dt);
}

// ---- comparison ----------------------------------------------------------------------------

// "" when equal within tolerance, else the first differing element.
std::string compare(const Array& cpu, const Array& ref, double scale) {
  if (cpu.type() != ref.type()) return "types differ: cpu " + type_str(cpu.type()) + ", ref " + type_str(ref.type());
  std::ostringstream os;
  if (!is_float(cpu.dtype())) {
    std::vector<int32_t> a = cpu.to_i32(), b = ref.to_i32();
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i] != b[i]) {
        os << "index " << i << ": cpu " << a[i] << ", ref " << b[i] << " (exact)";
        return os.str();
      }
    return "";
  }
  std::vector<float> a = cpu.to_f32(), b = ref.to_f32();
  double mx = 1;
  for (float v : b)
    if (std::isfinite(v)) mx = std::max(mx, static_cast<double>(std::fabs(v)));
  const Tol t = tolerance(cpu.dtype(), scale);
  int bad = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if ((std::isnan(a[i]) && std::isnan(b[i])) || (std::isinf(a[i]) && a[i] == b[i])) continue;
    if (std::fabs(a[i] - b[i]) <= t.atol * mx + t.rtol * std::fabs(b[i])) continue;
    if (bad++ == 0) {
      os.precision(9);
      os << "index " << i << ": cpu " << a[i] << ", ref " << b[i] << " (|diff| " << std::fabs(a[i] - b[i]) << " > atol "
         << t.atol << " * " << mx << " + rtol " << t.rtol << " * |ref|)";
    }
  }
  if (bad > 1) os << "; " << bad << " of " << a.size() << " elements differ";
  return os.str();
}

// ---- running a case ------------------------------------------------------------------------

std::vector<TensorType> types_of(const std::vector<Array>& xs) { return testing::types_of(xs); }

void add_prims(const Graph& g, std::set<std::string>& seen) {
  for (const Node& n : g.nodes()) seen.insert(n.prim->name);
}

// Compiles g for `platform` and runs it; adds the primitives of the compiled program to `ran`.
std::vector<Array> run_on(const Graph& g, const std::string& platform, const std::vector<Array>& in,
                          std::set<std::string>& ran) {
  CompileOptions o;
  o.platform = platform;
  auto exe = Executable::compile(g, o);
  // The ref backend never fuses: a fused group would mean the program ran elsewhere.
  if (platform == "ref" && exe->num_fused_groups() != 0) throw Error("the ref program has fused groups");
  add_prims(exe->graph(), ran);
  return exe->run(in);
}

// The vjp program of a case: inputs, then one cotangent per float output; outputs the gradients
// of sum_k <out_k, ct_k> with respect to the float inputs. Null when the case has none.
std::unique_ptr<Graph> vjp_graph(const Case& c, DType dt, const std::vector<TensorType>& in_types, const Graph& fwd,
                                 std::vector<TensorType>* ct_types) {
  std::vector<int> wrt;
  for (size_t i = 0; i < in_types.size(); ++i)
    if (is_float(in_types[i].dtype)) wrt.push_back(static_cast<int>(i));
  std::vector<int> outs;
  for (size_t o = 0; o < fwd.outputs().size(); ++o)
    if (is_float(fwd.type(fwd.outputs()[o]).dtype)) outs.push_back(static_cast<int>(o));
  if (!c.vjp || wrt.empty() || outs.empty()) return nullptr;
  ct_types->clear();
  for (int o : outs) ct_types->push_back(fwd.type(fwd.outputs()[o]));
  std::vector<TensorType> all = in_types;
  all.insert(all.end(), ct_types->begin(), ct_types->end());
  const size_t n_in = in_types.size();
  return trace(
      [&](const std::vector<Tensor>& a) {
        std::vector<Tensor> xs(a.begin(), a.begin() + static_cast<long>(n_in));
        std::vector<Tensor> ys = c.fn(xs, dt), fys, dys, wx;
        for (size_t k = 0; k < outs.size(); ++k) {
          fys.push_back(ys[outs[k]]);
          dys.push_back(a[n_in + k]);
        }
        for (int w : wrt) wx.push_back(xs[w]);
        return gradients(fys, wx, dys);
      },
      all);
}

// Results, for the summary: [row primitive][dtype] -> counts.
struct Counts {
  int fwd_pass = 0, fwd_fail = 0, vjp_pass = 0, vjp_fail = 0;
};
using Summary = std::map<std::string, std::map<DType, Counts>>;

// Runs graph g on cpu and ref and compares; returns "" or what went wrong.
// `ran` collects the primitives of the compiled ref programs.
std::string check_graph(const Graph& g, const std::vector<Array>& in, double scale, std::set<std::string>& ran) {
  std::vector<Array> a, b;
  std::set<std::string> on_cpu;
  try {
    a = run_on(g, "cpu", in, on_cpu);
  } catch (const std::exception& e) {
    return std::string("cpu threw: ") + e.what();
  }
  try {
    b = run_on(g, "ref", in, ran);
  } catch (const std::exception& e) {
    return std::string("ref threw: ") + e.what();
  }
  if (a.size() != b.size()) return "output counts differ";
  std::string msg;
  for (size_t o = 0; o < a.size(); ++o) {
    std::string m = compare(a[o], b[o], scale);
    if (!m.empty()) msg += (msg.empty() ? "" : "\n    ") + ("output " + std::to_string(o) + ": " + m);
  }
  return msg;
}

const char* short_name(DType d) { return dtype_name(d); }

std::string variant_str(const std::vector<Array>& in) {
  std::string s;
  for (const Array& a : in) s += (s.empty() ? "" : ", ") + type_str(a.type());
  return "(" + s + ")";
}

// Runs every case; records failures (ADD_FAILURE) and the summary; collects the primitives seen.
void run_all(Summary& summary, std::set<std::string>& seen, std::set<std::string>& ran) {
  for (const Case& c : cases()) {
    const std::string row = c.prim.empty() ? c.name : c.prim;
    for (DType dt : c.dtypes) {
      for (size_t vi = 0; vi < c.variants.size(); ++vi) {
        const std::string what = c.name + " " + short_name(dt) + " variant " + std::to_string(vi);
        std::vector<Array> in;
        for (size_t k = 0; k < c.variants[vi].size(); ++k)
          in.push_back(make_input(c.variants[vi][k], dt, seed_of(what + "#" + std::to_string(k))));
        std::unique_ptr<Graph> fwd;
        try {
          fwd = trace([&](const std::vector<Tensor>& a) { return c.fn(a, dt); }, types_of(in));
        } catch (const std::exception& e) {
          ADD_FAILURE() << what << " " << variant_str(in) << ": the case does not trace: " << e.what();
          summary[row][dt].fwd_fail++;
          continue;
        }
        add_prims(*fwd, seen);
        std::string m = check_graph(*fwd, in, c.tol, ran);
        (m.empty() ? summary[row][dt].fwd_pass : summary[row][dt].fwd_fail)++;
        if (!m.empty()) ADD_FAILURE() << "[forward] " << what << " " << variant_str(in) << ":\n    " << m;

        std::vector<TensorType> ct_types;
        std::unique_ptr<Graph> bwd;
        const std::string vrow = c.vjp_prim.empty() ? row : c.vjp_prim;
        try {
          bwd = vjp_graph(c, dt, types_of(in), *fwd, &ct_types);
        } catch (const std::exception& e) {
          ADD_FAILURE() << "[vjp] " << what << ": the gradient does not trace: " << e.what();
          summary[vrow][dt].vjp_fail++;
          continue;
        }
        if (!bwd) continue;
        add_prims(*bwd, seen);
        std::vector<Array> bin = in;
        for (size_t k = 0; k < ct_types.size(); ++k)
          bin.push_back(
              make_input(In{ct_types[k].shape, -1, 1}, ct_types[k].dtype, seed_of(what + "#ct" + std::to_string(k))));
        m = check_graph(*bwd, bin, c.tol * kVjpTolFactor, ran);
        (m.empty() ? summary[vrow][dt].vjp_pass : summary[vrow][dt].vjp_fail)++;
        if (!m.empty()) ADD_FAILURE() << "[vjp] " << what << " " << variant_str(in) << ":\n    " << m;
      }
    }
  }
}

std::string summary_table(const Summary& s) {
  const std::vector<DType> cols = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean};
  std::ostringstream os;
  os << "Backend conformance, cpu vs ref: passed/run per primitive and dtype (fwd = forward, vjp = gradient)\n\n";
  os << "| primitive |";
  for (DType d : cols) os << " " << dtype_name(d) << " |";
  os << "\n|---|";
  for (size_t i = 0; i < cols.size(); ++i) os << "---|";
  os << "\n";
  for (const auto& [prim, by_dt] : s) {
    os << "| " << prim << " |";
    for (DType d : cols) {
      auto it = by_dt.find(d);
      if (it == by_dt.end()) {
        os << " - |";
        continue;
      }
      const Counts& c = it->second;
      std::string cell;
      if (c.fwd_pass + c.fwd_fail)
        cell += "fwd " + std::to_string(c.fwd_pass) + "/" + std::to_string(c.fwd_pass + c.fwd_fail);
      if (c.vjp_pass + c.vjp_fail)
        cell += std::string(cell.empty() ? "" : ", ") + "vjp " + std::to_string(c.vjp_pass) + "/" +
                std::to_string(c.vjp_pass + c.vjp_fail);
      if (c.fwd_fail + c.vjp_fail) cell += " FAIL";
      os << " " << cell << " |";
    }
    os << "\n";
  }
  return os.str();
}

// The primitives the cases' forward and vjp graphs contain (tracing only, nothing runs).
std::set<std::string> traced_primitives() {
  std::set<std::string> seen;
  for (const Case& c : cases())
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
                                  "tests/backend/conformance_cases.h, or exclude them with a reason):"
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

TEST(Conformance, CpuMatchesRefForwardAndVjp) {
  ensure_sharding_registered();
  Summary summary;
  std::set<std::string> seen, ran;
  const auto t0 = std::chrono::steady_clock::now();
  run_all(summary, seen, ran);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cout << "\n" << summary_table(summary) << "\n(" << s << " s)\n";
  // Traced primitives that compilation removes or rewrites (CSE/DCE, identities), so that no ref
  // kernel of theirs ran: informational, the traced graph is what the coverage test counts.
  std::string not_run;
  for (const std::string& p : seen)
    if (!ran.count(p)) not_run += " " + p;
  std::cout << "traced but never reached a ref kernel (removed or rewritten by compile):"
            << (not_run.empty() ? " none" : not_run) << "\n";
}

// local_slice: a replicated value constrained to a split over 'data' makes the partitioner take
// each device's block with local_slice; ref:2 gives the same blocks as cpu:2.
TEST(Conformance, LocalSliceRunsOnRefAsOnCpu) {
  for (DType dt : {DType::f32, DType::bf16, DType::i32, DType::boolean}) {
    auto g = trace(
        [](const std::vector<Tensor>& a) {
          return std::vector<Tensor>{with_sharding_constraint(a[0], PartitionSpec{"data"}),
                                     with_sharding_constraint(a[0], PartitionSpec{none, "data"})};
        },
        {{dt, {6, 4}}});
    Array in = make_input(In{{6, 4}, -3, 3}, dt, seed_of("local_slice"));
    std::vector<std::vector<Array>> outs;
    for (const char* platform : {"cpu", "ref"}) {
      auto exe = ShardedExecutable::compile(*g, Mesh::create({{"data", 2}}, DeviceSet{platform, 2}), {PartitionSpec{}});
      std::set<std::string> prims;
      add_prims(*exe->program().local, prims);
      EXPECT_TRUE(prims.count("local_slice")) << platform << ": the local program has no local_slice\n"
                                              << exe->program().summary();
      outs.push_back(exe->run_full({in}));
    }
    for (size_t o = 0; o < outs[0].size(); ++o)
      EXPECT_EQ(compare(outs[0][o], outs[1][o], 1), "") << "local_slice " << dtype_name(dt) << " output " << o;
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
  if (mesh.platform() == "ref")
    EXPECT_EQ(step.executable().num_fused_groups(), 0) << cfg.name << " on " << mesh.to_string();
  else
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

void check_model(const nn::LmConfig& cfg) {
  const auto cpu1 = train(cfg, Mesh::create({{"data", 1}}, DeviceSet{"cpu", 1}), ShardingStrategy::DDP);
  const auto ref1 = train(cfg, Mesh::create({{"data", 1}}, DeviceSet{"ref", 1}), ShardingStrategy::DDP);
  expect_same_losses(cpu1, ref1, cfg.name + ": ref:1 vs cpu:1");
  const Mesh ref2 = Mesh::create({{"data", 2}}, DeviceSet{"ref", 2});
  expect_same_losses(ref1, train(cfg, ref2, ShardingStrategy::DDP), cfg.name + ": DDP on ref:2 vs ref:1");
  expect_same_losses(ref1, train(cfg, ref2, ShardingStrategy::FSDP), cfg.name + ": FSDP on ref:2 vs ref:1");
  std::cout.precision(9);
  for (size_t i = 0; i < ref1.size(); ++i)
    std::cout << cfg.name << " step " << i << ": loss cpu:1 " << cpu1[i].loss << ", ref:1 " << ref1[i].loss << "\n";
}

TEST(ConformanceModels, TinyGptTrainsOnRefAsOnCpu) { check_model(gpt_conf()); }
TEST(ConformanceModels, TinyLlamaTrainsOnRefAsOnCpu) { check_model(llama_conf()); }

}  // namespace
}  // namespace px
