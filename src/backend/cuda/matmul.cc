// dot_general on cuBLASLt (matmul.h).
#include "backend/cuda/matmul.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>

#include "backend/cuda/check.h"
#include "backend/cuda/gemm_layout.h"
#include "core/env.h"
#include "parallax/core.h"

namespace px::cuda {

namespace {

// The cuBLASLt functions called here, resolved from the library at run time.
struct Lt {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
};

const Lt& lt() {
  static const Lt loaded = [] {
    const std::string name = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib)
      throw Error("[cuda] cannot load " + name + " (cuBLASLt, which runs the matmuls): " + dlerror() +
                  "; install the CUDA toolkit's cuBLAS libraries or add their folder to LD_LIBRARY_PATH");
    Lt l;
    auto sym = [&](auto& f, const char* s) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, s));
      if (!f) throw Error("[cuda] " + name + " has no " + s + ": a cuBLASLt older than the toolkit this was built with");
    };
    sym(l.create, "cublasLtCreate");
    sym(l.desc_create, "cublasLtMatmulDescCreate");
    sym(l.desc_destroy, "cublasLtMatmulDescDestroy");
    sym(l.desc_set, "cublasLtMatmulDescSetAttribute");
    sym(l.layout_create, "cublasLtMatrixLayoutCreate");
    sym(l.layout_destroy, "cublasLtMatrixLayoutDestroy");
    sym(l.layout_set, "cublasLtMatrixLayoutSetAttribute");
    sym(l.pref_create, "cublasLtMatmulPreferenceCreate");
    sym(l.pref_destroy, "cublasLtMatmulPreferenceDestroy");
    sym(l.pref_set, "cublasLtMatmulPreferenceSetAttribute");
    sym(l.heuristic, "cublasLtMatmulAlgoGetHeuristic");
    sym(l.matmul, "cublasLtMatmul");
    return l;
  }();
  return loaded;
}

void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string("[cuda] ") + what + " failed (cuBLAS status " + std::to_string(s) + ")");
}
using cuda::check;  // and the CUDA runtime's (check.h)

// Each device's handle and the workspace its matmuls share: they are all queued on the device's
// compute stream, so one runs at a time.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
struct DeviceLt {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
};
const DeviceLt& device_lt(int device) {
  static std::mutex mutex;
  static std::map<int, DeviceLt> devices;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, added] = devices.try_emplace(device);
  if (added) {
    try {
      check(cudaSetDevice(device), "cudaSetDevice");
      check(lt().create(&it->second.handle), "cublasLtCreate");
      check(cudaMalloc(&it->second.workspace, kWorkspaceBytes), "cudaMalloc (the cuBLASLt workspace)");
    } catch (...) {
      devices.erase(it);
      throw;
    }
  }
  return it->second;
}

cudaDataType_t data_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
    case DType::f16:
      return CUDA_R_16F;
    default:
      throw InternalError(std::string("[cuda] dot_general on ") + dtype_name(t) + ": cuBLASLt runs f32, bf16 and f16");
  }
}

// One node's descriptors and the algorithm chosen for them, destroyed with the kernel.
struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    for (cublasLtMatrixLayout_t l : {a, b, d})
      if (l) lt().layout_destroy(l);
    if (op) lt().desc_destroy(op);
  }
};

cublasLtMatrixLayout_t layout(DType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  check(lt().layout_create(&l, data_type(t), static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld),
        "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    check(lt().layout_set(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), "cublasLtMatrixLayoutSetAttribute");
    check(lt().layout_set(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
          "cublasLtMatrixLayoutSetAttribute");
  }
  return l;
}

}  // namespace

Kernel matmul_kernel(const Graph& g, const Node& n, int device, void* stream) {
  const TensorType &lhs = g.type(n.inputs.at(0)), &rhs = g.type(n.inputs.at(1)), &out = g.type(n.outputs.at(0));
  const DotDims dims{n.attrs.ints("lhs_contract"), n.attrs.ints("rhs_contract"), n.attrs.ints("lhs_batch"),
                     n.attrs.ints("rhs_batch")};
  const std::string what = "dot_general " + type_str(lhs) + " x " + type_str(rhs) + " -> " + type_str(out);
  std::string why;
  const std::optional<GemmLayout> L = gemm_layout(lhs.shape, rhs.shape, dims, &why);
  if (!L) throw InternalError("[cuda] " + what + " is not one strided batched GEMM: " + why);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const size_t out_bytes = static_cast<size_t>(out.nbytes());
  if (L->m == 0 || L->n == 0 || L->batch == 0) return [](const void* const*, void* const*) {};
  if (L->k == 0)  // an empty sum: zeros
    return [device, s, out_bytes](const void* const*, void* const* o) {
      check(cudaSetDevice(device), "cudaSetDevice");
      check(cudaMemsetAsync(o[0], 0, out_bytes, s), "cudaMemsetAsync");
    };
  const DeviceLt& dev = device_lt(device);
  auto plan = std::make_shared<Plan>();
  // f32 exact unless PX_CUDA_TF32=1; 16-bit operands accumulate in f32 either way.
  const bool tf32 = env().cuda_tf32 && lhs.dtype == DType::f32 && rhs.dtype == DType::f32;
  check(lt().desc_create(&plan->op, tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F),
        "cublasLtMatmulDescCreate");
  const cublasOperation_t ta = L->a.transpose ? CUBLAS_OP_T : CUBLAS_OP_N, tb = L->b.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(lt().desc_set(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "cublasLtMatmulDescSetAttribute");
  check(lt().desc_set(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "cublasLtMatmulDescSetAttribute");
  // cuBLAS's a is the rhs and its b the lhs: C^T = rhs^T lhs^T (gemm_layout.h).
  plan->a = layout(rhs.dtype, L->a.rows, L->a.cols, L->a.ld, L->batch, L->a.batch_stride);
  plan->b = layout(lhs.dtype, L->b.rows, L->b.cols, L->b.ld, L->batch, L->b.batch_stride);
  plan->d = layout(out.dtype, L->m, L->n, L->ldd, L->batch, L->d_batch_stride);
  cublasLtMatmulPreference_t pref = nullptr;
  check(lt().pref_create(&pref), "cublasLtMatmulPreferenceCreate");
  std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, decltype(lt().pref_destroy)> pref_owner(
      pref, lt().pref_destroy);
  const uint64_t ws = kWorkspaceBytes;
  check(lt().pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)),
        "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t found{};
  int count = 0;
  check(lt().heuristic(dev.handle, plan->op, plan->a, plan->b, plan->d, plan->d, pref, 1, &found, &count),
        "cublasLtMatmulAlgoGetHeuristic");
  if (count == 0) throw InternalError("[cuda] cuBLASLt has no algorithm for " + what);
  plan->algo = found.algo;
  const cublasLtHandle_t handle = dev.handle;
  void* workspace = dev.workspace;
  return [plan, handle, workspace, device, s](const void* const* in, void* const* o) {
    const float one = 1.0f, zero = 0.0f;
    check(cudaSetDevice(device), "cudaSetDevice");
    check(lt().matmul(handle, plan->op, &one, in[1], plan->a, in[0], plan->b, &zero, o[0], plan->d, o[0], plan->d,
                      &plan->algo, workspace, kWorkspaceBytes, s),
          "cublasLtMatmul");
  };
}

}  // namespace px::cuda
