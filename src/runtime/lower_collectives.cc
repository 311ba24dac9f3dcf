// Collective events of the schedule become ops the communicator runs (with their packing scratch
// added to the program's buffers); copies between memory kinds ("transfer") become ops of the
// backend's copy stream. Also: the program's buffers, one per value at its storage root, and the
// kernels' working memory.
#include <map>

#include "ir/primitive.h"
#include "runtime/compile_passes.h"
#include "ops/prims.h"

namespace px {

ProgramBuffers value_buffers(const Graph& g, const std::vector<Unit>& units) {
  const size_t nv = g.values().size();
  ProgramBuffers b;
  // Reshapes outside fused groups are views: their result shares the operand's storage.
  b.root.resize(nv);
  for (size_t v = 0; v < nv; ++v) b.root[v] = static_cast<int>(v);
  for (const Unit& u : units)
    if (u.kind == Unit::Kind::view) b.root[u.out_values[0]] = b.root[u.in_values[0]];
  b.bytes.resize(nv);
  for (size_t v = 0; v < nv; ++v) b.bytes[v] = g.type(static_cast<int>(v)).nbytes();
  for (const ValueInfo& info : g.values()) {
    b.category.push_back(info.category);
    b.kind.push_back(info.kind);
  }
  return b;
}

void kernel_scratch(const Graph& g, const std::vector<Unit>& units, const Backend& backend, const Placement& device,
                    ProgramBuffers& buffers) {
  buffers.kernel_scratch.assign(units.size(), -1);
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].kind != Unit::Kind::kernel && units[u].kind != Unit::Kind::fused) continue;
    const int64_t bytes = backend.scratch_bytes(g, units[u], device);
    if (bytes < 0)
      throw InternalError("[compile] the " + backend.name() + " backend asks for " + std::to_string(bytes) +
                          " bytes of scratch for " + units[u].label);
    if (bytes == 0) continue;
    buffers.kernel_scratch[u] = static_cast<int>(buffers.bytes.size());
    buffers.bytes.push_back(bytes);
    buffers.category.push_back(MemoryCategory::kernel_scratch);
    buffers.kind.push_back(MemoryKind::device);
  }
}

LoweredCollectives lower_collectives(const Graph& g, const std::vector<Unit>& units,
                                     const std::function<CollectiveGroups(const Node&)>& groups, ProgramBuffers& buffers) {
  const auto& nodes = g.nodes();
  const std::vector<MemoryCategory> category = buffers.category;  // as the values were given
  LoweredCollectives lc;
  lc.of_unit.assign(units.size(), -1);
  std::map<int, int> op_of_node;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = units[u];
    if (unit.kind != Unit::Kind::collective_start && unit.kind != Unit::Kind::collective_wait) continue;
    const int node = unit.nodes[0];
    auto it = op_of_node.find(node);
    if (it == op_of_node.end() && nodes[node].prim == prims::transfer()) {
      // A copy between memory kinds; its result is categorized as what it copies.
      const int in = nodes[node].inputs[0], out = nodes[node].outputs[0];
      CollectiveOp c;
      c.transfer = true;
      c.dtype = g.type(in).dtype;
      c.in_shape = c.out_shape = g.type(in).shape;
      lc.ops.push_back(std::move(c));
      it = op_of_node.emplace(node, static_cast<int>(lc.ops.size()) - 1).first;
      lc.scratch_of.emplace_back();
      if (category[out] == MemoryCategory::temporaries) buffers.category[out] = category[in];
      lc.transfer_bytes += g.type(in).nbytes();
    } else if (it == op_of_node.end()) {
      if (!groups)
        throw Error("[compile] the program has the collective '" + nodes[node].prim->name + "' (%" +
                    std::to_string(nodes[node].outputs[0]) +
                    "): compile it for a mesh with px::ShardedExecutable, not px::Executable");
      lc.ops.push_back(make_collective_op(g, nodes[node], groups(nodes[node])));
      it = op_of_node.emplace(node, static_cast<int>(lc.ops.size()) - 1).first;
      const CollectiveOp& c = lc.ops.back();
      std::vector<int> scratch;
      for (int64_t elems : {c.scratch_in, c.scratch_out}) {
        if (!elems) continue;
        scratch.push_back(static_cast<int>(buffers.bytes.size()));
        buffers.bytes.push_back(elems * dtype_size(c.dtype));
        buffers.category.push_back(MemoryCategory::collective_buffers);
        buffers.kind.push_back(MemoryKind::device);
      }
      lc.scratch_of.push_back(std::move(scratch));
      for (int v : nodes[node].outputs)
        if (category[v] == MemoryCategory::temporaries) buffers.category[v] = MemoryCategory::collective_buffers;
    }
    lc.of_unit[u] = it->second;
  }
  return lc;
}

}  // namespace px
