// Where data lives and how much of it: memory kinds, per-device accounting.
//
//   px::Array a(px::DType::f32, {1024}, {.device = 3});            // on virtual device 3
//   px::MemoryStats s = px::memory_stats({.device = 3});
//   std::cout << s.bytes_in_use << " in use, high-water mark " << s.peak_bytes_in_use << "\n";
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace px {

// `device`: accelerator (or, on the CPU backend, the device's own pool of host memory);
// `pinned_host`: host memory that devices copy to and from (offloaded weights and state).
enum class MemoryKind : uint8_t { device, pinned_host };
const char* memory_kind_name(MemoryKind k);
MemoryKind parse_memory_kind(const std::string& name);  // "device" or "pinned_host"; throws naming both

// What a buffer holds, for the memory report: every byte a device uses for a step is one of these.
// `kernel_scratch` is the working memory kernels ask for while they run (Backend::scratch_bytes).
enum class MemoryCategory : uint8_t {
  params,
  gradients,
  optimizer_state,
  activations,
  temporaries,
  collective_buffers,
  kernel_scratch
};
constexpr int kNumMemoryCategories = 7;
const char* memory_category_name(MemoryCategory c);

// A device (global id, as in Mesh::device_ids) of a platform (a backend's name: "cpu", "ref"),
// and a memory kind on it.
struct Placement {
  int device = 0;
  MemoryKind kind = MemoryKind::device;
  std::string platform = "cpu";
  bool operator==(const Placement& o) const = default;
  std::string to_string() const;  // "cpu:3/device"
};

// The devices a mesh is made on (parallax/sharding.h): "cpu:8" is 8 virtual CPU devices in this
// process. `processes` > 1 spreads them over that many processes, in equal consecutive blocks
// (DeviceSet{"cpu", 8, 2}: "cpu:8 over 2 processes"); Mesh::create then makes a mesh whose
// positions know their process (tests run such a world as threads, see make_threaded_world).
struct DeviceSet {
  std::string platform = "cpu";
  int64_t count = 1;
  int64_t processes = 1;
  std::string to_string() const;  // "cpu:8", or "cpu:8 over 2 processes"
  bool operator==(const DeviceSet& o) const = default;
};
// Parses "cpu" (= cpu:1) or "cpu:N" (N >= 1), likewise any registered backend's platform
// ("ref:2"); a malformed text throws px::Error naming the accepted forms, a platform without a
// backend ("tpu:2", "cuda:2") px::UserError naming the registered ones.
DeviceSet parse_devices(const std::string& text);
// The devices named by PX_DEVICES (cpu:1 when unset), checked as parse_devices checks.
DeviceSet default_devices();

struct MemoryStats {
  int64_t bytes_in_use = 0;
  int64_t peak_bytes_in_use = 0;  // high-water mark since the start or the last reset_peak_memory
  int64_t allocations = 0;        // number of allocations so far
};

// Counters of every allocation made through px (Arrays, executable arenas) per placement
// (platform, device and memory kind).
MemoryStats memory_stats(const Placement& p);
void reset_peak_memory(const Placement& p);  // the high-water mark becomes the bytes in use
// The same over every device and memory kind of a platform in this process (on the `cpu` platform:
// the host memory px holds).
MemoryStats platform_memory_stats(const std::string& platform);
void reset_platform_peak_memory(const std::string& platform);

// The capacity of a placement (bytes; 0, the default: unlimited). On the CPU backend device memory
// is a pool of host memory: with a capacity it behaves like a device of that size. Allocations
// past it throw px::UserError; compiled programs take it as their memory limit
// (CompileOptions::memory_limit_bytes, host_memory_limit_bytes) and fail at compile time with a report.
void set_memory_capacity(const Placement& p, int64_t bytes);
int64_t memory_capacity(const Placement& p);

// Allocates `bytes` (64-byte aligned, at least 64) at `p` from its platform's memory, counted;
// throws px::Error when out of memory or over the placement's capacity. Freed with
// free_bytes(p, ptr, bytes). Every Array and executable arena is allocated here.
void* allocate_bytes(const Placement& p, int64_t bytes);
void free_bytes(const Placement& p, void* ptr, int64_t bytes);

// Where a platform's memory comes from: its backend's allocate, free and copy (parallax/backend.h;
// px::register_backend registers them, and the built-in backends register theirs before any
// Array is made). A platform with none registered gets 64-byte-aligned host memory. Registering
// throws when memory of the platform is already in use (it came from the host, and must go back
// there), or twice.
struct PlatformMemory {
  std::function<void*(const Placement&, int64_t)> allocate;  // uncounted; throws or returns nullptr when out of memory
  std::function<void(const Placement&, void*, int64_t)> free;
  // Copies `bytes` from src to dst and returns when done; one side is this platform's memory, the
  // other this platform's or host memory (as memmove: the ranges may overlap). Unset: memmove.
  std::function<void(void* dst, const void* src, int64_t bytes)> copy;
  // Whether the host may read and write memory of this placement through its pointer. False for
  // device memory of an accelerator (and of the `ref` backend's discrete mode): the host reaches
  // it only through `copy` (px::copy_bytes, Array::to, Array::to_f32). Unset: always.
  std::function<bool(const Placement&)> host_visible;
};
void register_platform_memory(const std::string& platform, PlatformMemory memory);

// Whether the host may dereference memory at `p` (PlatformMemory::host_visible). Host memory
// (`cpu`, and `pinned_host` of every built-in platform) always is.
bool host_visible(const Placement& p);
// Copies `bytes` from `src` at `src_at` to `dst` at `dst_at` through the platforms' copies (memmove
// where both are host-visible; staged through host memory between two platforms that are not),
// returning when done.
void copy_bytes(const Placement& dst_at, void* dst, const Placement& src_at, const void* src, int64_t bytes);

}  // namespace px
