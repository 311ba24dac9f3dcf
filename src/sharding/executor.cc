// The sharded executor: the local program compiled once by the runtime for every device of this
// process, i.e. the communicator's local positions of the mesh (one schedule with collectives as
// its nodes, one buffer plan, an arena per device), run in lockstep through the injected
// communicator (the in-process one over every position by default).
#include <map>
#include <memory>
#include <mutex>
#include <sstream>

#include "core/exclusive.h"
#include "ir/primitive.h"
#include "parallax/backend.h"
#include "parallax/communicator.h"
#include "parallax/spmd.h"
#include "runtime/program.h"
#include "sharding/groups.h"
#include "sharding/prims.h"
#include "sharding/spmd_internal.h"

namespace px {

std::function<CollectiveGroups(const Node&)> collective_groups(const Mesh& mesh) {
  // A program has many collectives over few distinct axis sets: each set's groups are built once
  // (on a mesh of a thousand devices, building them for every node dominated AUTO's planning).
  struct Cache {
    std::mutex mu;
    std::map<std::vector<int>, std::shared_ptr<const std::vector<std::vector<int>>>> groups;
  };
  auto cache = std::make_shared<Cache>();
  return [mesh, cache](const Node& n) {
    CollectiveGroups cg;
    std::vector<int> axes = spmd::axis_ids(mesh, split_axes(n.attrs.s("axes")));
    std::shared_ptr<const std::vector<std::vector<int>>> groups;
    {
      std::lock_guard<std::mutex> lock(cache->mu);
      auto& slot = cache->groups[axes];
      if (!slot) slot = std::make_shared<const std::vector<std::vector<int>>>(mesh.groups(axes));
      groups = slot;
    }
    cg.groups = *groups;
    if (n.prim == prims::collective_permute()) {
      const auto& p = n.attrs.ints("pairs");
      for (const auto& grp : cg.groups)
        for (size_t k = 0; k + 1 < p.size(); k += 2) cg.pairs.push_back({grp[p[k]], grp[p[k + 1]]});
    }
    return cg;
  };
}

struct ShardedExecutable::Impl {
  SpmdProgram prog;
  std::unique_ptr<Communicator> own_comm;
  Communicator* comm = nullptr;
  std::unique_ptr<Executable> exe;
  int process = 0;                            // the mesh process this executable runs
  std::vector<int> positions;                 // its mesh positions (the communicator's local ones)
  int64_t devices = 1;                        // positions.size()
  std::vector<Array> coords;                  // per local device
  std::vector<std::vector<Array>> ins, outs;  // per device, reused between runs
  std::atomic<bool> running{false};           // one run at a time (ins / outs are reused)
  int64_t runs_counted = 0;                   // runs since the stats were reset
};

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
                                                              DeviceParallelism par, Communicator* comm) {
  ensure_sharding_registered();
  auto impl = std::make_unique<Impl>();
  impl->prog = std::move(program);
  const Mesh& mesh = impl->prog.mesh;
  if (!comm) {
    if (mesh.num_processes() > 1)
      throw Error("[ShardedExecutable] the mesh " + mesh.to_string() +
                  " spans several processes, so each process runs only its own positions: pass this process's "
                  "communicator (ShardedExecutable::compile(program, options, parallelism, communicator), or "
                  "ShardingOptions::communicator for a training step)");
    impl->own_comm = make_inproc_communicator(mesh.size());
    comm = impl->own_comm.get();
  }
  impl->comm = comm;
  // The positions to run are the communicator's local ones, which must be one process's of the mesh.
  const std::vector<int>& local = comm->local_positions();
  auto text = [](const std::vector<int>& v) {
    std::string t;
    for (size_t i = 0; i < v.size(); ++i) t += (i ? ", " : "") + std::to_string(v[i]);
    return "{" + t + "}";
  };
  if (comm->world_size() != mesh.size() || local.empty() ||
      comm->local_positions() != mesh.local_positions(mesh.process_of(local[0])))
    throw Error("[ShardedExecutable] the communicator '" + comm->name() + "' holds positions " + text(local) +
                " of a world of " + std::to_string(comm->world_size()) + ", which are not the positions of one " +
                "process of " + mesh.to_string() + "; make the mesh with the same processes (Mesh::with_processes) " +
                "and pass each process its own communicator");
  impl->process = mesh.process_of(local[0]);
  impl->positions = local;
  const int64_t D = static_cast<int64_t>(local.size());
  impl->devices = D;
  for (int p : impl->positions) {
    const std::vector<int64_t> c = mesh.coords(p);
    impl->coords.push_back(
        Array::from_i32(std::vector<int32_t>(c.begin(), c.end()), {static_cast<int64_t>(c.size())}).to(mesh.placement(p)));
  }
  DeviceSetup setup;
  setup.device_ids.clear();
  for (int p : impl->positions) setup.device_ids.push_back(mesh.device_ids()[p]);
  setup.comm = comm;
  const int threads = backend_for(mesh.platform()).num_threads();
  setup.over_devices =
      par == DeviceParallelism::over_devices || (par == DeviceParallelism::automatic && D > 1 && D >= threads);
  setup.groups = collective_groups(mesh);
  CompileOptions opt = copt;
  opt.platform = mesh.platform();
  if (opt.output_donors.empty()) opt.output_donors = impl->prog.output_donors;
  impl->exe = compile_on_devices(*impl->prog.local, opt, setup);
  impl->ins.resize(static_cast<size_t>(D));
  impl->outs.resize(static_cast<size_t>(D));
  return std::unique_ptr<ShardedExecutable>(new ShardedExecutable(std::move(impl)));
}

std::vector<ShardedArray> ShardedExecutable::run(const std::vector<ShardedArray>& inputs) {
  std::vector<ShardedArray> outs;
  run_into(inputs, outs);
  return outs;
}

void ShardedExecutable::run_into(const std::vector<ShardedArray>& inputs, std::vector<ShardedArray>& outs) {
  Impl& m = *impl_;
  ExclusiveCall call(m.running, "sharded executable");
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
    detail::check_complete(inputs[i], "run");
    if (inputs[i].process() != m.process)
      throw Error("[run] input " + std::to_string(i) + " holds the shards of process " +
                  std::to_string(inputs[i].process()) + " of " + m.prog.mesh.to_string() +
                  ", but this executable runs process " + std::to_string(m.process) +
                  "; shard the inputs for this process (px::shard(x, sharding, exe->process()))");
  }
  // Outputs land in the caller's arrays when they fit and the caller alone holds them, or when
  // they are the shards of the input donated to them (a training step's state), else in fresh
  // ones on each device.
  outs.resize(g.outputs().size());
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    int v = g.outputs()[o];
    const Sharding& s = m.prog.out_shardings[o];
    const std::vector<Array>& have = outs[o].shards();
    bool reuse =
        outs[o].sharding() == s && outs[o].process() == m.process && static_cast<int64_t>(have.size()) == m.devices;
    const MemoryKind kind = m.exe->output_kind(static_cast<int>(o));
    // A donated input's shards (CompileOptions::output_donors) take its output even though the
    // caller holds them: the program writes them in place.
    const int donor = m.exe->output_donor(static_cast<int>(o));
    for (size_t d = 0; reuse && d < have.size(); ++d) {
      const bool donated = donor >= 0 && static_cast<size_t>(donor) < nin && !have[d].read_only() &&
                           inputs[donor].shards().size() == have.size() &&
                           inputs[donor].shards()[d].raw() == have[d].raw();
      reuse = have[d].type() == g.type(v) && (have[d].sole_owner() || donated) && have[d].placement().kind == kind;
    }
    if (!reuse) {
      std::vector<Array> shards;
      for (int64_t d = 0; d < m.devices; ++d)
        shards.push_back(Array(g.type(v).dtype, g.type(v).shape, m.prog.mesh.placement(m.positions[d], kind)));
      TensorType global = g.type(v);
      for (int d = 0; d < static_cast<int>(global.shape.size()); ++d) global.shape[d] *= s.num_shards(d);
      outs[o] = ShardedArray(global, s, std::move(shards), m.process);
    }
  }
  for (int64_t d = 0; d < m.devices; ++d) {
    auto& in = m.ins[d];
    in.clear();
    for (size_t i = 0; i < nin; ++i) {
      // A shard in the wrong memory kind is copied for this run (a step keeps its state in place).
      const Array& sh = inputs[i].shards()[d];
      const MemoryKind want = m.exe->input_kind(static_cast<int>(i));
      in.push_back(sh.placement().kind == want ? sh : sh.to({sh.placement().device, want}));
    }
    in.push_back(m.coords[d]);
    auto& out = m.outs[d];
    out.clear();
    for (size_t o = 0; o < outs.size(); ++o) out.push_back(outs[o].shards()[d]);
  }
  m.exe->run_on_devices(m.ins, m.outs);
  ++m.runs_counted;
  // Let go of the caller's arrays, so that it is their sole owner again and the next run may
  // write into them.
  for (int64_t d = 0; d < m.devices; ++d) {
    m.ins[d].clear();
    m.outs[d].clear();
  }
}

std::vector<Array> ShardedExecutable::run_full(const std::vector<Array>& inputs) {
  std::vector<ShardedArray> in;
  for (size_t i = 0; i < inputs.size(); ++i)
    in.push_back(shard(inputs[i], in_sharding(static_cast<int>(i)), impl_->process));
  std::vector<Array> out;
  for (auto& r : run(in)) out.push_back(gather(r, *impl_->comm));
  return out;
}

const Sharding& ShardedExecutable::in_sharding(int i) const { return impl_->prog.in_shardings.at(i); }
const Sharding& ShardedExecutable::out_sharding(int i) const { return impl_->prog.out_shardings.at(i); }
const SpmdProgram& ShardedExecutable::program() const { return impl_->prog; }
int ShardedExecutable::process() const { return impl_->process; }
const std::vector<int>& ShardedExecutable::positions() const { return impl_->positions; }
Communicator& ShardedExecutable::communicator() const { return *impl_->comm; }
const CollectiveStats& ShardedExecutable::stats() const { return impl_->comm->stats(); }
void ShardedExecutable::reset_stats() {
  impl_->comm->reset_stats();
  impl_->runs_counted = 0;
}
int64_t ShardedExecutable::runs_counted() const { return impl_->runs_counted; }
const Executable& ShardedExecutable::executable() const { return *impl_->exe; }
void ShardedExecutable::use_arena(int device_id, void* arena) { impl_->exe->use_arena(device_id, arena); }
MemoryReport ShardedExecutable::memory() const { return impl_->exe->memory(); }
int64_t ShardedExecutable::peak_bytes(int position) const {
  if (position < 0 || position >= impl_->prog.mesh.size())
    throw Error("[peak_bytes] mesh position " + std::to_string(position) + " is not in " +
                impl_->prog.mesh.to_string());
  return impl_->exe->memory().peak_bytes;  // one program: every device plans the same bytes
}

std::string ShardedExecutable::summary() const {
  std::ostringstream os;
  os << "sharded executable on " << impl_->prog.mesh.to_string() << "\n" << impl_->exe->summary();
  return os.str();
}

}  // namespace px
