// Mixed-precision pass: f32 matmuls take 16-bit operands and keep f32 results.
#include <algorithm>
#include <functional>
#include <optional>

#include "ir/primitive.h"
#include "ir/replay.h"
#include "ops/prims.h"
#include "parallax/ops.h"
#include "parallax/passes.h"
#include "runtime/schedule.h"

namespace px {

namespace {

void identity_map(const Graph& g, std::vector<int>* value_map) {
  if (!value_map) return;
  value_map->resize(g.values().size());
  for (size_t v = 0; v < g.values().size(); ++v) (*value_map)[v] = static_cast<int>(v);
}

bool sixteen_bit(DType d) { return d == DType::bf16 || d == DType::f16; }

// A cast from bf16 or f16 to f32 (exact).
bool widening_cast(const Graph& g, const Node& n) {
  return n.prim == prims::cast() && sixteen_bit(g.type(n.inputs[0]).dtype) && g.type(n.outputs[0]).dtype == DType::f32;
}

// n emitted into the graph being traced with operands `ins` (and attributes `attrs`, by default
// its own), keeping its name.
std::vector<Tensor> emit_named(const Node& n, const std::vector<Tensor>& ins, const Attrs& attrs) {
  std::vector<Tensor> res = current_graph()->emit(*n.prim, ins, attrs);
  if (!n.name.empty()) current_graph()->mutable_nodes().back().name = n.name;
  return res;
}
std::vector<Tensor> emit_named(const Node& n, const std::vector<Tensor>& ins) { return emit_named(n, ins, n.attrs); }

// Whether n's primitive takes an `out_dtype` attribute (the type of its first result).
bool takes_out_dtype(const Node& n) {
  for (const AttrSpec& a : n.prim->attrs)
    if (a.name == "out_dtype" && a.kind == AttrKind::dtype) return true;
  return false;
}

// n's attributes, with `out_dtype` set to the type its first result has in g where its primitive
// takes one: they keep that type whatever type its operands are read in.
Attrs with_out_dtype(const Graph& g, const Node& n) {
  Attrs a = n.attrs;
  if (takes_out_dtype(n)) a.set("out_dtype", g.type(n.outputs[0]).dtype);
  return a;
}


struct LayoutNarrowing {
  const Graph& g;
  const size_t nv;
  std::vector<int> readers;
  bool any = false;
  // The plan, made before rebuilding (nothing in it: no new graph). wide[v]: the 16-bit type v was
  // widened from, by a widening cast and the single-reader layout ops after it (which move to the
  // 16-bit side); f32 if none.
  std::vector<DType> wide;
  std::vector<std::vector<char>> narrow_reads;
  std::vector<DType> early;
  std::vector<Tensor> now;        // the new graph's tensor of each value read so far
  std::vector<Tensor> narrow_of;  // v == cast(narrow_of[v], f32), in the new graph
  std::vector<Tensor> cast_of;    // the early casts: cast(v, early[v])

  explicit LayoutNarrowing(const Graph& graph)
      : g(graph), nv(graph.values().size()), readers(nv, 0), wide(nv, DType::f32), narrow_reads(graph.nodes().size()),
        early(nv, DType::f32), now(nv), narrow_of(nv), cast_of(nv) {
    for (const Node& n : g.nodes())
      for (int v : n.inputs) ++readers[v];
    for (int v : g.outputs()) ++readers[v];
  }

  static bool layout(const Node& n) { return n.prim == prims::reshape() || n.prim == prims::transpose(); }
  bool widening(const Node& n) const { return widening_cast(g, n); }
  bool narrowing(const Node& n) const {
    return n.prim == prims::cast() && g.type(n.inputs[0]).dtype == DType::f32 && sixteen_bit(g.type(n.outputs[0]).dtype);
  }
  int producer(int v) const { return g.values()[v].producer; }

  // The operands that node i, whose kernel widens them itself, can read narrow: where the narrow
  // value leaves its results' types as they are (a loss gradient's type follows its logits unless
  // it has an out_dtype), or where an `out_dtype` attribute keeps them (reduce_sum's: a bias
  // gradient summed from the 16-bit gradient, its f32 copy never written).
  bool reads_narrow(const Node& n, size_t k) const {
    if (!(n.prim->widens_operands >> k & 1u) || wide[n.inputs[k]] == DType::f32) return false;
    std::vector<TensorType> types;
    for (int v : n.inputs) types.push_back(g.type(v));
    types[k].dtype = wide[n.inputs[k]];
    std::vector<TensorType> out = n.prim->infer(types, with_out_dtype(g, n));
    for (size_t o = 0; o < n.outputs.size(); ++o)
      if (out[o] != g.type(n.outputs[o])) return false;
    return true;
  }

  void plan_wide() {
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (widening(n)) {
        wide[n.outputs[0]] = g.type(n.inputs[0]).dtype;
      } else if (layout(n) && wide[n.inputs[0]] != DType::f32 && readers[n.inputs[0]] == 1) {
        wide[n.outputs[0]] = wide[n.inputs[0]];
        any = true;
      }
      if (!n.prim->widens_operands) continue;
      narrow_reads[i].assign(n.inputs.size(), 0);
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        narrow_reads[i][k] = reads_narrow(n, k);
        any = any || narrow_reads[i][k];
      }
    }
  }

  // A narrowing cast of v to `to` casts the value below v's single-reader layout ops (-1: the chain
  // starts from a value widened from `to`, nothing to cast). That cast is made right after the
  // value's producer, so that it joins the producer's elementwise group: at the narrowing cast's
  // place, the layout ops of other values in between would have closed the group.
  int cast_base(int v, DType to) const {
    for (;;) {
      if (wide[v] == to) return -1;
      int p = producer(v);
      if (p < 0 || !layout(g.nodes()[p]) || readers[v] != 1) return v;
      v = g.nodes()[p].inputs[0];
    }
  }

  // A narrowing cast with no layout op to move is placed after its value's producer too, where that
  // is near (a reader in between, such as a bias gradient's reduce_sum, closes the group) or the
  // cast is the value's only reader (the f32 value then dies there): a far cast of a value that
  // lives on would hold both copies.
  void plan_early() {
    constexpr size_t kNear = 32;
    for (size_t i = 0; i < g.nodes().size(); ++i) {
      const Node& n = g.nodes()[i];
      if (!narrowing(n)) continue;
      const int v = n.inputs[0];
      const int b = cast_base(v, g.type(n.outputs[0]).dtype);
      any = any || b != v;  // layout ops to move, or a widened value to take back
      // Not after a transfer or collective: the cast would wait there for what runs in the background.
      if (b < 0 || producer(b) < 0 || early[b] != DType::f32 || is_async_primitive(*g.nodes()[producer(b)].prim))
        continue;
      if (b != v || readers[v] == 1 || i - static_cast<size_t>(producer(v)) <= kNear) {
        early[b] = g.type(n.outputs[0]).dtype;
        any = true;
      }
    }
  }

  Tensor emit_like(const Node& n, const Tensor& x) {
    Tensor r = current_graph()->emit(*n.prim, {x}, n.attrs)[0];
    current_graph()->mutable_value(r.id()).copy_facts(g.values()[n.outputs[0]]);
    return r;
  }

  // v cast to `to`, with the single-reader layout ops that made v applied after the cast; an
  // undefined tensor at the top when there is nothing to move.
  Tensor narrowed(int v, DType to, bool top) {
    if (narrow_of[v].defined() && narrow_of[v].dtype() == to) return narrow_of[v];
    int p = producer(v);
    if (p >= 0 && layout(g.nodes()[p]) && readers[v] == 1)
      return emit_like(g.nodes()[p], narrowed(g.nodes()[p].inputs[0], to, false));
    if (cast_of[v].defined() && cast_of[v].dtype() == to) return cast_of[v];
    return top ? Tensor() : cast(now[v], to);
  }

  std::unique_ptr<Graph> rebuild() {
    return replay(g, nullptr, [&](size_t i, const std::vector<Tensor>& ins) -> std::optional<std::vector<Tensor>> {
      const Node& n = g.nodes()[i];
      for (size_t k = 0; k < ins.size(); ++k) now[n.inputs[k]] = ins[k];
      std::optional<std::vector<Tensor>> res;
      if (widening(n)) {
        narrow_of[n.outputs[0]] = ins[0];
      } else if (layout(n) && narrow_of[n.inputs[0]].defined() && readers[n.inputs[0]] == 1) {
        Tensor moved = emit_like(n, narrow_of[n.inputs[0]]);
        narrow_of[n.outputs[0]] = moved;
        res = std::vector<Tensor>{cast(moved, DType::f32)};
      } else if (narrowing(n)) {
        Tensor t = narrowed(n.inputs[0], g.type(n.outputs[0]).dtype, true);
        if (t.defined()) res = std::vector<Tensor>{t};
      } else if (!narrow_reads[i].empty()) {
        // An operand the kernel widens itself is read narrow (the widening cast dies if nothing
        // else reads it).
        std::vector<Tensor> read = ins;
        bool changed = false;
        for (size_t k = 0; k < ins.size(); ++k)
          if (narrow_reads[i][k] && narrow_of[n.inputs[k]].defined()) {
            read[k] = narrow_of[n.inputs[k]];
            changed = true;
          }
        if (changed) res = emit_named(n, read, with_out_dtype(g, n));
      }
      bool casts_early = false;
      for (int o : n.outputs) casts_early = casts_early || early[o] != DType::f32;
      if (!casts_early) return res;
      if (!res) res = emit_named(n, ins);
      for (size_t k = 0; k < n.outputs.size(); ++k) {
        const int o = n.outputs[k];
        if (early[o] == DType::f32) continue;
        cast_of[o] = cast((*res)[k], early[o]);
        current_graph()->mutable_value(cast_of[o].id()).copy_facts(g.values()[o]);
      }
      return res;
    });
  }
};

}  // namespace

std::unique_ptr<Graph> autocast(const Graph& g, DType compute, std::vector<int>* value_map) {
  if (compute != DType::f32 && compute != DType::bf16 && compute != DType::f16)
    throw Error(std::string("[autocast] compute dtype must be f32, bf16 or f16, got ") + dtype_name(compute));
  if (compute == DType::f32) {
    identity_map(g, value_map);
    return g.clone();
  }
  return replay(g, value_map, [&](size_t i, const std::vector<Tensor>& ins) -> std::optional<std::vector<Tensor>> {
    const Node& n = g.nodes()[i];
    const bool all_f32 = n.prim == prims::dot_general() && ins.size() == 2 && n.outputs.size() == 1 &&
                         ins[0].dtype() == DType::f32 && ins[1].dtype() == DType::f32 &&
                         g.type(n.outputs[0]).dtype == DType::f32;
    if (!all_f32) return std::nullopt;
    DotDims d{n.attrs.ints("lhs_contract"), n.attrs.ints("rhs_contract"), n.attrs.ints("lhs_batch"),
              n.attrs.ints("rhs_batch")};
    Tensor r = dot_general(cast(ins[0], compute), cast(ins[1], compute), d, DType::f32);
    if (!n.name.empty()) current_graph()->mutable_nodes().back().name = n.name;
    return std::vector<Tensor>{r};
  });
}

// A value whose every reader casts it to the same narrower float type is made narrow: an all-gather
// gathers the cast operand instead (under bf16 compute, FSDP moves and holds bf16 weights, not
// f32), the cross-entropy gradient and a norm's result are written in that type (the rounding the
// cast did, in the kernel's store).
std::unique_ptr<Graph> narrow_producers(const Graph& g) {
  std::vector<std::vector<int>> users(g.values().size());
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (int v : g.nodes()[i].inputs) users[v].push_back(static_cast<int>(i));
  std::vector<char> is_output(g.values().size(), 0);
  for (int v : g.outputs()) is_output[v] = 1;
  // The narrow type each gather can move, or each primitive that takes an `out_dtype` attribute can
  // write as its first result (the loss gradient, layer_norm, rms_norm), or f32 when it cannot.
  auto gathers = [](const Node& n) { return n.prim->spmd.collective == CollectiveKind::all_gather; };
  std::vector<DType> narrow(g.nodes().size(), DType::f32);
  bool any = false;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    if (!((gathers(n) && n.outputs.size() == 1) || takes_out_dtype(n)) || g.type(n.outputs[0]).dtype != DType::f32 ||
        is_output[n.outputs[0]] || users[n.outputs[0]].empty())
      continue;
    DType to = DType::f32;
    bool ok = true;
    for (int u : users[n.outputs[0]]) {
      const Node& c = g.nodes()[u];
      DType d = c.prim == prims::cast() ? g.type(c.outputs[0]).dtype : DType::f32;
      ok = ok && (d == DType::bf16 || d == DType::f16) && (to == DType::f32 || to == d);
      to = d;
    }
    if (ok) {
      narrow[i] = to;
      any = true;
    }
  }
  if (!any) return nullptr;
  std::vector<char> made_narrow(g.values().size(), 0);  // a result already in the narrow type
  return replay(g, nullptr, [&](size_t i, const std::vector<Tensor>& ins) -> std::optional<std::vector<Tensor>> {
    const Node& n = g.nodes()[i];
    if (narrow[i] != DType::f32) {
      made_narrow[n.outputs[0]] = 1;
      if (gathers(n)) return current_graph()->emit(*n.prim, {cast(ins[0], narrow[i])}, n.attrs);
      Attrs a = n.attrs;
      a.set("out_dtype", narrow[i]);
      return current_graph()->emit(*n.prim, ins, std::move(a));
    }
    if (n.prim == prims::cast() && made_narrow[n.inputs[0]]) return std::vector<Tensor>{ins[0]};  // already narrow
    return std::nullopt;
  });
}

// Casts between float types commute with reshape and transpose (these move elements, a cast maps
// each one), so the layout ops between a 16-bit value and its f32 readers run on the narrow side:
// a layout op of a widened value (whose only reader it is) moves the 16-bit value and widens its
// result; a narrowing cast of a layout op's result (its only reader) casts before the layout op,
// right after the value's producer, where the cast joins the producer's elementwise group; and a
// narrowing cast of a value widened from that type is the value. Other narrowing casts move next
// to their producer too where that is near. An operand that its primitive widens itself
// (Primitive::widens_operands: adamw_update's gradient, the loss's logits) is read in its 16-bit
// type. Every result keeps its bits; the layout ops move half the bytes.
std::unique_ptr<Graph> narrow_layouts(const Graph& g) {
  LayoutNarrowing s(g);
  s.plan_wide();
  s.plan_early();
  return s.rebuild();
}

// A widening cast that a reader far after it reads again (an activation's gradient in the backward
// pass reading what the forward pass widened) is made again right before each such elementwise
// reader, where it joins the reader's fused group: what lives from one to the other is the 16-bit
// value, half the bytes of its f32 copy, which is not written at all where no near reader needs
// it stored. Widening is exact: every result keeps its bits. Null when no reader is far.
std::unique_ptr<Graph> widen_near_readers(const Graph& g) {
  constexpr size_t kNear = 32;  // nodes: farther readers widen for themselves
  const std::vector<Node>& nodes = g.nodes();
  std::vector<int> cast_at(g.values().size(), -1);  // per value: the node of the widening cast that made it
  std::vector<std::vector<char>> own(nodes.size());  // own[j][k]: node j widens its operand k itself
  bool any = false;
  for (size_t j = 0; j < nodes.size(); ++j) {
    const Node& n = nodes[j];
    if (widening_cast(g, n)) cast_at[n.outputs[0]] = static_cast<int>(j);
    if (!n.prim->elementwise) continue;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const int c = cast_at[n.inputs[k]];
      if (c < 0 || j - static_cast<size_t>(c) <= kNear) continue;
      own[j].resize(n.inputs.size(), 0);
      own[j][k] = 1;
      any = true;
    }
  }
  if (!any) return nullptr;
  std::vector<Tensor> narrow_of(g.values().size());
  return replay(g, nullptr, [&](size_t j, const std::vector<Tensor>& ins) -> std::optional<std::vector<Tensor>> {
    const Node& n = nodes[j];
    if (widening_cast(g, n)) narrow_of[n.outputs[0]] = ins[0];
    if (own[j].empty()) return std::nullopt;
    std::vector<Tensor> read = ins;
    for (size_t k = 0; k < ins.size(); ++k) {
      if (!own[j][k]) continue;
      const size_t first = std::find(n.inputs.begin(), n.inputs.end(), n.inputs[k]) - n.inputs.begin();
      if (first < k) {  // mul(x, x): one cast
        read[k] = read[first];
        continue;
      }
      read[k] = cast(narrow_of[n.inputs[k]], DType::f32);
      current_graph()->mutable_value(read[k].id()).copy_facts(g.values()[n.outputs[0]]);
    }
    return emit_named(n, read);
  });
}

}  // namespace px
