// Pipeline schedules as data (include/parallax/pipeline.h): GPipe, 1F1B and interleaved 1F1B by
// their closed forms, ZB-H1 by list scheduling on unit costs, and one simulator that checks any
// schedule (every action once, no deadlock) and measures its bubble and held activations.
#include "parallax/pipeline.h"

#include <algorithm>
#include <limits>
#include <map>
#include <sstream>

#include "core/enum_names.h"
#include "parallax/core.h"

namespace px::pipeline {

namespace {

const char* op_letter(Op op) {
  switch (op) {
    case Op::forward: return "F";
    case Op::backward: return "B";
    case Op::backward_input: return "I";
    case Op::backward_weight: return "W";
  }
  return "?";
}

double duration(Op op, const Costs& c) {
  switch (op) {
    case Op::forward: return c.forward;
    case Op::backward: return c.backward_input + c.backward_weight;
    case Op::backward_input: return c.backward_input;
    case Op::backward_weight: return c.backward_weight;
  }
  return 0;
}

// 1F1B over a device's sequence of `total` forward and backward items: `warmup` forwards, then one
// forward and one backward in turn, then the remaining backwards. fwd(k) / bwd(k) give item k.
template <class F, class B>
std::vector<Action> one_f_one_b(int total, int warmup, F fwd, B bwd) {
  warmup = std::min(warmup, total);
  std::vector<Action> a;
  for (int k = 0; k < warmup; ++k) a.push_back(fwd(k));
  for (int k = 0; k < total - warmup; ++k) {
    a.push_back(fwd(warmup + k));
    a.push_back(bwd(k));
  }
  for (int k = total - warmup; k < total; ++k) a.push_back(bwd(k));
  return a;
}

// ZB-H1 by list scheduling on the default unit costs. A free device runs, in this order of
// preference: a forward while it is ahead of its input gradients by fewer than D - d (1F1B's
// warm-up); the input gradient of its oldest ready microbatch (the previous stage waits for it); a
// forward, while it holds fewer than D microbatches (the most any device holds under 1F1B); a
// deferred weight gradient. Otherwise it waits for the next action anywhere to finish. With equal
// costs this meets the ZB-H1 bubble, (D-1)(F+I-W) per device.
Schedule zero_bubble(int D, int M) {
  Schedule s;
  s.kind = Kind::zero_bubble;
  s.devices = D;
  s.microbatches = M;
  s.per_device.resize(D);
  const Costs c;
  constexpr double kNever = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> f_end(D, std::vector<double>(M, kNever)), i_end = f_end;
  std::vector<double> free_at(D, 0.0);
  std::vector<int> next_f(D, 0), held(D, 0), left(D, 3 * M);
  std::vector<std::vector<int>> pending_w(D);  // microbatches whose I has run, oldest first
  std::vector<double> ends;                    // every scheduled action's end
  int remaining = 3 * M * D;
  std::vector<int> inputs_done(D, 0);
  auto choose = [&](int d, double t) {
    const bool f_ready = next_f[d] < M && held[d] < D && (d == 0 || f_end[d - 1][next_f[d]] <= t);
    if (f_ready && next_f[d] - inputs_done[d] < D - d) return Action{Op::forward, next_f[d], d};
    for (int m = 0; m < M; ++m)
      if (f_end[d][m] <= t && i_end[d][m] == kNever && (d == D - 1 || i_end[d + 1][m] <= t))
        return Action{Op::backward_input, m, d};
    if (f_ready) return Action{Op::forward, next_f[d], d};
    if (!pending_w[d].empty()) return Action{Op::backward_weight, pending_w[d].front(), d};
    return Action{Op::forward, -1, d};
  };
  while (remaining > 0) {
    double t = kNever;
    for (int d = 0; d < D; ++d)
      if (left[d] > 0) t = std::min(t, free_at[d]);
    bool any = false;
    for (int d = 0; d < D; ++d) {
      if (left[d] == 0 || free_at[d] != t) continue;
      const Action act = choose(d, t);
      if (act.microbatch < 0) continue;
      const double end = t + duration(act.op, c);
      if (act.op == Op::forward) {
        f_end[d][act.microbatch] = end;
        ++next_f[d];
        ++held[d];
      } else if (act.op == Op::backward_input) {
        i_end[d][act.microbatch] = end;
        pending_w[d].push_back(act.microbatch);
        ++inputs_done[d];
      } else {
        pending_w[d].erase(pending_w[d].begin());
        --held[d];
      }
      s.per_device[d].push_back(act);
      ends.push_back(end);
      free_at[d] = end;
      --left[d];
      --remaining;
      any = true;
    }
    if (any) continue;
    // Nobody free at t can start anything: wait for the next action to finish.
    double next = kNever;
    for (double e : ends)
      if (e > t) next = std::min(next, e);
    for (int d = 0; d < D; ++d)
      if (left[d] > 0 && free_at[d] > t) next = std::min(next, free_at[d]);
    if (next == kNever) throw Error("[pipeline] internal: the zero-bubble list schedule is stuck");
    for (int d = 0; d < D; ++d)
      if (left[d] > 0 && free_at[d] == t) free_at[d] = next;
  }
  return s;
}

}  // namespace

constexpr const char* kKindNames[] = {"gpipe", "1f1b", "interleaved", "zero_bubble"};
static_assert(std::size(kKindNames) == static_cast<size_t>(Kind::zero_bubble) + 1);

const char* kind_name(Kind k) { return enum_name(k, kKindNames); }

Kind parse_kind(const std::string& name) {
  if (auto k = enum_from_name<Kind>(name, kKindNames)) return *k;
  throw UserError("[pipeline] unknown schedule '" + name + "': use gpipe, 1f1b, interleaved or zero_bubble");
}

bool Schedule::splits_backward() const {
  for (const std::vector<Action>& dev : per_device)
    for (const Action& a : dev)
      if (a.op == Op::backward_input || a.op == Op::backward_weight) return true;
  return false;
}

std::string Schedule::to_string() const {
  std::ostringstream os;
  os << kind_name(kind) << ": " << devices << " devices, " << stages() << " stages, " << microbatches
     << " microbatches\n";
  for (size_t d = 0; d < per_device.size(); ++d) {
    os << "device " << d << ":";
    for (const Action& a : per_device[d]) {
      os << " " << op_letter(a.op) << a.microbatch;
      if (virtual_stages > 1) os << ".s" << a.stage;
    }
    os << "\n";
  }
  return os.str();
}

Schedule make_schedule(Kind kind, int devices, int microbatches, int virtual_stages) {
  if (devices < 1 || microbatches < 1 || virtual_stages < 1)
    throw UserError("[pipeline] devices (" + std::to_string(devices) + "), microbatches (" +
                    std::to_string(microbatches) + ") and virtual stages (" + std::to_string(virtual_stages) +
                    ") must each be at least 1");
  if (virtual_stages > 1 && kind != Kind::interleaved)
    throw UserError(std::string("[pipeline] ") + kind_name(kind) + " has one stage per device, got " +
                    std::to_string(virtual_stages) + " virtual stages: use the interleaved schedule");
  const int D = devices, M = microbatches, V = virtual_stages;
  if (kind == Kind::interleaved && V > 1 && M % D != 0)
    throw UserError("[pipeline] the interleaved schedule needs the microbatches (" + std::to_string(M) +
                    ") to be a multiple of the devices (" + std::to_string(D) +
                    "): use " + std::to_string((M + D - 1) / D * D) + " microbatches, or 1f1b");
  if (kind == Kind::zero_bubble) return zero_bubble(D, M);
  Schedule s;
  s.kind = kind;
  s.devices = D;
  s.virtual_stages = V;
  s.microbatches = M;
  s.per_device.resize(D);
  for (int d = 0; d < D; ++d) {
    std::vector<Action>& a = s.per_device[d];
    if (kind == Kind::gpipe) {
      for (int m = 0; m < M; ++m) a.push_back({Op::forward, m, d});
      for (int m = 0; m < M; ++m) a.push_back({Op::backward, m, d});
    } else if (V == 1) {
      a = one_f_one_b(M, D - d - 1, [&](int k) { return Action{Op::forward, k, d}; },
                      [&](int k) { return Action{Op::backward, k, d}; });
    } else {
      // Microbatches in groups of D: a group runs through the device's first stage, then its
      // second, ...; backwards visit the stages in reverse (Megatron-LM's interleaved order).
      auto mb = [&](int k) { return k / (D * V) * D + k % D; };
      auto chunk = [&](int k) { return k / D % V; };
      a = one_f_one_b(
          M * V, (D - d - 1) * 2 + (V - 1) * D,
          [&](int k) { return Action{Op::forward, mb(k), chunk(k) * D + d}; },
          [&](int k) { return Action{Op::backward, mb(k), (V - 1 - chunk(k)) * D + d}; });
    }
  }
  return s;
}

Simulation simulate(const Schedule& s, const Costs& costs) {
  return simulate(s, std::vector<Costs>(static_cast<size_t>(std::max(s.stages(), 1)), costs));
}

Simulation simulate(const Schedule& s, const std::vector<Costs>& per_stage) {
  const int D = s.devices, S = s.stages(), M = s.microbatches;
  if (static_cast<int>(per_stage.size()) != S)
    throw Error("[pipeline] " + std::to_string(per_stage.size()) + " stage costs for " + std::to_string(S) + " stages");
  if (static_cast<int>(s.per_device.size()) != D)
    throw Error("[pipeline] the schedule lists " + std::to_string(s.per_device.size()) + " devices, expected " +
                std::to_string(D));
  // When each (op, microbatch, stage) ends; -1 before it runs. A stage's backward is B, or I and W.
  enum { F, B, I, W, kOps };
  std::vector<double> end(static_cast<size_t>(kOps) * M * S, -1.0);
  auto at = [&](int op, int m, int st) -> double& { return end[(static_cast<size_t>(op) * M + m) * S + st]; };
  std::vector<char> listed(end.size(), 0);
  for (int d = 0; d < D; ++d)
    for (const Action& a : s.per_device[d]) {
      if (a.microbatch < 0 || a.microbatch >= M || a.stage < 0 || a.stage >= S || s.device_of(a.stage) != d)
        throw Error("[pipeline] device " + std::to_string(d) + " lists " + op_letter(a.op) +
                    std::to_string(a.microbatch) + " of stage " + std::to_string(a.stage) +
                    ", which is not one of its stages' microbatches");
      char& l = listed[(static_cast<size_t>(a.op) * M + a.microbatch) * S + a.stage];
      if (l) throw Error(std::string("[pipeline] ") + op_letter(a.op) + std::to_string(a.microbatch) + " of stage " +
                         std::to_string(a.stage) + " is listed twice");
      l = 1;
    }
  for (int m = 0; m < M; ++m)
    for (int st = 0; st < S; ++st) {
      auto has = [&](int op) { return listed[(static_cast<size_t>(op) * M + m) * S + st] != 0; };
      const bool split = has(I) || has(W);
      if (!has(F) || (split ? !(has(I) && has(W)) || has(B) : !has(B)))
        throw Error("[pipeline] microbatch " + std::to_string(m) + " of stage " + std::to_string(st) +
                    " needs a forward and a backward (B, or both I and W) exactly once");
    }
  Simulation r;
  r.busy.assign(D, 0.0);
  r.peak_activations.assign(D, 0);
  r.start.resize(D);
  std::vector<size_t> next(D, 0);
  std::vector<double> free_at(D, 0.0);
  std::vector<int> held(D, 0);
  auto input_grad = [&](int m, int st) { return std::max(at(B, m, st), at(I, m, st)); };
  size_t done = 0, total = 0;
  for (const auto& a : s.per_device) total += a.size();
  while (done < total) {
    bool progressed = false;
    for (int d = 0; d < D; ++d) {
      while (next[d] < s.per_device[d].size()) {
        const Action& a = s.per_device[d][next[d]];
        const int m = a.microbatch, st = a.stage;
        // What it waits for: (end time, the stage it comes from).
        std::vector<std::pair<double, int>> deps;
        if (a.op == Op::forward) {
          if (st > 0) deps.push_back({at(F, m, st - 1), st - 1});
        } else if (a.op == Op::backward_weight) {
          deps.push_back({at(I, m, st), st});
        } else {
          deps.push_back({at(F, m, st), st});
          if (st < S - 1) deps.push_back({input_grad(m, st + 1), st + 1});
        }
        double t = free_at[d];
        bool ready = true;
        for (auto [e, from] : deps) {
          if (e < 0) ready = false;
          t = std::max(t, e + (s.device_of(from) != d ? per_stage[from].message : 0.0));
        }
        if (!ready) break;
        const double e = t + duration(a.op, per_stage[st]);
        at(static_cast<int>(a.op), m, st) = e;
        r.start[d].push_back(t);
        r.busy[d] += e - t;
        free_at[d] = e;
        held[d] += a.op == Op::forward ? 1 : (a.op == Op::backward || a.op == Op::backward_weight) ? -1 : 0;
        r.peak_activations[d] = std::max(r.peak_activations[d], held[d]);
        r.makespan = std::max(r.makespan, e);
        ++next[d];
        ++done;
        progressed = true;
      }
    }
    if (!progressed) {
      std::ostringstream os;
      os << "[pipeline] the " << kind_name(s.kind) << " schedule deadlocks: ";
      for (int d = 0; d < D; ++d)
        if (next[d] < s.per_device[d].size()) {
          const Action& a = s.per_device[d][next[d]];
          os << "device " << d << " waits at " << op_letter(a.op) << a.microbatch << " of stage " << a.stage << "; ";
        }
      throw Error(os.str() + "each waits for an action that another device runs only later");
    }
  }
  double busy = 0;
  for (double b : r.busy) busy += b;
  r.bubble = r.makespan > 0 ? 1.0 - busy / (D * r.makespan) : 0.0;
  return r;
}

double bubble_theory(Kind kind, int devices, int microbatches, int virtual_stages, const Costs& c) {
  const double D = devices, M = microbatches, V = virtual_stages;
  switch (kind) {
    case Kind::gpipe:
    case Kind::one_f_one_b: return (D - 1) / (M + D - 1);
    case Kind::interleaved: return (D - 1) / (V * M + D - 1);
    case Kind::zero_bubble: {
      const double idle = (D - 1) * std::max(0.0, c.forward + c.backward_input - c.backward_weight);
      return idle / (M * (c.forward + c.backward_input + c.backward_weight) + idle);
    }
  }
  return 0;
}

}  // namespace px::pipeline
