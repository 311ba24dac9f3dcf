// The CUDA backend (src/backend/cuda/backend.h) on a GPU: it registers exactly where a device is
// visible, and generated kernels run through its allocate, copy and make_kernel give the ref
// backend's results. Without a device the GPU tests skip, saying so: they have never run (no GPU
// was available to this project when they were written). Built only with PX_WITH_CUDA.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/backend.h"
#include "backend/ref/ref.h"
#include "ops/prims.h"
#include "parallax/backend.h"

namespace px {
namespace {

TEST(CudaBackend, RegistersOnlyWhereAGpuIsVisible) {
  const int n = cuda::visible_devices();
  EXPECT_EQ(cuda::register_cuda_backend(), n > 0);
  EXPECT_EQ(has_backend("cuda"), n > 0);
}

// gelu(x * y + b) on the device, b broadcast along the rows, against the ref backend node by node.
TEST(CudaBackend, AFusedGroupOnTheDeviceEqualsTheRefBackend) {
  if (cuda::visible_devices() == 0) GTEST_SKIP() << "no CUDA device visible: this test has never run on a GPU";
  ASSERT_TRUE(cuda::register_cuda_backend());
  Backend& be = backend_for("cuda");
  Graph g;
  const TensorType x{DType::f32, {64, 96}}, row{DType::f32, {96}};
  Tensor a = g.input(x), b = g.input(x), c = g.input(row);
  Tensor cb = g.emit(*prims::broadcast_in_dim(), {c}, Attrs{{"shape", x.shape}, {"dims", std::vector<int64_t>{1}}})[0];
  Tensor m = g.emit(*prims::mul(), {a, b})[0];
  Tensor s = g.emit(*prims::add(), {m, cb})[0];
  Tensor y = g.emit(*prims::gelu(), {s}, Attrs{{"approximate", std::string("tanh")}})[0];
  g.set_outputs({y});
  Unit u;
  u.kind = Unit::Kind::fused;
  u.nodes = {0, 1, 2, 3};
  u.in_values = {c.id(), a.id(), b.id()};
  u.out_values = {y.id()};

  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<std::vector<float>> host = {std::vector<float>(96), std::vector<float>(64 * 96),
                                          std::vector<float>(64 * 96)};
  for (auto& h : host)
    for (float& v : h) v = nd(rng);
  const Placement dev{0, MemoryKind::device, "cuda"};
  std::vector<void*> bufs;
  std::vector<CopyJob> up;
  for (auto& h : host) {
    const int64_t bytes = static_cast<int64_t>(h.size() * 4 + 63) / 64 * 64;
    bufs.push_back(be.allocate(dev, bytes));
    ASSERT_NE(bufs.back(), nullptr);
    up.push_back({bufs.back(), h.data(), static_cast<int64_t>(h.size() * 4)});
  }
  void* out = be.allocate(dev, 64 * 96 * 4);
  be.copy(up).wait();
  Kernel k = be.make_kernel(g, u, dev);
  const void* in[] = {bufs[0], bufs[1], bufs[2]};
  void* outs[] = {out};
  k(in, outs);
  std::vector<float> got(64 * 96);
  be.copy({{got.data(), out, 64 * 96 * 4}}).wait();

  for (int64_t i = 0; i < 64 * 96; ++i) {
    const double sv = static_cast<double>(static_cast<float>(host[1][i] * host[2][i])) + host[0][i % 96];
    std::vector<TensorType> it{TensorType{DType::f32, {1}}}, ot{TensorType{DType::f32, {1}}};
    const float sf = static_cast<float>(sv);
    float want = 0;
    const void* ri[] = {&sf};
    void* ro[] = {&want};
    (*ref::find_kernel(prims::gelu()))(ref::Spec{it, ot, Attrs{{"approximate", std::string("tanh")}}})(ri, ro);
    ASSERT_NEAR(got[i], want, 1e-5 * (1 + std::fabs(want))) << i;
  }
  for (void* p : bufs) be.free(dev, p, 0);
  be.free(dev, out, 0);
}

// q k^T of attention (batched over two dims, both operands contracted on their last dim) on
// cuBLASLt, f32 without TF32, against the product summed on the host.
TEST(CudaBackend, ABatchedMatmulOnTheDeviceEqualsTheHost) {
  if (cuda::visible_devices() == 0) GTEST_SKIP() << "no CUDA device visible: this test has never run on a GPU";
  ASSERT_TRUE(cuda::register_cuda_backend());
  Backend& be = backend_for("cuda");
  constexpr int64_t B = 2, H = 3, S = 40, T = 24, D = 16;
  Graph g;
  Tensor q = g.input({DType::f32, {B, H, S, D}}), k = g.input({DType::f32, {B, H, T, D}});
  Tensor s = g.emit(*prims::dot_general(), {q, k},
                    Attrs{{"lhs_contract", std::vector<int64_t>{3}}, {"rhs_contract", std::vector<int64_t>{3}},
                          {"lhs_batch", std::vector<int64_t>{0, 1}}, {"rhs_batch", std::vector<int64_t>{0, 1}}})[0];
  g.set_outputs({s});
  Unit u;
  u.kind = Unit::Kind::kernel;
  u.nodes = {0};
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> hq(B * H * S * D), hk(B * H * T * D);
  for (float& v : hq) v = nd(rng);
  for (float& v : hk) v = nd(rng);
  const Placement dev{0, MemoryKind::device, "cuda"};
  void* dq = be.allocate(dev, static_cast<int64_t>(hq.size() * 4));
  void* dk = be.allocate(dev, static_cast<int64_t>(hk.size() * 4));
  void* ds = be.allocate(dev, B * H * S * T * 4);
  ASSERT_TRUE(dq && dk && ds);
  be.copy({{dq, hq.data(), static_cast<int64_t>(hq.size() * 4)}, {dk, hk.data(), static_cast<int64_t>(hk.size() * 4)}})
      .wait();
  Kernel kern = be.make_kernel(g, u, dev);
  const void* in[] = {dq, dk};
  void* outs[] = {ds};
  kern(in, outs);
  std::vector<float> got(B * H * S * T);
  be.copy({{got.data(), ds, static_cast<int64_t>(got.size() * 4)}}).wait();
  for (int64_t b = 0; b < B * H; ++b)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t j = 0; j < T; ++j) {
        double want = 0;
        for (int64_t d = 0; d < D; ++d) want += static_cast<double>(hq[(b * S + i) * D + d]) * hk[(b * T + j) * D + d];
        ASSERT_NEAR(got[(b * S + i) * T + j], want, 1e-4 * (1 + std::fabs(want))) << b << " " << i << " " << j;
      }
  for (void* p : {dq, dk, ds}) be.free(dev, p, 0);
}

}  // namespace
}  // namespace px
