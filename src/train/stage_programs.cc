// The pipeline pass: the traced step of one microbatch cut into stage programs (see pipeline_step.h).
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "core/dump.h"
#include "core/env.h"
#include "core/enum_names.h"
#include "ir/primitive.h"
#include "memory/rewrite.h"
#include "memory/step_program.h"
#include "parallax/ops.h"
#include "runtime/program.h"
#include "sharding/groups.h"
#include "sharding/recipes/step.h"
#include "train/pipeline_step.h"

namespace px::detail {

namespace {

constexpr int kUnset = -1;

// "blocks.3": a layer whose last name part is a number.
bool numbered(const std::string& layer) {
  const size_t dot = layer.rfind('.');
  const std::string last = dot == std::string::npos ? layer : layer.substr(dot + 1);
  return !last.empty() && last.find_first_not_of("0123456789") == std::string::npos;
}

// The stage of every layer of the params (declaration order): numbered layers by the split, a
// layer before the first numbered one with the first stage, any other with the numbered layer
// before it (final norm and head with the last stage).
std::map<std::string, int> split_layers(const std::vector<std::string>& paths, int stages,
                                        const std::vector<int>& per_stage,
                                        std::vector<std::vector<std::string>>& stage_layers) {
  std::vector<std::string> layers;
  for (const std::string& p : paths) {
    const std::string l = memory_pass::layer_of(p);
    if (std::find(layers.begin(), layers.end(), l) == layers.end()) layers.push_back(l);
  }
  const int n = static_cast<int>(std::count_if(layers.begin(), layers.end(), numbered));
  if (n == 0)
    throw UserError(
        "[pipeline] the model has no layer boundaries: a `stage` axis splits a model's numbered layers (params "
        "named like 'blocks.3.attn.wq') into stages, and none of its params is in one; use a mesh without a "
        "`stage` axis for this model");
  if (stages > n)
    throw UserError(fmt::format(
        "[pipeline] {} stages but the model has {} numbered layers: each stage needs at least one; use at most {} "
        "stages (devices on the `stage` axis times pipeline.virtual_stages)",
        stages, n, n));
  std::vector<int> split = per_stage;
  if (split.empty()) {
    if (n % stages != 0) {
      std::vector<int> example(stages, n / stages);
      for (int s = 0; s < n % stages; ++s) ++example[s];
      throw UserError(fmt::format(
          "[pipeline] the model's {} numbered layers do not split evenly into {} stages: set "
          "TrainStepOptions::pipeline.layers_per_stage (pax: pipeline.layers_per_stage), one count per stage, "
          "e.g. [{}], or use a stage count that divides {}",
          n, stages, fmt::join(example, ", "), n));
    }
    split.assign(stages, n / stages);
  }
  int sum = 0;
  for (int k : split) sum += k;
  if (static_cast<int>(split.size()) != stages || sum != n ||
      std::any_of(split.begin(), split.end(), [](int k) { return k < 1; }))
    throw UserError(fmt::format(
        "[pipeline] layers_per_stage [{}] does not fit: it needs one count of at least 1 per stage ({} stages) "
        "adding up to the model's {} numbered layers",
        fmt::join(split, ", "), stages, n));
  std::map<std::string, int> stage_of;
  stage_layers.assign(static_cast<size_t>(stages), {});
  int stage = 0, used = 0;
  for (const std::string& l : layers) {
    if (numbered(l)) {
      if (used == split[stage]) ++stage, used = 0;
      ++used;
    }
    stage_of[l] = stage;
    stage_layers[stage].push_back(l);
  }
  return stage_of;
}

// Per node: its stage. A forward node runs with the deepest layer it depends on; a backward node
// with the latest stage whose forward pass reads the forward values, params and batch it reads (a
// stage's input belongs to the stage reading it; a tied embedding, read by the first and the last
// stage, has its head's gradient on the last), but never later than the backward values it reads;
// an update node with the first stage of the params and optimizer state it reads. Forward values flow to the same or
// later stages, backward values to the same or earlier ones; a node none of this places (a constant, the batch's
// targets) runs with its readers.
std::vector<int> node_stages(const Graph& g, const std::vector<char>& phase, const std::map<std::string, int>& stage_of,
                             const std::vector<char>& live) {
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  std::vector<int> st(n, kUnset);
  std::vector<int> used_until(g.values().size(), kUnset);  // a forward value: the last stage reading it
  auto producer = [&](int v) { return g.values()[v].producer; };
  auto layer_stage = [&](int v) {
    auto it = stage_of.find(g.values()[v].layer);
    return it == stage_of.end() ? kUnset : it->second;
  };
  auto lower = [](int a, int b) { return a == kUnset ? b : b == kUnset ? a : std::min(a, b); };
  for (int i = 0; i < n; ++i) {
    int s = kUnset;
    if (phase[i] == 0)
      for (int v : nodes[i].outputs) s = std::max(s, layer_stage(v));
    for (int v : nodes[i].inputs) {
      const int q = producer(v);
      if (phase[i] == 2 && q < 0) s = lower(s, layer_stage(v));
      if (phase[i] == 1 && q < 0 && used_until[v] != kUnset) s = std::max(s, used_until[v]);
      if (q < 0 || st[q] == kUnset) continue;
      if (phase[q] == 0 && phase[i] == 0) s = std::max(s, st[q]);
      if (phase[q] == 0 && phase[i] == 1) s = std::max(s, used_until[v]);
    }
    for (int v : nodes[i].inputs) {
      const int q = producer(v);
      if (q < 0 || st[q] == kUnset) continue;
      if (phase[i] == 1 && phase[q] == 1) s = lower(s, st[q]);
    }
    if (phase[i] == 2 && s == kUnset) {  // no param: where all its operands are, else with its readers
      std::set<int> at;
      for (int v : nodes[i].inputs)
        if (producer(v) >= 0) at.insert(st[producer(v)]);
      if (at.size() == 1) s = *at.begin();
    }
    st[i] = s;
    if (phase[i] == 0 && s != kUnset) {
      for (int v : nodes[i].outputs) used_until[v] = std::max(used_until[v], s);
      for (int v : nodes[i].inputs) used_until[v] = std::max(used_until[v], s);
    }
  }
  std::vector<std::vector<int>> readers(g.values().size());
  for (int i = 0; i < n; ++i)
    if (live[i])
      for (int v : nodes[i].inputs) readers[v].push_back(i);
  for (int i = n - 1; i >= 0; --i) {
    if (st[i] != kUnset) continue;
    int s = kUnset;
    for (int v : nodes[i].outputs)
      for (int r : readers[v]) {
        if (st[r] == kUnset) continue;
        s = s == kUnset ? st[r] : phase[i] == 1 ? std::max(s, st[r]) : std::min(s, st[r]);
      }
    st[i] = s == kUnset ? 0 : s;
  }
  for (int i = 0; i < n; ++i)
    for (int v : nodes[i].inputs) {
      const int q = producer(v);
      if (q < 0 || !live[i]) continue;
      if ((phase[i] == 0 && phase[q] == 0 && st[q] > st[i]) || (phase[i] == 1 && phase[q] == 1 && st[q] < st[i]))
        throw InternalError(fmt::format("[pipeline] node {} ({}) on stage {} reads %{} of stage {} against the flow", i,
                                        nodes[i].prim ? "op" : "?", st[i], v, st[q]));
    }
  return st;
}

std::unique_ptr<Graph> subgraph(const Graph& g, const std::vector<int>& nodes, const std::vector<int>& inputs,
                                const std::vector<int>& outputs, std::vector<int>& id) {
  auto sub = std::make_unique<Graph>();
  id.assign(g.values().size(), -1);
  for (int v : inputs) {
    const int p = g.values()[v].producer;
    const std::string name = p < 0 ? g.input_names()[g.values()[v].output_index] : fmt::format("%{}", v);
    id[v] = sub->input(g.type(v), name).id();
  }
  for (int i : nodes) {
    Node n = g.nodes()[i];
    for (int& v : n.inputs) v = id.at(v);
    const int at = static_cast<int>(sub->nodes().size());
    for (size_t k = 0; k < n.outputs.size(); ++k) {
      const int v = n.outputs[k];
      n.outputs[k] = id[v] = sub->add_value(g.type(v), at, static_cast<int>(k));
    }
    sub->add_node(std::move(n));
  }
  std::vector<Tensor> outs;
  for (int v : outputs) outs.push_back(sub->tensor(id.at(v)));
  sub->set_outputs(outs);
  sub->copy_facts(g, id);
  sub->verify();
  return sub;
}

// `spec` with a group axis it leaves unused (size > 1) added to the last dim that the axis still
// divides: the layout a message is sent in, each device its slice. None when no axis is left.
std::optional<PartitionSpec> sliced_spec(const PartitionSpec& spec, const Shape& shape, const Mesh& group) {
  const std::vector<std::string> used = spec.used_axes();
  std::vector<PartitionSpec::Dim> dims = spec.dims();
  dims.resize(shape.size());
  for (const MeshAxis& a : group.axes()) {
    if (a.size < 2 || std::find(used.begin(), used.end(), a.name) != used.end()) continue;
    for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
      int64_t ways = a.size;
      for (const std::string& x : dims[d].axes) ways *= group.axis_size(x);
      if (shape[d] % ways != 0) continue;
      dims[d].axes.push_back(a.name);
      return PartitionSpec(std::move(dims));
    }
  }
  return std::nullopt;
}

// What a program computes, without the names of its values: its inputs' types, each node's
// primitive, attributes, operands and output types, where each value lives and what it holds.
std::string structure_of(const Graph& g) {
  std::string s;
  auto value = [&](int v) {
    const ValueInfo& info = g.values()[v];
    s += type_str(info.type);
    s += static_cast<char>('0' + static_cast<int>(info.kind));
    s += static_cast<char>('a' + static_cast<int>(info.category));
    s += ' ';
  };
  for (int v : g.inputs()) value(v);
  for (const Node& n : g.nodes()) {
    s += '\n';
    s += n.prim->name;
    s += n.attrs.to_string();
    for (int v : n.inputs) s += fmt::format(" %{}", v);
    s += " ->";
    for (int v : n.outputs) value(v);
  }
  for (int v : g.outputs()) s += fmt::format(" %{}", v);
  return s;
}

// The decision for one stage program (`nodes` of `g`, `id` mapping g's values to the program's):
// its inputs and outputs as given, and the constraints of the step's decision `whole` that fall on
// its nodes: a value it computes laid out as required (gradients excepted: their layout is the
// program's outputs'), a value read in a layout by its readers among these nodes.
ShardingDecision program_decision(const ShardingDecision& whole, const Graph& g, const std::vector<int>& nodes,
                                  const std::vector<int>& id, const std::set<int>& grads, const Mesh& group,
                                  std::vector<Sharding> in, std::vector<std::optional<Sharding>> outs) {
  ShardingDecision d;
  d.mesh = group;
  d.inputs = std::move(in);
  d.outputs = std::move(outs);
  std::vector<int> at(g.nodes().size(), -1);  // node of g -> its index in the program
  for (size_t j = 0; j < nodes.size(); ++j) at[nodes[j]] = static_cast<int>(j);
  for (const ValueConstraint& c : whole.constraints) {
    const int v = id[c.value];
    if (v < 0) continue;
    if (c.readers_begin < 0) {
      const int q = g.values()[c.value].producer;
      if (q >= 0 && at[q] >= 0 && !grads.count(c.value)) d.constraints.push_back({v, c.spec, -1, -1, false});
      continue;
    }
    int first = -1, last = -1;
    for (int i = c.readers_begin; i < c.readers_end; ++i) {
      if (at[i] < 0) continue;
      const auto& ins = g.nodes()[i].inputs;
      if (std::find(ins.begin(), ins.end(), c.value) == ins.end()) continue;
      if (first < 0) first = at[i];
      last = at[i];
    }
    if (first >= 0) d.constraints.push_back({v, c.spec, first, last + 1, c.regather});
  }
  return d;
}

// The split whose costliest stage costs least: each numbered layer's forward FLOPs (a forward value
// belongs to the deepest layer it depends on; its backward costs about twice its forward, in every
// layer alike), what comes before the first numbered layer with the first stage, the rest (final
// norm, head, loss) with the last.
std::vector<int> balanced_split(StepProgram& p, int stages) {
  memory_pass::label_layers(p);
  const Graph& g = *p.graph;
  std::vector<std::string> layers;
  std::set<std::string> first;  // the layers declared before the first numbered one (embeddings)
  for (const std::string& path : p.paths) {
    const std::string l = memory_pass::layer_of(path);
    if (!numbered(l) && layers.empty()) first.insert(l);
    if (numbered(l) && std::find(layers.begin(), layers.end(), l) == layers.end()) layers.push_back(l);
  }
  const int n = static_cast<int>(layers.size());
  if (n < stages || stages < 1) return {};  // split_layers says what is wrong
  std::map<std::string, int> index;
  for (int i = 0; i < n; ++i) index[layers[i]] = i;
  std::vector<double> cost(n, 0.0);
  double before = 0, after = 0;
  const std::vector<char> phase = memory_pass::phases(p);
  for (size_t k = 0; k < g.nodes().size(); ++k) {
    const Node& node = g.nodes()[k];
    if (phase[k] != 0) continue;
    std::vector<TensorType> ins, outs;
    for (int v : node.inputs) ins.push_back(g.type(v));
    for (int v : node.outputs) outs.push_back(g.type(v));
    const double f = cost_of(*node.prim, ins, outs, node.attrs).flops;
    const std::string& l = node.outputs.empty() ? std::string() : g.values()[node.outputs[0]].layer;
    auto it = index.find(l);
    if (it != index.end())
      cost[it->second] += f;
    else if (first.count(l))
      before += f;
    else
      after += f;
  }
  // best[k][j]: the least costliest stage splitting layers [0, j) into k stages.
  std::vector<double> prefix(n + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + cost[i];
  const double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int j = k; j <= n; ++j)
      for (int i = k - 1; i < j; ++i) {
        const double c = prefix[j] - prefix[i] + (k == 1 ? before : 0) + (k == stages && j == n ? after : 0);
        const double m = std::max(best[k - 1][i], c);
        if (m < best[k][j]) best[k][j] = m, cut[k][j] = i;
      }
  std::vector<int> split(stages);
  for (int k = stages, j = n; k > 0; --k) {
    split[k - 1] = j - cut[k][j];
    j = cut[k][j];
  }
  return split;
}

const char* part_name(StagePart p) {
  static constexpr const char* names[] = {"forward", "backward",   "backward_input", "backward_weight",
                                          "update",  "accumulate", "mean",           "reduce"};
  static_assert(std::size(names) == static_cast<size_t>(StagePart::reduce) + 1);
  return enum_name(p, names);
}

// Where each node of the traced step runs and the programs it is cut into.
struct Cut {
  std::vector<char> phase, live;          // per node
  std::vector<int> stage, level;          // per node; level: of an update node
  std::vector<StagePart> part;            // per node
  std::vector<int> program_of;            // per node (-1: runs nowhere)
  std::vector<std::vector<int>> members;  // per program: its nodes in program order
  std::vector<std::set<int>> read_by;     // per value: the programs reading it
};

// Each node's stage, by the split of the layers into stages (given, or balanced by cost). Nodes
// nothing reads (autodiff leaves some: the gradient of an integer count) run nowhere.
Cut choose_stages(StepProgram& p, int S, const PipelineOptions& options, StagedStep& r) {
  if (options.balance && !options.layers_per_stage.empty())
    throw UserError(
        "[pipeline] pipeline.balance and pipeline.layers_per_stage are both set: balance chooses the split by "
        "cost, layers_per_stage gives it; set one");
  const std::vector<int> split = options.balance ? balanced_split(p, S) : options.layers_per_stage;
  const std::map<std::string, int> stage_of = split_layers(p.paths, S, split, r.stage_layers);
  memory_pass::label_layers(p);
  const Graph& g = *p.graph;
  const int n = static_cast<int>(g.nodes().size());
  Cut c;
  c.phase = memory_pass::phases(p);
  c.live.assign(n, 0);
  std::vector<char> needed_value(g.values().size(), 0);
  for (int v : g.outputs()) needed_value[v] = 1;
  for (int v : p.grads()) needed_value[v] = 1;
  for (int i = n - 1; i >= 0; --i) {
    for (int v : g.nodes()[i].outputs) c.live[i] = c.live[i] || needed_value[v];
    if (c.live[i])
      for (int v : g.nodes()[i].inputs) needed_value[v] = 1;
  }
  c.stage = node_stages(g, c.phase, stage_of, c.live);
  return c;
}

// Each node's part: forward, backward (split, when the schedule's actions are I and W, into what
// other stages wait for, I, and the rest, W) and update, cut into levels.
void choose_parts(const Graph& g, bool split_backward, Cut& c) {
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  c.part.assign(n, StagePart::forward);
  c.level.assign(n, 0);
  std::vector<char> needed(g.values().size(), 0);
  if (split_backward)
    for (int i = 0; i < n; ++i)
      for (int v : c.live[i] && c.phase[i] == 1 ? nodes[i].inputs : std::vector<int>{}) {
        const int q = g.values()[v].producer;
        if (q >= 0 && c.phase[q] == 1 && c.stage[q] != c.stage[i]) needed[v] = 1;
      }
  for (int i = n - 1; i >= 0; --i) {
    if (c.phase[i] != 1 || !c.live[i]) continue;
    bool input_part = false;
    for (int v : nodes[i].outputs) input_part = input_part || needed[v];
    c.part[i] = !split_backward ? StagePart::backward
                : input_part    ? StagePart::backward_input
                                : StagePart::backward_weight;
    if (input_part)
      for (int v : nodes[i].inputs) {
        const int q = g.values()[v].producer;
        if (q >= 0 && c.phase[q] == 1 && c.stage[q] == c.stage[i]) needed[v] = 1;
      }
  }
  for (int i = 0; i < n; ++i) {
    if (c.phase[i] != 2) continue;
    c.part[i] = StagePart::update;
    for (int v : nodes[i].inputs) {
      const int q = g.values()[v].producer;
      if (q >= 0 && c.phase[q] == 2) c.level[i] = std::max(c.level[i], c.level[q] + (c.stage[q] != c.stage[i] ? 1 : 0));
    }
  }
}

// Programs: one per (part, stage, level), nodes in program order.
void cut_programs(Graph& g, int S, Cut& c, StagedStep& r) {
  const int n = static_cast<int>(g.nodes().size());
  std::map<std::tuple<int, int, int>, int> index;
  c.program_of.assign(n, -1);
  for (int i = 0; i < n; ++i) {
    if (!c.live[i]) continue;
    const bool update = c.part[i] == StagePart::update;
    auto key = std::make_tuple(update ? 1 : 0, update ? c.level[i] : 0, static_cast<int>(c.part[i]) * S + c.stage[i]);
    auto [it, added] = index.emplace(key, static_cast<int>(r.programs.size()));
    if (added) {
      StageProgram& sp = r.programs.emplace_back();
      sp.part = c.part[i];
      sp.stage = c.stage[i];
      sp.level = c.level[i];
      c.members.emplace_back();
    }
    c.program_of[i] = it->second;
    c.members[it->second].push_back(i);
  }
  for (int i = 0; i < n; ++i) g.mutable_nodes()[i].facts.stage = c.stage[i];  // written on the program
}

// Each program's inputs (what it reads from elsewhere) and outputs (what is read elsewhere, the
// step's outputs and what is summed over microbatches: the loss and each gradient).
void connect_programs(const StepProgram& p, Cut& c, StagedStep& r) {
  const Graph& g = *p.graph;
  const auto& nodes = g.nodes();
  std::set<int> acc = {g.outputs().at(0)};
  for (int v : p.grads()) acc.insert(v);
  r.accumulated.assign(acc.begin(), acc.end());
  std::set<int> graph_outputs(g.outputs().begin(), g.outputs().end());
  c.read_by.resize(g.values().size());
  for (size_t i = 0; i < nodes.size(); ++i)
    if (c.live[i])
      for (int v : nodes[i].inputs) c.read_by[v].insert(c.program_of[i]);
  auto is_micro = [](StagePart q) { return q != StagePart::update; };
  for (size_t k = 0; k < r.programs.size(); ++k) {
    StageProgram& sp = r.programs[k];
    std::set<int> seen;
    for (int i : c.members[k])
      for (int v : nodes[i].inputs) {
        const int q = g.values()[v].producer;
        if ((q >= 0 && c.program_of[q] == static_cast<int>(k)) || !seen.insert(v).second) continue;
        if (q >= 0 && !is_micro(sp.part) && is_micro(c.part[q]) && !acc.count(v))
          throw InternalError(fmt::format("[pipeline] the update reads %{}, a value of one microbatch", v));
        sp.inputs.push_back(v);
      }
    for (int i : c.members[k])
      for (int v : nodes[i].outputs) {
        bool out = graph_outputs.count(v) || acc.count(v);
        for (int reader : c.read_by[v]) out = out || reader != static_cast<int>(k);
        if (out) sp.outputs.push_back(v);
        if (graph_outputs.count(v) && is_micro(sp.part) && !acc.count(v))
          throw InternalError(fmt::format("[pipeline] output %{} is computed per microbatch", v));
      }
  }
}

// The device groups: the mesh's positions at each `stage` coordinate, over the other axes.
void build_device_groups(const Mesh& mesh, const pipeline::Schedule& schedule, const Cluster* cluster, StagedStep& r) {
  const std::vector<MeshAxis>& axes = mesh.axes();
  size_t stage_dim = 0;
  std::vector<MeshAxis> others;
  for (size_t a = 0; a < axes.size(); ++a) {
    if (axes[a].name == "stage")
      stage_dim = a;
    else
      others.push_back(axes[a]);
  }
  for (int d = 0; d < schedule.devices; ++d) {
    std::vector<int> ids;
    int process = -1;
    for (int q = 0; q < mesh.size(); ++q) {
      if (mesh.coords(q)[stage_dim] != d) continue;
      ids.push_back(mesh.device_ids()[q]);
      if (process >= 0 && mesh.process_of(q) != process)
        throw UserError(fmt::format(
            "[pipeline] device group {} (stage coordinate {}) spans processes {} and {} of {}: a process must hold "
            "whole device groups; put the `stage` axis first (e.g. stage:2,data:2 over 2 processes)",
            d, d, process, mesh.process_of(q), mesh.to_string()));
      process = mesh.process_of(q);
    }
    r.groups.push_back(Mesh(others, ids, mesh.platform()));
    r.process_of_group.push_back(process);
  }
  // A process runs each of its groups on a thread of its own: the groups share its threads.
  std::map<int, int> groups_of;
  int most = 0;
  for (int p : r.process_of_group) most = std::max(most, ++groups_of[p]);
  if (most > 1) r.threads_per_group = std::max(1, process_threads() / most);
  if (cluster) r.stage_link = axes[stage_dim].link;
}

// Params and state by the plan, the batch's rows over its batch axes, the step counter replicated.
void set_input_specs(const StepProgram& p, const ShardingPlan& plan, const std::vector<PartitionSpec>& state_specs,
                     StagedStep& r) {
  const Graph& g = *p.graph;
  for (const std::string& a : plan.batch_axes) r.batch_shards *= static_cast<int>(plan.mesh.axis_size(a));
  const size_t n_io = p.n_params + p.n_state;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    if (i < p.n_params)
      r.input_specs.push_back(plan.params[i].spec);
    else if (i < n_io)
      r.input_specs.push_back(state_specs[i - p.n_params]);
    else if (i < n_io + p.n_batch && g.type(g.inputs()[i]).rank() > 0 && !plan.batch_axes.empty())
      r.input_specs.push_back(PartitionSpec({PartitionSpec::Dim(plan.batch_axes)}));
    else
      r.input_specs.emplace_back();
  }
}

// What each program must leave: a microbatch's gradient laid out as its param and the loss
// replicated, each left a partial sum over the batch axes where it is one (summed over the
// microbatches first, reduced once a step by the stage's reduce program); the new params and
// state as the old.
std::map<int, Sharding> output_shardings(const StepProgram& p, const ShardingPlan& plan, const StagedStep& r) {
  const Graph& g = *p.graph;
  std::map<int, Sharding> out_sharding;
  auto partial_beside = [&](const PartitionSpec& spec) {  // the batch axes the spec does not split over
    std::vector<std::string> axes;
    const std::vector<std::string> used = spec.used_axes();
    for (const std::string& a : plan.batch_axes)
      if (std::find(used.begin(), used.end(), a) == used.end()) axes.push_back(a);
    return axes;
  };
  const std::vector<int> grads = p.grads();
  for (size_t i = 0; i < grads.size(); ++i)
    out_sharding[grads[i]] = Sharding(Mesh(), plan.params[i].spec, partial_beside(plan.params[i].spec));
  out_sharding[g.outputs()[0]] = Sharding(Mesh(), PartitionSpec(), plan.batch_axes);
  for (size_t i = 0; i < p.n_params + p.n_state && 3 + i < g.outputs().size(); ++i)
    out_sharding.emplace(g.outputs()[3 + i], Sharding(Mesh(), r.input_specs[i]));
  return out_sharding;
}

// The programs in an order that runs each after the programs it reads from.
std::vector<int> program_order(const Graph& g, const Cut& c, const std::vector<StageProgram>& programs) {
  std::vector<int> order, waiting(programs.size(), 0);
  std::vector<std::vector<int>> consumers(programs.size());
  for (size_t k = 0; k < programs.size(); ++k)
    for (int v : programs[k].inputs) {
      const int q = g.values()[v].producer;
      if (q < 0) continue;
      consumers[c.program_of[q]].push_back(static_cast<int>(k));
      ++waiting[k];
    }
  for (size_t k = 0; k < programs.size(); ++k)
    if (waiting[k] == 0) order.push_back(static_cast<int>(k));
  for (size_t i = 0; i < order.size(); ++i)
    for (int k : consumers[order[i]])
      if (--waiting[k] == 0) order.push_back(k);
  if (order.size() != programs.size())
    throw InternalError("[pipeline] the stage programs depend on each other in a cycle");
  return order;
}

// Partitions each program over its stage's devices and compiles it through the runtime's passes
// (or only plans it), timed on the cluster.
struct StageCompiler {
  const Graph& g;
  StagedStep& r;
  const Cluster* cluster;
  bool compile;
  std::map<int, Sharding> out_sharding;
  CompileOptions o;
  // The recipe's layouts inside the step (FSDP: a param gathered where it is read; activation
  // rules), each program given those of its own nodes. The gradients are laid out by the outputs.
  ShardingDecision whole;
  std::set<int> grads;
  std::vector<std::optional<PartitionSpec>> spec_of;  // per value crossing programs: its layout
  std::vector<std::vector<std::string>> partial_of;   // and the axes it is a partial sum over
  std::map<int, PartitionSpec> sent_split;            // value -> its layout where read, when sent split
  // Planning only, the middle stages' programs are alike but for their params' names: each kind
  // is timed and planned once (every group has the same shape of mesh and the same links).
  std::map<std::string, std::pair<double, int64_t>> planned_alike;

  // Offload: where each param and optimizer state array lives, its prefetch group, and per value
  // the state array whose new value it is.
  bool offloading = false, host_update = false;
  std::vector<MemoryKind> state_kind;
  std::vector<std::string> state_group;
  std::map<int, size_t> new_state_of;

  StageCompiler(const StepProgram& p, const ShardingPlan& plan, const std::vector<PartitionSpec>& state_specs,
                const CompileOptions& copt, const OffloadOptions& offload, const Cluster* cluster, bool compile,
                StagedStep& r)
      : g(*p.graph), r(r), cluster(cluster), compile(compile), out_sharding(output_shardings(p, plan, r)), o(copt) {
    o.platform = plan.mesh.platform();
    o.output_donors.clear();
    o.memory_limit_bytes = o.host_memory_limit_bytes = 0;
    o.one_forward_pass = false;
    host_update = offload.optimizer_state && p.n_state > 0;
    state_kind = offloaded_state(offload, p.paths, p.n_state);
    offloading = std::count(state_kind.begin(), state_kind.end(), MemoryKind::pinned_host) > 0;
    if (offloading) o.prefetch_depth = offload.prefetch_depth;
    for (size_t j = 0; j < state_kind.size(); ++j) {
      state_group.push_back(j < p.n_params ? memory_pass::layer_of(p.paths[j]) : g.input_names()[j]);
      new_state_of[g.outputs().at(3 + j)] = j;
    }
    std::vector<TensorType> batch_types;
    for (size_t i = 0; i < p.n_batch; ++i) batch_types.push_back(g.type(g.inputs()[p.n_params + p.n_state + i]));
    whole = decide_train_step(p, plan, state_specs, batch_types, /*bucket_bytes=*/0);
    for (size_t v = 0; v < g.values().size(); ++v)
      if (g.values()[v].grad_of >= 0 || g.values()[v].micro_grad_of >= 0) grads.insert(static_cast<int>(v));
    spec_of.resize(g.values().size());
    partial_of.resize(g.values().size());
  }

  // The state array that graph input value v is, or -1.
  int state_index(int v) const {
    const ValueInfo& info = g.values()[v];
    return info.producer < 0 && static_cast<size_t>(info.output_index) < state_kind.size() ? info.output_index : -1;
  }

  // The offload pass on program sp's partitioned program (offload_step's rewrite, as the flat
  // step's): the offloaded state it reads fetched ahead of use, its update on the host where the
  // optimizer state is there (else only the parts reading an offloaded param), new values left
  // where the old ones live.
  void offload(SpmdProgram& prog, const StageProgram& sp) const {
    if (!offloading) return;
    memory_pass::OffloadRewrite w;
    bool any = false;
    for (int v : sp.inputs) {
      const int j = state_index(v);
      w.in_kind.push_back(j >= 0 ? state_kind[j] : MemoryKind::device);
      w.group.push_back(j >= 0 ? state_group[j] : "");
      any = any || w.in_kind.back() == MemoryKind::pinned_host;
    }
    w.in_kind.resize(prog.local->inputs().size(), MemoryKind::device);  // the mesh coordinates after them
    w.group.resize(w.in_kind.size());
    const bool update = sp.part == StagePart::update;
    for (int v : sp.outputs) {
      auto it = new_state_of.find(v);
      w.out_kind.push_back(it == new_state_of.end() ? std::nullopt : std::optional<MemoryKind>(state_kind[it->second]));
    }
    if (!any && !(update && host_update)) return;
    if (update && !host_update) {  // only the elementwise parts reading an offloaded param run on the host
      const Graph& local = *prog.local;
      std::vector<char> offloaded(local.values().size(), 0);
      for (size_t k = 0; k < w.in_kind.size(); ++k)
        offloaded[local.inputs()[k]] = w.in_kind[k] == MemoryKind::pinned_host;
      if (auto split = memory_pass::split_host_updates(local, offloaded)) prog.local = std::move(split);
    }
    w.update.assign(prog.local->nodes().size(), update);
    w.host_update = host_update;
    prog.local = memory_pass::offload_program(*prog.local, w);
  }

  void finish(StageProgram& sp, SpmdProgram prog, const Mesh& group) {
    for (int v : prog.local->inputs()) sp.input_kinds.push_back(prog.local->values()[v].kind);
    const ThreadBudget budget(r.threads_per_group);  // the kernels (and their scratch) for the group's threads
    if (compile) {
      if (cluster) sp.seconds = cost_program(prog, *cluster, o).step_s;
      sp.exe = ShardedExecutable::compile(std::move(prog), o, DeviceParallelism::within_kernels);
      sp.arena_bytes = sp.exe->executable().peak_bytes();
      return;
    }
    auto [it, added] = planned_alike.try_emplace(structure_of(*prog.local));
    if (added) {
      it->second.first = cluster ? cost_program(prog, *cluster, o).step_s : 0.0;
      it->second.second = plan_program(*prog.local, o, collective_groups(group)).report.arena_bytes;
    }
    std::tie(sp.seconds, sp.arena_bytes) = it->second;
  }

  // Program k's layouts: an input as its producer left it (a graph input by its spec), an output
  // as the step must leave it, the recipe's on its nodes, a value received split gathered where read.
  ShardingDecision stage_decision(int k, const Cut& c, const Graph& sub, const std::vector<int>& id,
                                  const Mesh& group) {
    const StageProgram& sp = r.programs[k];
    std::vector<Sharding> in;
    for (int v : sp.inputs) {
      const ValueInfo& info = g.values()[v];
      in.emplace_back(group, info.producer >= 0 ? spec_of[v].value() : r.input_specs.at(info.output_index));
    }
    std::vector<std::optional<Sharding>> outs;
    for (int v : sp.outputs) {
      auto it = out_sharding.find(v);
      outs.push_back(it == out_sharding.end()
                         ? std::nullopt
                         : std::optional<Sharding>(Sharding(group, it->second.spec, it->second.partial)));
    }
    ShardingDecision decision = program_decision(whole, g, c.members[k], id, grads, group, in, outs);
    for (int input : sp.inputs) {
      auto it = sent_split.find(input);
      if (it == sent_split.end()) continue;
      const int v = id[input];
      int first = -1, last = -1;
      for (size_t j = 0; j < sub.nodes().size(); ++j)
        for (int x : sub.nodes()[j].inputs)
          if (x == v) {
            if (first < 0) first = static_cast<int>(j);
            last = static_cast<int>(j);
          }
      if (first >= 0) decision.constraints.push_back({v, it->second, first, last + 1, false});
    }
    return decision;
  }

  // A value another stage reads and that this group holds whole on some axis (tensor
  // parallelism's activations, replicated over `model`) is sent split over that axis, each
  // device its slice, and gathered by the reader's group over its own devices: a message of
  // 1 / t the bytes. The partitioner's layout first; then, where that applies, the split asked.
  void split_sent_values(const StageProgram& sp, const Cut& c, const Graph& sub, const Mesh& group,
                         ShardingDecision& decision) {
    std::vector<char> to_other_stage(sp.outputs.size(), 0);
    for (size_t i = 0; i < sp.outputs.size(); ++i)
      for (int reader : c.read_by[sp.outputs[i]]) to_other_stage[i] |= r.programs[reader].stage != sp.stage;
    if (group.size() <= 1 || std::count(to_other_stage.begin(), to_other_stage.end(), 1) == 0) return;
    SpmdProgram first;
    {
      DumpCandidates quiet;
      first = partition(sub, decision);
    }
    for (size_t i = 0; i < sp.outputs.size(); ++i) {
      const int v = sp.outputs[i];
      if (!to_other_stage[i] || decision.outputs[i] || !first.out_shardings[i].partial.empty()) continue;
      if (std::optional<PartitionSpec> sliced = sliced_spec(first.out_shardings[i].spec, g.type(v).shape, group)) {
        decision.outputs[i] = Sharding(group, *sliced);
        sent_split[v] = first.out_shardings[i].spec;
      }
    }
  }

  // Producers first: a value crossing programs keeps the layout its producer gives it. PX_DUMP
  // writes every program in pipeline_stages.
  void compile_programs(const Cut& c, const std::vector<int>& order) {
    r.device_bytes.assign(g.values().size(), 0);
    std::string dump;
    for (int k : order) {
      StageProgram& sp = r.programs[k];
      const Mesh& group = r.groups[r.schedule.device_of(sp.stage)];
      std::vector<int> id;  // value of the traced step -> of the program
      std::unique_ptr<Graph> sub = subgraph(g, c.members[k], sp.inputs, sp.outputs, id);
      const std::string name = fmt::format("stage{}.{}{}", sp.stage, part_name(sp.part),
                                           sp.part == StagePart::update ? fmt::format(".level{}", sp.level) : "");
      if (dumping()) dump += fmt::format("# {} on {}\n{}\n", name, group.to_string(), sub->to_string());
      ShardingDecision decision = stage_decision(k, c, *sub, id, group);
      split_sent_values(sp, c, *sub, group, decision);
      DumpProgram scope("train_step." + name);
      SpmdProgram prog = partition(*sub, decision);
      offload(prog, sp);
      for (size_t i = 0; i < sp.outputs.size(); ++i) {
        const int v = sp.outputs[i];
        spec_of[v] = prog.out_shardings[i].spec;
        partial_of[v] = prog.out_shardings[i].partial;
        r.device_bytes[v] = TensorType{g.type(v).dtype, prog.out_shardings[i].local_shape(g.type(v).shape)}.nbytes();
      }
      finish(sp, std::move(prog), group);
    }
    dump_pass("pipeline_stages", [&] { return dump; });
    r.value_spec.resize(g.values().size());
    for (size_t v = 0; v < g.values().size(); ++v)
      if (spec_of[v]) r.value_spec[v] = *spec_of[v];
  }

  // Per stage: one reduce of the sums left partial over the batch axes (the loss, DDP's gradients).
  void add_reduce_programs() {
    const int S = r.schedule.stages();
    r.reduce.assign(S, -1);
    for (int st = 0; st < S; ++st) {
      std::vector<int> vals;
      for (int v : r.accumulated)
        if (stage_of(g, v) == st && !partial_of[v].empty()) vals.push_back(v);
      if (vals.empty()) continue;
      std::vector<TensorType> types;
      for (int v : vals) types.push_back(g.type(v));
      auto same = trace([](const std::vector<Tensor>& in) { return in; }, types);
      const Mesh& group = r.groups[r.schedule.device_of(st)];
      std::vector<Sharding> in;
      PartitionOptions popt;
      for (int v : vals) {
        in.emplace_back(group, spec_of[v].value(), partial_of[v]);
        popt.out_shardings.push_back(Sharding(group, spec_of[v].value()));
      }
      StageProgram sp;
      sp.part = StagePart::reduce;
      sp.stage = st;
      sp.inputs = sp.outputs = vals;
      DumpProgram scope(fmt::format("train_step.stage{}.reduce", st));
      finish(sp, partition(*same, group, in, popt), group);
      r.reduce[st] = static_cast<int>(r.programs.size());
      r.programs.push_back(std::move(sp));
    }
  }

  // Per stage, with microbatches: the same additions and division of the loss and gradients as
  // the microbatched step on one device (trace_step.cc), on each device's copy.
  void add_accumulate_and_mean() {
    const int S = r.schedule.stages(), M = r.schedule.microbatches;
    r.accumulate.assign(S, -1);
    r.mean.assign(S, -1);
    if (M <= 1) return;
    for (int s = 0; s < S; ++s) {
      std::vector<int> vals;
      for (int v : r.accumulated)
        if (stage_of(g, v) == s) vals.push_back(v);
      if (vals.empty()) continue;
      std::vector<TensorType> types;  // as each device holds them
      for (int v : vals)
        types.push_back({g.type(v).dtype, Sharding(r.groups[0], spec_of[v].value()).local_shape(g.type(v).shape)});
      const size_t k = vals.size();
      std::vector<TensorType> two = types;
      two.insert(two.end(), types.begin(), types.end());
      auto sum = trace(
          [&](const std::vector<Tensor>& in) {
            std::vector<Tensor> out;
            for (size_t i = 0; i < k; ++i) out.push_back(in[i] + in[k + i]);
            return out;
          },
          two);
      auto mean = trace(
          [&](const std::vector<Tensor>& in) {
            std::vector<Tensor> out;
            for (size_t i = 0; i < k; ++i) out.push_back(in[i] / static_cast<double>(M));
            return out;
          },
          types);
      CompileOptions in_place = o;
      for (size_t i = 0; i < k; ++i) in_place.output_donors.push_back(static_cast<int>(i));
      const ThreadBudget budget(r.threads_per_group);
      for (auto [q, graph] : {std::pair{StagePart::accumulate, sum.get()}, std::pair{StagePart::mean, mean.get()}}) {
        StageProgram sp;
        sp.part = q;
        sp.stage = s;
        sp.inputs = sp.outputs = vals;
        if (compile) {  // on the group's first device, whose arena the group's programs share
          DeviceSetup first;
          first.device_ids = {r.groups[r.schedule.device_of(s)].device_ids().at(0)};
          sp.local = compile_on_devices(*graph, in_place, first);
          sp.arena_bytes = sp.local->peak_bytes();
        } else {  // planned only (remat auto's candidates): their loops' scratch counts too
          sp.arena_bytes = plan_program(*graph, in_place, {}).report.arena_bytes;
        }
        (q == StagePart::accumulate ? r.accumulate : r.mean)[s] = static_cast<int>(r.programs.size());
        r.programs.push_back(std::move(sp));
      }
    }
  }
};

// Per stage: the program of each part; the update programs by level, then stage.
void index_programs(StagedStep& r) {
  auto per_stage = [&](StagePart q) {
    std::vector<int> v(r.schedule.stages(), -1);
    for (size_t k = 0; k < r.programs.size(); ++k)
      if (r.programs[k].part == q) v[r.programs[k].stage] = static_cast<int>(k);
    return v;
  };
  r.forward = per_stage(StagePart::forward);
  r.backward = per_stage(StagePart::backward);
  r.backward_input = per_stage(StagePart::backward_input);
  r.backward_weight = per_stage(StagePart::backward_weight);
  std::vector<std::pair<std::pair<int, int>, int>> ups;
  for (size_t k = 0; k < r.programs.size(); ++k)
    if (r.programs[k].part == StagePart::update)
      ups.push_back({{r.programs[k].level, r.programs[k].stage}, static_cast<int>(k)});
  std::sort(ups.begin(), ups.end());
  for (auto& u : ups) r.updates.push_back(u.second);
}

}  // namespace

StagedStep stage_programs(StepProgram p, const pipeline::Schedule& schedule, const PipelineOptions& options,
                          const Mesh& mesh, const ShardingPlan& plan, const std::vector<PartitionSpec>& state_specs,
                          const CompileOptions& copt, const OffloadOptions& offload, const Cluster* cluster,
                          bool compile) {
  StagedStep r;
  r.schedule = schedule;
  r.n_params = p.n_params;
  r.n_state = p.n_state;
  r.n_batch = p.n_batch;
  Cut c = choose_stages(p, schedule.stages(), options, r);
  const Graph& g = *p.graph;
  r.split_backward = schedule.splits_backward();
  choose_parts(g, r.split_backward, c);
  cut_programs(*p.graph, schedule.stages(), c, r);
  connect_programs(p, c, r);
  build_device_groups(mesh, schedule, cluster, r);
  set_input_specs(p, plan, state_specs, r);
  StageCompiler compiler(p, plan, state_specs, copt, offload, cluster, compile, r);
  compiler.compile_programs(c, program_order(g, c, r.programs));
  index_programs(r);
  compiler.add_reduce_programs();
  compiler.add_accumulate_and_mean();
  r.graph = std::move(p.graph);
  return r;
}

}  // namespace px::detail

namespace px::detail {

StagedStep one_stage(std::unique_ptr<Graph> graph, std::unique_ptr<ShardedExecutable> exe, size_t n_params,
                     size_t n_state) {
  const Graph& g = *graph;
  const size_t nv = g.values().size(), n_state_in = n_params + n_state;
  StagedStep r;
  r.n_params = n_params;
  r.n_state = n_state;
  r.n_batch = g.inputs().size() - n_state_in - 1;  // the step counter is the last input
  r.schedule.per_device.assign(1, {});
  r.groups = {exe->in_sharding(0).mesh};
  r.process = exe->process();
  r.stage_layers.assign(1, {});
  for (Node& n : graph->mutable_nodes()) n.facts.stage = 0;
  r.device_bytes.assign(nv, 0);
  r.value_spec.resize(nv);
  for (std::vector<int>* part :
       {&r.forward, &r.backward, &r.backward_input, &r.backward_weight, &r.accumulate, &r.mean, &r.reduce})
    part->assign(1, -1);
  // Its working memory: what the program plans beside the state it reads in device memory.
  int64_t state_bytes = 0;
  StageProgram sp;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    r.input_specs.push_back(exe->in_sharding(static_cast<int>(i)).spec);
    sp.input_kinds.push_back(exe->executable().input_kind(static_cast<int>(i)));
    if (i < n_state_in && exe->executable().input_kind(static_cast<int>(i)) == MemoryKind::device)
      state_bytes += TensorType{g.type(g.inputs()[i]).dtype,
                                exe->in_sharding(static_cast<int>(i)).local_shape(g.type(g.inputs()[i]).shape)}
                         .nbytes();
  }
  sp.part = StagePart::step;
  sp.inputs = g.inputs();
  sp.outputs = g.outputs();
  sp.arena_bytes = exe->memory().peak_bytes - state_bytes;
  sp.exe = std::move(exe);
  r.programs.push_back(std::move(sp));
  r.updates = {0};
  r.graph = std::move(graph);
  return r;
}

}  // namespace px::detail
