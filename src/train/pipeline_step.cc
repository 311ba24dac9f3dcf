// The run loop of a pipelined step: one thread per device runs its stages' programs in the
// schedule's order; a value another device reads is sent as a message when it is computed and
// received when the reader's action starts. What a device holds (activations, gradients, messages
// received) is counted at every action, as the plan counts it from the schedule.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "core/env.h"
#include "train/pipeline_step.h"

namespace px {

int64_t PipelineReport::planned_peak(int d) const {
  return state_bytes.at(d) + accumulator_bytes.at(d) + arena_bytes.at(d) + planned_held_bytes.at(d);
}

int64_t PipelineReport::measured_peak(int d) const {
  if (measured_held_bytes.empty()) return 0;
  return state_bytes.at(d) + accumulator_bytes.at(d) + arena_bytes.at(d) + measured_held_bytes.at(d);
}

double PipelineReport::bubble_measured() const {
  if (timeline.empty() || schedule_s <= 0) return 0;
  double busy = 0;
  int devices = 0;  // the devices timed here (over several processes: this process's)
  for (const auto& dev : timeline) {
    devices += !dev.empty();
    for (const Span& s : dev)
      if (s.name != "update" && s.name != "step") busy += s.end_s - s.begin_s;
  }
  return devices ? 1.0 - busy / (static_cast<double>(devices) * schedule_s) : 0;
}

double PipelineReport::bubble_theory() const {
  return pipeline::bubble_theory(schedule.kind, schedule.devices, schedule.microbatches, schedule.virtual_stages);
}

std::string PipelineReport::to_string() const {
  std::ostringstream os;
  os << "pipeline: " << pipeline::kind_name(schedule.kind) << ", " << schedule.devices << " devices, "
     << schedule.stages() << " stages, " << schedule.microbatches << " microbatches";
  if (threads_per_group > 0) os << ", " << threads_per_group << " thread(s) per device group";
  os << "\n";
  for (size_t s = 0; s < stage_layers.size(); ++s)
    os << fmt::format("  stage {} (device {}): {}\n", s, schedule.device_of(static_cast<int>(s)),
                      fmt::join(stage_layers[s], ", "));
  for (int d = 0; d < schedule.devices; ++d) {
    os << fmt::format(
        "  device {}: planned peak {} bytes (params and optimizer state {}, gradient sums {}, programs {}, held "
        "{})",
        d, planned_peak(d), state_bytes[d], accumulator_bytes[d], arena_bytes[d], planned_held_bytes[d]);
    if (!measured_held_bytes.empty()) os << fmt::format(", measured peak {} bytes", measured_peak(d));
    os << "\n";
  }
  os << fmt::format("  messages per step: {} ({} bytes, all devices)\n", messages, message_bytes);
  if (predicted_step_s > 0)
    os << fmt::format("  predicted: step {:.4g} s (schedule {:.4g} s, bubble {:.3f})\n", predicted_step_s,
                      predicted_schedule_s, predicted_bubble);
  os << fmt::format("  bubble: {:.3f} in theory (unit costs)", bubble_theory());
  if (!timeline.empty()) os << fmt::format(", {:.3f} measured over {:.4f} s", bubble_measured(), schedule_s);
  os << "\n";
  return os.str();
}

std::string PipelineReport::chrome_trace() const {
  std::ostringstream os;
  os << "{\"traceEvents\":[";
  bool first = true;
  for (size_t d = 0; d < timeline.size(); ++d) {
    os << (first ? "" : ",")
       << fmt::format(
              "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":{},\"args\":{{\"name\":\"device {}\"}}}}", d,
              d);
    first = false;
    for (const Span& s : timeline[d])
      os << fmt::format(",{{\"name\":\"{}\",\"ph\":\"X\",\"pid\":0,\"tid\":{},\"ts\":{:.3f},\"dur\":{:.3f}}}", s.name,
                        d, s.begin_s * 1e6, (s.end_s - s.begin_s) * 1e6);
  }
  os << "]}";
  return os.str();
}

namespace pipeline {

bool has_stage_axis(const Mesh& mesh) {
  for (const MeshAxis& a : mesh.axes())
    if (a.name == "stage") return true;
  return false;
}

std::string action_name(const Action& a, bool with_stage) {
  const char* letter = a.op == Op::forward ? "F" : a.op == Op::backward ? "B" : a.op == Op::backward_input ? "I" : "W";
  return fmt::format("{}{}{}", letter, a.microbatch, with_stage ? fmt::format(".s{}", a.stage) : "");
}

}  // namespace pipeline

namespace detail {

namespace {

using Clock = std::chrono::steady_clock;

// Messages between processes carry host memory: an array on devices the host cannot reach is sent
// from a host copy (send copies it before returning).
void send_array(Communicator& comm, int to, int64_t tag, const Array& a) {
  const Array host = a.on_host();
  comm.send(to, tag, host.raw(), host.nbytes());
}

// Microbatch k of m of a batch array whose rows are split `shards` ways: each shard's rows k, k + m,
// ... of its own rows, the shards' in order (the rows trace_train_step slices, so that each device's
// microbatch is made of rows it holds).
Array microbatch_rows(const Array& batch, int shards, int k, int m) {
  if (m == 1 || batch.shape().empty()) return batch;
  const Array x = batch.on_host();
  Shape rows = x.shape();
  const int64_t per_shard = rows[0] / shards;
  rows[0] /= m;
  Array out(x.dtype(), rows);
  const int64_t row = x.shape()[0] ? x.nbytes() / x.shape()[0] : 0;
  const auto* src = static_cast<const std::byte*>(x.raw());
  auto* dst = static_cast<std::byte*>(out.raw());
  for (int64_t j = 0; j < rows[0]; ++j) {
    const int64_t shard = j / (per_shard / m), in_shard = j % (per_shard / m);
    std::memcpy(dst + j * row, src + (shard * per_shard + in_shard * m + k) * row, static_cast<size_t>(row));
  }
  return out;
}

// Which programs of a device an action runs: its part's program of the stage, then (after the
// stage's last backward part of a microbatch) the gradient sums.
int program_of(const StagedStep& s, const pipeline::Action& a) {
  switch (a.op) {
    case pipeline::Op::forward:
      return s.forward[a.stage];
    case pipeline::Op::backward:
      return s.backward[a.stage];
    case pipeline::Op::backward_input:
      return s.backward_input[a.stage];
    case pipeline::Op::backward_weight:
      return s.backward_weight[a.stage];
  }
  return -1;
}

bool ends_backward(const StagedStep& s, const pipeline::Action& a) {
  return a.op == (s.split_backward ? pipeline::Op::backward_weight : pipeline::Op::backward);
}

}  // namespace

namespace {

Readers readers_of(const StagedStep& s) {
  const int D = s.schedule.devices;
  const size_t nv = s.graph->values().size();
  Readers r;
  r.micro.resize(D);
  r.step.resize(D);
  r.micro_remote.resize(nv);
  r.step_remote.resize(nv);
  for (const StageProgram& p : s.programs) {
    // The gradient sums' programs read the sums, not a microbatch's values.
    if (p.part == StagePart::accumulate || p.part == StagePart::mean || p.part == StagePart::reduce) continue;
    const int d = s.schedule.device_of(p.stage);
    auto& counts = p.part == StagePart::update ? r.step[d] : r.micro[d];
    for (int v : p.inputs)
      if (s.graph->values()[v].producer >= 0) ++counts[v];
  }
  for (int v : s.accumulated) ++r.micro[s.schedule.device_of(s.stage_of(v))][v];
  for (size_t v = 0; v < nv; ++v) {
    const int st = s.stage_of(v);
    if (st < 0) continue;
    const int home = s.schedule.device_of(st);
    for (int d = 0; d < D; ++d) {
      if (d == home) continue;
      if (r.micro[d].count(static_cast<int>(v))) r.micro_remote[v].push_back(d);
      if (r.step[d].count(static_cast<int>(v))) r.step_remote[v].push_back(d);
    }
  }
  return r;
}

// The held bytes of one device of group d over the schedule, walked as the run loop walks it.
int64_t plan_held(const StagedStep& s, const Readers& r, int d) {
  std::map<std::pair<int, int>, int> held;
  int64_t bytes = 0, peak = 0;
  auto nb = [&](int v) { return s.device_bytes[v]; };
  auto release = [&](int v, int m) {
    auto it = held.find({v, m});
    if (it != held.end() && --it->second == 0) {
      bytes -= nb(v);
      held.erase(it);
    }
  };
  for (const pipeline::Action& a : s.schedule.per_device[d]) {
    const int k = program_of(s, a);
    if (k >= 0) {
      const StageProgram& p = s.programs[k];
      for (int v : p.inputs)
        if (s.graph->values()[v].producer >= 0 && held.emplace(std::pair{v, a.microbatch}, r.micro[d].at(v)).second)
          bytes += nb(v);
      int64_t out = 0;
      for (int v : p.outputs) out += nb(v);
      peak = std::max(peak, bytes + out);
      for (int v : p.outputs) {
        auto it = r.micro[d].find(v);
        if (it != r.micro[d].end()) {
          held.emplace(std::pair{v, a.microbatch}, it->second);
          bytes += nb(v);
        }
      }
      for (int v : p.inputs)
        if (s.graph->values()[v].producer >= 0) release(v, a.microbatch);
    }
    if (ends_backward(s, a))
      for (int v : s.accumulated)
        if (s.stage_of(v) == a.stage) release(v, a.microbatch);
  }
  return peak;
}

}  // namespace

PipelineReport pipeline_report(const StagedStep& s) {
  const int D = s.schedule.devices, S = s.schedule.stages(), M = s.schedule.microbatches;
  const Graph& g = *s.graph;
  const Readers r = readers_of(s);
  PipelineReport rep;
  rep.schedule = s.schedule;
  rep.stage_layers = s.stage_layers;
  rep.threads_per_group = s.threads_per_group;
  rep.state_bytes.assign(D, 0);
  rep.accumulator_bytes.assign(D, 0);
  rep.arena_bytes.assign(D, 0);
  rep.planned_held_bytes.assign(D, 0);
  rep.param_bytes.assign(D, 0);
  std::vector<std::set<int>> state_read(D);
  for (const StageProgram& p : s.programs) {
    const int d = s.schedule.device_of(p.stage);
    rep.arena_bytes[d] = std::max(rep.arena_bytes[d], p.arena_bytes);  // the group's one arena: the largest
    for (size_t k = 0; k < p.inputs.size(); ++k) {
      const int v = p.inputs[k];
      const int input = g.values()[v].producer < 0 ? g.values()[v].output_index : -1;
      const bool on_device = k >= p.input_kinds.size() || p.input_kinds[k] == MemoryKind::device;
      if (input >= 0 && static_cast<size_t>(input) < s.n_params + s.n_state && on_device) state_read[d].insert(v);
    }
  }
  for (int d = 0; d < D; ++d) {
    for (int v : state_read[d]) {
      const size_t at = static_cast<size_t>(g.values()[v].output_index);
      const int64_t b =
          TensorType{g.type(v).dtype, Sharding(s.groups[d], s.input_specs[at]).local_shape(g.type(v).shape)}.nbytes();
      rep.state_bytes[d] += b;
      if (at < s.n_params) rep.param_bytes[d] += b;
    }
    rep.planned_held_bytes[d] = plan_held(s, r, d);
  }
  for (int v : s.accumulated) rep.accumulator_bytes[s.schedule.device_of(s.stage_of(v))] += s.device_bytes[v];
  const int G = s.groups[0].size();
  std::vector<int64_t> sent(S, 0);  // per stage: bytes per device its microbatch sends to other devices
  for (size_t v = 0; v < g.values().size(); ++v) {
    const int64_t n = static_cast<int64_t>(M * r.micro_remote[v].size() + r.step_remote[v].size());
    rep.messages += static_cast<int>(n) * G;
    rep.message_bytes += s.device_bytes[v] * G * n;
    if (s.stage_of(v) >= 0)
      sent[s.stage_of(v)] += s.device_bytes[v] * static_cast<int64_t>(r.micro_remote[v].size());
  }
  // The prediction: each stage's programs timed by the cost model, played in the schedule's order.
  if (s.stage_link) {
    std::vector<pipeline::Costs> costs(S);
    auto secs = [&](const std::vector<int>& of, int st) { return of[st] >= 0 ? s.programs[of[st]].seconds : 0.0; };
    for (int st = 0; st < S; ++st) {
      pipeline::Costs& c = costs[st];
      c.forward = secs(s.forward, st);
      const bool split = s.split_backward;
      c.backward_input = split ? secs(s.backward_input, st) : secs(s.backward, st);
      c.backward_weight = split ? secs(s.backward_weight, st) : 0.0;
      c.message = sent[st] > 0 ? collective_seconds(CollectiveKind::permute, 2, sent[st], *s.stage_link) : 0.0;
    }
    const pipeline::Simulation sim = pipeline::simulate(s.schedule, costs);
    std::vector<double> update(D, 0.0);
    for (int k : s.updates) update[s.schedule.device_of(s.programs[k].stage)] += s.programs[k].seconds;
    for (int k : s.reduce)
      if (k >= 0) update[s.schedule.device_of(s.programs[k].stage)] += s.programs[k].seconds;
    rep.predicted_schedule_s = sim.makespan;
    rep.predicted_bubble = sim.bubble;
    rep.predicted_step_s = sim.makespan + *std::max_element(update.begin(), update.end());
  }
  return rep;
}

PipelineRunner::PipelineRunner(StagedStep s, Communicator* comm)
    : s_(std::move(s)),
      report_(pipeline_report(s_)),
      readers_(readers_of(s_)),
      is_output_(s_.graph->values().size(), 0),
      comm_(comm) {
  const Graph& g = *s_.graph;
  for (int v : g.outputs()) is_output_[v] = 1;
  // One group that every process runs its part of (one stage): nothing is sent between processes.
  const bool shared = s_.process_of_group.empty();
  if (shared) s_.process_of_group.assign(s_.groups.size(), s_.process);
  processes_ = shared ? 1 : 1 + *std::max_element(s_.process_of_group.begin(), s_.process_of_group.end());
  if (processes_ > 1 && !comm_)
    throw InternalError("[pipeline] a pipeline over several processes needs this process's communicator");
  process_ = comm_ ? comm_->process_index() : s_.process;
  auto process_of = [&](int stage) { return s_.process_of_group[s_.schedule.device_of(stage)]; };
  // The values another process reads, numbered for their message tags.
  message_index_.assign(g.values().size(), -1);
  int messages = 0;
  for (size_t v = 0; v < g.values().size(); ++v) {
    if (s_.stage_of(v) < 0) continue;
    bool remote = false;
    for (const auto* readers : {&readers_.micro_remote[v], &readers_.step_remote[v]})
      for (int d : *readers) remote = remote || s_.process_of_group[d] != process_of(s_.stage_of(v));
    if (remote) message_index_[v] = messages++;
  }
  output_tag_ =
      static_cast<int64_t>(messages) * (s_.schedule.microbatches + 1) * s_.schedule.devices * s_.groups[0].size();
  gather_tag_ = output_tag_ + static_cast<int64_t>(g.outputs().size());
  // Each state input's home: the group whose update program writes it, else the first reading it.
  const size_t n_state = s_.n_params + s_.n_state;
  home_.assign(n_state, -1);
  away_.assign(n_state, {});
  copy_tag_ = gather_tag_ + static_cast<int64_t>(n_state);
  for (size_t j = 0; j < n_state && 3 + j < g.outputs().size(); ++j) {
    const int v = g.outputs()[3 + j];
    if (g.values()[v].producer >= 0) home_[j] = s_.schedule.device_of(s_.stage_of(v));
  }
  std::vector<std::vector<int>> readers(n_state);
  for (const StageProgram& p : s_.programs)
    for (int v : p.inputs) {
      const ValueInfo& info = g.values()[v];
      if (info.producer >= 0 || static_cast<size_t>(info.output_index) >= n_state) continue;
      std::vector<int>& r = readers[info.output_index];
      const int d = s_.schedule.device_of(p.stage);
      if (std::find(r.begin(), r.end(), d) == r.end()) r.push_back(d);
    }
  for (size_t j = 0; j < n_state; ++j) {
    if (home_[j] < 0) home_[j] = readers[j].empty() ? 0 : readers[j][0];
    for (int d : readers[j])
      if (d != home_[j]) away_[j].push_back(d);
    const int h = home_[j];
    const Mesh& group = s_.groups[h];
    const Mesh held = processes_ > 1
                          ? group.with_process_of(
                                std::vector<int>(static_cast<size_t>(group.size()), s_.process_of_group[h]), processes_)
                          : group;
    state_shardings_.emplace_back(held, s_.input_specs[j]);
  }
  // The batch and the step counter: as the one program of a one-stage step takes them, else whole
  // (split into each program's microbatches and layouts here).
  input_shardings_ = state_shardings_;
  const bool whole_step = s_.programs.size() == 1 && s_.programs[0].part == StagePart::step;
  for (size_t i = n_state; i < g.inputs().size(); ++i)
    input_shardings_.push_back(whole_step ? s_.programs[0].exe->in_sharding(static_cast<int>(i))
                                          : Sharding::replicated(Mesh()));
  for (StageProgram& p : s_.programs)
    if (p.exe) programs_.push_back(p.exe.get());
  share_arenas();
}

// Each device of this process's groups gets one arena, the size of the largest program its group
// runs there, and every program of the group runs in it (pipeline_report plans the same).
void PipelineRunner::share_arenas() {
  for (int d = 0; d < s_.schedule.devices; ++d) {
    if (s_.process_of_group[d] != process_) continue;
    const std::vector<int>& ids = s_.groups[d].device_ids();
    for (int id : ids) {
      // The programs with an arena on device `id`: the group's sharded ones, and the accumulate
      // and mean programs, compiled for its first device.
      std::vector<std::function<void(void*)>> users;
      int64_t bytes = 0;
      for (StageProgram& p : s_.programs) {
        if (s_.schedule.device_of(p.stage) != d) continue;
        if (p.exe) {
          bytes = std::max(bytes, p.exe->executable().peak_bytes());
          users.push_back([&p, id](void* a) { p.exe->use_arena(id, a); });
        } else if (p.local && id == ids[0]) {
          bytes = std::max(bytes, p.local->peak_bytes());
          users.push_back([&p, id](void* a) { p.local->use_arena(id, a); });
        }
      }
      if (users.size() < 2 || bytes == 0) continue;
      arenas_.push_back(std::make_unique<Arena>(Placement{id, MemoryKind::device, s_.groups[d].platform()}, bytes));
      for (auto& use : users) use(arenas_.back()->data);
    }
  }
}

// Tags: a message of value v for microbatch m (-1: the step's) to group `to`, one per shard; then
// the step's outputs; then gather_state's arrays; then the copies of state for other groups.
int64_t PipelineRunner::message_tag(int v, int m, int to, int shard) const {
  const int64_t M = s_.schedule.microbatches, D = s_.schedule.devices, G = s_.groups[0].size();
  return ((static_cast<int64_t>(message_index_.at(v)) * (M + 1) + (m + 1)) * D + to) * G + shard;
}

namespace {

// The same shards seen as an array of `group` (a mesh of one process) with `spec`.
ShardedArray on_group(const ShardedArray& a, const Mesh& group, const PartitionSpec& spec) {
  return ShardedArray(a.type(), Sharding(group, spec), a.shards());
}

}  // namespace

Array PipelineRunner::gather_state(size_t j, const ShardedArray& a) const {
  const int h = home_.at(j), owner = s_.process_of_group[h];
  if (s_.groups[h].num_processes() > 1) return gather(a, programs_.at(0)->communicator());  // a collective
  Array whole;
  if (owner == process_) whole = gather(on_group(a, s_.groups[h], s_.input_specs[j]));
  if (processes_ == 1) return whole;
  const int64_t tag = gather_tag_ + static_cast<int64_t>(j);
  if (owner == process_) {
    for (int q = 0; q < processes_; ++q)
      if (q != process_) comm_->send(q, tag, whole.raw(), whole.nbytes());
  } else {
    whole = Array(a.dtype(), a.shape());
    comm_->receive(owner, tag, whole.raw(), whole.nbytes());
  }
  return whole;
}

// The state inputs that groups other than their home read, for this step: the home's shards
// themselves when both groups are in this process, else a message of each shard.
std::map<std::pair<size_t, int>, ShardedArray> PipelineRunner::copy_state(
    const std::vector<ShardedArray>& state) const {
  std::map<std::pair<size_t, int>, ShardedArray> copies;
  const int64_t D = s_.schedule.devices, G = s_.groups[0].size();
  auto tag = [&](size_t j, int d, int shard) { return copy_tag_ + (static_cast<int64_t>(j) * D + d) * G + shard; };
  for (size_t j = 0; j < away_.size(); ++j) {
    const int h = home_[j], from = s_.process_of_group[h];
    for (int d : away_[j]) {
      const int to = s_.process_of_group[d];
      if (from == process_ && to == process_) {
        copies[{j, d}] = on_group(state[j], s_.groups[d], s_.input_specs[j]);
      } else if (from == process_) {
        for (size_t i = 0; i < state[j].shards().size(); ++i)
          send_array(*comm_, to, tag(j, d, static_cast<int>(i)), state[j].shards()[i]);
      }
    }
  }
  for (size_t j = 0; j < away_.size(); ++j) {
    const int from = s_.process_of_group[home_[j]];
    for (int d : away_[j]) {
      if (from == process_ || s_.process_of_group[d] != process_) continue;
      const Sharding sh(s_.groups[d], s_.input_specs[j]);
      const TensorType local{state[j].dtype(), sh.local_shape(state[j].shape())};
      std::vector<Array> shards;
      for (int i = 0; i < sh.mesh.size(); ++i) {
        Array host(local.dtype, local.shape);
        comm_->receive(from, tag(j, d, i), host.raw(), host.nbytes());
        shards.push_back(host.to(s_.groups[d].placement(i)));
      }
      copies[{j, d}] = ShardedArray(state[j].type(), sh, std::move(shards));
    }
  }
  return copies;
}

ShardedArray PipelineRunner::state_input(size_t j, int d, const Sharding& sh, const std::vector<ShardedArray>& state,
                                         const std::map<std::pair<size_t, int>, ShardedArray>& copies) const {
  const ShardedArray& a = d == home_[j] ? state.at(j) : copies.at({j, d});
  if (a.sharding() == sh) return a;
  if (sh.spec == s_.input_specs[j]) return ShardedArray(a.type(), sh, a.shards());
  return shard(gather(on_group(a, s_.groups[d], s_.input_specs[j])), sh);  // a program that reads it otherwise
}

// One run's inputs, the messages between the device groups of this process (and to and from other
// processes), the step's outputs and the first failure, which stops every group.
struct PipelineRunner::Exchange {
  Exchange(const PipelineRunner& runner, const std::vector<ShardedArray>& st, const std::vector<char>& don,
           const Array& counter)
      : r(runner), state(st), donate(don), step(counter) {}
  const PipelineRunner& r;
  const std::vector<ShardedArray>& state;
  const std::vector<char>& donate;
  const Array& step;
  std::vector<std::vector<Array>> micro;  // per microbatch and batch input: its rows
  std::map<std::pair<size_t, int>, ShardedArray> copies;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::tuple<int, int, int>, ShardedArray> box;  // (value, microbatch or -1, receiver)
  std::map<int, ShardedArray> results;
  bool failed = false;
  std::exception_ptr failure;
  Clock::time_point t0 = Clock::now();

  double since() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

  // A graph input as program input i on group d: the state's shards where the group holds them,
  // the batch's rows and the step counter split (or repeated) over the group's devices.
  ShardedArray input(int v, int m, const ShardedExecutable& exe, int i, int d) const {
    const Graph& g = *r.s_.graph;
    const size_t at = static_cast<size_t>(g.values()[v].output_index), n_state = r.s_.n_params + r.s_.n_state;
    const Sharding& sh = exe.in_sharding(i);
    if (at < n_state) return r.state_input(at, d, sh, state, copies);
    const Array& whole = at < n_state + r.s_.n_batch ? micro.at(std::max(m, 0))[at - n_state] : step;
    bool same_place = sh.is_fully_replicated() && sh.mesh.num_processes() == 1;
    for (int p = 0; same_place && p < sh.mesh.size(); ++p) same_place = whole.placement() == sh.mesh.placement(p);
    if (same_place) return ShardedArray(g.type(v), sh, std::vector<Array>(static_cast<size_t>(sh.mesh.size()), whole));
    return shard(whole, sh, exe.process());
  }

  void send(int v, int m, int to, const ShardedArray& a) {
    const int proc = r.s_.process_of_group[to];
    if (proc != r.process_) {
      for (size_t i = 0; i < a.shards().size(); ++i)
        send_array(*r.comm_, proc, r.message_tag(v, m, to, static_cast<int>(i)), a.shards()[i]);
      return;
    }
    std::lock_guard<std::mutex> lock(mu);
    box[{v, m, to}] = a;
    cv.notify_all();
  }

  ShardedArray receive(int v, int m, int at) {
    const StagedStep& s = r.s_;
    const int from = s.process_of_group[s.schedule.device_of(s.stage_of(v))];
    if (from != r.process_) {  // from another process: its shards, laid out as its group holds them
      const TensorType& t = s.graph->type(v);
      const Sharding sh(s.groups[at], s.value_spec[v]);
      const TensorType local{t.dtype, sh.local_shape(t.shape)};
      std::vector<Array> shards;
      for (int i = 0; i < sh.mesh.size(); ++i) {
        shards.emplace_back(local.dtype, local.shape);
        r.comm_->receive(from, r.message_tag(v, m, at, i), shards.back().raw(), shards.back().nbytes());
      }
      return ShardedArray(t, sh, std::move(shards));
    }
    std::unique_lock<std::mutex> lock(mu);
    const auto key = std::make_tuple(v, m, at);
    cv.wait(lock, [&] { return failed || box.count(key); });
    if (!box.count(key)) throw Error("[pipeline] stopped: another device failed");
    ShardedArray a = std::move(box[key]);
    box.erase(key);
    return a;
  }

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!failed) failure = std::move(e);
    failed = true;
    cv.notify_all();
  }
};

// One device group of this process in a run: its actions in the schedule's order, what it holds
// between them, counted per device as the plan counts it, and its timeline.
class PipelineRunner::GroupRun {
 public:
  GroupRun(Exchange& x, int d) : x_(x), s_(x.r.s_), r_(x.r.readers_), d_(d), group_(s_.groups[d]) {}
  std::vector<PipelineReport::Span> timeline;
  int64_t held_peak = 0;
  int device() const { return d_; }

  void run() {
    for (const pipeline::Action& a : s_.schedule.per_device[d_]) {
      ready_ = x_.since();
      const int k = program_of(s_, a);
      if (k >= 0 && s_.programs[k].exe) run_program(k, a.microbatch);
      if (ends_backward(s_, a)) accumulate(a);
      // From when its messages had arrived: waiting for them is the bubble.
      timeline.push_back({pipeline::action_name(a, s_.schedule.virtual_stages > 1), ready_, x_.since()});
    }
    const double begin = x_.since();
    bool whole = false;
    for (int k : s_.updates)
      if (s_.schedule.device_of(s_.programs[k].stage) == d_) {
        run_program(k, -1);
        whole = whole || s_.programs[k].part == StagePart::step;
      }
    timeline.push_back({whole ? "step" : "update", begin, x_.since()});
  }

 private:
  struct Held {
    ShardedArray a;
    int left;  // readers still to run
  };

  const ShardedArray& take(int v, int m) {
    auto it = held_.find({v, m});
    if (it != held_.end()) return it->second.a;
    // A message: copied onto this group's devices.
    ShardedArray got = x_.receive(v, m, d_);
    std::vector<Array> shards;
    for (size_t i = 0; i < got.shards().size(); ++i)
      shards.push_back(got.shards()[i].to(group_.placement(static_cast<int>(i), got.shards()[i].placement().kind)));
    ShardedArray a(got.type(), Sharding(group_, got.sharding().spec), std::move(shards));
    const int left = (m < 0 ? r_.step[d_] : r_.micro[d_]).at(v);
    if (m >= 0) bytes_ += a.shards()[0].nbytes();
    return held_.emplace(std::pair{v, m}, Held{std::move(a), left}).first->second.a;
  }

  void release(int v, int m) {
    auto it = held_.find({v, m});
    if (it == held_.end() || --it->second.left > 0) return;
    if (m >= 0) bytes_ -= it->second.a.shards()[0].nbytes();
    held_.erase(it);
  }

  void put(int v, int m, ShardedArray a) {
    for (int to : (m < 0 ? r_.step_remote : r_.micro_remote)[v]) x_.send(v, m, to, a);
    if (m < 0 && x_.r.is_output_[v]) {
      std::lock_guard<std::mutex> lock(x_.mu);
      x_.results[v] = a;
    }
    const auto& here = m < 0 ? r_.step[d_] : r_.micro[d_];
    auto it = here.find(v);
    if (it == here.end()) return;
    if (m >= 0) bytes_ += a.shards()[0].nbytes();
    held_[{v, m}] = Held{std::move(a), it->second};
  }

  void run_program(int k, int m) {
    const Graph& g = *s_.graph;
    const StageProgram& p = s_.programs[k];
    std::vector<ShardedArray> in;
    in.reserve(p.inputs.size());
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      const int v = p.inputs[i];
      in.push_back(g.values()[v].producer < 0 ? x_.input(v, m, *p.exe, static_cast<int>(i), d_) : take(v, m));
    }
    ready_ = x_.since();
    std::vector<ShardedArray> out = run_donating(p, in);
    int64_t out_bytes = 0;
    for (const ShardedArray& a : out) out_bytes += a.shards()[0].nbytes();
    if (m >= 0) held_peak = std::max(held_peak, bytes_ + out_bytes);
    for (size_t o = 0; o < out.size(); ++o) put(p.outputs[o], m, std::move(out[o]));
    for (int v : p.inputs)
      if (g.values()[v].producer >= 0) release(v, m);
  }

  // Runs p, writing each output that a state input donates into that input's arrays (the state
  // this group is home of, held by nobody else).
  std::vector<ShardedArray> run_donating(const StageProgram& p, const std::vector<ShardedArray>& in) {
    const Executable& exe = p.exe->executable();
    std::vector<ShardedArray> out(p.outputs.size());
    bool donated = false;
    for (size_t o = 0; o < p.outputs.size(); ++o) {
      const int k = exe.output_donor(static_cast<int>(o));
      if (k < 0) continue;
      const ValueInfo& info = s_.graph->values()[p.inputs[k]];
      const size_t j = static_cast<size_t>(info.output_index);
      if (info.producer < 0 && j < x_.donate.size() && x_.donate[j] && x_.r.home_[j] == d_) {
        out[o] = in[k];
        donated = true;
      }
    }
    if (!donated) return p.exe->run(in);
    p.exe->run_into(in, out);
    return out;
  }

  // Runs an accumulate or mean program on each device's copy, in place.
  void on_each_device(Executable& exe, const std::vector<int>& vals, const std::vector<ShardedArray>& add) {
    for (int rep = 0; rep < group_.size(); ++rep) {
      std::vector<Array> in, out;
      for (int v : vals) in.push_back(sums_.at(v).shards()[rep]), out.push_back(sums_.at(v).shards()[rep]);
      for (const ShardedArray& a : add) in.push_back(a.shards()[rep]);
      exe.run_into(in, out);
    }
  }

  // After a stage's backward pass of a microbatch: its loss and gradients added to the earlier
  // microbatches' (as the step on one device adds them); after the last, divided by the count and
  // handed to the update.
  void accumulate(const pipeline::Action& a) {
    const int M = s_.schedule.microbatches;
    std::vector<int> vals;
    for (int v : s_.accumulated)
      if (s_.stage_of(v) == a.stage) vals.push_back(v);
    if (vals.empty()) return;
    std::vector<ShardedArray> cur;
    for (int v : vals) {
      cur.push_back(take(v, a.microbatch));
      release(v, a.microbatch);
    }
    if (a.microbatch == 0 || M == 1) {
      for (size_t i = 0; i < vals.size(); ++i) {
        for (Array& sh : cur[i].mutable_shards())
          if (!sh.sole_owner()) sh = sh.clone();
        sums_[vals[i]] = std::move(cur[i]);
      }
    } else {
      on_each_device(*s_.programs[s_.accumulate[a.stage]].local, vals, cur);
    }
    if (a.microbatch != M - 1) return;
    if (s_.reduce[a.stage] >= 0) {  // the sums left partial over the batch axes, reduced once
      const StageProgram& red = s_.programs[s_.reduce[a.stage]];
      std::vector<ShardedArray> in;
      for (int v : red.inputs) in.push_back(sums_.at(v));
      std::vector<ShardedArray> out = red.exe->run(in);
      for (size_t i = 0; i < out.size(); ++i) sums_[red.inputs[i]] = std::move(out[i]);
    }
    if (M > 1) on_each_device(*s_.programs[s_.mean[a.stage]].local, vals, {});
    for (int v : vals) put(v, -1, sums_.at(v));
  }

  Exchange& x_;
  const StagedStep& s_;
  const Readers& r_;
  const int d_;
  const Mesh& group_;
  std::map<std::pair<int, int>, Held> held_;  // (value, microbatch; -1: the update's)
  int64_t bytes_ = 0;                         // held, per device
  std::map<int, ShardedArray> sums_;          // per accumulated value of this group's stages
  double ready_ = 0;                          // when the running action's inputs had all arrived
};

PipelineRunner::Outputs PipelineRunner::run(const std::vector<ShardedArray>& state, const std::vector<char>& donate,
                                            const Array& step, const std::vector<Array>& batch) {
  const int D = s_.schedule.devices, M = s_.schedule.microbatches;
  Exchange x(*this, state, donate, step);
  // Per microbatch and batch input: its rows, each device's from the rows it holds.
  x.micro.resize(static_cast<size_t>(M));
  for (int m = 0; m < M; ++m)
    for (const Array& b : batch) x.micro[m].push_back(microbatch_rows(b, s_.batch_shards, m, M));
  x.copies = copy_state(state);
  // One thread per device group of this process.
  std::vector<GroupRun> groups;
  groups.reserve(static_cast<size_t>(D));
  for (int d = 0; d < D; ++d)
    if (s_.process_of_group[d] == process_) groups.emplace_back(x, d);
  const int L = static_cast<int>(groups.size());
  x.t0 = Clock::now();
  if (L == 1) {  // its kernels keep every thread of the process
    groups[0].run();
  } else {
    // Each group's thread runs its kernels on its share of the threads (threads_per_group, what
    // they were made for): their own parallel regions nest inside the groups'.
    const int levels = omp_get_max_active_levels();  // restored after: elsewhere nothing nests
    omp_set_max_active_levels(std::max(levels, 2));
#pragma omp parallel num_threads(L)
    {
      try {
        if (omp_get_num_threads() != L)
          throw Error(fmt::format("[pipeline] the step needs one thread per device group ({}), OpenMP gave {}", L,
                                  omp_get_num_threads()));
        const ThreadBudget budget(s_.threads_per_group);
        groups[omp_get_thread_num()].run();
      } catch (...) {
        x.fail(std::current_exception());
      }
    }
    omp_set_max_active_levels(levels);
  }
  if (x.failure) std::rethrow_exception(x.failure);

  report_.timeline.assign(D, {});
  report_.measured_held_bytes.assign(D, 0);
  for (GroupRun& gr : groups) {
    report_.timeline[gr.device()] = std::move(gr.timeline);
    report_.measured_held_bytes[gr.device()] = gr.held_peak;
  }
  double first = 1e30, last = 0;
  for (const auto& dev : report_.timeline)
    for (const PipelineReport::Span& sp : dev)
      if (sp.name != "update" && sp.name != "step")
        first = std::min(first, sp.begin_s), last = std::max(last, sp.end_s);
  report_.schedule_s = last > first ? last - first : 0;

  Outputs out;
  out.loss = metric(0, x.results);
  out.grad_norm = metric(1, x.results);
  out.lr = metric(2, x.results);
  out.state = new_state(state, x.results);
  return out;
}

MemoryKind PipelineRunner::state_kind(size_t j) const {
  const Graph& g = *s_.graph;
  for (const StageProgram& p : s_.programs) {
    if (s_.schedule.device_of(p.stage) != home_.at(j)) continue;
    for (size_t k = 0; k < p.inputs.size() && k < p.input_kinds.size(); ++k) {
      const ValueInfo& info = g.values()[p.inputs[k]];
      if (info.producer < 0 && static_cast<size_t>(info.output_index) == j) return p.input_kinds[k];
    }
  }
  return MemoryKind::device;
}

int64_t PipelineRunner::planned_peak() const {
  int64_t peak = 0;
  for (int d = 0; d < report_.schedule.devices; ++d) peak = std::max(peak, report_.planned_peak(d));
  return peak;
}

std::string PipelineRunner::collectives_table() const {
  struct Row {
    int64_t count = 0, bytes = 0;
  };
  std::map<std::string, Row> planned;
  int64_t runs = 0, devices = 0;
  CollectiveStats::Entry counted[kNumCollectiveKinds];
  for (const ShardedExecutable* exe : programs_) {
    for (const CollectiveRecord& c : exe->program().collectives) {
      if (c.local_slice()) continue;
      std::string key = collective_name(*c.kind);
      for (size_t i = 0; i < c.axes.size(); ++i) key += (i ? "," : " over ") + c.axes[i];
      Row& r = planned[key];
      ++r.count;
      const TensorType& t = c.kind == CollectiveKind::all_gather ? c.result : c.operand;
      r.bytes += numel(t.shape) * dtype_size(t.dtype);
    }
    if (exe->stats().per_device.empty()) continue;
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      const CollectiveStats::Entry e = exe->stats().total(static_cast<CollectiveKind>(k));
      counted[k].calls += e.calls;
      counted[k].payload_bytes += e.payload_bytes;
      counted[k].wire_bytes += e.wire_bytes;
    }
  }
  // Steps: the runs of a program run once a step; devices: this process's, over its groups.
  std::set<int> groups;
  for (int k : s_.updates) {
    const StageProgram& p = s_.programs[k];
    if (!p.exe || !groups.insert(s_.schedule.device_of(p.stage)).second) continue;
    runs = p.exe->runs_counted();
    devices += static_cast<int64_t>(p.exe->positions().size());
  }
  std::ostringstream os;
  os << "planned collectives per step (payload bytes per device):\n";
  for (const auto& [k, r] : planned) os << "  " << k << ": " << r.count << " calls, " << r.bytes << " bytes\n";
  if (planned.empty())
    os << (s_.groups[0].size() * s_.schedule.devices == 1 ? "  none: the step runs on one device\n" : "  none\n");
  if (report_.messages > 0)
    os << "messages between stages per step: " << report_.messages << ", " << report_.message_bytes << " bytes\n";
  const int64_t steps = std::max<int64_t>(runs, 1);
  devices = std::max<int64_t>(devices, 1);
  os << "counted at run time, per step and device (over " << runs << " steps):\n";
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const CollectiveStats::Entry& e = counted[k];
    if (e.calls == 0) continue;
    os << "  " << collective_name(static_cast<CollectiveKind>(k)) << ": " << e.calls / (steps * devices)
       << " calls, payload " << e.payload_bytes / (steps * devices) << " bytes, wire "
       << e.wire_bytes / (steps * devices) << " bytes\n";
  }
  return os.str();
}

// Output o (< 3: the loss, gradient norm or learning rate) whole on every process: sent by the
// process computing it.
Array PipelineRunner::metric(int o, const std::map<int, ShardedArray>& results) const {
  const Graph& g = *s_.graph;
  const int v = g.outputs().at(o);
  const int owner = s_.process_of_group[s_.schedule.device_of(s_.stage_of(v))];
  const int64_t tag = output_tag_ + o;
  if (owner != process_) {
    Array a(g.type(v).dtype, g.type(v).shape);
    comm_->receive(owner, tag, a.raw(), a.nbytes());
    return a;
  }
  auto it = results.find(v);
  if (it == results.end()) throw InternalError(fmt::format("[pipeline] output %{} was not computed", v));
  Array a = it->second.sharding().is_fully_replicated() ? it->second.shards().at(0) : gather(it->second);
  if (processes_ == 1) return a;
  for (int q = 0; q < processes_; ++q)
    if (q != process_) send_array(*comm_, q, tag, a);
  return a;
}

// The new params and optimizer state where they live: each its update's result on its home group
// (held by that group's process; the others hold nothing of it), unchanged where nothing updates it.
std::vector<ShardedArray> PipelineRunner::new_state(const std::vector<ShardedArray>& state,
                                                    const std::map<int, ShardedArray>& results) const {
  const Graph& g = *s_.graph;
  std::vector<ShardedArray> out;
  for (size_t j = 0; j < state_shardings_.size(); ++j) {
    const int v = g.outputs().at(3 + j);
    const Sharding& want = state_shardings_[j];
    if (g.values()[v].producer < 0 || s_.process_of_group[home_[j]] != process_) {
      out.push_back(g.values()[v].producer < 0 ? state[j] : ShardedArray(g.type(v), want, {}, process_));
      continue;
    }
    auto it = results.find(v);
    if (it == results.end()) throw InternalError(fmt::format("[pipeline] output %{} was not computed", v));
    const ShardedArray& a = it->second;
    out.push_back(a.sharding().spec == want.spec ? ShardedArray(a.type(), want, a.shards(), process_)
                                                 : shard(gather(a), want, process_));
  }
  return out;
}

}  // namespace detail
}  // namespace px
