// The fused-loop engine: runs a chain of elementwise nodes tile by tile, so intermediate
// values stay in a few L1-sized scratch tiles instead of round-tripping through memory.
// A group may also contain broadcast_in_dim nodes of external operands: they become strided
// loads (bias adds, per-row scales) instead of materialized broadcasts, read in place where a
// tile is one contiguous run of the operand.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <memory>
#include <unordered_map>

#include "backend/cpu/kernel.h"
#include "backend/cpu/reduce_feed.h"
#include "ir/primitive.h"
#include "ops/prims.h"

namespace px::cpu {

namespace {
// Up to 1024 floats = 4 KiB per tile: the live tiles fit L1, the per-tile overhead (pointer
// setup, one indirect call per op) is amortized over enough elements, and operands streamed from
// memory are read in short bursts that the prefetchers keep ahead of (with 2048-float tiles the
// first ops waited on memory and the rest left it idle: fusion_bench ran 20% slower).
constexpr int64_t kTile = 1024;            // the f32 path's largest
constexpr int64_t kScratchFloats = 12288;  // 48 KiB of live tiles per thread: about L1
constexpr int kMaxArity = 8;
// f32 and bf16 results of groups over this many bytes of f32 are written with streaming stores:
// they cannot be read back from cache anyway, and plain stores would first read every line.
constexpr int64_t kStreamBytes = 8 << 20;

bool int_like(DType d) { return d == DType::i32 || d == DType::boolean; }

// Rounds f32 values to what storing them as `t` and loading them back gives, so that a value
// kept inside a tile equals the value an unfused kernel would have written.
void quantize(float* x, int64_t n, DType t) {
  switch (t) {
    case DType::f32: break;
    case DType::bf16:
      // Round to nearest even, branch-free (the loop vectorizes); NaN stays NaN.
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, x + i, 4);
        const uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        u = (u & 0x7fffffffu) > 0x7f800000u ? u : r;
        std::memcpy(x + i, &u, 4);
      }
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) x[i] = f16_to_f32(f32_to_f16(x[i]));
      break;
    case DType::i32:
      for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>(static_cast<int32_t>(x[i]));
      break;
    case DType::boolean:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] != 0.0f ? 1.0f : 0.0f;
      break;
  }
}

// A broadcast_in_dim read as a strided load: result dims, coalesced, with the operand stride
// of each (0 where the dim is broadcast). The innermost stride is 0 (fill) or 1 (copy).
struct BroadcastLoad {
  std::vector<int64_t> sizes, strides;
};

BroadcastLoad make_broadcast_load(const TensorType& operand, const TensorType& result, const Attrs& attrs) {
  const std::vector<int64_t>& dims = attrs.ints("dims");
  int r = result.rank();
  std::vector<int64_t> stride(r, 0);
  int64_t s = 1;
  for (int i = operand.rank() - 1; i >= 0; --i) {
    if (operand.shape[i] != 1) stride[dims[i]] = s;
    s *= operand.shape[i];
  }
  BroadcastLoad b;
  for (int d = 0; d < r; ++d) {
    if (result.shape[d] == 1) continue;
    if (!b.sizes.empty() && b.strides.back() == stride[d] * result.shape[d]) {
      b.sizes.back() *= result.shape[d];
      b.strides.back() = stride[d];
    } else {
      b.sizes.push_back(result.shape[d]);
      b.strides.push_back(stride[d]);
    }
  }
  if (b.sizes.empty()) {
    b.sizes.push_back(1);
    b.strides.push_back(0);
  }
  return b;
}

// Fills dst[0, len) with the broadcast's elements [off, off + len).
void run_broadcast(const BroadcastLoad& b, const void* src, DType t, int64_t off, int64_t len, float* dst) {
  int nd = static_cast<int>(b.sizes.size());
  int64_t idx[8];
  int64_t rem = off, src_off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rem % b.sizes[d];
    rem /= b.sizes[d];
    src_off += idx[d] * b.strides[d];
  }
  const int64_t inner = b.sizes[nd - 1], inner_stride = b.strides[nd - 1];
  int64_t done = 0;
  while (done < len) {
    int64_t run = std::min(inner - idx[nd - 1], len - done);
    if (inner_stride == 0) {
      float v;
      load_f32(src, t, src_off, &v, 1);
      std::fill(dst + done, dst + done + run, v);
    } else {
      load_f32(src, t, src_off, dst + done, run);
    }
    done += run;
    // Advance the multi-index by `run` elements: the inner dim wraps, outer dims carry.
    idx[nd - 1] += run;
    src_off += run * inner_stride;
    for (int d = nd - 1; d > 0 && idx[d] == b.sizes[d]; --d) {
      src_off -= b.sizes[d] * b.strides[d];
      idx[d] = 0;
      ++idx[d - 1];
      src_off += b.strides[d - 1];
    }
  }
}

// The operand's elements [off, off + len) in place, when they are contiguous f32 (a bias row that
// the tile does not wrap around): nullptr when the tile must be filled by run_broadcast.
const float* broadcast_view(const BroadcastLoad& b, const void* src, DType t, int64_t off, int64_t len) {
  const int nd = static_cast<int>(b.sizes.size());
  if (t != DType::f32 || b.strides[nd - 1] != 1) return nullptr;
  int64_t rem = off, src_off = 0;
  for (int d = nd - 1; d >= 0; --d) {
    const int64_t idx = rem % b.sizes[d];
    if (d == nd - 1 && idx + len > b.sizes[d]) return nullptr;
    rem /= b.sizes[d];
    src_off += idx * b.strides[d];
  }
  return static_cast<const float*>(src) + src_off;
}

// The fused program: a list of ops over slots. A slot is the tile of one value; it points into
// an external f32 buffer (read or written in place) or at a scratch tile.
struct Op {
  enum Kind : uint8_t { load, broadcast, compute, round, store } kind;
  int slot = -1;                  // the slot written (load/broadcast/compute/round) or read (store)
  int ext = -1;                   // operand index (load/broadcast) or result index (store)
  DType dtype = DType::f32;       // of the external buffer, or the rounding target
  EltwiseF32 fn = nullptr;        // compute
  int params = -1;                // compute: offset into the params pool, -1 when none
  int nargs = 0;
  int args[kMaxArity] = {};       // compute: operand slots
  int bcast = -1;                 // broadcast: index into the loads table
};

struct SlotPlace {
  enum Kind : uint8_t { ext_in, scratch } kind;
  int index;  // operand index or scratch tile
};

struct Program {
  std::vector<Op> ops;
  std::vector<SlotPlace> places;
  std::vector<BroadcastLoad> loads;
  std::vector<float> params;
  int num_tiles = 0;  // scratch tiles per thread
  int64_t tile = kTile;
  int64_t count = 0;
  bool stream = false;  // f32 stores are streaming (large results)
  // Operands read contiguously (index, element bytes): prefetched a tile ahead, spread over the
  // tile's ops, when the operands are too large to stay in cache.
  std::vector<std::pair<int, int>> prefetch;
  int compute_ops = 0;
};

// Allocates scratch tiles by liveness: a tile is reused as soon as its value's last reader ran.
class TileAllocator {
 public:
  int take() {
    if (!free_.empty()) {
      int t = free_.back();
      free_.pop_back();
      return t;
    }
    return used_++;
  }
  void give(int t) { free_.push_back(t); }
  int used() const { return used_; }

 private:
  std::vector<int> free_;
  int used_ = 0;
};

class ProgramBuilder {
 public:
  ProgramBuilder(const Graph& g, const FusedGroup& group) : g_(g), group_(group) {}

  Program build() {
    const Node& first = g_.nodes()[group_.nodes[0]];
    p_.count = g_.type(first.outputs[0]).numel();
    index_externals();
    find_renames();
    plan_liveness();
    for (size_t i = 0; i < group_.nodes.size(); ++i) add_node(static_cast<int>(i));
    finish();
    return std::move(p_);
  }

 private:
  void index_externals() {
    for (size_t k = 0; k < group_.ext_inputs.size(); ++k) ext_in_index_[group_.ext_inputs[k]] = static_cast<int>(k);
    for (size_t k = 0; k < group_.ext_outputs.size(); ++k) {
      if (!ext_out_index_.emplace(group_.ext_outputs[k], static_cast<int>(k)).second)
        throw Error("[fused] value stored twice");
    }
  }

  int root(int v) const {
    auto it = root_map_.find(v);
    return it == root_map_.end() ? v : it->second;
  }

  // A reshape member is a new name for its operand's tile (elementwise loops see flat indices), and
  // so is a cast between float types whose result the tile already holds: a widening one (f32
  // holds every bf16 and f16 value), or a narrowing one that is only stored (the store rounds, once,
  // as the cast would). Not a cast of an operand read in place: a store to an output sharing the
  // operand's array may come first.
  void find_renames() {
    std::unordered_map<int, char> read_in_group;
    for (int ni : group_.nodes)
      for (int v : g_.nodes()[ni].inputs) read_in_group[v] = 1;
    for (int ni : group_.nodes) {
      const Node& n = g_.nodes()[ni];
      bool rename = n.prim == prims::reshape();
      if (n.prim == prims::cast()) {
        const int v = n.inputs.at(0), r = root(v);
        const DType from = g_.type(v).dtype, to = g_.type(n.outputs.at(0)).dtype;
        const bool in_place = ext_in_index_.count(r) && g_.type(r).dtype == DType::f32;
        const bool exact = to == DType::f32 || to == from;
        rename = is_float(from) && is_float(to) && !in_place && (exact || !read_in_group.count(n.outputs[0]));
      }
      if (rename) {
        renames_[ni] = 1;
        root_map_[n.outputs.at(0)] = root(n.inputs.at(0));
      }
    }
  }

  // Liveness is tracked per storage root: the last op position reading any name of it.
  void plan_liveness() {
    for (size_t i = 0; i < group_.nodes.size(); ++i)
      for (int v : g_.nodes()[group_.nodes[i]].inputs) last_read_[root(v)] = static_cast<int>(i);
    for (int v : group_.ext_outputs) kept_[root(v)] = 1;
  }

  int new_slot(SlotPlace place) {
    p_.places.push_back(place);
    tile_of_.push_back(place.kind == SlotPlace::scratch ? place.index : -1);
    return static_cast<int>(p_.places.size()) - 1;
  }

  // Slot of an external operand read as a contiguous tile (loaded on first use when not f32).
  int operand_slot(int v, const std::string& who) {
    auto it = slot_of_.find(v);
    if (it != slot_of_.end()) return it->second;
    auto e = ext_in_index_.find(v);
    if (e == ext_in_index_.end()) throw Error("[fused] operand of '" + who + "' is neither external nor in the group");
    if (g_.type(v).numel() != p_.count) throw Error("[fused] operand of '" + who + "' has the wrong element count");
    DType t = g_.type(v).dtype;
    int slot;
    if (t == DType::f32) {
      slot = new_slot({SlotPlace::ext_in, e->second});
    } else {
      slot = new_slot({SlotPlace::scratch, tiles_.take()});
      Op op{Op::load};
      op.slot = slot;
      op.ext = e->second;
      op.dtype = t;
      p_.ops.push_back(op);
    }
    slot_of_[v] = slot;
    return slot;
  }

  // Results are computed into scratch and stored at the end of the tile, after every operand
  // read: an output may then share its array with an operand (in-place updates).
  void store_if_external(int out, int slot, DType dtype) {
    auto eo = ext_out_index_.find(out);
    if (eo == ext_out_index_.end()) return;
    Op st{Op::store};
    st.slot = slot;
    st.ext = eo->second;
    st.dtype = dtype;
    stores_.push_back(st);
  }

  void fill_broadcast(const Node& n, const TensorType& out_t, Op& op) {
    auto e = ext_in_index_.find(n.inputs.at(0));
    if (e == ext_in_index_.end()) throw Error("[fused] broadcast_in_dim of a value computed in the group");
    op.kind = Op::broadcast;
    op.ext = e->second;
    op.dtype = g_.type(n.inputs[0]).dtype;
    op.bcast = static_cast<int>(p_.loads.size());
    p_.loads.push_back(make_broadcast_load(g_.type(n.inputs[0]), out_t, n.attrs));
    if (p_.loads.back().sizes.size() > 8) throw Error("[fused] broadcast of too high a rank");
  }

  void fill_eltwise(const Node& n, Op& op) {
    const EltwiseKernel* ek = find_eltwise(n.prim);
    if (!ek || !ek->f32) throw Error("[fused] no f32 elementwise kernel for '" + n.prim->name + "'");
    if (n.inputs.size() > static_cast<size_t>(kMaxArity))
      throw Error("[fused] '" + n.prim->name + "' has too many operands");
    op.fn = ek->f32;
    std::vector<float> prm = ek->params ? ek->params(n.attrs) : std::vector<float>{};
    if (!prm.empty()) {
      op.params = static_cast<int>(p_.params.size());
      p_.params.insert(p_.params.end(), prm.begin(), prm.end());
    }
    op.nargs = static_cast<int>(n.inputs.size());
    for (int k = 0; k < op.nargs; ++k) op.args[k] = operand_slot(n.inputs[k], n.prim->name);
  }

  void add_node(int i) {
    const Node& n = g_.nodes()[group_.nodes[i]];
    if (n.outputs.size() != 1) throw Error("[fused] '" + n.prim->name + "' has several results");
    int out = n.outputs[0];
    const TensorType& out_t = g_.type(out);
    if (out_t.numel() != p_.count) throw Error("[fused] group mixes element counts");

    if (renames_.count(group_.nodes[i]) > 0) {
      int slot = operand_slot(n.inputs.at(0), n.prim->name);
      slot_of_[out] = slot;
      store_if_external(out, slot, out_t.dtype);
      return;  // nothing to free: the operand's root lives on under the new name
    }
    Op op{Op::compute};
    if (n.prim == prims::broadcast_in_dim())
      fill_broadcast(n, out_t, op);
    else
      fill_eltwise(n, op);
    // The result's tile is taken before the operands' tiles are freed: kernels never run in place.
    op.slot = new_slot({SlotPlace::scratch, tiles_.take()});
    slot_of_[out] = op.slot;
    p_.ops.push_back(op);
    // A result narrower than f32 is rounded to its dtype, except where it holds that dtype's
    // values already: a broadcast (its operand's values) and a cast to a float type (rounded by it).
    const bool exact = op.kind == Op::broadcast || (n.prim == prims::cast() && is_float(out_t.dtype));
    if (out_t.dtype != DType::f32 && !exact) {
      Op r{Op::round};
      r.slot = op.slot;
      r.dtype = out_t.dtype;
      p_.ops.push_back(r);
    }
    store_if_external(out, op.slot, out_t.dtype);
    free_dead_tiles(n, i, out);
  }

  // Free tiles read for the last time here (and results nobody reads), except stored results.
  void free_dead_tiles(const Node& n, int i, int out) {
    std::vector<int> done;
    for (int v : n.inputs)
      if (last_read_[root(v)] == i) done.push_back(root(v));
    if (!last_read_.count(out)) done.push_back(out);
    std::sort(done.begin(), done.end());
    done.erase(std::unique(done.begin(), done.end()), done.end());
    for (int v : done) {
      auto it = slot_of_.find(v);
      if (it != slot_of_.end() && tile_of_[it->second] >= 0 && !kept_.count(v)) tiles_.give(tile_of_[it->second]);
    }
  }

  void finish() {
    p_.ops.insert(p_.ops.end(), stores_.begin(), stores_.end());
    if (p_.params.empty()) p_.params.push_back(0.0f);  // block functions get a valid pointer
    for (int v : group_.ext_outputs)
      if (!slot_of_.count(v))
        throw InternalError("[fused] output %" + std::to_string(v) + " is not computed by the group");
    p_.stream = p_.count >= kStreamBytes / 4;  // (count * 4 could overflow for huge counts)
    if (p_.stream) plan_prefetch();
    p_.num_tiles = std::max(tiles_.used(), 1);
    // Shorter tiles when many are live, so that they stay in L1 (multiples of 64 for alignment).
    p_.tile = std::clamp<int64_t>(kScratchFloats / p_.num_tiles / 64 * 64, 256, kTile);
  }

  void plan_prefetch() {
    std::vector<char> seen(group_.ext_inputs.size(), 0);
    for (size_t k = 0; k < group_.ext_inputs.size(); ++k) {
      const TensorType& t = g_.type(group_.ext_inputs[k]);
      if (t.numel() == p_.count && !seen[k])
        p_.prefetch.push_back({static_cast<int>(k), static_cast<int>(dtype_size(t.dtype))});
      seen[k] = 1;
    }
    for (const Op& op : p_.ops) p_.compute_ops += op.kind == Op::compute || op.kind == Op::broadcast;
  }

  const Graph& g_;
  const FusedGroup& group_;
  Program p_;
  std::unordered_map<int, int> ext_in_index_, ext_out_index_;
  std::unordered_map<int, int> root_map_;
  std::unordered_map<int, char> renames_;  // node index -> 1: a new name for its operand's tile
  std::unordered_map<int, int> last_read_;
  std::unordered_map<int, char> kept_;  // roots with a stored name keep their tile to the end
  TileAllocator tiles_;
  std::unordered_map<int, int> slot_of_;  // value id -> slot
  std::vector<int> tile_of_;              // slot -> scratch tile or -1
  std::vector<Op> stores_;
};

Program build_program(const Graph& g, const FusedGroup& group) { return ProgramBuilder(g, group).build(); }

// Runs the program's ops over elements [off, off + len) (len <= p.tile) on one thread's tiles
// (base) and slot table (ptr, scratch slots set); prefetch() runs before each compute op.
template <class Prefetch>
void run_ops(const Program& p, const void* const* in, void* const* out, float* base, float** ptr, int64_t off,
             int64_t len, Prefetch&& prefetch) {
  const int nslots = static_cast<int>(p.places.size());
  const int64_t tile = p.tile;
  for (int s = 0; s < nslots; ++s)
    if (p.places[s].kind == SlotPlace::ext_in)
      ptr[s] = const_cast<float*>(static_cast<const float*>(in[p.places[s].index])) + off;
  for (const Op& op : p.ops) {
    if (op.kind == Op::compute || op.kind == Op::broadcast) prefetch();
    switch (op.kind) {
      case Op::load:
        load_f32(in[op.ext], op.dtype, off, ptr[op.slot], len);
        break;
      case Op::broadcast: {
        // Read in place where the tile is one contiguous run of the operand, else filled.
        float* tile_ptr = base + p.places[op.slot].index * tile;
        const float* view = broadcast_view(p.loads[op.bcast], in[op.ext], op.dtype, off, len);
        ptr[op.slot] = view ? const_cast<float*>(view) : tile_ptr;
        if (!view) run_broadcast(p.loads[op.bcast], in[op.ext], op.dtype, off, len, tile_ptr);
        break;
      }
      case Op::compute: {
        const float* args[kMaxArity];
        for (int k = 0; k < op.nargs; ++k) args[k] = ptr[op.args[k]];
        op.fn(args, ptr[op.slot], len, p.params.data() + std::max(op.params, 0));
        break;
      }
      case Op::round: quantize(ptr[op.slot], len, op.dtype); break;
      case Op::store:
        if (p.stream && op.dtype == DType::f32)
          stream_f32(ptr[op.slot], static_cast<float*>(out[op.ext]) + off, len);
        else if (p.stream && op.dtype == DType::bf16)
          stream_bf16(ptr[op.slot], static_cast<uint16_t*>(out[op.ext]) + off, len);
        else
          store_f32(ptr[op.slot], out[op.ext], op.dtype, off, len);
        break;
    }
  }
}


// A group of one all-integer node takes the exact i32 path of that node's own kernel: its factory,
// else null.
const KernelFactory* integer_kernel(const Graph& g, const FusedGroup& group) {
  if (group.nodes.empty()) throw InternalError("[fused] empty group");
  const Node& first = g.nodes()[group.nodes[0]];
  if (group.nodes.size() != 1 || !first.prim->elementwise) return nullptr;
  const EltwiseKernel* ek = find_eltwise(first.prim);
  const KernelFactory* f = find_kernel(first.prim);
  bool all_int = int_like(g.type(first.outputs[0]).dtype);
  for (int v : first.inputs) all_int = all_int && int_like(g.type(v).dtype);
  return ek && ek->i32 && all_int ? f : nullptr;
}

// Per thread, in the kernel's scratch: the tiles, then the slot pointer table. Each thread's part
// starts a cache line (64 bytes) past the previous one's end: the threads write their slot
// pointers every tile, and a shared line would bounce between the cores.
// Small loops run on the calling thread alone (one part): waking a team costs microseconds. In
// double: count * ops overflows int64 for counts near 2^63.
struct FusedScratch {
  int threads = 1;  // that run the loop
  int64_t tile_floats = 0, ptr_stride = 0, table_at = 0, per_thread = 0;  // per_thread, table_at: bytes
  explicit FusedScratch(const Program& p) {
    const int64_t ntiles = (p.count + p.tile - 1) / p.tile;
    const bool small = static_cast<double>(p.count) * static_cast<double>(p.ops.size()) < (1 << 14);
    threads = ntiles <= 1 || small ? 1 : num_threads();
    tile_floats = p.num_tiles * p.tile + 16;
    ptr_stride = (static_cast<int64_t>(p.places.size()) + 7) / 8 * 8 + 8;
    ScratchLayout l;
    l.add_floats(tile_floats);
    table_at = l.add(ptr_stride * static_cast<int64_t>(sizeof(float*)));
    per_thread = l.bytes;
  }
  int64_t bytes() const { return threads * per_thread; }
};

bool ends_in_reduction(const Graph& g, const FusedGroup& group) {
  const Node& last = g.nodes()[group.nodes.back()];
  return last.prim == prims::reduce_sum() || last.prim == prims::reduce_max();
}

// A group that ends in a reduction (reduce_feed.h): the loop of the members before it (the chain)
// feeds the reduction's kernel range by range. The chain's results are the group's but the
// reduction's (the group's last), then the reduced operand, which the reduction gets from its
// tile: it is stored only when it is a result of the group too.
struct FedGroup {
  FusedGroup chain;
  const Node* reduce = nullptr;
  Program prog;
  int sink_slot = -1;             // the operand's slot after the chain's ops
  DType sink_dtype = DType::f32;  // the operand's dtype (a stored-only narrowing cast is rounded on the copy)
  std::vector<TensorType> reduce_in, reduce_out;
  std::vector<std::pair<int, int>> contiguous;  // operands read element for element: (index, element bytes)

  FedGroup(const Graph& g, const FusedGroup& group) : reduce(&g.nodes()[group.nodes.back()]) {
    const int result = reduce->outputs.at(0), operand = reduce->inputs.at(0);
    if (group.nodes.size() < 2 || group.ext_outputs.empty() || group.ext_outputs.back() != result)
      throw InternalError("[fused] a group ending in a reduction must have the reduction's result last");
    chain.nodes.assign(group.nodes.begin(), group.nodes.end() - 1);
    chain.ext_inputs = group.ext_inputs;
    chain.ext_outputs.assign(group.ext_outputs.begin(), group.ext_outputs.end() - 1);
    auto at = std::find(chain.ext_outputs.begin(), chain.ext_outputs.end(), operand);
    const bool stored = at != chain.ext_outputs.end();
    const int sink = static_cast<int>(at - chain.ext_outputs.begin());
    if (!stored) chain.ext_outputs.push_back(operand);
    prog = build_program(g, chain);
    prog.prefetch.clear();  // ranges come in the reduction's order; large results still stream
    for (auto it = prog.ops.begin(); it != prog.ops.end(); ++it)
      if (it->kind == Op::store && it->ext == sink) {
        sink_slot = it->slot;
        sink_dtype = it->dtype;
        if (!stored) prog.ops.erase(it);
        break;
      }
    if (sink_slot < 0) throw InternalError("[fused] the reduced operand is not computed by the group");
    for (size_t k = 0; k < chain.ext_inputs.size(); ++k) {
      const TensorType& t = g.type(chain.ext_inputs[k]);
      if (t.numel() == prog.count) contiguous.push_back({static_cast<int>(k), static_cast<int>(dtype_size(t.dtype))});
    }
    reduce_in.push_back(g.type(operand));
    reduce_out.push_back(g.type(result));
  }
  KernelSpec reduce_spec() const { return KernelSpec{reduce_in, reduce_out, reduce->attrs}; }
};

// The scratch of a fed reduction: the reduction's partials, then the chain's per-thread tiles.
struct FedScratch {
  FusedScratch chain;
  int64_t chain_at = 0, bytes = 0;
  explicit FedScratch(const FedGroup& f) : chain(f.prog) {
    ScratchLayout l;
    l.add(fed_reduce_scratch_bytes(f.reduce->prim, f.reduce_spec()));
    chain_at = l.add(chain.bytes());
    bytes = l.bytes;
  }
};

// What one run of a fed reduction hands its ReduceFeed.
struct FeedRun {
  const FedGroup* fed;
  const FusedScratch* layout;
  const void* const* in;
  void* const* out;  // the chain's results are the group's first ones
  std::byte* scratch;
};

void prefetch_chain(const void* run, int64_t off, int64_t n) {
  const FeedRun& r = *static_cast<const FeedRun*>(run);
  for (const auto& [index, bytes] : r.fed->contiguous) {
    const char* at = static_cast<const char*>(r.in[index]) + off * bytes;
    for (int64_t b = 0; b < n * bytes; b += 64) _mm_prefetch(at + b, _MM_HINT_T0);
  }
}

void fill_from_chain(const void* run, int tid, int64_t off, int64_t n, float* dst) {
  const FeedRun& r = *static_cast<const FeedRun*>(run);
  const Program& p = r.fed->prog;
  std::byte* mine = r.scratch + tid * r.layout->per_thread;
  float* base = reinterpret_cast<float*>(mine);
  float** ptr = reinterpret_cast<float**>(mine + r.layout->table_at);
  for (size_t s = 0; s < p.places.size(); ++s)
    if (p.places[s].kind == SlotPlace::scratch) ptr[s] = base + p.places[s].index * p.tile;
  for (int64_t done = 0; done < n; done += p.tile) {
    const int64_t len = std::min(p.tile, n - done);
    run_ops(p, r.in, r.out, base, ptr, off + done, len, [] {});
    std::memcpy(dst + done, ptr[r.fed->sink_slot], static_cast<size_t>(len) * sizeof(float));
    if (r.fed->sink_dtype != DType::f32) quantize(dst + done, len, r.fed->sink_dtype);
  }
}

Kernel make_fed_kernel(const Graph& g, const FusedGroup& group) {
  auto fed = std::make_shared<const FedGroup>(g, group);
  const FedScratch layout(*fed);
  Kernel reduce =
      make_fed_reduce_kernel(fed->reduce->prim, fed->reduce_spec(), layout.chain.threads, fed->prog.stream);
  const size_t results = group.ext_outputs.size();
  return [fed, layout, reduce, results](const void* const* in, void* const* out) {
    std::byte* scratch = scratch_of<std::byte>(out, results);
    const FeedRun run{fed.get(), &layout.chain, in, out, scratch + layout.chain_at};
    const ReduceFeed feed{&run, fill_from_chain, prefetch_chain};
    const void* reduce_in[1] = {&feed};
    void* reduce_out[2] = {out[results - 1], scratch};
    reduce(reduce_in, reduce_out);
  };
}

}  // namespace

int64_t fused_scratch_bytes(const Graph& g, const FusedGroup& group) {
  if (integer_kernel(g, group)) return 0;  // no i32 kernel asks for scratch
  if (ends_in_reduction(g, group)) return FedScratch(FedGroup(g, group)).bytes;
  return FusedScratch(build_program(g, group)).bytes();
}

Kernel make_fused_kernel(const Graph& g, const FusedGroup& group) {
  if (const KernelFactory* f = integer_kernel(g, group)) {
    const Node& first = g.nodes()[group.nodes[0]];
    std::vector<TensorType> in_t, out_t;
    for (int v : first.inputs) in_t.push_back(g.type(v));
    out_t.push_back(g.type(first.outputs[0]));
    return (*f)(KernelSpec{in_t, out_t, first.attrs});
  }
  if (ends_in_reduction(g, group)) return make_fed_kernel(g, group);
  auto prog = std::make_shared<const Program>(build_program(g, group));
  const FusedScratch layout(*prog);
  const int threads = layout.threads, nslots = static_cast<int>(prog->places.size());
  const size_t results = group.ext_outputs.size();
  return [prog, layout, threads, nslots, results](const void* const* in, void* const* out) {
    const Program& p = *prog;
    std::byte* scratch = scratch_of<std::byte>(out, results);
    const int64_t tile = p.tile, ntiles = (p.count + tile - 1) / tile;
    // Runs tiles [t0, t1) on thread `tid`'s scratch.
    auto run_tiles = [&](int tid, int64_t t0, int64_t t1) {
      std::byte* mine = scratch + tid * layout.per_thread;
      float* base = reinterpret_cast<float*>(mine);
      float** ptr = reinterpret_cast<float**>(mine + layout.table_at);
      for (int s = 0; s < nslots; ++s)
        if (p.places[s].kind == SlotPlace::scratch) ptr[s] = base + p.places[s].index * tile;
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t off = t * tile, len = std::min(tile, p.count - off);
        // Large operands come from memory: the next tile's lines are prefetched a slice after each
        // compute op, so that the memory streams while this tile computes (the hardware prefetchers
        // only run a little ahead of the loads, which all come in the tile's first ops).
        const int64_t next = off + tile, next_len = t + 1 < t1 ? std::min(tile, p.count - next) : 0;
        int slice = 0;
        auto prefetch_slice = [&] {
          if (next_len <= 0 || p.compute_ops == 0) return;
          for (const auto& [index, bytes] : p.prefetch) {
            const char* base = static_cast<const char*>(in[index]) + next * bytes;
            const int64_t lines = (next_len * bytes + 63) / 64;
            const int64_t l0 = lines * slice / p.compute_ops, l1 = lines * (slice + 1) / p.compute_ops;
            for (int64_t l = l0; l < l1; ++l) _mm_prefetch(base + l * 64, _MM_HINT_T0);
          }
          ++slice;
        };
        run_ops(p, in, out, base, ptr, off, len, prefetch_slice);
      }
      if (p.stream) _mm_sfence();  // streaming stores are visible to other threads after this
    };
    // A serial OpenMP region still costs libgomp a team allocation, so serial runs skip OpenMP;
    // parallel ones always ask for the same team size, which libgomp caches.
    if (threads <= 1) {
      run_tiles(0, 0, ntiles);
      return;
    }
#pragma omp parallel num_threads(threads)
    {
      const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
      run_tiles(tid, ntiles * tid / nt, ntiles * (tid + 1) / nt);
    }
  };
}

}  // namespace px::cpu
