// The CUDA backend (backend.h): never run, see there. Three streams per device (StreamKind):
// kernels on compute, copies on host_to_device or device_to_host after the compute stream's work.
// Allocations are stream-ordered on the compute stream (cudaMallocAsync from the device's default
// pool, whose release threshold keeps freed memory cached for reuse) and synchronized before they
// are handed out, so that an Array is usable at once from any stream.
#include "backend/cuda/backend.h"

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cuda/check.h"
#include "backend/cuda/codegen.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/nvrtc.h"
#include "ir/primitive.h"
#include "ops/prims.h"
#include "parallax/backend.h"
#include "parallax/core.h"

namespace px::cuda {

namespace {

struct Device {
  int index = 0;
  int sm = 0;  // compute capability as 80, 90
  cudaStream_t compute = nullptr;
  cudaStream_t streams[3] = {};  // by StreamKind: compute, host_to_device, device_to_host
};

// An event recorded on `stream` now; waiting synchronizes with it and destroys it.
Event record_on(cudaStream_t stream) {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  check(cudaEventRecord(e, stream), "cudaEventRecord");
  return Event([e] {
    const cudaError_t r = cudaEventSynchronize(e);
    cudaEventDestroy(e);
    check(r, "cudaEventSynchronize");
  });
}

// A generated kernel loaded on one device: the library stays loaded while a Kernel holds it.
struct Loaded {
  cudaLibrary_t library = nullptr;
  cudaKernel_t kernel = nullptr;
  ~Loaded() {
    if (library) cudaLibraryUnload(library);
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int count) {
    for (int d = 0; d < count; ++d) {
      Device dev;
      dev.index = d;
      check(cudaSetDevice(d), "cudaSetDevice");
      int major = 0, minor = 0;
      check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d), "cudaDeviceGetAttribute");
      check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d), "cudaDeviceGetAttribute");
      dev.sm = major * 10 + minor;
      for (cudaStream_t& st : dev.streams)
        check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "cudaStreamCreate");
      dev.compute = dev.streams[0];
      // Freed blocks stay in the pool (a caching allocator) instead of going back to the driver.
      cudaMemPool_t pool = nullptr;
      check(cudaDeviceGetDefaultMemPool(&pool, d), "cudaDeviceGetDefaultMemPool");
      uint64_t keep = UINT64_MAX;
      check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep), "cudaMemPoolSetAttribute");
      devices_.push_back(dev);
    }
  }

  std::string name() const override { return "cuda"; }

  void* allocate(const Placement& p, int64_t bytes) override {
    const Device& d = device(p);
    check(cudaSetDevice(d.index), "cudaSetDevice");
    void* ptr = nullptr;
    if (p.kind == MemoryKind::pinned_host) {
      if (cudaMallocHost(&ptr, static_cast<size_t>(bytes)) != cudaSuccess) return nullptr;
      return ptr;
    }
    if (cudaMallocAsync(&ptr, static_cast<size_t>(bytes), d.compute) != cudaSuccess) return nullptr;
    check(cudaStreamSynchronize(d.compute), "cudaStreamSynchronize");
    return ptr;
  }

  void free(const Placement& p, void* ptr, int64_t) override {
    const Device& d = device(p);
    check(cudaSetDevice(d.index), "cudaSetDevice");
    if (p.kind == MemoryKind::pinned_host)
      cudaFreeHost(ptr);
    else
      cudaFreeAsync(ptr, d.compute);  // after the kernels already queued that read it
  }

  // Device memory is the GPU's; pinned host memory is the host's too.
  bool host_visible(const Placement& p) const override { return p.kind == MemoryKind::pinned_host; }

  void* stream(const Placement& p, StreamKind kind) override { return device(p).streams[static_cast<int>(kind)]; }
  Event record(const Placement& p, StreamKind kind) override {
    const Device& d = device(p);
    check(cudaSetDevice(d.index), "cudaSetDevice");
    return record_on(d.streams[static_cast<int>(kind)]);
  }
  void synchronize(const Placement& p) override {
    const Device& d = device(p);
    check(cudaSetDevice(d.index), "cudaSetDevice");
    for (cudaStream_t st : d.streams) check(cudaStreamSynchronize(st), "cudaStreamSynchronize");
  }

  bool can_fuse(const Graph& g, const Node& n) const override { return can_generate_elementwise(g, n); }
  bool has_kernel(const Primitive* primitive) const override {
    return primitive == prims::constant() || primitive == prims::dot_general() || can_generate(primitive);
  }
  bool kernels_per_device() const override { return true; }  // a library is loaded per device

  Kernel make_kernel(const Graph& g, const Unit& unit, const Placement& where) override {
    const Device& d = device(where);
    const Node& first = g.nodes()[unit.nodes.at(0)];
    if (unit.kind == Unit::Kind::kernel && first.prim == prims::constant()) return constant(first, d);
    if (unit.kind == Unit::Kind::kernel && first.prim == prims::dot_general())
      return matmul_kernel(g, first, d.index, d.compute);
    const KernelSource src = generate(g, unit);
    const Cubin cubin = compile_cubin(src, d.sm);
    if (!cubin.ok)
      throw InternalError("[cuda] the generated kernel " + src.name + " (" + src.label + ") does not compile for sm_" +
                          std::to_string(d.sm) + ":\n" + cubin.log);
    check(cudaSetDevice(d.index), "cudaSetDevice");
    auto loaded = std::make_shared<Loaded>();
    check(cudaLibraryLoadData(&loaded->library, cubin.image.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
          "cudaLibraryLoadData");
    check(cudaLibraryGetKernel(&loaded->kernel, loaded->library, src.name.c_str()), "cudaLibraryGetKernel");
    const int nin = src.num_inputs, nout = src.num_outputs;
    std::vector<size_t> zero;  // bytes of each result to zero before the launch (atomic sums)
    if (src.zero_outputs)
      for (int v : unit.out_values) zero.push_back(static_cast<size_t>(g.type(v).nbytes()));
    const dim3 grid(static_cast<unsigned>(src.launch.blocks)), block(static_cast<unsigned>(src.launch.threads));
    const cudaStream_t stream = d.compute;
    const int dev = d.index;
    // Queued on the device's compute stream; the caller synchronizes before the host reads results.
    return [loaded, nin, nout, grid, block, stream, dev, zero](const void* const* in, void* const* out) {
      std::vector<void*> ptrs(static_cast<size_t>(nin + nout));
      std::vector<void*> args(ptrs.size());
      for (int k = 0; k < nin; ++k) ptrs[k] = const_cast<void*>(in[k]);
      for (int k = 0; k < nout; ++k) ptrs[nin + k] = out[k];
      for (size_t k = 0; k < ptrs.size(); ++k) args[k] = &ptrs[k];
      check(cudaSetDevice(dev), "cudaSetDevice");
      for (size_t k = 0; k < zero.size(); ++k) check(cudaMemsetAsync(out[k], 0, zero[k], stream), "cudaMemsetAsync");
      check(cudaLaunchKernel(reinterpret_cast<const void*>(loaded->kernel), grid, block, args.data(), 0, stream),
            "cudaLaunchKernel");
    };
  }

  // In order on one copy stream, after the kernels already queued on the device's compute stream
  // (which may have written the sources): host_to_device when the first job writes device memory,
  // else device_to_host; cudaMemcpyDefault tells host, pinned and device pointers apart. The
  // device is the one owning the first device pointer among the jobs (device 0 if none).
  Event copy(std::vector<CopyJob> jobs) override {
    if (jobs.empty()) return Event();
    const auto on_device = [](const void* ptr, int* dev) {
      cudaPointerAttributes a{};
      if (cudaPointerGetAttributes(&a, ptr) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
      if (a.type != cudaMemoryTypeDevice) return false;
      *dev = a.device;
      return true;
    };
    int dev = 0;
    const bool to_device = on_device(jobs[0].dst, &dev);
    if (!to_device) on_device(jobs[0].src, &dev);
    const Device& d = devices_.at(static_cast<size_t>(dev));
    check(cudaSetDevice(d.index), "cudaSetDevice");
    const cudaStream_t s =
        d.streams[static_cast<int>(to_device ? StreamKind::host_to_device : StreamKind::device_to_host)];
    cudaEvent_t after = nullptr;
    check(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(after, d.compute), "cudaEventRecord");
    check(cudaStreamWaitEvent(s, after, 0), "cudaStreamWaitEvent");
    cudaEventDestroy(after);  // released once the wait has happened
    for (const CopyJob& j : jobs)
      if (j.bytes > 0 && j.dst != j.src)
        check(cudaMemcpyAsync(j.dst, j.src, static_cast<size_t>(j.bytes), cudaMemcpyDefault, s), "cudaMemcpyAsync");
    return record_on(s);
  }

  int num_threads() const override { return 1; }

 private:
  // A constant's bytes are copied to the device once, here; each run copies them into the result
  // on the compute stream. (This copy of the value is not counted by px::memory_stats.)
  Kernel constant(const Node& n, const Device& d) {
    const Array& value = n.attrs.array("value");
    const size_t bytes = static_cast<size_t>(value.nbytes());
    if (bytes == 0) return [](const void* const*, void* const*) {};
    check(cudaSetDevice(d.index), "cudaSetDevice");
    void* raw = nullptr;
    check(cudaMalloc(&raw, bytes), "cudaMalloc");
    std::shared_ptr<void> buf(raw, [](void* p) { cudaFree(p); });
    check(cudaMemcpy(raw, value.on_host().raw(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    const cudaStream_t stream = d.compute;
    const int dev = d.index;
    return [buf, bytes, stream, dev](const void* const*, void* const* out) {
      check(cudaSetDevice(dev), "cudaSetDevice");
      check(cudaMemcpyAsync(out[0], buf.get(), bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
    };
  }

  const Device& device(const Placement& p) const {
    if (p.device < 0 || p.device >= static_cast<int>(devices_.size()))
      throw UserError("[cuda] device " + std::to_string(p.device) + " is not visible: this process sees " +
                      std::to_string(devices_.size()) + " (CUDA_VISIBLE_DEVICES, PX_DEVICES=cuda:N)");
    return devices_[p.device];
  }

  std::vector<Device> devices_;
};

}  // namespace

int visible_devices() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: clear the sticky error
    return 0;
  }
  return n;
}

void provide_cuda_platform() {
  register_platform_provider("cuda", [] {
    if (register_cuda_backend()) return std::string();
    return std::string("no CUDA device is visible to this process: check nvidia-smi and CUDA_VISIBLE_DEVICES");
  });
}

bool register_cuda_backend() {
  static std::mutex m;
  std::lock_guard<std::mutex> l(m);
  if (has_backend("cuda")) return true;
  const int n = visible_devices();
  if (n <= 0) return false;
  register_backend("cuda", [n]() -> Backend& {
    static CudaBackend b(n);
    return b;
  });
  return true;
}

}  // namespace px::cuda
