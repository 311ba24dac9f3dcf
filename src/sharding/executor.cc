// The sharded executor: the local program split into compute segments (each compiled into an
// Executable) and collectives. A run executes step s on every device, then step s+1: a segment
// runs on the devices in parallel (one thread each) or one after the other (threaded kernels), and
// a collective sees every device's buffer at once.
#include <omp.h>

#include <exception>
#include <sstream>

#include "backend/cpu/kernel.h"
#include "distributed/communicator.h"
#include "ir/primitive.h"
#include "parallax/spmd.h"
#include "sharding/box.h"
#include "sharding/prims.h"
#include "sharding/spmd_internal.h"

namespace px {

namespace {

struct Segment {
  // One executable per device when devices run in parallel (each needs its own arena), else one.
  std::vector<std::unique_ptr<Executable>> exes;
  std::vector<int> in_values, out_values;     // local-graph value ids
  std::vector<std::vector<Array>> ins, outs;  // per device, prepared handles
  std::vector<int> input_slots;               // operands that are graph inputs, patched per run
};

struct Collective {
  int node = -1;  // in the local graph
  std::string kind;
  int in_value = -1, out_value = -1;
  DType dtype = DType::f32;
  Shape in_shape, out_shape;
  int dim = -1, concat_dim = -1;
  ReduceOp op = ReduceOp::sum;
  DeviceGroups groups;
  int64_t n = 1;                               // group size
  std::vector<std::pair<int, int>> pairs;      // permute: mesh positions
  std::vector<Array> scratch_in, scratch_out;  // per device, for layout packing
};

struct Step {
  bool collective = false;
  int index = 0;
};

}  // namespace

struct ShardedExecutable::Impl {
  SpmdProgram prog;
  std::unique_ptr<Communicator> comm;
  std::vector<Segment> segments;
  std::vector<Collective> collectives;
  std::vector<Step> steps;
  int64_t devices = 1;
  std::vector<std::vector<Array>> store;  // [device][local value]: values that cross steps
  std::vector<Array> coords;              // per device
  std::vector<int> input_of;              // local value -> graph input index, -1 otherwise
  bool over_devices = false;              // run the devices of a segment in parallel
  int threads = 1;
  // Where each program output's value is held (segment results and operands), so that a run can
  // place it in the caller's arrays: steps write outputs in place instead of copying them at the end.
  struct Slot {
    int segment;
    bool out;
    int index;
  };
  std::vector<std::vector<Slot>> output_slots;  // per output
  std::vector<char> output_bound;               // per output: placed in the caller's arrays (not an
                                                // input, and the value's first output position)
  void bind(int64_t device, int v, const std::vector<Slot>& slots, const Array& a) {
    store[device][v] = a;
    for (const Slot& sl : slots) (sl.out ? segments[sl.segment].outs : segments[sl.segment].ins)[device][sl.index] = a;
  }
  const Array& value(int device, int v, const std::vector<ShardedArray>& inputs) const {
    int i = input_of[v];
    if (i < 0) return store[device][v];
    if (i == static_cast<int>(prog.in_shardings.size())) return coords[device];
    return inputs[i].shard(device);
  }
  void run_collective(Collective& c, const std::vector<ShardedArray>& inputs);
};

namespace {

// Rebuilds the nodes `node_ids` of `g` as a standalone graph whose inputs are the values they read
// from outside (`ins`) and whose outputs are the values read later (`outs`).
std::unique_ptr<Graph> extract(const Graph& g, const std::vector<int>& node_ids, const std::vector<int>& ins,
                               const std::vector<int>& outs) {
  auto sub = std::make_unique<Graph>();
  std::vector<Tensor> map(g.values().size());
  for (int v : ins) map[v] = sub->input(g.type(v), "%" + std::to_string(v));
  for (int ni : node_ids) {
    const Node& n = g.nodes()[ni];
    std::vector<Tensor> args;
    for (int v : n.inputs) args.push_back(map[v]);
    std::vector<Tensor> res;
    if (args.empty()) {
      TraceScope scope(sub.get());
      res = sub->emit(*n.prim, args, n.attrs);
    } else {
      res = sub->emit(*n.prim, args, n.attrs);
    }
    for (size_t j = 0; j < res.size(); ++j) map[n.outputs[j]] = res[j];
  }
  std::vector<Tensor> o;
  for (int v : outs) o.push_back(map[v]);
  sub->set_outputs(o);
  return sub;
}

ReduceOp reduce_op(const Attrs& a) { return a.s("reduce") == "max" ? ReduceOp::max : ReduceOp::sum; }

}  // namespace

ShardedExecutable::ShardedExecutable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ShardedExecutable::~ShardedExecutable() = default;

std::unique_ptr<ShardedExecutable> ShardedExecutable::compile(const Graph& g, const Mesh& mesh,
                                                              const std::vector<PartitionSpec>& in_specs,
                                                              const PartitionOptions& popt, const CompileOptions& copt,
                                                              DeviceParallelism par) {
  std::vector<Sharding> s;
  for (auto& spec : in_specs) s.emplace_back(mesh, spec);
  return compile(partition(g, mesh, s, popt), copt, par);
}

std::unique_ptr<ShardedExecutable> ShardedExecutable::compile(SpmdProgram program, const CompileOptions& copt,
                                                              DeviceParallelism par) {
  ensure_sharding_registered();
  auto impl = std::make_unique<Impl>();
  impl->prog = std::move(program);
  const Graph& g = *impl->prog.local;
  const Mesh& mesh = impl->prog.mesh;
  const int64_t D = mesh.size();
  impl->devices = D;
  impl->threads = cpu::num_threads();
  impl->over_devices =
      par == DeviceParallelism::over_devices || (par == DeviceParallelism::automatic && D > 1 && D >= impl->threads);
  impl->comm = make_inproc_communicator(D);
  const size_t nv = g.values().size();
  impl->input_of.assign(nv, -1);
  for (size_t i = 0; i < g.inputs().size(); ++i) impl->input_of[g.inputs()[i]] = static_cast<int>(i);
  for (int64_t d = 0; d < D; ++d) {
    std::vector<int32_t> c;
    for (int64_t x : mesh.coords(static_cast<int>(d))) c.push_back(static_cast<int32_t>(x));
    impl->coords.push_back(Array::from_i32(c, {static_cast<int64_t>(c.size())}));
  }

  // Level schedule: a compute node's level is one more than that of the collectives it reads,
  // and a collective runs right after the level of its operand. Each level's compute nodes (in
  // graph order) form one segment, followed by its collectives, so compute that does not depend
  // on a collective never waits for it and segments are as few as the collective chains allow.
  const auto& nodes = g.nodes();
  std::vector<int> level(nodes.size(), 0);
  std::vector<char> coll(nodes.size(), 0);
  int max_level = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    coll[i] = is_collective(nodes[i].prim->name);
    for (int v : nodes[i].inputs) {
      int p = g.values()[v].producer;
      if (p >= 0) level[i] = std::max(level[i], level[p] + (coll[p] && !coll[i] ? 1 : 0));
    }
    max_level = std::max(max_level, level[i]);
  }
  std::vector<int> step_of_value(nv, -1), step_of_node(nodes.size(), -1);
  std::vector<std::vector<int>> seg_nodes;  // per step (empty for collectives)
  for (int l = 0; l <= max_level; ++l) {
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < nodes.size(); ++i) {
        if (level[i] != l || coll[i] != (pass == 1)) continue;
        if (coll[i]) {
          impl->steps.push_back({true, static_cast<int>(impl->collectives.size())});
          impl->collectives.emplace_back();
          impl->collectives.back().node = static_cast<int>(i);
          seg_nodes.emplace_back();
        } else if (impl->steps.empty() || impl->steps.back().collective) {
          impl->steps.push_back({false, static_cast<int>(impl->segments.size())});
          impl->segments.emplace_back();
          seg_nodes.emplace_back();
        }
        if (!coll[i]) seg_nodes.back().push_back(static_cast<int>(i));
        step_of_node[i] = static_cast<int>(impl->steps.size()) - 1;
        for (int v : nodes[i].outputs) step_of_value[v] = step_of_node[i];
      }
  }
  // Values read by a later step (or returned) cross steps and get per-device storage.
  std::vector<char> crosses(nv, 0);
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int v : nodes[i].inputs)
      if (impl->input_of[v] < 0 && (step_of_value[v] != step_of_node[i] || impl->steps[step_of_node[i]].collective))
        crosses[v] = 1;
  for (int v : g.outputs())
    if (impl->input_of[v] < 0) crosses[v] = 1;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (is_collective(nodes[i].prim->name)) crosses[nodes[i].outputs[0]] = 1;
  impl->store.assign(static_cast<size_t>(D), std::vector<Array>(nv));
  for (size_t v = 0; v < nv; ++v)
    if (crosses[v])
      for (int64_t d = 0; d < D; ++d)
        impl->store[d][v] = Array(g.type(static_cast<int>(v)).dtype, g.type(static_cast<int>(v)).shape);

  for (size_t s = 0; s < impl->steps.size(); ++s) {
    if (impl->steps[s].collective) continue;
    Segment& seg = impl->segments[impl->steps[s].index];
    std::vector<char> inside(nv, 0), seen(nv, 0);
    for (int ni : seg_nodes[s])
      for (int v : nodes[ni].outputs) inside[v] = 1;
    for (int ni : seg_nodes[s]) {
      for (int v : nodes[ni].inputs)
        if (!inside[v] && !seen[v]) {
          seg.in_values.push_back(v);
          seen[v] = 1;
        }
      for (int v : nodes[ni].outputs)
        if (crosses[v]) seg.out_values.push_back(v);
    }
    auto sub = extract(g, seg_nodes[s], seg.in_values, seg.out_values);
    for (int64_t d = 0; d < (impl->over_devices ? D : 1); ++d) seg.exes.push_back(Executable::compile(*sub, copt));
    seg.ins.resize(static_cast<size_t>(D));
    seg.outs.resize(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) {
      for (int v : seg.in_values) seg.ins[d].push_back(impl->input_of[v] < 0 ? impl->store[d][v] : Array());
      for (int v : seg.out_values) seg.outs[d].push_back(impl->store[d][v]);
    }
    for (int s_in = 0; s_in < static_cast<int>(seg.in_values.size()); ++s_in)
      if (impl->input_of[seg.in_values[s_in]] >= 0) seg.input_slots.push_back(s_in);
  }

  for (Collective& c : impl->collectives) {
    const Node& n = nodes[c.node];
    c.kind = n.prim->name;
    c.in_value = n.inputs[0];
    c.out_value = n.outputs[0];
    c.dtype = g.type(c.in_value).dtype;
    c.in_shape = g.type(c.in_value).shape;
    c.out_shape = g.type(c.out_value).shape;
    std::vector<int> axes = spmd::axis_ids(mesh, split_axes(n.attrs.s("axes")));
    c.groups = mesh.groups(axes);
    c.n = mesh.group_size(axes);
    if (n.attrs.has("reduce")) c.op = reduce_op(n.attrs);
    if (n.attrs.has("dim")) c.dim = static_cast<int>(n.attrs.i("dim"));
    if (c.kind == "all_to_all") {
      c.dim = static_cast<int>(n.attrs.i("split_dim"));
      c.concat_dim = static_cast<int>(n.attrs.i("concat_dim"));
    }
    if (c.kind == "collective_permute") {
      const auto& p = n.attrs.ints("pairs");
      for (const auto& grp : c.groups)
        for (size_t k = 0; k + 1 < p.size(); k += 2) c.pairs.push_back({grp[p[k]], grp[p[k + 1]]});
    }
    // Blocks exchanged must be contiguous: pack around dims that are not leading.
    int64_t outer = 1;
    for (int d = 0; d < c.dim; ++d) outer *= c.in_shape[d];
    bool pack = (c.kind == "all_gather" || c.kind == "reduce_scatter") ? outer > 1 : c.kind == "all_to_all";
    if (pack)
      for (int64_t d = 0; d < D; ++d) {
        int64_t count = numel(c.kind == "all_gather" ? c.out_shape : c.in_shape);
        c.scratch_in.push_back(Array(c.dtype, {count}));
        if (c.kind == "all_to_all") c.scratch_out.push_back(Array(c.dtype, {count}));
      }
  }
  impl->output_slots.resize(g.outputs().size());
  impl->output_bound.assign(g.outputs().size(), 0);
  std::vector<char> bound(nv, 0);
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    int v = g.outputs()[o];
    if (impl->input_of[v] >= 0 || bound[v]) continue;
    bound[v] = 1;
    impl->output_bound[o] = 1;
    auto& slots = impl->output_slots[o];
    for (size_t s = 0; s < impl->segments.size(); ++s) {
      const Segment& seg = impl->segments[s];
      for (size_t k = 0; k < seg.out_values.size(); ++k)
        if (seg.out_values[k] == v) slots.push_back({static_cast<int>(s), true, static_cast<int>(k)});
      for (size_t k = 0; k < seg.in_values.size(); ++k)
        if (seg.in_values[k] == v) slots.push_back({static_cast<int>(s), false, static_cast<int>(k)});
    }
  }
  return std::unique_ptr<ShardedExecutable>(new ShardedExecutable(std::move(impl)));
}

void ShardedExecutable::Impl::run_collective(Collective& c, const std::vector<ShardedArray>& inputs) {
  const int64_t D = devices;
  Buffers ins(static_cast<size_t>(D));
  MutBuffers outs(static_cast<size_t>(D));
  for (int64_t d = 0; d < D; ++d) {
    ins[d] = value(static_cast<int>(d), c.in_value, inputs).raw();
    outs[d] = store[d][c.out_value].raw();
  }
  const int64_t es = dtype_size(c.dtype);
  const int64_t count = numel(c.in_shape);
  if (c.kind == "all_reduce") {
    comm->all_reduce(ins, outs, count, c.dtype, c.op, c.groups);
  } else if (c.kind == "collective_permute") {
    comm->permute(ins, outs, count, c.dtype, c.pairs);
  } else if (c.kind == "all_gather") {
    if (c.scratch_in.empty()) {
      comm->all_gather(ins, outs, count, c.dtype, c.groups);
      return;
    }
    // Gather whole blocks into scratch [n, in_shape], then interleave them along `dim`.
    MutBuffers tmp(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) tmp[d] = c.scratch_in[d].raw();
    comm->all_gather(ins, tmp, count, c.dtype, c.groups);
    std::vector<int64_t> zero(c.in_shape.size(), 0), off(c.in_shape.size(), 0);
    for (int64_t d = 0; d < D; ++d)
      for (int64_t k = 0; k < c.n; ++k) {
        off[c.dim] = k * c.in_shape[c.dim];
        copy_box(static_cast<const std::byte*>(tmp[d]) + k * count * es, c.in_shape, zero.data(), outs[d], c.out_shape,
                 off.data(), c.in_shape, es);
      }
  } else if (c.kind == "reduce_scatter") {
    if (c.scratch_in.empty()) {
      comm->reduce_scatter(ins, outs, count, c.dtype, c.op, c.groups);
      return;
    }
    Buffers packed(static_cast<size_t>(D));
    std::vector<int64_t> zero(c.in_shape.size(), 0), off(c.in_shape.size(), 0);
    const int64_t block = numel(c.out_shape);
    for (int64_t d = 0; d < D; ++d) {
      for (int64_t k = 0; k < c.n; ++k) {
        off[c.dim] = k * c.out_shape[c.dim];
        copy_box(ins[d], c.in_shape, off.data(), c.scratch_in[d].data<std::byte>() + k * block * es, c.out_shape,
                 zero.data(), c.out_shape, es);
      }
      packed[d] = c.scratch_in[d].raw();
    }
    comm->reduce_scatter(packed, outs, count, c.dtype, c.op, c.groups);
  } else if (c.kind == "all_to_all") {
    // Pack the blocks of split_dim contiguously, exchange, and lay the received blocks along concat_dim.
    Shape blk = c.in_shape;
    blk[c.dim] /= c.n;
    const int64_t block = numel(blk);
    std::vector<int64_t> zero(blk.size(), 0), off(blk.size(), 0);
    Buffers packed(static_cast<size_t>(D));
    MutBuffers recv(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) {
      std::fill(off.begin(), off.end(), 0);
      for (int64_t k = 0; k < c.n; ++k) {
        off[c.dim] = k * blk[c.dim];
        copy_box(ins[d], c.in_shape, off.data(), c.scratch_in[d].data<std::byte>() + k * block * es, blk, zero.data(),
                 blk, es);
      }
      packed[d] = c.scratch_in[d].raw();
      recv[d] = c.scratch_out[d].raw();
    }
    comm->all_to_all(packed, recv, count, c.dtype, c.groups);
    for (int64_t d = 0; d < D; ++d) {
      std::fill(off.begin(), off.end(), 0);
      for (int64_t j = 0; j < c.n; ++j) {
        off[c.concat_dim] = j * blk[c.concat_dim];
        copy_box(static_cast<const std::byte*>(recv[d]) + j * block * es, blk, zero.data(), outs[d], c.out_shape,
                 off.data(), blk, es);
      }
    }
  }
}

std::vector<ShardedArray> ShardedExecutable::run(const std::vector<ShardedArray>& inputs) {
  std::vector<ShardedArray> outs;
  run_into(inputs, outs);
  return outs;
}

void ShardedExecutable::run_into(const std::vector<ShardedArray>& inputs, std::vector<ShardedArray>& outs) {
  Impl& m = *impl_;
  const Graph& g = *m.prog.local;
  const size_t nin = m.prog.in_shardings.size();
  if (inputs.size() != nin)
    throw Error("[run] expected " + std::to_string(nin) + " inputs, got " + std::to_string(inputs.size()));
  for (size_t i = 0; i < nin; ++i) {
    if (inputs[i].sharding() != m.prog.in_shardings[i]) {
      std::string name = g.input_names()[i].empty() ? "" : " ('" + g.input_names()[i] + "')";
      throw Error("[run] input " + std::to_string(i) + name + " is sharded as " + inputs[i].sharding().to_string() +
                  " on " + inputs[i].mesh().to_string() + " but the program was compiled for " +
                  m.prog.in_shardings[i].to_string() + " on " + m.prog.mesh.to_string() +
                  "; reshard it with px::shard(px::gather(x), exe->in_sharding(i))");
    }
  }
  // Every output lands in the caller's arrays when they fit and the caller alone holds them (the
  // buffers of the step before last, in a training loop), else in fresh ones. Computed outputs
  // are written there by the steps themselves, never copied at the end.
  outs.resize(g.outputs().size());
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    int v = g.outputs()[o];
    const Sharding& s = m.prog.out_shardings[o];
    const std::vector<Array>& have = outs[o].shards();
    bool reuse = outs[o].sharding() == s && static_cast<int64_t>(have.size()) == m.devices;
    for (size_t d = 0; reuse && d < have.size(); ++d) reuse = have[d].type() == g.type(v) && have[d].sole_owner();
    if (!reuse) {
      std::vector<Array> shards;
      for (int64_t d = 0; d < m.devices; ++d) shards.push_back(Array(g.type(v).dtype, g.type(v).shape));
      TensorType global = g.type(v);
      for (int d = 0; d < static_cast<int>(global.shape.size()); ++d) global.shape[d] *= s.num_shards(d);
      outs[o] = ShardedArray(global, s, std::move(shards));
    }
    if (m.output_bound[o])
      for (int64_t d = 0; d < m.devices; ++d) m.bind(d, v, m.output_slots[o], outs[o].shard(static_cast<int>(d)));
  }
  for (const Step& st : m.steps) {
    if (st.collective) {
      m.run_collective(m.collectives[st.index], inputs);
      continue;
    }
    Segment& seg = m.segments[st.index];
    auto run_device = [&](int64_t d) {
      for (int slot : seg.input_slots) seg.ins[d][slot] = m.value(static_cast<int>(d), seg.in_values[slot], inputs);
      seg.exes[m.over_devices ? d : 0]->run_into(seg.ins[d], seg.outs[d]);
    };
    if (!m.over_devices) {
      for (int64_t d = 0; d < m.devices; ++d) run_device(d);
      continue;
    }
    // Devices share the cores; kernels called inside the region run on their calling thread.
    std::exception_ptr failure;
#pragma omp parallel for schedule(static) num_threads(m.threads)
    for (int64_t d = 0; d < m.devices; ++d) {
      try {
        run_device(d);
      } catch (...) {
#pragma omp critical(px_sharded_run)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }
  // The other outputs (inputs returned, a value returned twice) are copied.
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    if (m.output_bound[o]) continue;
    for (int64_t d = 0; d < m.devices; ++d) {
      const Array& src = m.value(static_cast<int>(d), g.outputs()[o], inputs);
      Array& dst = outs[o].mutable_shards()[d];
      if (src.raw() != dst.raw() && src.nbytes()) std::memcpy(dst.raw(), src.raw(), static_cast<size_t>(src.nbytes()));
    }
  }
  // Let go of the caller's arrays (outputs and inputs), so that it is their sole owner again and
  // the next run may write into them.
  for (size_t o = 0; o < g.outputs().size(); ++o)
    if (m.output_bound[o])
      for (int64_t d = 0; d < m.devices; ++d) m.bind(d, g.outputs()[o], m.output_slots[o], Array());
  for (Segment& seg : m.segments)
    for (int64_t d = 0; d < m.devices; ++d)
      for (int slot : seg.input_slots) seg.ins[d][slot] = Array();
}

std::vector<Array> ShardedExecutable::run_full(const std::vector<Array>& inputs) {
  std::vector<ShardedArray> in;
  for (size_t i = 0; i < inputs.size(); ++i) in.push_back(shard(inputs[i], in_sharding(static_cast<int>(i))));
  std::vector<Array> out;
  for (auto& r : run(in)) out.push_back(gather(r));
  return out;
}

const Sharding& ShardedExecutable::in_sharding(int i) const { return impl_->prog.in_shardings.at(i); }
const Sharding& ShardedExecutable::out_sharding(int i) const { return impl_->prog.out_shardings.at(i); }
const SpmdProgram& ShardedExecutable::program() const { return impl_->prog; }
const CollectiveStats& ShardedExecutable::stats() const { return impl_->comm->stats(); }
void ShardedExecutable::reset_stats() { impl_->comm->reset_stats(); }
int ShardedExecutable::num_segments() const { return static_cast<int>(impl_->segments.size()); }

std::string ShardedExecutable::summary() const {
  std::ostringstream os;
  os << "sharded executable on " << impl_->prog.mesh.to_string() << ": " << impl_->segments.size()
     << " compute segments, " << impl_->collectives.size() << " collectives\n";
  for (const Step& st : impl_->steps) {
    if (st.collective) {
      const Collective& c = impl_->collectives[st.index];
      os << "  " << c.kind << " %" << c.in_value << " -> %" << c.out_value << "\n";
    } else {
      os << "  segment: " << impl_->segments[st.index].exes[0]->num_steps() << " kernels\n";
    }
  }
  return os.str();
}

}  // namespace px
