// Counted allocation per placement: every Array and executable arena goes through here, so a
// device's high-water mark can be read back and compared with the buffer plan.
#include "parallax/memory.h"


#include <array>
#include <atomic>
#include <cstdlib>
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

// Counters for devices 0..kMaxDevices-1 and both kinds; larger ids share the last slot.
constexpr int kMaxDevices = 4096;
Counter& counter(const Placement& p) {
  static std::array<std::unique_ptr<Counter[]>, 2> table = {std::make_unique<Counter[]>(kMaxDevices),
                                                            std::make_unique<Counter[]>(kMaxDevices)};
  int d = p.device < 0 ? 0 : (p.device >= kMaxDevices ? kMaxDevices - 1 : p.device);
  return table[static_cast<int>(p.kind)][d];
}

}  // namespace

const char* memory_kind_name(MemoryKind k) { return k == MemoryKind::device ? "device" : "pinned_host"; }

const char* memory_category_name(MemoryCategory c) {
  static constexpr const char* names[] = {"params",      "gradients",   "optimizer_state",
                                          "activations", "temporaries", "collective_buffers"};
  static_assert(std::size(names) == kNumMemoryCategories);
  return enum_name(c, names);
}

MemoryKind parse_memory_kind(const std::string& name) {
  if (name == "device") return MemoryKind::device;
  if (name == "pinned_host") return MemoryKind::pinned_host;
  throw UserError("[memory] unknown memory kind '" + name + "'; the kinds are device and pinned_host");
}

std::string Placement::to_string() const { return "cpu:" + std::to_string(device) + "/" + memory_kind_name(kind); }

MemoryStats memory_stats(const Placement& p) {
  Counter& c = counter(p);
  return {c.in_use.load(), c.peak.load(), c.count.load()};
}

void reset_peak_memory(const Placement& p) {
  Counter& c = counter(p);
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
  Counter& c = counter(p);
  const int64_t cap = c.capacity.load();
  if (cap > 0 && c.in_use.load() + bytes > cap)
    throw UserError("[memory] out of memory on " + p.to_string() + ": allocating " + std::to_string(bytes) +
                    " bytes with " + std::to_string(c.in_use.load()) + " in use exceeds its capacity of " +
                    std::to_string(cap) + " bytes; compiled steps plan within the capacity and say what would fit "
                    "(remat, offload, more devices)");
  size_t rounded = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  void* ptr = std::aligned_alloc(64, rounded);
  if (!ptr)
    throw Error("[memory] out of memory allocating " + std::to_string(bytes) + " bytes on " + p.to_string());
  int64_t now = c.in_use.fetch_add(bytes) + bytes;
  int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
  c.count.fetch_add(1);
  return ptr;
}

void free_bytes(const Placement& p, void* ptr, int64_t bytes) {
  if (!ptr) return;
  counter(p).in_use.fetch_sub(bytes);
  std::free(ptr);
}

// ---- device sets ----

std::string DeviceSet::to_string() const {
  std::string s = platform + ":" + std::to_string(count);
  return processes == 1 ? s : s + " over " + std::to_string(processes) + " processes";
}

DeviceSet parse_devices(const std::string& text) {
  auto [platform, count] = parse_device_text(text, "[devices] ");
  return DeviceSet{platform, count};
}

DeviceSet default_devices() {
  if (!env().devices_error.empty()) throw UserError(env().devices_error);
  return DeviceSet{env().device_platform, env().device_count};
}

}  // namespace px
