#include "runtime/collectives.h"

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

// copy(d, k) for every device d of `devices` and block k of `n`: the packing around a collective
// over a dim that is not leading, spread over the threads when it moves enough bytes.
template <typename Copy>
void for_each_block(size_t devices, int64_t n, int64_t bytes, Copy&& copy) {
  const int64_t jobs = static_cast<int64_t>(devices) * n;
#pragma omp parallel for schedule(static) if (jobs > 1 && bytes > (int64_t{1} << 18))
  for (int64_t j = 0; j < jobs; ++j) copy(static_cast<size_t>(j / n), j % n);
}

}  // namespace

CollectiveHandle start_collective(Communicator& comm, const CollectiveOp& c, const Buffers& ins,
                                  const MutBuffers& outs, const MutBuffers& scratch_in,
                                  const MutBuffers& scratch_out) {
  const size_t D = ins.size();
  const int64_t es = dtype_size(c.dtype);
  const int64_t count = numel(c.in_shape);
  const DeviceGroups& groups = c.groups.groups;
  switch (c.kind) {
    case CollectiveKind::all_reduce: return comm.start_all_reduce(ins, outs, count, c.dtype, c.op, groups);
    case CollectiveKind::permute: return comm.start_permute(ins, outs, count, c.dtype, c.groups.pairs);
    case CollectiveKind::all_gather: break;
    case CollectiveKind::reduce_scatter: break;
    case CollectiveKind::all_to_all: break;
    case CollectiveKind::broadcast: throw Error("[run] internal: broadcast is not a node of local programs");
  }
  if (c.kind == CollectiveKind::all_gather) {
    if (!c.scratch_in) return comm.start_all_gather(ins, outs, count, c.dtype, groups);
    // Gather whole blocks into scratch [n, in_shape], then interleave them along `dim`.
    comm.start_all_gather(ins, scratch_in, count, c.dtype, groups).wait();
    for_each_block(D, c.n, count * es * c.n * static_cast<int64_t>(D), [&](size_t d, int64_t k) {
      std::vector<int64_t> zero(c.in_shape.size(), 0), off(c.in_shape.size(), 0);
      off[c.dim] = k * c.in_shape[c.dim];
      copy_box(static_cast<const std::byte*>(scratch_in[d]) + k * count * es, c.in_shape, zero.data(), outs[d],
               c.out_shape, off.data(), c.in_shape, es);
    });
    return CollectiveHandle();
  }
  if (c.kind == CollectiveKind::reduce_scatter) {
    if (!c.scratch_in) return comm.start_reduce_scatter(ins, outs, count, c.dtype, c.op, groups);
    Buffers packed(scratch_in.begin(), scratch_in.end());
    const int64_t block = numel(c.out_shape);
    for_each_block(D, c.n, count * es * static_cast<int64_t>(D), [&](size_t d, int64_t k) {
      std::vector<int64_t> zero(c.in_shape.size(), 0), off(c.in_shape.size(), 0);
      off[c.dim] = k * c.out_shape[c.dim];
      copy_box(ins[d], c.in_shape, off.data(), static_cast<std::byte*>(scratch_in[d]) + k * block * es, c.out_shape,
               zero.data(), c.out_shape, es);
    });
    return comm.start_reduce_scatter(packed, outs, count, c.dtype, c.op, groups);
  }
  {
    // all_to_all: pack the blocks of split_dim contiguously, exchange, and lay the received blocks along concat_dim.
    Shape blk = c.in_shape;
    blk[c.dim] /= c.n;
    const int64_t block = numel(blk), bytes = count * es * static_cast<int64_t>(D);
    Buffers packed(scratch_in.begin(), scratch_in.end());
    for_each_block(D, c.n, bytes, [&](size_t d, int64_t k) {
      std::vector<int64_t> zero(blk.size(), 0), off(blk.size(), 0);
      off[c.dim] = k * blk[c.dim];
      copy_box(ins[d], c.in_shape, off.data(), static_cast<std::byte*>(scratch_in[d]) + k * block * es, blk,
               zero.data(), blk, es);
    });
    comm.start_all_to_all(packed, scratch_out, count, c.dtype, groups).wait();
    for_each_block(D, c.n, bytes, [&](size_t d, int64_t j) {
      std::vector<int64_t> zero(blk.size(), 0), off(blk.size(), 0);
      off[c.concat_dim] = j * blk[c.concat_dim];
      copy_box(static_cast<const std::byte*>(scratch_out[d]) + j * block * es, blk, zero.data(), outs[d],
               c.out_shape, off.data(), blk, es);
    });
    return CollectiveHandle();
  }
}

}  // namespace px
