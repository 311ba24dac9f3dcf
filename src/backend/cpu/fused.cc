// The fused-loop engine: runs a chain of elementwise nodes tile by tile, so intermediate
// values stay in L1-sized scratch instead of round-tripping through memory.
#include <omp.h>

#include <algorithm>
#include <memory>
#include <unordered_map>

#include "backend/cpu/kernel.h"
#include "ir/primitive.h"

namespace px::cpu {

namespace {
constexpr int64_t kTile = 1024;

struct Step {
  EltwiseF32 fn;
  std::vector<float> params;
  std::vector<int> in_slots;
  int out_slot;
};

// Where a slot's tile lives: an external f32 buffer read/written in place, or scratch.
struct Slot {
  int ext_in = -1;   // index into operands when loaded from outside
  int ext_out = -1;  // index into results when stored outside
  DType dtype = DType::f32;
};

bool int_like(DType d) { return d == DType::i32 || d == DType::boolean; }

// A single elementwise node whose operands are all integers: exact i32 path, whole array.
Kernel make_int_kernel(const Graph& g, const Node& n, const EltwiseKernel& ek) {
  std::vector<DType> in_t;
  for (int v : n.inputs) in_t.push_back(g.type(v).dtype);
  DType out_t = g.type(n.outputs[0]).dtype;
  int64_t count = g.type(n.outputs[0]).numel();
  std::vector<float> params = ek.params ? ek.params(n.attrs) : std::vector<float>{};
  EltwiseI32 fn = ek.i32;
  int nin = static_cast<int>(in_t.size());
  // Bool operands/results are widened to i32 per tile, in scratch owned by the kernel.
  int threads = num_threads();
  auto scratch = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(threads * (nin + 1) * kTile));
  return [=](const void* const* in, void* const* out) {
    int64_t ntiles = (count + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) if (ntiles > 4)
    for (int64_t t = 0; t < ntiles; ++t) {
      int32_t* s = scratch->data() + static_cast<size_t>(omp_get_thread_num()) * (nin + 1) * kTile;
      int64_t off = t * kTile, len = std::min(kTile, count - off);
      const int32_t* ptrs[8];
      for (int k = 0; k < nin; ++k) {
        if (in_t[k] == DType::i32) {
          ptrs[k] = static_cast<const int32_t*>(in[k]) + off;
        } else {
          const uint8_t* b = static_cast<const uint8_t*>(in[k]) + off;
          int32_t* d = s + k * kTile;
          for (int64_t i = 0; i < len; ++i) d[i] = b[i];
          ptrs[k] = d;
        }
      }
      if (out_t == DType::i32) {
        fn(ptrs, static_cast<int32_t*>(out[0]) + off, len, params.data());
      } else {
        int32_t* r = s + nin * kTile;
        fn(ptrs, r, len, params.data());
        uint8_t* o = static_cast<uint8_t*>(out[0]) + off;
        for (int64_t i = 0; i < len; ++i) o[i] = r[i] != 0;
      }
    }
  };
}
}  // namespace

Kernel make_fused_kernel(const Graph& g, const FusedGroup& group) {
  if (group.nodes.empty()) throw Error("[fused] empty group");
  const Node& first = g.nodes()[group.nodes[0]];
  int64_t count = g.type(first.outputs[0]).numel();

  if (group.nodes.size() == 1) {
    const EltwiseKernel* ek = find_eltwise(first.prim->name);
    bool all_int = int_like(g.type(first.outputs[0]).dtype);
    for (int v : first.inputs) all_int = all_int && int_like(g.type(v).dtype);
    if (ek && ek->i32 && all_int) return make_int_kernel(g, first, *ek);
  }

  std::unordered_map<int, int> slot_of;  // value id -> slot
  std::vector<Slot> slots;
  for (size_t k = 0; k < group.ext_inputs.size(); ++k) {
    int v = group.ext_inputs[k];
    slot_of[v] = static_cast<int>(slots.size());
    slots.push_back({static_cast<int>(k), -1, g.type(v).dtype});
  }
  std::vector<Step> steps;
  for (int ni : group.nodes) {
    const Node& n = g.nodes()[ni];
    const EltwiseKernel* ek = find_eltwise(n.prim->name);
    if (!ek || !ek->f32) throw Error("[fused] no f32 elementwise kernel for '" + n.prim->name + "'");
    if (g.type(n.outputs[0]).numel() != count) throw Error("[fused] group mixes element counts");
    Step s;
    s.fn = ek->f32;
    s.params = ek->params ? ek->params(n.attrs) : std::vector<float>{};
    for (int v : n.inputs) {
      auto it = slot_of.find(v);
      if (it == slot_of.end()) throw Error("[fused] operand of '" + n.prim->name + "' is neither external nor in the group");
      s.in_slots.push_back(it->second);
    }
    s.out_slot = static_cast<int>(slots.size());
    slot_of[n.outputs[0]] = s.out_slot;
    slots.push_back({-1, -1, g.type(n.outputs[0]).dtype});
    steps.push_back(std::move(s));
  }
  for (size_t k = 0; k < group.ext_outputs.size(); ++k) {
    int slot = slot_of.at(group.ext_outputs[k]);
    if (slots[slot].ext_out != -1 || slots[slot].ext_in != -1) throw Error("[fused] value stored twice");
    slots[slot].ext_out = static_cast<int>(k);
  }

  int nslots = static_cast<int>(slots.size());
  int threads = num_threads();
  auto scratch = std::make_shared<std::vector<float>>(static_cast<size_t>(threads) * nslots * kTile);
  return [=](const void* const* in, void* const* out) {
    int64_t ntiles = (count + kTile - 1) / kTile;
#pragma omp parallel if (ntiles > 2)
    {
      float* base = scratch->data() + static_cast<size_t>(omp_get_thread_num()) * nslots * kTile;
      std::vector<float*> ptr_storage;  // small; avoided below via fixed array when possible
      float* ptr[64];
      float** p = nslots <= 64 ? ptr : (ptr_storage.resize(nslots), ptr_storage.data());
      const float* args[8];
#pragma omp for schedule(static)
      for (int64_t t = 0; t < ntiles; ++t) {
        int64_t off = t * kTile, len = std::min(kTile, count - off);
        for (int s = 0; s < nslots; ++s) {
          const Slot& sl = slots[s];
          if (sl.ext_in >= 0) {
            if (sl.dtype == DType::f32) {
              p[s] = const_cast<float*>(static_cast<const float*>(in[sl.ext_in])) + off;
            } else {
              p[s] = base + s * kTile;
              load_f32(in[sl.ext_in], sl.dtype, off, p[s], len);
            }
          } else if (sl.ext_out >= 0 && sl.dtype == DType::f32) {
            p[s] = static_cast<float*>(out[sl.ext_out]) + off;
          } else {
            p[s] = base + s * kTile;
          }
        }
        for (const Step& st : steps) {
          for (size_t k = 0; k < st.in_slots.size(); ++k) args[k] = p[st.in_slots[k]];
          st.fn(args, p[st.out_slot], len, st.params.data());
        }
        for (int s = 0; s < nslots; ++s) {
          const Slot& sl = slots[s];
          if (sl.ext_out >= 0 && sl.dtype != DType::f32) store_f32(p[s], out[sl.ext_out], sl.dtype, off, len);
        }
      }
    }
  };
}

}  // namespace px::cpu
