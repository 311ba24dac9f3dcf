// The recipes: each param's PartitionSpec from the strategy, the traced forward program (TP reads
// which matmul consumes each param and which matmul that feeds) and the user's override rules.
#include <algorithm>
#include <map>
#include <set>
#include <sstream>

#include "core/enum_names.h"
#include "ir/primitive.h"
#include "ops/prims.h"
#include "parallax/parallel.h"
#include "sharding/recipes/tp.h"

namespace px {

namespace {
constexpr const char* kStrategyNames[] = {"AUTO", "DDP", "FSDP", "TP", "FSDP_TP", "MANUAL"};
static_assert(std::size(kStrategyNames) == static_cast<size_t>(ShardingStrategy::MANUAL) + 1);
}  // namespace

const char* strategy_name(ShardingStrategy s) { return enum_name(s, kStrategyNames); }

namespace {

// The Megatron pattern is anchored on three primitives by name: the weight matmul (dot_general),
// the table lookup (take) and the bias add (add) are what TP splits, not properties that another
// primitive could declare. Everything the analysis passes through is read from TpTraits.

using View = TpTraits::View;
// Whether the analysis sees a param through n's result: ops that keep its dims, or with
// `layout` also those that move or repeat its elements.
bool sees_through(const Node& n, View allowed) {
  if (!n.prim) return false;
  View v = n.prim->tp.view;
  return v == View::same_dims || (allowed == View::layout && v == View::layout);
}
// Ops that mix the features of a row: a column split does not carry through them.
bool stops_tp(const Node& n) { return n.prim && n.prim->tp.mixes_features; }

// A dot_general whose operand `side` is a rank-2 param (through same_dims ops such as casts) with
// one contracting dim.
struct ParamMatmul {
  int node = -1;
  int param = -1;
  int side = 0;         // operand index of the param
  int free_dim = 0;     // the param's dim that survives into the output
  int activation = -1;  // value id of the other operand
};

struct GraphIndex {
  const Graph& g;
  int n_params;
  std::vector<int> param_of_value;                          // -1 or the param index of an input value
  std::vector<std::vector<std::pair<int, int>>> consumers;  // value -> (node, operand)

  GraphIndex(const Graph& graph, int np) : g(graph), n_params(np) {
    param_of_value.assign(g.values().size(), -1);
    for (int i = 0; i < np; ++i) param_of_value[g.inputs()[i]] = i;
    consumers.resize(g.values().size());
    for (int n = 0; n < static_cast<int>(g.nodes().size()); ++n)
      for (int k = 0; k < static_cast<int>(g.nodes()[n].inputs.size()); ++k)
        consumers[g.nodes()[n].inputs[k]].push_back({n, k});
  }

  // The param a value is, looking through single-input ops the traits allow.
  int param_through(int v, View pass) const {
    for (int guard = 0; guard < 16; ++guard) {
      if (param_of_value[v] >= 0) return param_of_value[v];
      int p = g.values()[v].producer;
      if (p < 0) return -1;
      const Node& n = g.nodes()[p];
      if (n.inputs.size() != 1 || !sees_through(n, pass)) return -1;
      v = n.inputs[0];
    }
    return -1;
  }
};

std::vector<ParamMatmul> find_param_matmuls(const GraphIndex& ix) {
  std::vector<ParamMatmul> out;
  for (int n = 0; n < static_cast<int>(ix.g.nodes().size()); ++n) {
    const Node& node = ix.g.nodes()[n];
    if (node.prim != prims::dot_general() || node.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      int p = ix.param_through(node.inputs[side], View::same_dims);
      if (p < 0 || ix.g.type(node.inputs[side]).rank() != 2) continue;
      const auto& contract = node.attrs.ints(side == 0 ? "lhs_contract" : "rhs_contract");
      const auto& batch = node.attrs.ints(side == 0 ? "lhs_batch" : "rhs_batch");
      if (contract.size() != 1 || !batch.empty()) continue;
      out.push_back({n, p, side, contract[0] == 0 ? 1 : 0, node.inputs[1 - side]});
      break;
    }
  }
  return out;
}

using TpAssignment = TpRole;

// Union-find over params: a column weight with the row weights it feeds, its siblings and biases.
int find_group(std::vector<int>& parent, int i) {
  while (parent[i] != i) i = parent[i] = parent[parent[i]];
  return i;
}
void join(std::vector<int>& parent, int a, int b) { parent[find_group(parent, a)] = find_group(parent, b); }

// Megatron pairing from the graph: a weight matmul whose output reaches (through ops that keep
// features separate) another weight matmul's activation is column-split, that one row-split.
std::vector<TpAssignment> derive_tp(const GraphIndex& ix, const std::vector<std::string>& paths) {
  std::vector<TpAssignment> a(ix.n_params);
  std::vector<int> parent(ix.n_params);
  for (int i = 0; i < ix.n_params; ++i) parent[i] = i;
  std::vector<ParamMatmul> mms = find_param_matmuls(ix);
  std::map<int, const ParamMatmul*> by_node;
  for (const auto& m : mms) by_node[m.node] = &m;
  // Tables read by take are split by rows (vocab-parallel lookup: each device looks up the rows
  // it holds, one all-reduce sums the parts); a tied table's logits are then vocab-parallel too.
  for (const Node& n : ix.g.nodes())
    if (n.prim == prims::take()) {
      int p = ix.param_through(n.inputs[0], View::same_dims);
      if (p >= 0) a[p] = {TpAssignment::embedding, 0, "vocab-parallel embedding"};
    }
  std::vector<bool> paired(mms.size(), false);
  for (size_t i = 0; i < mms.size(); ++i) {
    const ParamMatmul& m1 = mms[i];
    std::vector<int> targets;
    std::vector<int> stack = ix.g.nodes()[m1.node].outputs;
    std::set<int> seen(stack.begin(), stack.end());
    while (!stack.empty()) {
      int v = stack.back();
      stack.pop_back();
      for (auto [c, k] : ix.consumers[v]) {
        auto it = by_node.find(c);
        if (it != by_node.end()) {
          if (k == 1 - it->second->side) targets.push_back(c);
          continue;
        }
        if (stops_tp(ix.g.nodes()[c])) continue;
        for (int o : ix.g.nodes()[c].outputs)
          if (seen.insert(o).second) stack.push_back(o);
      }
    }
    if (targets.empty()) continue;
    paired[i] = true;
    if (a[m1.param].kind == TpAssignment::none)
      a[m1.param] = {TpAssignment::column, m1.free_dim, "column (feeds " + paths[by_node[targets[0]]->param] + ")"};
    for (int t : targets) {
      const ParamMatmul& m2 = *by_node[t];
      join(parent, m2.param, m1.param);
      if (a[m2.param].kind == TpAssignment::none)
        a[m2.param] = {TpAssignment::row, 1 - m2.free_dim, "row (fed by " + paths[m1.param] + ")"};
    }
  }
  // Siblings: weights reading the same activation as a column weight (q, k, v; gate, up).
  for (size_t i = 0; i < mms.size(); ++i)
    for (size_t j = 0; j < mms.size(); ++j)
      if (mms[i].activation == mms[j].activation && a[mms[i].param].kind == TpAssignment::column &&
          a[mms[j].param].kind == TpAssignment::none) {
        join(parent, mms[j].param, mms[i].param);
        a[mms[j].param] = {TpAssignment::column, mms[j].free_dim, "column (sibling of " + paths[mms[i].param] + ")"};
      }
  // Weight matmuls that feed no other weight matmul and were not paired: the logits projection.
  for (size_t i = 0; i < mms.size(); ++i)
    if (!paired[i] && a[mms[i].param].kind == TpAssignment::none)
      a[mms[i].param] = {TpAssignment::vocab, mms[i].free_dim, "vocab-parallel logits"};
  // Biases added to a column-split output are split the same way.
  for (const Node& n : ix.g.nodes()) {
    if (n.prim != prims::add() || n.inputs.size() != 2) continue;
    for (int s = 0; s < 2; ++s) {
      int b = ix.param_through(n.inputs[s], View::layout);
      if (b < 0 || ix.g.type(ix.g.inputs()[b]).rank() != 1 || a[b].kind != TpAssignment::none) continue;
      int v = n.inputs[1 - s];
      int prod = ix.g.values()[v].producer;
      while (prod >= 0 && sees_through(ix.g.nodes()[prod], View::same_dims))
        prod = ix.g.values()[ix.g.nodes()[prod].inputs[0]].producer;
      auto it = prod >= 0 ? by_node.find(prod) : by_node.end();
      if (it == by_node.end()) continue;
      TpAssignment::Kind k = a[it->second->param].kind;
      if (k != TpAssignment::column && k != TpAssignment::vocab) continue;
      a[b] = {TpAssignment::column, 0, "column bias (of " + paths[it->second->param] + ")"};
      join(parent, b, it->second->param);
    }
  }
  for (int i = 0; i < ix.n_params; ++i) a[i].group = find_group(parent, i);
  return a;
}

PartitionSpec with_dim(int rank, int dim, std::vector<std::string> axes, const PartitionSpec& base = {}) {
  std::vector<PartitionSpec::Dim> dims(rank);
  for (int d = 0; d < rank && d < base.size(); ++d) dims[d] = PartitionSpec::Dim(base[d]);
  dims[dim] = PartitionSpec::Dim(std::move(axes));
  return PartitionSpec(std::move(dims));
}

}  // namespace

int storage_dim(const TensorType& t, int64_t n, int skip) {
  for (int d = 0; d < t.rank(); ++d)
    if (d != skip && t.shape[d] % n == 0) return d;
  return -1;
}

std::vector<TpRole> tp_roles(const Graph& forward, const std::vector<std::string>& paths) {
  GraphIndex ix(forward, static_cast<int>(paths.size()));
  return derive_tp(ix, paths);
}

std::string ShardingPlan::table() const {
  std::ostringstream os;
  os << strategy_name(strategy) << " on " << mesh.to_string() << "; batch split over ";
  if (batch_axes.empty()) os << "nothing";
  for (size_t i = 0; i < batch_axes.size(); ++i) os << (i ? ", " : "") << "'" << batch_axes[i] << "'";
  os << "\n";
  size_t w = 5;
  for (const auto& p : params) w = std::max(w, p.path.size());
  char line[512];
  std::snprintf(line, sizeof line, "%-*s  %-18s %-26s %12s %12s  %s\n", static_cast<int>(w), "param", "type", "spec",
                "bytes", "bytes/device", "why");
  os << line;
  int64_t total = 0, per_dev = 0;
  for (const auto& p : params) {
    std::snprintf(line, sizeof line, "%-*s  %-18s %-26s %12lld %12lld  %s\n", static_cast<int>(w), p.path.c_str(),
                  type_str(p.type).c_str(), p.spec.to_string().c_str(), static_cast<long long>(p.type.nbytes()),
                  static_cast<long long>(p.bytes_per_device), p.reason.c_str());
    os << line;
    total += p.type.nbytes();
    per_dev += p.bytes_per_device;
  }
  std::snprintf(line, sizeof line, "%-*s  %-18s %-26s %12lld %12lld\n", static_cast<int>(w), "total", "", "",
                static_cast<long long>(total), static_cast<long long>(per_dev));
  os << line;
  return os.str();
}

int64_t ShardingPlan::param_bytes_per_device() const {
  int64_t s = 0;
  for (const auto& p : params) s += p.bytes_per_device;
  return s;
}

ShardingPlan plan_sharding(const Graph& forward, const std::vector<std::string>& paths, const Mesh& mesh,
                           ShardingStrategy strategy, const ShardingOptions& opt) {
  const int np = static_cast<int>(paths.size());
  if (static_cast<int>(forward.inputs().size()) < np)
    throw Error("[sharding] the traced program has " + std::to_string(forward.inputs().size()) + " inputs but " +
                std::to_string(np) + " params were named");
  if (strategy == ShardingStrategy::AUTO)
    throw Error("[sharding] AUTO plans a whole training step (TrainStep on a mesh, px::plan_auto), not a forward "
                "program alone; use DDP, FSDP, TP, FSDP_TP or MANUAL here");
  ShardingPlan plan;
  plan.mesh = mesh;
  plan.strategy = strategy;
  for (const auto& ax : mesh.axes())
    if (ax.name != opt.model_axis) plan.batch_axes.push_back(ax.name);
  plan.activations = opt.activation_rules;
  const bool wants_data =
      strategy == ShardingStrategy::DDP || strategy == ShardingStrategy::FSDP || strategy == ShardingStrategy::FSDP_TP;
  const bool tp = strategy == ShardingStrategy::TP || strategy == ShardingStrategy::FSDP_TP;
  const bool fsdp = strategy == ShardingStrategy::FSDP || strategy == ShardingStrategy::FSDP_TP;
  if (wants_data && mesh.axis_index(opt.data_axis) < 0)
    throw Error(std::string("[sharding] ") + strategy_name(strategy) + " needs the data axis '" + opt.data_axis +
                "' but " + mesh.to_string() + " has axes " +
                [&] {
                  std::string s;
                  for (auto& n : mesh.axis_names()) s += (s.empty() ? "'" : ", '") + n + "'";
                  return s;
                }() +
                "; set ShardingOptions::data_axis");
  if (tp && mesh.axis_index(opt.model_axis) < 0)
    throw Error(std::string("[sharding] ") + strategy_name(strategy) + " needs the model axis '" + opt.model_axis +
                "' but " + mesh.to_string() + " has none; set ShardingOptions::model_axis or use DDP/FSDP");
  int64_t data_size = 1;
  for (auto& a : plan.batch_axes) data_size *= mesh.axis_size(a);

  std::vector<TpAssignment> tpa;
  if (tp) {
    GraphIndex ix(forward, np);
    tpa = derive_tp(ix, paths);
  }
  for (int i = 0; i < np; ++i) {
    ParamPlacement pp;
    pp.path = paths[i];
    pp.type = forward.type(forward.inputs()[i]);
    const int rank = pp.type.rank();
    pp.spec = PartitionSpec::replicated(0);
    pp.reason = "replicated";
    int tp_dim = -1;
    if (tp && tpa[i].kind != TpAssignment::none) {
      tp_dim = tpa[i].dim;
      pp.spec = with_dim(rank, tp_dim, {opt.model_axis});
      pp.reason = tpa[i].note;
      Sharding(mesh, pp.spec).validate(pp.type, "param '" + pp.path + "' (TP " + tpa[i].note + ")");
    }
    if (fsdp && data_size > 1) {
      if (pp.type.nbytes() < opt.fsdp_min_bytes) {
        pp.reason += pp.reason == "replicated" ? " (below fsdp_min_bytes)" : "";
      } else {
        const int best = storage_dim(pp.type, data_size, tp_dim);
        if (best >= 0) {
          pp.spec = with_dim(rank, best, plan.batch_axes, pp.spec);
          pp.reason = (tp_dim >= 0 ? pp.reason + " + " : std::string()) + "fsdp dim " + std::to_string(best);
        } else {
          pp.reason += " (no dim divisible by " + std::to_string(data_size) + " for fsdp)";
        }
      }
    }
    for (size_t r = 0; r < opt.rules.size(); ++r)
      if (glob_match(opt.rules[r].pattern, pp.path)) {
        pp.spec = opt.rules[r].spec;
        pp.reason = "rule '" + opt.rules[r].pattern + "'";
        Sharding(mesh, pp.spec).validate(pp.type, "param '" + pp.path + "' (rule '" + opt.rules[r].pattern + "')");
        break;
      }
    if (strategy == ShardingStrategy::MANUAL && pp.reason == "replicated") pp.reason = "replicated (no rule)";
    pp.bytes_per_device = numel(Sharding(mesh, pp.spec).local_shape(pp.type.shape)) * dtype_size(pp.type.dtype);
    plan.params.push_back(std::move(pp));
  }
  return plan;
}

}  // namespace px
