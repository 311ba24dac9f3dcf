// The SPMD partitioner: after propagation, emits one local graph (the same on every device) with
// local shapes, resharding operands where a node's factor assignment wants another layout and
// turning partial results into all-reduces or reduce-scatters.
#include <algorithm>
#include <functional>
#include <map>
#include <set>

#include "core/dump.h"
#include "parallax/spmd.h"
#include "sharding/prims.h"
#include "sharding/spmd_internal.h"
#include "ops/prims.h"

namespace px {

using namespace spmd;

namespace {

struct Local {
  Tensor t;
  Spec spec;
  std::vector<int> partial;  // mesh axes holding partial results
  std::string reduce;        // how they combine
};

bool is_prefix(const std::vector<int>& a, const std::vector<int>& b) {  // a is a prefix of b
  return a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin());
}

class Partitioner {
 public:
  Partitioner(const Graph& g, const Mesh& mesh, const Propagation& prop, CollectiveEmitter& em, Graph& local,
              std::vector<CollectiveRecord>& records)
      : g_(g),
        mesh_(mesh),
        prop_(prop),
        em_(em),
        local_(local),
        records_(records),
        values_(g.values().size()),
        specs_(prop.spec.begin(), prop.spec.end()) {}

  void set_input(int v, Tensor t, const Sharding& s) {
    values_[v] = {t, to_spec(s, g_.type(v).rank()), axis_ids(mesh_, s.partial), "sum"};
  }

  void emit_node(int index) {
    const Node& n = g_.nodes()[index];
    reason_ = "%" + std::to_string(n.outputs.empty() ? -1 : n.outputs[0]) + " " + n.prim->name;
    if (n.prim == prims::sharding_constraint()) {
      int v = n.outputs[0];
      values_[v] = {reshard(n.inputs[0], prop_.spec[v], false, n.attrs.i("regather", 0) != 0), prop_.spec[v], {}, ""};
      return;
    }
    NodeRule r = node_rule(g_, n);
    if (n.prim == prims::iota()) {
      emit_iota(n, r);
      return;
    }
    FactorAxes fa = assign_factors(g_, n, r, mesh_, specs_, prop_.fixed);
    std::vector<int> carried = carried_partial(n, fa);
    std::vector<Tensor> ins;
    std::vector<TensorType> in_types;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      bool keep = !carried.empty() && !values_[n.inputs[k]].partial.empty();
      ins.push_back(reshard(n.inputs[k], spec_from_factors(r.rule.operands[k], r, fa), keep));
      in_types.push_back(ins.back().type());
    }
    std::vector<Spec> out_specs;
    std::vector<TensorType> want;
    for (size_t j = 0; j < n.outputs.size(); ++j) {
      out_specs.push_back(spec_from_factors(r.rule.results[j], r, fa));
      const TensorType& t = g_.type(n.outputs[j]);
      want.push_back({t.dtype, local_shape(mesh_, t.shape, out_specs.back())});
    }
    std::vector<Tensor> outs;
    if (needs_local_form(n, r.rule, fa)) {
      outs = local_form(local_context(), n, g_, r.rule, fa, ins, want);
    } else {
      TraceScope scope(&local_);
      outs = local_.emit(*n.prim, ins, localize(n, in_types, want));
    }
    for (size_t j = 0; j < outs.size(); ++j)
      if (outs[j].type() != want[j])
        throw Error("[partition] primitive '" + n.prim->name + "' gave the local result " + type_str(outs[j].type()) +
                    " for " + type_str(g_.type(n.outputs[j])) + " split as " + spec_str(mesh_, out_specs[j]) +
                    ", expected " + type_str(want[j]) + "; its attributes need a local form in localize()");
    std::vector<int> partial = carried;
    for (size_t f = 0; f < fa.size(); ++f)
      if (r.rule.factor_kinds[f] == ShardingRule::Kind::reduction)
        partial.insert(partial.end(), fa[f].begin(), fa[f].end());
    std::sort(partial.begin(), partial.end());
    std::string reduce = carried.empty() ? r.reduce : "sum";
    for (size_t j = 0; j < outs.size(); ++j) values_[n.outputs[j]] = {outs[j], out_specs[j], partial, reduce};
  }

  // Partial sums flow through ops that are linear in them (the primitive's SpmdTraits::linear),
  // so that e.g. the three partial input gradients of q, k, v projections are added before one
  // all-reduce. Returns the partial axes the result inherits (empty: operands are reduced first);
  // fa drops the partial axes.
  std::vector<int> carried_partial(const Node& n, FactorAxes& fa) const {
    using In = Linearity::In;
    const Linearity& lin = n.prim->spmd.linear;
    if (lin.in == In::none) return {};
    std::vector<int> p;
    int partial_operands = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const Local& l = values_[n.inputs[k]];
      if (l.partial.empty()) continue;
      if (l.reduce != "sum" || (partial_operands && l.partial != p)) return {};
      p = l.partial;
      ++partial_operands;
    }
    const int count = static_cast<int>(n.inputs.size());
    bool ok = partial_operands > 0 &&
              ((lin.in == In::all_operands && partial_operands == count) ||
               (lin.in == In::any_one && partial_operands == 1) ||
               (lin.in == In::first && partial_operands == 1 && !values_[n.inputs[0]].partial.empty()));
    if (!ok) return {};
    // Adding partial sums before reducing them beats splitting the op over the partial axes:
    // one reduce-scatter instead of one per operand (e.g. the tied embedding's two gradients).
    // Products keep their split: computing them whole would cost more than the early reduce.
    for (auto& axes : fa) {
      if (!lin.cheap) {
        for (int a : axes)
          if (std::count(p.begin(), p.end(), a)) return {};
        continue;
      }
      auto first = std::find_if(axes.begin(), axes.end(), [&](int a) { return std::count(p.begin(), p.end(), a); });
      axes.erase(first, axes.end());
    }
    return p;
  }

  void set_reason(std::string r) { reason_ = std::move(r); }

  // The local id of global value v (-1 when it has none).
  int local_id(int v) const { return values_[v].t.defined() ? values_[v].t.id() : -1; }

  // An output asked to stay partial over `partial` (sorted axis ids): kept so when v is a sum
  // partial over exactly those axes and laid out as `want`, else reduced to `want`; `kept` says which.
  Tensor output(int v, const Spec& want_in, const std::vector<int>& partial, bool& kept) {
    Spec want = want_in;
    want.resize(g_.type(v).shape.size());
    const Local& cur = values_[v];
    kept = !partial.empty() && cur.partial == partial && cur.reduce == "sum" && cur.spec == want;
    return kept ? cur.t : reshard(v, want);
  }

  // The local value of global value v laid out as `want`: reduced, unless keep_partial (then its
  // partial axes stay partial and only the dims are resharded). `fresh` emits new collectives
  // even when an earlier reader resharded v the same way (a regather, after the first was freed).
  Tensor reshard(int v, const Spec& want_in, bool keep_partial = false, bool fresh = false) {
    Spec want = want_in;
    want.resize(g_.type(v).shape.size());
    const Local& cur = values_[v];
    if (!cur.t.defined()) throw Error("[partition] internal: value %" + std::to_string(v) + " has no local value");
    if ((cur.partial.empty() || keep_partial) && cur.spec == want) return cur.t;
    std::string key = std::to_string(v) + spec_str(mesh_, want) + (keep_partial ? "+partial" : "");
    auto it = fresh ? cache_.end() : cache_.find(key);
    if (it != cache_.end()) return it->second;
    Tensor t = cur.t;
    Spec c = cur.spec;
    c.resize(want.size());
    std::string why = reason_ + " needs %" + std::to_string(v) + " as " + spec_str(mesh_, want);

    std::vector<int> partial = keep_partial ? std::vector<int>() : cur.partial;
    if (!partial.empty()) {
      // Scatter the partial axes that `want` splits a dim over; all-reduce the rest.
      for (size_t d = 0; d < want.size(); ++d) {
        if (!is_prefix(c[d], want[d]) || c[d].size() == want[d].size()) continue;
        std::vector<int> extra(want[d].begin() + c[d].size(), want[d].end());
        bool all_partial = true;
        for (int a : extra) all_partial = all_partial && std::count(partial.begin(), partial.end(), a);
        if (!all_partial || t.shape()[d] % shards_of(mesh_, extra) != 0) continue;
        t = record(CollectiveKind::reduce_scatter, extra, t, static_cast<int>(d), -1, cur.reduce, why,
                   [&] { return em_.reduce_scatter(t, axis_names(mesh_, extra), static_cast<int>(d), cur.reduce); });
        c[d] = want[d];
        for (int a : extra) partial.erase(std::find(partial.begin(), partial.end(), a));
        break;
      }
      if (!partial.empty())
        t = record(CollectiveKind::all_reduce, partial, t, -1, -1, cur.reduce, why,
                   [&] { return em_.all_reduce(t, axis_names(mesh_, partial), cur.reduce); });
    }
    // Move an axis from one dim to another with an all-to-all.
    for (bool moved = true; moved;) {
      moved = false;
      for (size_t d1 = 0; d1 < c.size() && !moved; ++d1) {
        if (c[d1].empty() || is_prefix(c[d1], want[d1])) continue;
        int x = c[d1].back();
        for (size_t d2 = 0; d2 < c.size() && !moved; ++d2) {
          if (d2 == d1 || !is_prefix(c[d2], want[d2]) || want[d2].size() <= c[d2].size() || want[d2][c[d2].size()] != x)
            continue;
          t = record(CollectiveKind::all_to_all, {x}, t, static_cast<int>(d2), static_cast<int>(d1), "", why, [&] {
            return em_.all_to_all(t, axis_names(mesh_, {x}), static_cast<int>(d2), static_cast<int>(d1));
          });
          c[d1].pop_back();
          c[d2].push_back(x);
          moved = true;
        }
      }
    }
    // Gather what `want` does not split the same way, then slice what it splits further.
    for (size_t d = 0; d < c.size(); ++d) {
      size_t common = 0;
      while (common < c[d].size() && common < want[d].size() && c[d][common] == want[d][common]) ++common;
      if (common == c[d].size()) continue;
      std::vector<int> extra(c[d].begin() + common, c[d].end());
      t = record(CollectiveKind::all_gather, extra, t, static_cast<int>(d), -1, "", why,
                 [&] { return em_.all_gather(t, axis_names(mesh_, extra), static_cast<int>(d)); });
      c[d].resize(common);
    }
    for (size_t d = 0; d < c.size(); ++d) {
      if (c[d].size() == want[d].size()) continue;
      std::vector<int> extra(want[d].begin() + c[d].size(), want[d].end());
      t = record(std::nullopt, extra, t, static_cast<int>(d), -1, "", why,
                 [&] { return em_.local_slice(t, axis_names(mesh_, extra), static_cast<int>(d)); });
      c[d] = want[d];
    }
    if (!fresh) cache_[key] = t;
    return t;
  }

 private:
  // Emits one collective (nothing over a group of one device) and records it.
  Tensor record(std::optional<CollectiveKind> kind, const std::vector<int>& axes, const Tensor& in, int dim, int concat_dim,
                const std::string& reduce, const std::string& why, const std::function<Tensor()>& emit) {
    if (shards_of(mesh_, axes) == 1) return in;
    Tensor out = emit();
    CollectiveRecord r;
    r.kind = kind;
    r.axes = axis_names(mesh_, axes);
    r.operand = in.type();
    r.result = out.type();
    r.dim = dim;
    r.concat_dim = concat_dim;
    r.reduce = reduce;
    r.reason = why;
    records_.push_back(r);
    return out;
  }

  // A sharded iota: this device's part of the 1-D iota along the axis, broadcast to the local
  // shape, so the values match the unsharded iota without materializing the global array.
  void emit_iota(const Node& n, const NodeRule& r) {
    int v = n.outputs[0];
    FactorAxes fa = assign_factors(g_, n, r, mesh_, specs_, prop_.fixed);
    Spec spec = spec_from_factors(r.rule.results[0], r, fa);
    const TensorType& t = g_.type(v);
    int axis = static_cast<int>(n.attrs.i("axis"));
    Shape local = local_shape(mesh_, t.shape, spec);
    TraceScope scope(&local_);
    Tensor line = emit1(
        "iota", {}, Attrs{{"shape", std::vector<int64_t>{t.shape[axis]}}, {"axis", int64_t{0}}, {"dtype", t.dtype}});
    if (!spec[axis].empty())
      line = record(std::nullopt, spec[axis], line, 0, -1, "", reason_ + " (sharded iota)",
                    [&] { return em_.local_slice(line, axis_names(mesh_, spec[axis]), 0); });
    Tensor out = t.rank() == 1 ? line
                               : emit1("broadcast_in_dim", {line},
                                       Attrs{{"shape", std::vector<int64_t>(local.begin(), local.end())},
                                             {"dims", std::vector<int64_t>{axis}}});
    values_[v] = {out, spec, {}, ""};
  }

  LocalContext local_context() {
    std::vector<int64_t> sizes;
    for (const MeshAxis& a : mesh_.axes()) sizes.push_back(a.size);
    return {local_, std::move(sizes), em_.coords(), [this](const Tensor& x, const std::vector<int>& axes, const std::string& op) {
              return record(CollectiveKind::all_reduce, axes, x, -1, -1, op, reason_,
                            [&] { return em_.all_reduce(x, axis_names(mesh_, axes), op); });
            }};
  }

  // Attributes that hold global sizes, rewritten for the local shapes.
  Attrs localize(const Node& n, const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
    Attrs a = n.attrs;
    if (a.has("shape") && out.size() == 1 && n.outputs.size() == 1 && a.ints("shape") == g_.type(n.outputs[0]).shape)
      a.set("shape", std::vector<int64_t>(out[0].shape.begin(), out[0].shape.end()));
    if (n.prim == prims::slice()) {
      std::vector<int64_t> limits = a.ints("limits");
      const Shape& global = g_.type(n.inputs[0]).shape;
      for (size_t d = 0; d < limits.size(); ++d)
        if (limits[d] == global[d] && in[0].shape[d] != global[d]) limits[d] = in[0].shape[d];
      a.set("limits", limits);
    }
    return a;
  }

  const Graph& g_;
  const Mesh& mesh_;
  const Propagation& prop_;
  CollectiveEmitter& em_;
  Graph& local_;
  std::vector<CollectiveRecord>& records_;
  std::vector<Local> values_;
  std::vector<std::optional<Spec>> specs_;  // prop_.spec in the form assign_factors takes
  std::map<std::string, Tensor> cache_;
  std::string reason_;
};

std::string input_label(const Graph& g, size_t i) {
  const std::string& n = g.input_names()[i];
  return "input " + std::to_string(i) + (n.empty() ? "" : " ('" + n + "')");
}

}  // namespace

namespace {

SpmdProgram partition_impl(const Graph& g, const Mesh& mesh, const std::vector<Sharding>& in_shardings,
                           const PartitionOptions& opt) {
  ensure_sharding_registered();
  g.verify();
  if (in_shardings.size() != g.inputs().size())
    throw Error("[partition] the graph has " + std::to_string(g.inputs().size()) + " inputs but " +
                std::to_string(in_shardings.size()) + " shardings were given");
  if (opt.out_shardings.size() > g.outputs().size())
    throw Error("[partition] " + std::to_string(opt.out_shardings.size()) + " output shardings for " +
                std::to_string(g.outputs().size()) + " outputs");
  std::vector<Spec> in_specs;
  for (size_t i = 0; i < in_shardings.size(); ++i) {
    const Sharding& s = in_shardings[i];
    if (s.mesh != mesh)
      throw Error("[partition] " + input_label(g, i) + " is sharded on " + s.mesh.to_string() +
                  " but the program is partitioned over " + mesh.to_string());
    TensorType t = g.type(g.inputs()[i]);
    s.validate(t, input_label(g, i));
    in_specs.push_back(to_spec(s, t.rank()));
  }
  std::vector<std::optional<Spec>> out_specs(g.outputs().size());
  std::vector<std::vector<int>> out_partial(g.outputs().size());
  for (size_t o = 0; o < opt.out_shardings.size(); ++o) {
    if (!opt.out_shardings[o]) continue;
    const Sharding& s = *opt.out_shardings[o];
    TensorType t = g.type(g.outputs()[o]);
    s.validate(t, "output " + std::to_string(o));
    out_specs[o] = to_spec(s, t.rank());
    out_partial[o] = axis_ids(mesh, s.partial);
    std::sort(out_partial[o].begin(), out_partial[o].end());
  }
  Propagation prop = propagate(g, mesh, in_specs, out_specs);

  SpmdProgram p;
  p.mesh = mesh;
  p.in_shardings = in_shardings;
  p.local = std::make_unique<Graph>();
  Graph& local = *p.local;
  CollectiveEmitter default_emitter;
  CollectiveEmitter& em = opt.emitter ? *opt.emitter : default_emitter;
  Partitioner part(g, mesh, prop, em, local, p.collectives);
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    int v = g.inputs()[i];
    const TensorType& t = g.type(v);
    Tensor x = local.input({t.dtype, in_shardings[i].local_shape(t.shape)}, g.input_names()[i]);
    part.set_input(v, x, in_shardings[i]);
  }
  Tensor coords = local.input({DType::i32, {static_cast<int64_t>(mesh.rank())}}, "device_coords");
  em.bind(&mesh, coords);
  // Only nodes the outputs depend on: a dead consumer would otherwise pull in collectives.
  std::vector<char> live(g.values().size(), 0);
  for (int v : g.outputs()) live[v] = 1;
  std::vector<char> node_live(g.nodes().size(), 0);
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    for (int v : n.outputs) node_live[i] = node_live[i] || live[v];
    if (node_live[i])
      for (int v : n.inputs) live[v] = 1;
  }
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (node_live[i]) {
      NodeFactsScope facts(local, g.nodes()[i].facts);  // its local nodes and collectives
      part.emit_node(static_cast<int>(i));
    }
  std::vector<Tensor> outs;
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    int v = g.outputs()[o];
    Spec want = out_specs[o] ? *out_specs[o] : prop.spec[v];
    part.set_reason("output " + std::to_string(o));
    bool kept = false;
    outs.push_back(part.output(v, want, out_partial[o], kept));
    p.out_shardings.push_back(to_sharding(mesh, want, kept ? out_partial[o] : std::vector<int>{}));
  }
  local.set_outputs(outs);
  local.verify();
  for (size_t v = 0; v < g.values().size(); ++v) p.value_shardings.push_back(to_sharding(mesh, prop.spec[v]));
  // A local value holds what the global value it is a shard of holds, where that one lives.
  std::vector<int> local_of(g.values().size());
  for (size_t v = 0; v < g.values().size(); ++v) local_of[v] = part.local_id(static_cast<int>(v));
  local.copy_facts(g, local_of);
  return p;
}

}  // namespace

SpmdProgram partition(const Graph& g, const Mesh& mesh, const std::vector<Sharding>& in_shardings,
                      const PartitionOptions& opt) {
  return partition_impl(g, mesh, in_shardings, opt);
}

SpmdProgram partition(const Graph& g, const ShardingDecision& d, CollectiveEmitter* emitter) {
  dump_pass("sharding_decision", [&] { return d.to_string(g); });
  std::vector<int> to_annotated;
  std::unique_ptr<Graph> annotated = annotate(g, d, &to_annotated);
  // The values' facts carry over; a constraint's result holds what its operand holds, except a
  // value read in another layout (a gathered param), which is a collective buffer.
  annotated->copy_facts(g, to_annotated);
  std::vector<char> mapped(annotated->values().size(), 0);
  for (int v : to_annotated)
    if (v >= 0) mapped[v] = 1;
  for (const Node& n : annotated->nodes())
    for (int o : n.outputs) {
      if (mapped[o]) continue;
      ValueInfo& info = annotated->mutable_value(o);
      if (!n.inputs.empty()) info.copy_facts(annotated->values()[n.inputs[0]]);
      if (n.prim == prims::sharding_constraint() && n.attrs.has("reads"))
        info.category = MemoryCategory::collective_buffers;
    }
  dump_pass("annotate", [&] { return annotated->to_string(); });
  PartitionOptions opt;
  opt.out_shardings = d.outputs;
  opt.emitter = emitter;
  SpmdProgram p = partition_impl(*annotated, d.mesh, d.inputs, opt);
  dump_pass("partition", [&] { return p.summary(); });
  return p;
}

}  // namespace px
