// The backend interface: what the runtime needs from a kind of device, behind one small class.
// Arrays and the executable's arenas get their memory, and the executable its kernels, its copies
// between memory kinds and the packing around collectives, only through a Backend, chosen by the
// platform of the program's devices (CompileOptions::platform, a Mesh's platform, PX_DEVICES=ref:2,
// Placement::platform). Two are built in: `cpu` (src/backend/cpu/: oneDNN, OpenMP,
// fused elementwise loops) and `ref` (src/backend/ref/: plain single-threaded loops written from
// the primitives' definitions, the reference the CPU backend is checked against). A CUDA backend
// adds cudaMalloc/cudaMallocHost, cuBLASLt/cuDNN kernels and cudaMemcpyAsync on a copy stream
// behind the same calls; docs/adding-a-backend.md walks through adding one.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "parallax/graph.h"
#include "parallax/memory.h"

namespace px {

// One step of a schedule: a kernel, a fused elementwise group, a view, or the start or wait of a
// collective or copy.
struct Unit {
  enum class Kind { kernel, fused, view, collective_start, collective_wait };
  Kind kind = Kind::kernel;
  std::vector<int> nodes;       // graph nodes it runs (fused: members in order)
  std::vector<int> in_values;   // operands read from outside the unit
  std::vector<int> out_values;  // results written (fused: only those read outside the group)
  std::string label;
  bool alias_safe = false;  // a result may share its buffer with an operand (fused loops, in_place primitives)
};

// Started asynchronous work. wait() returns once it is complete (outputs written, inputs free to
// reuse); an event that holds nothing is already complete. Wait exactly once per started call.
class Event {
 public:
  Event() = default;
  explicit Event(std::function<void()> wait) : wait_(std::move(wait)) {}
  void wait() {
    if (wait_) std::exchange(wait_, nullptr)();
  }
  bool pending() const { return static_cast<bool>(wait_); }

 private:
  std::function<void()> wait_;
};

// A prepared kernel: runs one compute unit on raw operand and result buffers. A unit whose backend
// asks for working memory (Backend::scratch_bytes) gets it after its results, at
// out[unit.out_values.size()]: planned in the device's arena like a result that lives only while
// the unit runs, so a step allocates nothing outside its plan.
using Kernel = std::function<void(const void* const* in, void* const* out)>;

// One copy between memory kinds (or within one). The jobs of one call run in order; a job's
// ranges may overlap (it copies as memmove does).
struct CopyJob {
  void* dst;
  const void* src;
  int64_t bytes;
};

// One box copy within a device: the `extent` box at `src_offset` of a `src_shape` array to
// `dst_offset` of a `dst_shape` array, elements of `element_bytes` (the layout changes around a
// collective over a dim that is not leading). The boxes of one call do not overlap.
struct BoxCopy {
  void* dst;
  Shape dst_shape;
  std::vector<int64_t> dst_offset;
  const void* src;
  Shape src_shape;
  std::vector<int64_t> src_offset;
  Shape extent;
  int64_t element_bytes;
};

// How the schedule may group elementwise nodes into one loop on this backend.
struct FusionLimits {
  bool enabled = true;    // false: every node is its own unit (Backend::can_fuse is never asked)
  size_t max_group = 48;  // nodes in one fused loop
  int window = 32;        // a group no node joined for this many nodes closes (bounds lifetimes)
  // A reduce_sum or reduce_max of a value computed in an open group may join it as its last member:
  // the backend's kernel then evaluates the chain while it reduces (the reduced operand is never
  // written unless something else reads it). False: reductions are always kernels of their own.
  bool reductions = false;
};

// The queues of a device: its kernels and collectives run on `compute`; copies from host memory
// to the device on `host_to_device`, back on `device_to_host` (a CUDA backend's three streams).
enum class StreamKind : uint8_t { compute, host_to_device, device_to_host };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // ---- Memory ----
  // Memory of a placement (device memory or pinned host memory of one of its devices), `bytes` a
  // multiple of 64; nullptr (or a px::Error) when out of memory. This is the only allocator of a
  // platform's memory: px::allocate_bytes calls it for every Array and arena of the platform and
  // counts it (px::memory_stats, capacities). The default is 64-byte-aligned host memory (the cpu
  // backend, and the ref backend unless PX_REF_DISCRETE=1).
  virtual void* allocate(const Placement& p, int64_t bytes) {
    return std::aligned_alloc(64, static_cast<size_t>(bytes));
  }
  virtual void free(const Placement& p, void* ptr, int64_t bytes) { std::free(ptr); }
  // Whether the host may read and write memory at `p` through its pointer. When not (an
  // accelerator's device memory), everything the host reads or writes goes through copy(): Arrays'
  // to_f32 / to / clone, checkpoints, the communicators' staging (px::copy_bytes).
  virtual bool host_visible(const Placement& p) const { return true; }
  // ---- Streams ----
  // The native queue of one of a device's streams: a CUDA backend's cudaStream_t, bound into
  // kernels by make_kernel and handed to the communicator (Communicator::streams) for its calls.
  // Host backends run on the calling thread: nullptr.
  virtual void* stream(const Placement& device, StreamKind kind = StreamKind::compute) { return nullptr; }
  // An event that completes when the work queued on that stream of `device` so far has (an event
  // that holds nothing: already complete, the host backends').
  virtual Event record(const Placement& device, StreamKind kind) { return Event(); }
  // Returns when all work queued on every stream of `device` is done: the executor calls it before
  // the host may read what a program wrote there.
  virtual void synchronize(const Placement& device) {}
  // What the schedule pass may ask: whether elementwise node n can join a fused group, and whether
  // the backend has a kernel of its own for a primitive (a node's `prim`; a backend keys its
  // kernels by the primitive, see primitive_handle below).
  virtual bool can_fuse(const Graph& g, const Node& n) const = 0;
  virtual bool has_kernel(const Primitive* primitive) const = 0;
  // The kernel of one compute unit of a schedule (one node, or a fused elementwise group) for
  // `device` (what a backend binds into it: the device's stream, its library handles); throws
  // naming the primitive when the backend has none.
  virtual Kernel make_kernel(const Graph& g, const Unit& unit, const Placement& device) = 0;
  // The working memory (bytes; 0: none) the kernel of `unit` needs while it runs, beside its
  // results: the f32 copies of 16-bit operands, per-thread tiles and partial sums. Asked when the
  // program is planned, before any kernel is made; the kernel finds it at out[unit.out_values.size()],
  // 64-byte aligned. A backend that wraps another forwards this with make_kernel.
  virtual int64_t scratch_bytes(const Graph& g, const Unit& unit, const Placement& device) const { return 0; }
  // Whether every device of a process needs kernel instances of its own. False: devices that run
  // one after the other share device 0's instances (the CPU's kernels hold only per-thread scratch);
  // devices run side by side (for_each_device) always get their own.
  virtual bool kernels_per_device() const { return false; }
  // Starts the copies on the backend's copy stream, in order; the event completes when all have.
  // A job's two sides are this backend's memory (device or pinned host) or host memory, told apart
  // by the pointers (as cudaMemcpyDefault does).
  virtual Event copy(std::vector<CopyJob> jobs) = 0;
  // The box copies (packing and unpacking around a collective), returning when all are done. The
  // default copies them one after the other on the host; the CPU backend spreads them over its threads.
  virtual void copy_boxes(const std::vector<BoxCopy>& jobs);
  virtual int num_threads() const = 0;  // compute threads one device's kernels use
  virtual FusionLimits fusion() const { return {}; }
  // Runs body(d) for every d in [0, devices) and returns when all have: the devices of one process
  // between two collectives (asked only when the executor runs devices side by side, i.e. there
  // are at least as many devices as threads). The default runs them one after the other; the CPU
  // backend gives each a thread. The first exception thrown is rethrown after all have run.
  virtual void for_each_device(int devices, const std::function<void(int)>& body) {
    for (int d = 0; d < devices; ++d) body(d);
  }
};

Backend& cpu_backend();

// The registered primitive of that name (the names: build/tests/list_primitives), the handle a
// backend keys a kernel by: look it up once, when the backend fills its kernel table, and compare
// a node's `prim` with it (a Node's prim is the same pointer). Throws px::Error naming it when no
// primitive of that name is registered (the SPMD ones, e.g. local_slice, once the sharding layer
// has registered them).
const Primitive* primitive_handle(const std::string& name);

// Backends by platform name. `cpu` and `ref` are registered on first use; another backend (one
// built out of tree against the installed headers) registers itself before its first program
// compiles and before any Array is made on its devices: registering also makes the backend's
// allocate and free the platform's memory (px::register_platform_memory). Registering a platform
// twice throws.
void register_backend(const std::string& platform, std::function<Backend&()> get);
bool has_backend(const std::string& platform);
// Throws px::UserError naming the registered platforms when `platform` has none.
Backend& backend_for(const std::string& platform);
std::vector<std::string> backend_platforms();  // sorted
// A platform registered on first use: when a program names `platform` (PX_DEVICES, --devices,
// px::parse_devices, backend_for) and no backend is registered for it yet, `provide` runs to
// register it (px::register_backend) and returns "", or returns why it cannot ("no CUDA device is
// visible"), which the error naming the platform then gives. The CUDA backend's
// px::cuda::provide_cuda_platform() provides `cuda` so, and `pax` calls it: a process that never
// names `cuda` never starts the CUDA runtime.
void register_platform_provider(const std::string& platform, std::function<std::string()> provide);

}  // namespace px
