// The reference backend: counted host memory, kernels from its own table (by primitive), copies
// done at once. It never fuses (each node is its own unit) and runs on the calling thread.
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>

#include "backend/kernel_table.h"
#include "backend/ref/ref.h"
#include "ir/primitive.h"

namespace px::ref {

namespace {

KernelTable<Factory>& table() {
  static KernelTable<Factory> t("ref");
  return t;
}

void register_all() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_elementwise_kernels();
    register_shape_kernels();
    register_reduce_kernels();
    register_index_kernels();
    register_matmul_kernels();
    register_nn_kernels();
    register_optim_kernels();
    register_rng_kernels();
  });
}

class RefBackend final : public Backend {
 public:
  std::string name() const override { return "ref"; }
  bool can_fuse(const Graph&, const Node&) const override { return false; }
  bool has_kernel(const Primitive* primitive) const override { return find_kernel(primitive) != nullptr; }
  // Discrete mode: device memory is mapped apart and opened only around the backend's own work.
  void* allocate(const Placement& p, int64_t bytes) override {
    return discrete() && p.kind == MemoryKind::device ? discrete_allocate(bytes) : Backend::allocate(p, bytes);
  }
  void free(const Placement& p, void* ptr, int64_t bytes) override {
    if (discrete() && p.kind == MemoryKind::device)
      discrete_free(ptr);
    else
      Backend::free(p, ptr, bytes);
  }
  bool host_visible(const Placement& p) const override { return !discrete() || p.kind != MemoryKind::device; }

  Kernel make_kernel(const Graph& g, const Unit& unit, const Placement&) override {
    if (unit.kind != Unit::Kind::kernel)
      throw InternalError("[ref] asked for a fused unit, but the ref backend never fuses");
    const Node& n = g.nodes()[unit.nodes.at(0)];
    const Factory* f = find_kernel(n.prim);
    if (!f) throw Error("[compile] no ref kernel for primitive '" + n.prim->name + "'");
    std::vector<TensorType> in_t, out_t;
    for (int v : n.inputs) in_t.push_back(g.type(v));
    for (int v : n.outputs) out_t.push_back(g.type(v));
    Kernel k = (*f)(Spec{in_t, out_t, n.attrs});
    if (!discrete()) return k;
    return [k = std::move(k), n_in = in_t.size(), n_out = out_t.size()](const void* const* in, void* const* out) {
      DeviceAccess open(in, n_in, const_cast<const void* const*>(out), n_out);
      k(in, out);
    };
  }
  Event copy(std::vector<CopyJob> jobs) override {
    for (const CopyJob& j : jobs) {
      if (j.bytes <= 0 || j.dst == j.src) continue;
      std::optional<DeviceAccess> open;
      if (discrete()) open.emplace(std::initializer_list<const void*>{j.dst, j.src});
      std::memmove(j.dst, j.src, static_cast<size_t>(j.bytes));
    }
    return Event();
  }
  void copy_boxes(const std::vector<BoxCopy>& jobs) override {
    if (!discrete()) return Backend::copy_boxes(jobs);
    for (const BoxCopy& j : jobs) {
      DeviceAccess open{j.dst, j.src};
      Backend::copy_boxes({j});
    }
  }
  int num_threads() const override { return 1; }
  FusionLimits fusion() const override {
    FusionLimits l;
    l.enabled = false;
    return l;
  }
};

}  // namespace

void register_kernel(const Primitive* primitive, Factory f) { table().add(primitive, std::move(f)); }

void register_late_kernel(const Primitive* (*handle)(), Factory f) { table().add_late(handle, std::move(f)); }

void register_kernels(std::initializer_list<std::pair<const Primitive*, Factory>> kernels) {
  for (const auto& [primitive, f] : kernels) register_kernel(primitive, f);
}

void register_kernel_pair(const Primitive* off, const Primitive* on, Kernel (*f)(const Spec&, bool)) {
  register_kernel(off, [f](const Spec& s) { return f(s, false); });
  register_kernel(on, [f](const Spec& s) { return f(s, true); });
}

const Factory* find_kernel(const Primitive* primitive) {
  register_all();
  return table().find(primitive);
}

double load(const void* p, DType t, int64_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::bf16: {
      uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    case DType::f16:
      return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::i32:
      return static_cast<const int32_t*>(p)[i];
    case DType::boolean:
      return static_cast<const uint8_t*>(p)[i] ? 1.0 : 0.0;
  }
  return 0;
}

void store(void* p, DType t, int64_t i, double v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      return;
    case DType::bf16: {
      // Round the f32 value to nearest even in its top 16 bits; a NaN stays a (quiet) NaN.
      const float f = static_cast<float>(v);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      uint16_t r;
      if (std::isnan(f))
        r = static_cast<uint16_t>((u >> 16) | 0x40u);
      else
        r = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
      static_cast<uint16_t*>(p)[i] = r;
      return;
    }
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
      return;
    case DType::i32:  // truncated toward zero, saturated at the i32 range; NaN gives 0
      static_cast<int32_t*>(p)[i] = std::isnan(v)        ? 0
                                    : v <= -2147483648.0 ? std::numeric_limits<int32_t>::min()
                                    : v >= 2147483647.0  ? std::numeric_limits<int32_t>::max()
                                                         : static_cast<int32_t>(v);
      return;
    case DType::boolean:
      static_cast<uint8_t*>(p)[i] = v != 0.0;
      return;
  }
}

std::vector<int64_t> strides_of(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * shape[d + 1];
  return s;
}

Backend& backend() {
  static RefBackend b;
  return b;
}

}  // namespace px::ref
