// Counted allocation per placement: every Array and executable arena goes through here, so a
// device's high-water mark can be read back and compared with the buffer plan.
#include "parallax/memory.h"


#include <array>
#include <atomic>
#include <cstring>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/enum_names.h"
#include "core/env.h"
#include "parallax/core.h"

namespace px {

namespace {

struct Counter {
  std::atomic<int64_t> in_use{0}, peak{0}, count{0}, capacity{0};
};

// Counters for devices 0..kMaxDevices-1 and both kinds of one platform (larger ids share the last
// slot), and where its memory comes from.
constexpr int kMaxDevices = 4096;
struct Platform {
  std::array<std::unique_ptr<Counter[]>, 2> counters = {std::make_unique<Counter[]>(kMaxDevices),
                                                        std::make_unique<Counter[]>(kMaxDevices)};
  Counter all;                                         // all devices and kinds (no capacity)
  std::atomic<const PlatformMemory*> memory{nullptr};  // null: host memory; set once, never freed
};

std::mutex platforms_mutex;
Platform& platform_of(const std::string& name) {
  static Platform cpu;  // the common case, without the lock
  if (name == "cpu") return cpu;
  // Never destroyed: arrays freed during static destruction still find their platform.
  static auto* others = new std::map<std::string, std::unique_ptr<Platform>>();
  std::lock_guard<std::mutex> l(platforms_mutex);
  auto& p = (*others)[name];
  if (!p) p = std::make_unique<Platform>();
  return *p;
}

Counter& counter(Platform& pl, const Placement& p) {
  int d = p.device < 0 ? 0 : (p.device >= kMaxDevices ? kMaxDevices - 1 : p.device);
  return pl.counters[static_cast<int>(p.kind)][d];
}
Counter& counter(const Placement& p) { return counter(platform_of(p.platform), p); }

// What an allocation of `bytes` takes: at least 64 bytes, a multiple of 64 (the alignment).
int64_t rounded_bytes(int64_t bytes) { return (std::max<int64_t>(bytes, 1) + 63) / 64 * 64; }

}  // namespace

const char* memory_kind_name(MemoryKind k) { return k == MemoryKind::device ? "device" : "pinned_host"; }

const char* memory_category_name(MemoryCategory c) {
  static constexpr const char* names[] = {"params",      "gradients",   "optimizer_state",
                                          "activations", "temporaries", "collective_buffers", "kernel_scratch"};
  static_assert(std::size(names) == kNumMemoryCategories);
  return enum_name(c, names);
}

MemoryKind parse_memory_kind(const std::string& name) {
  if (name == "device") return MemoryKind::device;
  if (name == "pinned_host") return MemoryKind::pinned_host;
  throw UserError("[memory] unknown memory kind '" + name + "'; the kinds are device and pinned_host");
}

std::string Placement::to_string() const {
  return platform + ":" + std::to_string(device) + "/" + memory_kind_name(kind);
}

MemoryStats memory_stats(const Placement& p) {
  Counter& c = counter(p);
  return {c.in_use.load(), c.peak.load(), c.count.load()};
}

void reset_peak_memory(const Placement& p) {
  Counter& c = counter(p);
  c.peak.store(c.in_use.load());
}

MemoryStats platform_memory_stats(const std::string& platform) {
  const Counter& c = platform_of(platform).all;
  return {c.in_use.load(), c.peak.load(), c.count.load()};
}

void reset_platform_peak_memory(const std::string& platform) {
  Counter& c = platform_of(platform).all;
  c.peak.store(c.in_use.load());
}

void set_memory_capacity(const Placement& p, int64_t bytes) {
  if (bytes < 0)
    throw UserError("[memory] the capacity of " + p.to_string() + " must be >= 0 bytes (0: unlimited), got " +
                    std::to_string(bytes));
  counter(p).capacity.store(bytes);
}

int64_t memory_capacity(const Placement& p) { return counter(p).capacity.load(); }

void* allocate_bytes(const Placement& p, int64_t bytes) {
  Platform& pl = platform_of(p.platform);
  Counter& c = counter(pl, p);
  const int64_t cap = c.capacity.load();
  if (cap > 0 && c.in_use.load() + bytes > cap)
    throw UserError("[memory] out of memory on " + p.to_string() + ": allocating " + std::to_string(bytes) +
                    " bytes with " + std::to_string(c.in_use.load()) + " in use exceeds its capacity of " +
                    std::to_string(cap) + " bytes; compiled steps plan within the capacity and say what would fit "
                    "(remat, offload, more devices)");
  const int64_t rounded = rounded_bytes(bytes);
  const PlatformMemory* m = pl.memory.load();
  void* ptr = m ? m->allocate(p, rounded) : std::aligned_alloc(64, static_cast<size_t>(rounded));
  if (!ptr) throw Error("[memory] out of memory allocating " + std::to_string(bytes) + " bytes on " + p.to_string());
  for (Counter* k : {&c, &pl.all}) {
    const int64_t now = k->in_use.fetch_add(bytes) + bytes;
    int64_t peak = k->peak.load();
    while (now > peak && !k->peak.compare_exchange_weak(peak, now)) {
    }
    k->count.fetch_add(1);
  }
  return ptr;
}

void free_bytes(const Placement& p, void* ptr, int64_t bytes) {
  if (!ptr) return;
  Platform& pl = platform_of(p.platform);
  counter(pl, p).in_use.fetch_sub(bytes);
  pl.all.in_use.fetch_sub(bytes);
  const PlatformMemory* m = pl.memory.load();
  if (m)
    m->free(p, ptr, rounded_bytes(bytes));
  else
    std::free(ptr);
}

void register_platform_memory(const std::string& platform, PlatformMemory memory) {
  if (!memory.allocate || !memory.free)
    throw Error("[memory] platform '" + platform + "' registered without an allocate and a free");
  if (memory.host_visible && !memory.copy)
    throw Error("[memory] platform '" + platform + "' has memory the host cannot read but no copy to reach it");
  Platform& pl = platform_of(platform);
  std::lock_guard<std::mutex> l(platforms_mutex);
  if (pl.memory.load()) throw Error("[memory] platform '" + platform + "' registers its memory twice");
  if (const int64_t used = pl.all.in_use.load())
    throw Error("[memory] platform '" + platform + "' registers its memory after " + std::to_string(used) +
                " bytes of it were allocated from host memory; register its backend before making arrays on "
                "its devices");
  pl.memory.store(new PlatformMemory(std::move(memory)));  // lives as long as the process
}

bool host_visible(const Placement& p) {
  const PlatformMemory* m = platform_of(p.platform).memory.load();
  return !m || !m->host_visible || m->host_visible(p);
}

void copy_bytes(const Placement& dst_at, void* dst, const Placement& src_at, const void* src, int64_t bytes) {
  if (bytes <= 0 || dst == src) return;
  const bool dst_host = host_visible(dst_at), src_host = host_visible(src_at);
  if (dst_host && src_host) {
    std::memmove(dst, src, static_cast<size_t>(bytes));
    return;
  }
  const PlatformMemory* dm = platform_of(dst_at.platform).memory.load();
  const PlatformMemory* sm = platform_of(src_at.platform).memory.load();
  if (src_host) return dm->copy(dst, src, bytes);
  if (dst_host || dst_at.platform == src_at.platform) return sm->copy(dst, src, bytes);
  // Two platforms that the host cannot read: through a host buffer.
  std::unique_ptr<std::byte[]> staged(new std::byte[static_cast<size_t>(bytes)]);
  sm->copy(staged.get(), src, bytes);
  dm->copy(dst, staged.get(), bytes);
}

// ---- device sets ----

std::string DeviceSet::to_string() const {
  std::string s = platform + ":" + std::to_string(count);
  return processes == 1 ? s : s + " over " + std::to_string(processes) + " processes";
}

// parse_devices and default_devices are defined with the backend registry (src/backend/registry.cc),
// which knows the platforms they may name.

}  // namespace px
