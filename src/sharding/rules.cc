// Node rules as the partitioner sees them, and the choice of mesh axes for a node's factors.
#include <algorithm>
#include <numeric>

#include "sharding/spmd_internal.h"

namespace px::spmd {

namespace {

using Kind = ShardingRule::Kind;

bool rule_fits(const ShardingRule& r, const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  if (r.operands.size() != in.size() || r.results.size() != out.size()) return false;
  if (r.factor_kinds.size() != r.factor_sizes.size()) return false;
  auto dims_ok = [&](const std::vector<std::vector<int>>& fs, const std::vector<TensorType>& ts) {
    for (size_t i = 0; i < fs.size(); ++i) {
      if (fs[i].size() != ts[i].shape.size()) return false;
      for (int f : fs[i])
        if (f >= static_cast<int>(r.factor_kinds.size())) return false;
    }
    return true;
  };
  return dims_ok(r.operands, in) && dims_ok(r.results, out);
}

}  // namespace

// Everything here comes from the primitive's declaration (SpmdTraits): no primitive is named.
NodeRule node_rule(const Graph& g, const Node& n) {
  std::vector<TensorType> in, out;
  for (int v : n.inputs) in.push_back(g.type(v));
  for (int v : n.outputs) out.push_back(g.type(v));
  const SpmdTraits& t = n.prim->spmd;
  NodeRule nr;
  nr.rule = sharding_of(*n.prim, in, out, n.attrs);
  if (!rule_fits(nr.rule, in, out)) nr.rule = whole_rule(in, out);
  // Splits that the primitive's local form handles with this device's offset (a row-split table
  // gives a masked lookup of partial sums; split classes give cross entropy with all-reduced row
  // statistics; a split draw or iota computes its own block).
  for (int f : positional_factors(*n.prim, nr.rule, n.attrs)) {
    nr.rule.factor_kinds[f] = t.positional.split_as;
    if (t.positional.late) nr.late.push_back(f);
  }
  nr.reduce = partial_reduce_name(t.partial);
  if (nr.reduce.empty())
    for (auto& k : nr.rule.factor_kinds)
      if (k == Kind::reduction) k = Kind::whole;  // no known way to combine partial results
  return nr;
}

int64_t shards_of(const Mesh& mesh, const std::vector<int>& axes) {
  int64_t n = 1;
  for (int a : axes) n *= mesh.axes()[a].size;
  return n;
}

Shape local_shape(const Mesh& mesh, const Shape& global, const Spec& s) {
  Shape l = global;
  for (size_t d = 0; d < l.size() && d < s.size(); ++d) l[d] /= shards_of(mesh, s[d]);
  return l;
}

Spec spec_from_factors(const std::vector<int>& factors, const NodeRule& r, const FactorAxes& fa) {
  Spec s(factors.size());
  for (size_t d = 0; d < factors.size(); ++d) {
    int f = factors[d];
    if (f >= 0 && r.rule.factor_kinds[f] != Kind::whole) s[d] = fa[f];
  }
  return s;
}

FactorAxes assign_factors(const Graph& g, const Node& n, const NodeRule& r, const Mesh& mesh,
                          const std::vector<std::optional<Spec>>& specs, const std::vector<char>& fixed) {
  const ShardingRule& rule = r.rule;
  const size_t nf = rule.factor_kinds.size();
  FactorAxes fa(nf);
  std::vector<std::vector<int64_t>> dims_of(nf);
  struct Source {
    int value;
    const std::vector<int>* factors;
    int rank;  // 0 first: a fixed result; 1: an operand laid out for its readers; 2: the rest
    int64_t bytes;
    int order;
  };
  std::vector<Source> src;
  int order = 0;
  for (size_t j = 0; j < n.outputs.size(); ++j) {
    int v = n.outputs[j];
    src.push_back({v, &rule.results[j], fixed[v] != 0 ? 0 : 2, g.type(v).nbytes(), order++});
  }
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    int v = n.inputs[i];
    src.push_back({v, &rule.operands[i], fixed[v] == kFixedForReaders ? 1 : 2, g.type(v).nbytes(), order++});
  }
  for (const Source& s : src)
    for (size_t d = 0; d < s.factors->size(); ++d) {
      int f = (*s.factors)[d];
      if (f >= 0) dims_of[f].push_back(g.type(s.value).shape[d]);
    }
  std::stable_sort(src.begin(), src.end(), [](const Source& a, const Source& b) {
    if (a.rank != b.rank) return a.rank < b.rank;
    return a.bytes > b.bytes;
  });
  std::vector<char> used(static_cast<size_t>(mesh.rank()), 0);
  std::vector<char> late(nf, 0);
  for (int f : r.late) late[f] = 1;
  for (int pass = 0; pass < 2; ++pass)
    for (const Source& s : src) {
      if (!specs[s.value]) continue;
      const Spec& spec = *specs[s.value];
      for (size_t d = 0; d < s.factors->size() && d < spec.size(); ++d) {
        int f = (*s.factors)[d];
        if (f < 0 || rule.factor_kinds[f] == Kind::whole || !fa[f].empty() || spec[d].empty()) continue;
        if (late[f] != pass) continue;
        // The longest prefix of the dim's axes that is free and divides every dim of the factor.
        for (size_t k = spec[d].size(); k >= 1; --k) {
          std::vector<int> cand(spec[d].begin(), spec[d].begin() + k);
          bool ok = true;
          for (int a : cand) ok = ok && !used[a];
          int64_t n_shards = shards_of(mesh, cand);
          for (int64_t size : dims_of[f]) ok = ok && size % n_shards == 0;
          if (!ok) continue;
          fa[f] = cand;
          for (int a : cand) used[a] = 1;
          break;
        }
      }
    }
  return fa;
}

// ---- conversions ------------------------------------------------------------------------------

std::vector<int> axis_ids(const Mesh& mesh, const std::vector<std::string>& names) {
  std::vector<int> ids;
  for (auto& n : names) ids.push_back(mesh.require_axis(n, "sharding"));
  return ids;
}

std::vector<std::string> axis_names(const Mesh& mesh, const std::vector<int>& ids) {
  std::vector<std::string> n;
  for (int a : ids) n.push_back(mesh.axes()[a].name);
  return n;
}

Spec to_spec(const Sharding& s, int rank) {
  Spec out(static_cast<size_t>(rank));
  for (int d = 0; d < rank; ++d) out[d] = axis_ids(s.mesh, s.spec[d]);
  return out;
}

Sharding to_sharding(const Mesh& mesh, const Spec& s, const std::vector<int>& partial) {
  std::vector<PartitionSpec::Dim> dims;
  for (auto& d : s) dims.emplace_back(axis_names(mesh, d));
  return Sharding(mesh, PartitionSpec(dims), axis_names(mesh, partial));
}

std::string spec_str(const Mesh& mesh, const Spec& s) {
  std::vector<PartitionSpec::Dim> dims;
  for (auto& d : s) dims.emplace_back(axis_names(mesh, d));
  return PartitionSpec(dims).to_string();
}

}  // namespace px::spmd
