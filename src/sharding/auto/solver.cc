// The AUTO search. The decisions are units of params (a tensor-parallel group, or one param)
// linked across identical layers, so depth does not grow the problem. For each layout of the
// mesh (which axis, if any, is the tensor-parallel axis; the others split the batch) every unit
// chooses whether to apply its Megatron roles and over which batch axes to store its params
// split (ZeRO-3: gathered for use). The effect of each choice on the predicted step time is
// measured with the cost model around a base plan; an integer program (CBC) picks one choice
// per unit minimising the summed effect under the per-device memory limit; the plan it picks is
// costed whole, measured again around it and solved again while that helps. The recipes are
// costed by the same model and the fastest plan that fits wins, so AUTO is never predicted
// slower than a recipe.
#include "sharding/auto/solver.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <coin/CbcModel.hpp>
#include <coin/CoinPackedMatrix.hpp>
#include <coin/OsiClpSolverInterface.hpp>
#include <fmt/format.h>

#include "core/log.h"
#include "ir/primitive.h"
#include "sharding/recipes/tp.h"
#include "ops/prims.h"

namespace px::autoshard {
namespace {

using Clock = std::chrono::steady_clock;

// "blocks.3.attn.w" -> "blocks.*.attn.w": identical layers share a pattern.
std::string pattern_of(const std::string& path) {
  std::string out, part;
  auto flush = [&] {
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    out += digits ? "*" : part;
    part.clear();
  };
  for (char c : path) {
    if (c == '.') {
      flush();
      out += '.';
    } else {
      part += c;
    }
  }
  flush();
  return out;
}

struct Unit {
  std::vector<std::string> patterns;
  bool layered = false;
  bool has_tp = false;      // some param has a Megatron role
  bool sequence = false;    // no params: the activations between blocks, split over the sequence or not
};

std::string axes_text(const std::vector<std::string>& axes) {
  std::string s;
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", '" : "'") + axes[i] + "'";
  return s;
}

struct Layout {
  // Empty: no tensor parallelism. Several: the tensor-parallel dims are split over all of them
  // (in mesh order), as one group of their product's size.
  std::vector<std::string> model_axes;
  std::vector<std::string> batch_axes;
  std::string describe() const {
    std::string s = "batch over " + (batch_axes.empty() ? std::string("nothing") : axes_text(batch_axes));
    s += model_axes.empty() ? "; no tensor parallelism" : "; tensor parallel over " + axes_text(model_axes);
    return s;
  }
};

struct Choice {
  bool tp = false;
  std::vector<std::string> storage;  // batch axes the params are stored split over
};

int64_t axes_size(const Mesh& m, const std::vector<std::string>& axes) {
  int64_t n = 1;
  for (const auto& a : axes) n *= m.axis_size(a);
  return n;
}

std::string gib(double bytes) { return fmt::format("{:.2f} GiB", bytes / double(int64_t{1} << 30)); }

class Search {
 public:
  explicit Search(const Problem& p) : p_(p), start_(Clock::now()) {
    const int np = static_cast<int>(p.full.paths.size());
    roles_by_pattern_.clear();
    std::vector<TpRole> roles = tp_roles(*p.forward, p.full.paths);
    // Units: tensor-parallel groups, keyed by their params' patterns so identical layers link.
    std::map<int, std::set<std::string>> groups;
    for (int i = 0; i < np; ++i) {
      std::string pat = pattern_of(p.full.paths[i]);
      roles_by_pattern_.emplace(pat, roles[i]);
      groups[roles[i].group >= 0 ? roles[i].group : i].insert(pat);
    }
    std::map<std::set<std::string>, int> by_key;
    for (const auto& [g, pats] : groups) {
      if (by_key.count(pats)) continue;
      bool taken = false;
      for (const auto& pat : pats) taken = taken || unit_of_pattern_.count(pat);
      if (taken) continue;  // a pattern already decided with another group
      int u = static_cast<int>(units_.size());
      by_key[pats] = u;
      Unit unit;
      for (const auto& pat : pats) {
        unit.patterns.push_back(pat);
        unit.layered = unit.layered || pat.find('*') != std::string::npos;
        unit.has_tp = unit.has_tp || roles_by_pattern_[pat].kind != TpRole::none;
        unit_of_pattern_[pat] = u;
      }
      units_.push_back(std::move(unit));
    }
    // Small params without a Megatron role (norms, row biases) are one unit: deciding them one by
    // one would cost a search each and change the step by little.
    double total = 0;
    std::vector<double> unit_bytes(units_.size(), 0.0);
    for (int i = 0; i < np; ++i) {
      total += static_cast<double>(p.full.types[i].nbytes());
      unit_bytes[unit_of(pattern_of(p.full.paths[i]))] += static_cast<double>(p.full.types[i].nbytes());
    }
    std::vector<Unit> kept;
    Unit small;
    std::vector<int> renumber(units_.size());
    for (size_t u = 0; u < units_.size(); ++u) {
      if (!units_[u].has_tp && unit_bytes[u] < 0.01 * total) {
        renumber[u] = -1;
        small.patterns.insert(small.patterns.end(), units_[u].patterns.begin(), units_[u].patterns.end());
        small.layered = small.layered || units_[u].layered;
      } else {
        renumber[u] = static_cast<int>(kept.size());
        kept.push_back(units_[u]);
      }
    }
    if (!small.patterns.empty()) {
      for (auto& r : renumber)
        if (r < 0) r = static_cast<int>(kept.size());
      kept.push_back(small);
    }
    for (auto& [pat, u] : unit_of_pattern_) u = renumber[u];
    units_ = std::move(kept);
    // Sequence parallelism: the values between blocks (tagged layer_input) split over the sequence
    // on the tensor-parallel axis, a decision without params.
    for (const Node& n : p.forward->nodes())
      if (n.prim == prims::tag() && n.attrs.s("name") == "layer_input" && p.forward->type(n.outputs[0]).rank() == 3) {
        Unit s;
        s.sequence = true;
        s.layered = true;
        s.patterns = {"layer boundaries: sequence split over the tensor-parallel axis"};
        units_.push_back(s);
        break;
      }
    // Layouts: the whole mesh splits the batch, or some axes are tensor-parallel (one axis, then
    // several: a dim split over all of them) and the others split the batch. A layout of several
    // tensor-parallel axes is searched only where some unit's Megatron dims divide over them; the
    // one-axis layouts come first, so that a time limit cuts the larger group first.
    std::vector<std::string> axes = p.mesh.axis_names();
    layouts_.push_back({{}, axes});
    const int na = static_cast<int>(axes.size());
    std::vector<Layout> several;
    for (int mask = 1; mask < (1 << na); ++mask) {
      Layout l;
      for (int k = 0; k < na; ++k) (mask >> k & 1 ? l.model_axes : l.batch_axes).push_back(axes[k]);
      if (l.model_axes.size() == 1) {
        layouts_.push_back(std::move(l));
        continue;
      }
      bool divides = false;
      for (size_t u = 0; u < units_.size(); ++u) divides = divides || (units_[u].has_tp && tp_divides(l, static_cast<int>(u)));
      if (divides) several.push_back(std::move(l));
    }
    layouts_.insert(layouts_.end(), several.begin(), several.end());
  }

  AutoPlan run();

 private:
  struct Scored {
    std::vector<int> assignment;  // choice index per unit
    StepCost cost;
    bool ok = false;
  };

  bool out_of_time() const { return seconds() > p_.options.auto_time_limit_s; }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  std::vector<Choice> choices(const Layout& l, int u) const {
    if (units_[u].sequence) {
      if (l.model_axes.empty()) return {Choice{}};
      return {Choice{}, Choice{true, {}}};
    }
    std::vector<std::vector<std::string>> storages{{}};
    if (!l.batch_axes.empty()) storages.push_back(l.batch_axes);
    if (l.batch_axes.size() > 1)
      for (const auto& a : l.batch_axes) storages.push_back({a});
    std::vector<Choice> out;
    for (bool tp : {false, true}) {
      if (tp && (l.model_axes.empty() || !units_[u].has_tp || !tp_divides(l, u))) continue;
      for (const auto& s : storages) out.push_back({tp, s});
    }
    return out;
  }

  bool tp_divides(const Layout& l, int u) const {
    const int64_t n = axes_size(p_.mesh, l.model_axes);
    for (size_t i = 0; i < p_.full.paths.size(); ++i) {
      std::string pat = pattern_of(p_.full.paths[i]);
      if (unit_of(pat) != u) continue;
      const TpRole& r = roles_by_pattern_.at(pat);
      if (r.kind != TpRole::none && p_.full.types[i].shape[r.dim] % n != 0) return false;
    }
    return true;
  }

  int unit_of(const std::string& pat) const {
    auto it = unit_of_pattern_.find(pat);
    return it == unit_of_pattern_.end() ? -1 : it->second;
  }

  // The spec of one param under a choice (before the user's rules).
  PartitionSpec spec_of(const TensorType& t, const TpRole& role, const Layout& l, const Choice& c,
                        std::string* reason) const {
    std::vector<PartitionSpec::Dim> dims(t.rank());
    int tp_dim = -1;
    std::string why;
    if (c.tp && role.kind != TpRole::none) {
      tp_dim = role.dim;
      dims[tp_dim] = PartitionSpec::Dim(l.model_axes);
      why = role.note;
    }
    if (!c.storage.empty()) {
      const int64_t n = axes_size(p_.mesh, c.storage);
      const int best = storage_dim(t, n, tp_dim);
      if (best >= 0) {
        dims[best] = PartitionSpec::Dim(c.storage);
        why += (why.empty() ? "" : " + ") + fmt::format("stored split over {} (dim {})", axes_text(c.storage), best);
      }
    }
    if (reason) *reason = "auto: " + (why.empty() ? std::string("replicated") : why);
    return PartitionSpec(std::move(dims));
  }

  ShardingPlan plan_for(const Model& m, const Layout& l, const std::vector<std::vector<Choice>>& cands,
                        const std::vector<int>& a) const {
    ShardingPlan plan;
    plan.mesh = p_.mesh;
    plan.strategy = ShardingStrategy::AUTO;
    plan.batch_axes = l.batch_axes;
    for (size_t i = 0; i < m.paths.size(); ++i) {
      ParamPlacement pp;
      pp.path = m.paths[i];
      pp.type = m.types[i];
      std::string pat = pattern_of(pp.path);
      int u = unit_of(pat);
      auto role = roles_by_pattern_.find(pat);
      if (u >= 0 && role != roles_by_pattern_.end()) pp.spec = spec_of(pp.type, role->second, l, cands[u][a[u]], &pp.reason);
      else pp.reason = "auto: replicated";
      for (const auto& r : p_.options.rules)
        if (glob_match(r.pattern, pp.path)) {
          pp.spec = r.spec;
          pp.reason = "rule '" + r.pattern + "'";
          Sharding(p_.mesh, pp.spec).validate(pp.type, "param '" + pp.path + "' (rule '" + r.pattern + "')");
          break;
        }
      pp.bytes_per_device = numel(Sharding(p_.mesh, pp.spec).local_shape(pp.type.shape)) * dtype_size(pp.type.dtype);
      plan.params.push_back(std::move(pp));
    }
    plan.activations = p_.options.activation_rules;  // the user's first: the first match wins
    for (size_t u = 0; u < units_.size(); ++u)
      if (units_[u].sequence && cands[u][a[u]].tp) {
        std::vector<PartitionSpec::Dim> dims{PartitionSpec::Dim(l.batch_axes), PartitionSpec::Dim(l.model_axes),
                                             PartitionSpec::Dim(none)};
        plan.activations.push_back({"layer_input", PartitionSpec(std::move(dims))});
      }
    return plan;
  }

  // Params, gradients and optimizer state of the whole model per device, per unit.
  std::vector<int64_t> state_bytes(const ShardingPlan& plan) const {
    std::vector<int64_t> out(units_.size(), 0);
    for (size_t i = 0; i < plan.params.size(); ++i) {
      int u = unit_of(pattern_of(plan.params[i].path));
      if (u >= 0) out[u] += plan.params[i].bytes_per_device * (1 + p_.full.grads + p_.full.state_copies[i]);
    }
    return out;
  }

  Scored score(const Model& m, const Layout& l, const std::vector<std::vector<Choice>>& cands,
               const std::vector<int>& a) {
    Scored s;
    s.assignment = a;
    ++evaluations_;
    try {
      s.cost = m.cost(plan_for(m, l, cands, a));
      s.ok = std::isfinite(s.cost.step_s);
    } catch (const Error&) {
      s.ok = false;
    }
    return s;
  }

  // One choice per unit minimising sum(time) with sum(memory) <= budget (CBC); `start` is a
  // feasible warm start when it fits. Empty when nothing fits.
  std::vector<int> solve_ilp(const std::vector<std::vector<double>>& time, const std::vector<std::vector<double>>& mem,
                             double budget, const std::vector<int>& start);

  // Search one layout; returns its best plan costed on the whole model (ok = false: none).
  Scored search_layout(const Layout& l, std::vector<std::vector<Choice>>& cands);

  // A candidate answer: a recipe's plan, or the solver's best plan of one layout.
  struct Option {
    std::string from;
    ShardingPlan plan;
    StepCost cost;
    std::string layout;
    int layout_index = -1;
  };
  bool fits(const Option& o) const { return o.cost.memory.peak_bytes <= p_.memory_limit; }
  std::vector<Option> cost_recipes(std::vector<RecipeCost>& recipes);
  const Option& winner(const std::vector<Option>& options) const;
  void describe_units(AutoPlan& out, const Option& win) const;
  std::string why(const AutoPlan& out) const;

  const Problem& p_;
  Clock::time_point start_;
  std::map<std::string, TpRole> roles_by_pattern_;
  std::map<std::string, int> unit_of_pattern_;
  std::vector<Unit> units_;
  std::vector<Layout> layouts_;
  std::atomic<int> evaluations_{0};
  bool timed_out_ = false;
};

std::vector<int> Search::solve_ilp(const std::vector<std::vector<double>>& time,
                                   const std::vector<std::vector<double>>& mem, double budget,
                                   const std::vector<int>& start) {
  const int nu = static_cast<int>(time.size());
  std::vector<int> first(nu + 1, 0);
  for (int u = 0; u < nu; ++u) first[u + 1] = first[u] + static_cast<int>(time[u].size());
  const int nv = first[nu];
  // Rows: one "exactly one choice" per unit, then the memory row.
  CoinPackedMatrix rows(false, 0, 0);
  rows.setDimensions(0, nv);
  std::vector<double> row_lo, row_hi;
  for (int u = 0; u < nu; ++u) {
    std::vector<int> idx;
    std::vector<double> one;
    for (int v = first[u]; v < first[u + 1]; ++v) idx.push_back(v), one.push_back(1.0);
    rows.appendRow(static_cast<int>(idx.size()), idx.data(), one.data());
    row_lo.push_back(1.0);
    row_hi.push_back(1.0);
  }
  // Memory in MiB keeps the coefficients well scaled.
  std::vector<int> idx(nv);
  std::vector<double> coef(nv);
  for (int u = 0; u < nu; ++u)
    for (size_t c = 0; c < mem[u].size(); ++c) idx[first[u] + c] = first[u] + c, coef[first[u] + c] = mem[u][c] / 1048576.0;
  rows.appendRow(nv, idx.data(), coef.data());
  row_lo.push_back(-COIN_DBL_MAX);
  row_hi.push_back(budget / 1048576.0);
  std::vector<double> lo(nv, 0.0), hi(nv, 1.0), obj(nv);
  for (int u = 0; u < nu; ++u)
    for (size_t c = 0; c < time[u].size(); ++c) {
      double t = time[u][c];
      obj[first[u] + c] = std::isfinite(t) ? t : 0.0;
      if (!std::isfinite(t)) hi[first[u] + c] = 0.0;  // that choice does not apply
    }
  OsiClpSolverInterface si;
  si.messageHandler()->setLogLevel(0);
  si.loadProblem(rows, lo.data(), hi.data(), obj.data(), row_lo.data(), row_hi.data());
  for (int v = 0; v < nv; ++v) si.setInteger(v);
  CbcModel model(si);
  model.setLogLevel(0);
  model.messageHandler()->setLogLevel(0);
  model.setMaximumSeconds(std::max(0.5, p_.options.auto_time_limit_s - seconds()));
  double start_mem = 0, start_obj = 0;
  bool start_ok = static_cast<int>(start.size()) == nu;
  for (int u = 0; start_ok && u < nu; ++u) {
    start_mem += mem[u][start[u]];
    start_obj += obj[first[u] + start[u]];
    start_ok = std::isfinite(time[u][start[u]]);
  }
  if (start_ok && start_mem <= budget) {
    std::vector<double> x(nv, 0.0);
    for (int u = 0; u < nu; ++u) x[first[u] + start[u]] = 1.0;
    model.setBestSolution(x.data(), nv, start_obj, true);
  }
  model.branchAndBound();
  if (model.isSecondsLimitReached()) timed_out_ = true;
  const double* x = model.bestSolution();
  if (!x) return {};
  std::vector<int> a(nu, 0);
  for (int u = 0; u < nu; ++u)
    for (int v = first[u]; v < first[u + 1]; ++v)
      if (x[v] > 0.5) a[u] = v - first[u];
  return a;
}

Search::Scored Search::search_layout(const Layout& l, std::vector<std::vector<Choice>>& cands) {
  const int nu = static_cast<int>(units_.size());
  cands.assign(nu, {});
  for (int u = 0; u < nu; ++u) cands[u] = choices(l, u);
  // The base: every unit tensor-parallel where it can be, nothing stored split.
  std::vector<int> base(nu, 0);
  for (int u = 0; u < nu; ++u)
    for (size_t c = 0; c < cands[u].size(); ++c)
      if (cands[u][c].tp && cands[u][c].storage.empty()) base[u] = static_cast<int>(c);
  const bool proxy = p_.two_layers.cost && p_.layers > 2;
  const Model& probe = proxy ? p_.two_layers : p_.full;
  const double layer_scale = proxy ? static_cast<double>(p_.layers) / 2.0 : 1.0;
  Scored best;
  best.cost.step_s = std::numeric_limits<double>::infinity();
  double budget_cut = 0;
  std::set<std::vector<int>> tried;
  for (int round = 0; round < 4 && !out_of_time(); ++round) {
    Scored b = score(probe, l, cands, base);
    if (!b.ok) return best;  // the layout does not apply (e.g. the batch does not divide)
    // The memory beside params and their state, for the whole model.
    std::vector<int64_t> sb = state_bytes(plan_for(p_.full, l, cands, base));
    double state_full = 0;
    for (auto v : sb) state_full += static_cast<double>(v);
    double other = 0;
    if (proxy) {
      Scored one = score(p_.one_layer, l, cands, base);
      auto state_of = [&](const Model& m) {
        double s = 0;
        ShardingPlan plan = plan_for(m, l, cands, base);
        for (size_t i = 0; i < plan.params.size(); ++i)
          s += static_cast<double>(plan.params[i].bytes_per_device) * (1 + m.grads + m.state_copies[i]);
        return s;
      };
      double o2 = static_cast<double>(b.cost.memory.peak_bytes) - state_of(p_.two_layers);
      double o1 = one.ok ? static_cast<double>(one.cost.memory.peak_bytes) - state_of(p_.one_layer) : o2;
      other = o1 + static_cast<double>(p_.layers - 1) * (o2 - o1);
    } else {
      other = static_cast<double>(b.cost.memory.peak_bytes) - state_full;
    }
    // The effect of each choice, one unit at a time. Memory: the exact params, gradients and
    // state per device; for the unit without params (the activations between blocks) the change
    // of the measured peak, as the activations it splits are its whole effect.
    std::vector<std::vector<double>> time(nu), mem(nu);
    std::vector<std::pair<int, int>> tasks;  // (unit, choice) to cost
    for (int u = 0; u < nu; ++u) {
      time[u].assign(cands[u].size(), 0.0);
      mem[u].assign(cands[u].size(), 0.0);
      for (size_t c = 0; c < cands[u].size(); ++c) {
        std::vector<int> a = base;
        a[u] = static_cast<int>(c);
        mem[u][c] = static_cast<double>(state_bytes(plan_for(p_.full, l, cands, a))[u]);
        if (static_cast<int>(c) != base[u]) tasks.push_back({u, static_cast<int>(c)});
      }
    }
    // The costs are independent: spread them over the cores (each writes its own slot).
    std::atomic<size_t> next{0};
    auto worker = [&] {
      for (size_t k; (k = next++) < tasks.size();) {
        auto [u, c] = tasks[k];
        if (out_of_time()) {
          time[u][c] = std::numeric_limits<double>::infinity();
          continue;
        }
        std::vector<int> a = base;
        a[u] = c;
        Scored s = score(probe, l, cands, a);
        const double scale = units_[u].layered ? layer_scale : 1.0;
        time[u][c] = s.ok ? (s.cost.step_s - b.cost.step_s) * scale : std::numeric_limits<double>::infinity();
        if (s.ok && units_[u].sequence)
          mem[u][c] += static_cast<double>(s.cost.memory.peak_bytes - b.cost.memory.peak_bytes) * scale;
      }
    };
    std::vector<std::thread> pool;
    const unsigned threads = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 8));
    for (unsigned t = 1; t < threads && t < tasks.size(); ++t) pool.emplace_back(worker);
    worker();
    for (auto& t : pool) t.join();
    double budget = static_cast<double>(p_.memory_limit) - other - budget_cut;
    std::vector<int> a = solve_ilp(time, mem, budget, base);
    if (a.empty()) {
      // Nothing fits by the estimate: the plan that needs the least memory, to report by how much.
      a.assign(nu, 0);
      for (int u = 0; u < nu; ++u)
        for (size_t c = 0; c < cands[u].size(); ++c)
          if (mem[u][c] < mem[u][a[u]]) a[u] = static_cast<int>(c);
    }
    if (!tried.insert(a).second) break;  // solved to a plan already costed: converged
    Scored whole = score(p_.full, l, cands, a);
    if (!whole.ok) break;
    const bool fits = whole.cost.memory.peak_bytes <= p_.memory_limit;
    const bool best_fits = best.ok && best.cost.memory.peak_bytes <= p_.memory_limit;
    if (!best.ok || (fits && !best_fits) || (fits == best_fits && (fits ? whole.cost.step_s < best.cost.step_s
                                                                        : whole.cost.memory.peak_bytes <
                                                                              best.cost.memory.peak_bytes)))
      best = whole;
    if (!fits) budget_cut += static_cast<double>(whole.cost.memory.peak_bytes - p_.memory_limit) * 1.05;
    base = a;  // measure again around the plan found
  }
  return best;
}

// The recipes, costed whole by the same model: the yardstick and the fallback.
std::vector<Search::Option> Search::cost_recipes(std::vector<RecipeCost>& recipes) {
  std::vector<Option> options;
  for (ShardingStrategy s : p_.recipes) {
    RecipeCost rc;
    rc.strategy = s;
    auto t0 = Clock::now();
    try {
      ShardingOptions o = p_.options;
      ShardingPlan plan = plan_sharding(*p_.forward, p_.full.paths, p_.mesh, s, o);
      ++evaluations_;
      rc.cost = p_.full.cost(plan);
      rc.param_bytes_per_device = plan.param_bytes_per_device();
      rc.applies = true;
      rc.cost.memory_capacity = p_.memory_limit;
      Layout l;
      l.batch_axes = plan.batch_axes;
      if (s == ShardingStrategy::TP || s == ShardingStrategy::FSDP_TP) l.model_axes = {o.model_axis};
      options.push_back({strategy_name(s), std::move(plan), rc.cost, l.describe(), -1});
    } catch (const Error& e) {
      rc.reason = e.what();
    }
    rc.plan_s = std::chrono::duration<double>(Clock::now() - t0).count();
    recipes.push_back(std::move(rc));
  }
  return options;
}

// The fastest that fits; the solver's own plan wins ties. When none fits, the smallest.
const Search::Option& Search::winner(const std::vector<Option>& options) const {
  const Option* win = nullptr;
  for (const auto& o : options) {
    if (!win) { win = &o; continue; }
    bool f = fits(o), wf = fits(*win);
    if (f != wf) { if (f) win = &o; continue; }
    double a = f ? o.cost.step_s : static_cast<double>(o.cost.memory.peak_bytes);
    double b = f ? win->cost.step_s : static_cast<double>(win->cost.memory.peak_bytes);
    if (a < b * (1 - 1e-9) || (a <= b * (1 + 1e-9) && o.from == "solver" && win->from != "solver")) win = &o;
  }
  return *win;
}

// Units as chosen (for the solver's plan; for a recipe, read off its specs).
void Search::describe_units(AutoPlan& out, const Option& win) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    AutoUnit au;
    for (size_t k = 0; k < units_[u].patterns.size(); ++k) au.name += (k ? ", " : "") + units_[u].patterns[k];
    if (units_[u].sequence) {
      au.tensor_parallel = std::any_of(out.plan.activations.begin() + p_.options.activation_rules.size(),
                                       out.plan.activations.end(),
                                       [](const PathRule& r) { return r.pattern == "layer_input"; });
      out.units.push_back(std::move(au));
      continue;
    }
    std::set<std::string> storage;
    for (const auto& pp : out.plan.params) {
      if (unit_of(pattern_of(pp.path)) != static_cast<int>(u)) continue;
      ++au.params;
      auto i = static_cast<size_t>(&pp - out.plan.params.data());
      au.state_bytes_per_device += pp.bytes_per_device * (1 + p_.full.grads + p_.full.state_copies[i]);
      for (const auto& d : pp.spec.dims())
        for (const auto& a : d.axes) {
          if (std::find(out.plan.batch_axes.begin(), out.plan.batch_axes.end(), a) != out.plan.batch_axes.end())
            storage.insert(a);
          else
            au.tensor_parallel = true;
        }
    }
    for (const auto& a : p_.mesh.axis_names())
      if (storage.count(a)) au.storage.push_back(a);
    out.units.push_back(std::move(au));
  }
  if (out.from == "solver" && win.layout_index > 0 &&
      std::none_of(out.units.begin(), out.units.end(), [](const AutoUnit& u) { return u.tensor_parallel; }))
    out.layout = "batch over " + (out.plan.batch_axes.empty() ? std::string("nothing")
                                                              : axes_text(out.plan.batch_axes)) +
                 "; " + axes_text(layouts_[win.layout_index].model_axes) +
                 (layouts_[win.layout_index].model_axes.size() == 1 ? " unused (its devices repeat the same work)"
                                                                    : " unused (their devices repeat the same work)");
}

std::string Search::why(const AutoPlan& out) const {
  const RecipeCost* best_recipe = nullptr;
  for (const auto& r : out.recipes)
    if (r.applies && r.cost.memory.peak_bytes <= p_.memory_limit &&
        (!best_recipe || r.cost.step_s < best_recipe->cost.step_s))
      best_recipe = &r;
  if (!out.fits) {
    int64_t over = out.cost.memory.peak_bytes - p_.memory_limit;
    return fmt::format(
        "[auto] no plan fits on {}: the smallest needs {} per device, {} more than the limit of {} "
        "(ShardingOptions::auto_memory_limit_bytes or the cluster's device memory). What would fit: "
        "more devices (params, gradients and optimizer state split over all {} devices take {} each), "
        "a smaller batch (activations scale with it) or remat and offload of activations and state",
        p_.mesh.to_string(), gib(static_cast<double>(out.cost.memory.peak_bytes)), gib(static_cast<double>(over)),
        gib(static_cast<double>(p_.memory_limit)), p_.mesh.size(), [&] {
          double s = 0;
          for (size_t i = 0; i < p_.full.types.size(); ++i)
            s += static_cast<double>(p_.full.types[i].nbytes()) * (1 + p_.full.grads + p_.full.state_copies[i]);
          return gib(s / static_cast<double>(p_.mesh.size()));
        }());
  }
  if (!best_recipe) {
    const bool any_applies =
        std::any_of(out.recipes.begin(), out.recipes.end(), [](const RecipeCost& r) { return r.applies; });
    return std::string(any_applies ? "no recipe fits in memory" : "no recipe applies on this mesh (see above)") +
           "; the solver's plan does (" + gib(out.cost.memory.peak_bytes) + " of " +
           gib(static_cast<double>(p_.memory_limit)) + " per device)";
  }
  if (out.from != "solver")
    return fmt::format("the {} recipe is the fastest plan found ({:.4g} s/step); the solver found nothing faster",
                       out.from, out.cost.step_s);
  if (out.cost.step_s >= best_recipe->cost.step_s * (1 - 1e-4))
    return fmt::format("as fast as {}, the fastest recipe that fits ({:.4g} s per step): the solver's best plan "
                       "is that recipe's or one as good",
                       strategy_name(best_recipe->strategy), out.cost.step_s);
  const StepCost& r = best_recipe->cost;
  double gain = r.step_s - out.cost.step_s;
  return fmt::format(
      "{:.1f}% faster than {}, the fastest recipe that fits ({:.4g} s vs {:.4g} s per step): compute {:+.3g} s, "
      "exposed communication {:+.3g} s, peak memory {:+.3g} GiB per device",
      100.0 * gain / r.step_s, strategy_name(best_recipe->strategy), out.cost.step_s, r.step_s,
      out.cost.compute_s - r.compute_s, out.cost.exposed_comm_s() - r.exposed_comm_s(),
      static_cast<double>(out.cost.memory.peak_bytes - r.memory.peak_bytes) / double(int64_t{1} << 30));
}

AutoPlan Search::run() {
  AutoPlan out;
  out.memory_limit = p_.memory_limit;
  std::vector<Option> options = cost_recipes(out.recipes);
  for (size_t li = 0; li < layouts_.size() && !out_of_time(); ++li) {
    std::vector<std::vector<Choice>> cands;
    Scored s = search_layout(layouts_[li], cands);
    if (!s.ok) continue;
    options.push_back({"solver", plan_for(p_.full, layouts_[li], cands, s.assignment), s.cost,
                       layouts_[li].describe(), static_cast<int>(li)});
  }
  if (out_of_time()) timed_out_ = true;
  if (options.empty())
    throw UserError("[auto] no plan applies on " + p_.mesh.to_string() +
                    ": every layout failed (is the batch a multiple of a mesh axis?)");
  const Option& win = winner(options);
  out.plan = win.plan;
  out.plan.strategy = ShardingStrategy::AUTO;
  if (win.from != "solver")
    for (auto& pp : out.plan.params) pp.reason = "auto (as " + win.from + "): " + pp.reason;
  out.cost = win.cost;
  out.cost.memory_capacity = p_.memory_limit;
  out.fits = fits(win);
  out.from = win.from;
  out.layout = win.layout;
  describe_units(out, win);
  out.why = why(out);
  out.evaluations = evaluations_;
  out.timed_out = timed_out_;
  out.solve_s = seconds();
  out.plan.explanation = out.explain();
  out.plan.predicted_step_s = out.cost.step_s;
  return out;
}

}  // namespace

AutoPlan solve(const Problem& p) {
  if (!p.forward || !p.full.cost) throw Error("[auto] internal: the problem has no traced model");
  if (p.memory_limit <= 0) throw UserError("[auto] the memory limit per device must be positive");
  return Search(p).run();
}

}  // namespace px::autoshard

namespace px {

std::string AutoPlan::explain() const {
  std::ostringstream os;
  os << fmt::format("AUTO on {}: {:.4g} s/step predicted, {} per device (limit {}){}\n", plan.mesh.to_string(),
                    cost.step_s, autoshard::gib(static_cast<double>(cost.memory.peak_bytes)),
                    autoshard::gib(static_cast<double>(memory_limit)), fits ? "" : "  DOES NOT FIT");
  os << "  layout: " << layout << (from == "solver" ? "" : " (the " + from + " recipe)") << "\n";
  os << fmt::format("  {:<58} {:>6}  {:<5} {:<18} {:>12}\n", "unit (linked over layers)", "params", "TP", "stored split over",
                    "state/device");
  for (const auto& u : units) {
    std::string name = u.name.size() > 58 ? u.name.substr(0, 55) + "..." : u.name;
    os << fmt::format("  {:<58} {:>6}  {:<5} {:<18} {:>12}\n", name, u.params, u.tensor_parallel ? "yes" : "no",
                      u.storage.empty() ? "-" : autoshard::axes_text(u.storage),
                      autoshard::gib(static_cast<double>(u.state_bytes_per_device)));
  }
  os << fmt::format("  {:<8} {:>11} {:>11} {:>11} {:>11} {:>12}  {}\n", "plan", "step_s", "compute_s", "comm_s",
                    "exposed_s", "peak/device", "fits");
  auto row = [&](const std::string& name, const StepCost& c) {
    os << fmt::format("  {:<8} {:>11.4g} {:>11.4g} {:>11.4g} {:>11.4g} {:>12}  {}\n", name, c.step_s, c.compute_s,
                      c.comm_s, c.exposed_comm_s(), autoshard::gib(static_cast<double>(c.memory.peak_bytes)),
                      c.memory.peak_bytes <= memory_limit ? "yes" : "no");
  };
  row("AUTO", cost);
  for (const auto& r : recipes) {
    if (r.applies) row(strategy_name(r.strategy), r.cost);
    else os << fmt::format("  {:<8} does not apply: {}\n", strategy_name(r.strategy), r.reason);
  }
  os << "  why: " << why << "\n";
  os << fmt::format("  solved in {:.2f} s ({} step programs costed{})\n", solve_s, evaluations,
                    timed_out ? "; stopped at the time limit" : "");
  return os.str();
}

}  // namespace px
