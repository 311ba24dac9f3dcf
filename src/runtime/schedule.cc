#include "runtime/schedule.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "core/env.h"
#include "ir/primitive.h"
#include "ops/prims.h"
#include "parallax/backend.h"

namespace px {

namespace {

bool is_transfer(const Node& n) { return n.prim == prims::transfer(); }
bool is_fetch(const Node& n) { return is_transfer(n) && n.attrs.s("to") == "device"; }

bool is_broadcast(const Node& n) { return n.prim == prims::broadcast_in_dim() && n.outputs.size() == 1; }
bool is_reshape(const Node& n) { return n.prim == prims::reshape() && n.inputs.size() == 1 && n.outputs.size() == 1; }
bool is_reduction(const Node& n) {
  return (n.prim == prims::reduce_sum() || n.prim == prims::reduce_max()) && n.inputs.size() == 1 &&
         n.outputs.size() == 1;
}

struct Group {
  std::vector<int> nodes;
  bool fused = false;
  bool collective = false;
};

// Partitions the nodes into groups: fused groups (run at their last member) and single nodes.
// Several groups may be open at once, one per element count, so that interleaved chains of
// different sizes (forward and backward, bias and row statistics) each fuse. A node that reads an
// open group without joining it closes that group, which then runs before the node; this keeps
// "order groups by last member" a valid schedule.
std::vector<Group> form_groups(const Graph& g, const Backend& backend, const FusionLimits& limits, bool fuse_on,
                               std::vector<int>& group_of) {
  const auto& nodes = g.nodes();
  std::vector<Group> groups;
  std::map<int64_t, int> open_by_count;  // element count -> open fused group
  group_of.assign(nodes.size(), -1);
  fuse_on = fuse_on && limits.enabled;
  auto close = [&](int u) {
    for (auto it = open_by_count.begin(); it != open_by_count.end(); ++it)
      if (it->second == u) {
        open_by_count.erase(it);
        return;
      }
  };
  auto is_open = [&](int u) {
    for (auto& [cnt, ou] : open_by_count)
      if (ou == u) return true;
    return false;
  };
  // A float reduction of a value that an open group computes joins it as its last member and
  // closes it (the backend's FusionLimits::reductions): the group's loop feeds the reduction, and
  // the operand is written only if something else reads it. Not a group that only renames an
  // operand (a reshape): that is a view, which the reduction reads in place.
  auto joins_as_reduction = [&](const Node& n) {
    if (!fuse_on || !limits.reductions || !is_reduction(n) || !is_float(g.type(n.inputs[0]).dtype) ||
        !is_float(g.type(n.outputs[0]).dtype) || g.type(n.inputs[0]).numel() == g.type(n.outputs[0]).numel())
      return -1;
    const int p = g.values()[n.inputs[0]].producer;
    const int u = p < 0 ? -1 : group_of[p];
    if (u < 0 || !is_open(u) || groups[u].nodes.size() >= limits.max_group) return -1;
    for (int m : groups[u].nodes)
      if (!is_reshape(nodes[m])) return u;
    return -1;
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    for (auto it = open_by_count.begin(); it != open_by_count.end();)
      it = groups[it->second].nodes.back() + limits.window < static_cast<int>(i) ? open_by_count.erase(it) : std::next(it);
    if (const int u = joins_as_reduction(n); u >= 0) {
      groups[u].nodes.push_back(static_cast<int>(i));
      group_of[i] = u;
      close(u);
      continue;
    }
    std::vector<int> reads;  // open groups this node reads
    for (int v : n.inputs) {
      int p = g.values()[v].producer;
      if (p < 0) continue;
      int u = group_of[p];
      if (is_open(u) && std::find(reads.begin(), reads.end(), u) == reads.end()) reads.push_back(u);
    }
    const bool coll = is_async_primitive(*n.prim);
    int64_t count = n.outputs.empty() ? -1 : g.type(n.outputs[0]).numel();
    auto cand = open_by_count.find(count);
    int join = (cand != open_by_count.end() && groups[cand->second].nodes.size() < limits.max_group) ? cand->second : -1;
    // A broadcast fuses as a strided load of an external operand, never of a value inside its group.
    // A reshape keeps the flat order, so in a group it is only a new name for its operand's tile.
    bool fuse = !coll && fuse_on &&
                (backend.can_fuse(g, n) || is_reshape(n) ||
                 (is_broadcast(n) && std::find(reads.begin(), reads.end(), join) == reads.end()));
    if (!coll && !fuse_on && limits.enabled && backend.can_fuse(g, n)) fuse = true;  // a single-node loop, never joined
    for (int u : reads)
      if (!(fuse && fuse_on && u == join)) close(u);
    if (fuse && fuse_on && join >= 0 && open_by_count.count(count)) {
      groups[join].nodes.push_back(static_cast<int>(i));
      group_of[i] = join;
      continue;
    }
    groups.push_back({{static_cast<int>(i)}, fuse, coll});
    group_of[i] = static_cast<int>(groups.size()) - 1;
    if (fuse && fuse_on) open_by_count[count] = group_of[i];
  }
  // A lone broadcast or reshape computes nothing: run it with its own kernel (or as a view).
  for (Group& u : groups)
    if (u.fused && u.nodes.size() == 1 && (is_broadcast(nodes[u.nodes[0]]) || is_reshape(nodes[u.nodes[0]])) &&
        backend.has_kernel(nodes[u.nodes[0]].prim))
      u.fused = false;
  return groups;
}

struct Placed {
  int node, start, wait;
};

struct Scheduler {
  const Graph& g;
  const ScheduleOptions& opt;
  const std::vector<Node>& nodes;
  std::vector<Group> groups;
  std::vector<int> group_of;
  std::vector<std::vector<int>> users;
  std::vector<char> is_output;
  std::vector<Unit> compute;
  std::vector<int> pos_of_node;  // compute position of each non-collective node
  int n_compute = 0;
  std::vector<Placed> placed;
  std::vector<int> wait_of_value;  // collective result -> its wait position
  std::vector<int> late;           // indices into placed: all-gathers and fetches
  std::vector<int> chained;        // fetches read by a collective: they run just before it starts
  std::vector<int> first_use_of;
  std::vector<int> placed_of_node;

  Scheduler(const Graph& graph, const ScheduleOptions& options) : g(graph), opt(options), nodes(graph.nodes()) {}

  void build_compute(const std::vector<int>& order) {
    pos_of_node.assign(nodes.size(), -1);
    std::vector<char> in_group(g.values().size(), 0);
    for (int u : order) {
      const Group& grp = groups[u];
      Unit unit;
      if (grp.fused) {
        unit.kind = Unit::Kind::fused;
        unit.nodes = grp.nodes;
        for (int ni : grp.nodes) in_group[nodes[ni].outputs[0]] = 1;
        for (int ni : grp.nodes) {
          for (int v : nodes[ni].inputs)
            if (!in_group[v] && std::find(unit.in_values.begin(), unit.in_values.end(), v) == unit.in_values.end())
              unit.in_values.push_back(v);
          int out = nodes[ni].outputs[0];
          bool escapes = is_output[out];
          for (int user : users[out]) escapes = escapes || group_of[user] != u;
          if (escapes) unit.out_values.push_back(out);
        }
        for (int ni : grp.nodes) in_group[nodes[ni].outputs[0]] = 0;
        for (int ni : grp.nodes) unit.label += (unit.label.empty() ? "fused{" : ",") + nodes[ni].prim->name;
        unit.label += "}";
        // A loop that ends in a reduction writes the reduction's result while it may still read
        // operands (row by row): no result shares an operand's buffer.
        unit.alias_safe = !is_reduction(nodes[grp.nodes.back()]);
      } else {
        const Node& n = nodes[grp.nodes[0]];
        unit.kind = is_reshape(n) && !is_output[n.outputs[0]] ? Unit::Kind::view : Unit::Kind::kernel;
        unit.nodes = grp.nodes;
        unit.in_values = n.inputs;
        unit.out_values = n.outputs;
        unit.label = n.prim->name;
        unit.alias_safe = n.prim->in_place;
      }
      for (int ni : unit.nodes) pos_of_node[ni] = static_cast<int>(compute.size());
      compute.push_back(std::move(unit));
    }
    n_compute = static_cast<int>(compute.size());
  }

  // Collectives in graph order (a topological order): each gets a start and a wait position,
  // meaning "before compute unit k". A collective read by another waits at once.
  void place_collectives(const std::vector<int>& colls) {
    wait_of_value.assign(g.values().size(), -1);
    first_use_of.assign(colls.size(), 0);
    for (size_t c = 0; c < colls.size(); ++c) {
      const Node& n = nodes[groups[colls[c]].nodes[0]];
      int ready = 0;
      for (int v : n.inputs) {
        int p = g.values()[v].producer;
        if (p < 0) continue;
        ready = std::max(ready, pos_of_node[p] >= 0 ? pos_of_node[p] + 1 : wait_of_value[v]);
      }
      int first_use = n_compute;
      bool feeds_collective = false;
      for (int v : n.outputs)
        for (int user : users[v]) {
          if (pos_of_node[user] >= 0)
            first_use = std::min(first_use, pos_of_node[user]);
          else
            feeds_collective = true;
        }
      first_use = std::max(first_use, ready);
      const TensorType &in_t = g.type(n.inputs[0]), &out_t = g.type(n.outputs[0]);
      Placed p{groups[colls[c]].nodes[0], ready, ready};
      if (feeds_collective && is_fetch(n)) {
        chained.push_back(static_cast<int>(placed.size()));  // placed after its collective, below
      } else if (feeds_collective) {
        p.start = p.wait = ready;
      } else if (is_fetch(n) || (!is_transfer(n) && out_t.nbytes() > in_t.nbytes())) {
        p.start = p.wait = first_use;  // refined below with the lookahead
        late.push_back(static_cast<int>(placed.size()));
      } else {
        p.wait = std::min(first_use, ready + std::max(opt.overlap_units, 0));
      }
      first_use_of[placed.size()] = first_use;
      for (int v : n.outputs) wait_of_value[v] = p.wait;
      placed.push_back(p);
    }
    placed_of_node.assign(nodes.size(), -1);
    for (size_t c = 0; c < placed.size(); ++c) placed_of_node[placed[c].node] = static_cast<int>(c);
  }

  // Lookahead over the all-gathers and fetches in order of first use, counted in slots: each
  // all-gather is a slot, and so is each run of fetches of one prefetch group (a layer's params).
  void apply_lookahead() {
    std::stable_sort(late.begin(), late.end(), [&](int a, int b) { return first_use_of[a] < first_use_of[b]; });
    std::vector<int> slot(late.size()), slot_first_use;
    for (size_t j = 0; j < late.size(); ++j) {
      const Node& n = nodes[placed[late[j]].node];
      const Node* prev = j ? &nodes[placed[late[j - 1]].node] : nullptr;
      bool same = prev && is_fetch(n) && is_fetch(*prev) && n.attrs.has("group") && prev->attrs.has("group") &&
                  n.attrs.s("group") == prev->attrs.s("group");
      if (!same) slot_first_use.push_back(first_use_of[late[j]]);
      slot[j] = static_cast<int>(slot_first_use.size()) - 1;
    }
    for (size_t j = 0; j < late.size(); ++j) {
      Placed& p = placed[late[j]];
      int ready = 0;
      for (int v : nodes[p.node].inputs) {
        int pr = g.values()[v].producer;
        if (pr >= 0) ready = std::max(ready, pos_of_node[pr] >= 0 ? pos_of_node[pr] + 1 : wait_of_value[v]);
      }
      const int L = std::max(is_fetch(nodes[p.node]) ? opt.prefetch_depth : opt.collective_lookahead, 0);
      int start = slot[j] >= L ? slot_first_use[slot[j] - L] : ready;
      p.start = std::clamp(start, ready, p.wait);
    }
  }

  // Ahead of use, but under the peak: the device bytes live while each compute unit runs, with
  // every all-gather and fetch made at its first use, give the peak that none of them may raise.
  // Each of them (in order of first use) then starts at the earliest position from the lookahead's
  // on from which its result fits under that peak until its wait.
  void cap_by_peak() {
    std::vector<int> root(g.values().size());  // a view's storage is its operand's
    for (size_t v = 0; v < root.size(); ++v) root[v] = static_cast<int>(v);
    for (const Unit& u : compute)
      if (u.kind == Unit::Kind::view) root[u.out_values[0]] = root[u.in_values[0]];
    auto counted = [&](int v) {
      return g.values()[v].producer >= 0 && !is_output[v] && root[v] == v &&
             g.values()[v].kind != MemoryKind::pinned_host;
    };
    std::vector<int> first(g.values().size(), -1), last(g.values().size(), -1);
    for (size_t i = 0; i < nodes.size(); ++i) {
      const int c = placed_of_node[i];
      const int made = c >= 0 ? placed[c].start : pos_of_node[i];
      const int read = c >= 0 ? std::max(placed[c].wait - 1, placed[c].start) : pos_of_node[i];
      for (int v : nodes[i].outputs) first[v] = made;
      for (int v : nodes[i].inputs) last[root[v]] = std::max(last[root[v]], read);
    }
    for (int j : late)
      for (int v : nodes[placed[j].node].outputs) first[v] = placed[j].wait;
    std::vector<int64_t> live(n_compute + 1, 0);
    for (size_t v = 0; v < first.size(); ++v) {
      if (!counted(static_cast<int>(v)) || first[v] < 0 || first[v] >= n_compute) continue;
      const int64_t b = g.type(static_cast<int>(v)).nbytes();
      live[first[v]] += b;
      live[std::min(std::max(last[v], first[v]), n_compute - 1) + 1] -= b;
    }
    for (int k = 1; k <= n_compute; ++k) live[k] += live[k - 1];
    const int64_t cap = n_compute ? *std::max_element(live.begin(), live.begin() + n_compute) : 0;
    for (int j : late) {
      Placed& p = placed[j];
      int64_t b = 0;
      for (int v : nodes[p.node].outputs)
        if (counted(v)) b += g.type(v).nbytes();
      int s = p.wait;
      while (s > p.start && live[s - 1] + b <= cap) --s;
      for (int k = s; k < p.wait; ++k) live[k] += b;
      p.start = s;
    }
  }

  // A fetch read by a collective (an FSDP shard kept on the host) completes just before the
  // collective starts, or before its first compute use if that comes first.
  void place_chained() {
    for (int c : chained) {
      Placed& p = placed[c];
      int at = first_use_of[c];
      for (int v : nodes[p.node].outputs)
        for (int user : users[v])
          if (placed_of_node[user] >= 0) at = std::min(at, placed[placed_of_node[user]].start);
      p.start = p.wait = std::max(at, p.start);
    }
  }

  // Merge: at each position, collective events in graph order (start before wait).
  std::vector<Unit> merge() {
    struct Event {
      int pos, order, phase;
    };
    std::vector<Event> events;
    for (size_t c = 0; c < placed.size(); ++c) {
      events.push_back({placed[c].start, static_cast<int>(c), 0});
      events.push_back({placed[c].wait, static_cast<int>(c), 1});
    }
    std::stable_sort(events.begin(), events.end(), [](const Event& a, const Event& b) {
      if (a.pos != b.pos) return a.pos < b.pos;
      if (a.order != b.order) return a.order < b.order;
      return a.phase < b.phase;
    });
    std::vector<Unit> out;
    out.reserve(compute.size() + events.size());
    size_t e = 0;
    for (int k = 0; k <= n_compute; ++k) {
      for (; e < events.size() && events[e].pos == k; ++e) {
        const Node& n = nodes[placed[events[e].order].node];
        Unit u;
        u.kind = events[e].phase == 0 ? Unit::Kind::collective_start : Unit::Kind::collective_wait;
        u.nodes = {placed[events[e].order].node};
        u.label = n.prim->name + (events[e].phase == 0 ? ".start" : ".wait");
        if (events[e].phase == 0) {
          u.in_values = n.inputs;
          u.out_values = n.outputs;
        } else {
          u.in_values = n.inputs;
          u.in_values.insert(u.in_values.end(), n.outputs.begin(), n.outputs.end());
        }
        out.push_back(std::move(u));
      }
      if (k < n_compute) out.push_back(std::move(compute[k]));
    }
    return out;
  }
};

}  // namespace

bool is_async_primitive(const Primitive& p) { return p.spmd.collective || &p == prims::transfer(); }

std::vector<Unit> make_schedule(const Graph& g, const ScheduleOptions& opt) {
  Scheduler s(g, opt);
  const auto& nodes = g.nodes();
  const bool fuse_on = opt.fuse_elementwise && !env().disable_fusion;
  const Backend& backend = opt.backend ? *opt.backend : cpu_backend();
  s.groups = form_groups(g, backend, opt.fusion ? *opt.fusion : backend.fusion(), fuse_on, s.group_of);
  s.users.resize(g.values().size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int v : nodes[i].inputs) s.users[v].push_back(static_cast<int>(i));
  s.is_output.assign(g.values().size(), 0);
  for (int v : g.outputs()) s.is_output[v] = 1;

  // Compute groups ordered by their last member; collectives are placed among them below.
  std::vector<int> order, colls;
  for (size_t u = 0; u < s.groups.size(); ++u) (s.groups[u].collective ? colls : order).push_back(static_cast<int>(u));
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return s.groups[a].nodes.back() < s.groups[b].nodes.back(); });
  s.build_compute(order);
  s.place_collectives(colls);
  s.apply_lookahead();
  if (!s.late.empty()) s.cap_by_peak();
  s.place_chained();
  return s.merge();
}

std::string schedule_text(const std::vector<Unit>& units) {
  std::ostringstream os;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = units[u];
    os << u << ": " << unit.label << " (";
    for (size_t k = 0; k < unit.in_values.size(); ++k) os << (k ? ", " : "") << "%" << unit.in_values[k];
    os << ") ->";
    for (int v : unit.out_values) os << " %" << v;
    os << "\n";
  }
  return os.str();
}

}  // namespace px
