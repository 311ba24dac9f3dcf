#include "runtime/collectives.h"

#include <functional>

#include "core/box.h"
#include "ir/primitive.h"
#include "parallax/collectives.h"

namespace px {

std::string CollectiveOp::name() const { return transfer ? "transfer" : collective_name(kind); }

CollectiveOp make_collective_op(const Graph& g, const Node& n, CollectiveGroups groups) {
  if (!n.prim->spmd.collective)
    throw Error("[compile] internal: '" + n.prim->name + "' is not a collective primitive");
  CollectiveOp c;
  c.kind = *n.prim->spmd.collective;
  c.dtype = g.type(n.inputs[0]).dtype;
  c.in_shape = g.type(n.inputs[0]).shape;
  c.out_shape = g.type(n.outputs[0]).shape;
  if (n.attrs.has("reduce")) c.op = n.attrs.s("reduce") == "max" ? ReduceOp::max : ReduceOp::sum;
  if (n.attrs.has("dim")) c.dim = static_cast<int>(n.attrs.i("dim"));
  if (c.kind == CollectiveKind::all_to_all) {
    c.dim = static_cast<int>(n.attrs.i("split_dim"));
    c.concat_dim = static_cast<int>(n.attrs.i("concat_dim"));
  }
  c.n = groups.groups.empty() ? 1 : static_cast<int64_t>(groups.groups[0].size());
  c.groups = std::move(groups);
  // Blocks exchanged must be contiguous: pack around dims that are not leading.
  int64_t outer = 1;
  for (int d = 0; d < c.dim; ++d) outer *= c.in_shape[d];
  const bool gather = c.kind == CollectiveKind::all_gather, all_to_all = c.kind == CollectiveKind::all_to_all;
  const bool pack = (gather || c.kind == CollectiveKind::reduce_scatter) ? outer > 1 : all_to_all;
  if (pack) {
    c.scratch_in = numel(gather ? c.out_shape : c.in_shape);
    if (all_to_all) c.scratch_out = numel(c.in_shape);
  }
  return c;
}

namespace {

using Exchange = std::function<CollectiveHandle(const Buffers&, const MutBuffers&)>;

// One communicator call on every local device's buffers (in_bytes and out_bytes each); staged:
// the inputs copied to host buffers by the backend, the call run on those and waited for, and
// the outputs copied back.
CollectiveHandle exchange(Backend& backend, bool stage, const Buffers& ins, const MutBuffers& outs, int64_t in_bytes,
                          int64_t out_bytes, const Exchange& call) {
  if (!stage) return call(ins, outs);
  const size_t D = ins.size();
  std::vector<std::vector<std::byte>> host_in(D), host_out(D);  // outputs zeroed: a permute's unsent targets
  Buffers hin(D);
  MutBuffers hout(D);
  std::vector<CopyJob> jobs;
  for (size_t d = 0; d < D; ++d) {
    host_in[d].resize(static_cast<size_t>(in_bytes));
    host_out[d].resize(static_cast<size_t>(out_bytes));
    hin[d] = host_in[d].data();
    hout[d] = host_out[d].data();
    jobs.push_back({host_in[d].data(), ins[d], in_bytes});
  }
  backend.copy(std::move(jobs)).wait();
  call(hin, hout).wait();
  jobs.clear();
  for (size_t d = 0; d < D; ++d) jobs.push_back({outs[d], host_out[d].data(), out_bytes});
  backend.copy(std::move(jobs)).wait();
  return CollectiveHandle();
}

}  // namespace

CollectiveHandle start_collective(Communicator& comm, Backend& backend, const CollectiveOp& c, const Buffers& ins,
                                  const MutBuffers& outs, const MutBuffers& scratch_in, const MutBuffers& scratch_out,
                                  bool stage) {
  const size_t D = ins.size();
  const int64_t es = dtype_size(c.dtype);
  const int64_t count = numel(c.in_shape);
  const int64_t bytes = count * es;
  const DeviceGroups& groups = c.groups.groups;
  auto all_gather = [&](const Buffers& in, const MutBuffers& out) {
    return exchange(backend, stage, in, out, bytes, bytes * c.n,
                    [&](const Buffers& i, const MutBuffers& o) { return comm.start_all_gather(i, o, count, c.dtype, groups); });
  };
  auto reduce_scatter = [&](const Buffers& in, const MutBuffers& out) {
    return exchange(backend, stage, in, out, bytes, bytes / c.n, [&](const Buffers& i, const MutBuffers& o) {
      return comm.start_reduce_scatter(i, o, count, c.dtype, c.op, groups);
    });
  };
  switch (c.kind) {
    case CollectiveKind::all_reduce:
      return exchange(backend, stage, ins, outs, bytes, bytes, [&](const Buffers& i, const MutBuffers& o) {
        return comm.start_all_reduce(i, o, count, c.dtype, c.op, groups);
      });
    case CollectiveKind::permute:
      return exchange(backend, stage, ins, outs, bytes, bytes, [&](const Buffers& i, const MutBuffers& o) {
        return comm.start_permute(i, o, count, c.dtype, c.groups.pairs);
      });
    case CollectiveKind::all_gather:
      if (!c.scratch_in) return all_gather(ins, outs);
      break;
    case CollectiveKind::reduce_scatter:
      if (!c.scratch_in) return reduce_scatter(ins, outs);
      break;
    case CollectiveKind::all_to_all:
      break;
    case CollectiveKind::broadcast:
      throw Error("[run] internal: broadcast is not a node of local programs");
  }
  // The blocks exchanged must be contiguous: the backend packs them from (or unpacks them to) their
  // places along `dim` (all_to_all: `concat_dim` on the way back), block k of device d at offset k.
  const Shape block_shape = [&] {
    Shape b = c.kind == CollectiveKind::reduce_scatter ? c.out_shape : c.in_shape;
    if (c.kind == CollectiveKind::all_to_all) b[c.dim] /= c.n;
    return b;
  }();
  const int64_t block = numel(block_shape);
  auto boxes = [&](const Buffers& from, const MutBuffers& to, bool pack, int dim, const Shape& whole) {
    std::vector<BoxCopy> jobs;
    jobs.reserve(D * static_cast<size_t>(c.n));
    const std::vector<int64_t> zero(block_shape.size(), 0);
    for (size_t d = 0; d < D; ++d)
      for (int64_t k = 0; k < c.n; ++k) {
        std::vector<int64_t> at(block_shape.size(), 0);
        at[dim] = k * block_shape[dim];
        if (pack)
          jobs.push_back({static_cast<std::byte*>(to[d]) + k * block * es, block_shape, zero, from[d], whole, at,
                          block_shape, es});
        else
          jobs.push_back({to[d], whole, at, static_cast<const std::byte*>(from[d]) + k * block * es, block_shape, zero,
                          block_shape, es});
      }
    backend.copy_boxes(jobs);
  };
  const Buffers packed_in(scratch_in.begin(), scratch_in.end());
  switch (c.kind) {
    case CollectiveKind::all_gather:  // gather whole blocks into scratch [n, in_shape], then lay them along dim
      all_gather(ins, scratch_in).wait();
      boxes(packed_in, outs, false, c.dim, c.out_shape);
      return CollectiveHandle();
    case CollectiveKind::reduce_scatter:
      boxes(ins, scratch_in, true, c.dim, c.in_shape);
      return reduce_scatter(packed_in, outs);
    default:  // all_to_all: pack the blocks of split_dim, exchange, lay the received ones along concat_dim
      boxes(ins, scratch_in, true, c.dim, c.in_shape);
      exchange(backend, stage, packed_in, scratch_out, bytes, bytes, [&](const Buffers& i, const MutBuffers& o) {
        return comm.start_all_to_all(i, o, count, c.dtype, groups);
      }).wait();
      boxes(Buffers(scratch_out.begin(), scratch_out.end()), outs, false, c.concat_dim, c.out_shape);
      return CollectiveHandle();
  }
}

}  // namespace px
