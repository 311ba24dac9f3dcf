// The CUDA backend's dot_general as one strided batched GEMM (src/backend/cuda/gemm_layout.h),
// checked without a GPU: the layout it gives is run through a host GEMM with cuBLAS's semantics
// (column-major operands with a leading dimension, each used as is or transposed, a stride between
// the matrices of the batch) and compared with the ref backend's dot_general, for each form a
// training step's products take. Built only with PX_WITH_CUDA.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda/gemm_layout.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"
#include "testing.h"

namespace px {
namespace {

// D = op(A) op(B) as cuBLAS computes it, on host floats.
std::vector<float> host_gemm(const cuda::GemmLayout& L, const std::vector<float>& a, const std::vector<float>& b) {
  auto at = [](const cuda::GemmOperand& o, const std::vector<float>& x, int64_t batch, int64_t i, int64_t j) {
    // Element (i, j) of op(X): the stored matrix's (i, j), or its (j, i) when transposed.
    const int64_t r = o.transpose ? j : i, c = o.transpose ? i : j;
    return x.at(static_cast<size_t>(batch * o.batch_stride + r + c * o.ld));
  };
  std::vector<float> d(static_cast<size_t>(L.batch * L.d_batch_stride), 0.0f);
  for (int64_t s = 0; s < L.batch; ++s)
    for (int64_t i = 0; i < L.m; ++i)
      for (int64_t j = 0; j < L.n; ++j) {
        double sum = 0;
        for (int64_t p = 0; p < L.k; ++p) sum += static_cast<double>(at(L.a, a, s, i, p)) * at(L.b, b, s, p, j);
        d[static_cast<size_t>(s * L.d_batch_stride + i + j * L.ldd)] = static_cast<float>(sum);
      }
  return d;
}

std::vector<float> on_ref(const Shape& lhs, const Shape& rhs, const DotDims& dims, const Array& x, const Array& y) {
  auto g = trace([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{dot_general(in[0], in[1], dims)}; },
                 {{DType::f32, lhs}, {DType::f32, rhs}});
  CompileOptions o;
  o.platform = "ref";
  return Executable::compile(*g, o)->run({x, y}).at(0).to_f32();
}

struct Form {
  const char* what;
  Shape lhs, rhs;
  DotDims dims;
};

TEST(CudaGemmLayout, EveryFormOfAStepsProductsEqualsTheRefBackend) {
  const std::vector<Form> forms = {
      {"x w", {4, 8}, {8, 5}, {{1}, {0}, {}, {}}},
      {"x w^T", {4, 8}, {5, 8}, {{1}, {1}, {}, {}}},
      {"x^T dy (a weight gradient)", {8, 4}, {8, 5}, {{0}, {0}, {}, {}}},
      {"x^T w^T", {8, 4}, {5, 8}, {{0}, {1}, {}, {}}},
      {"activations [b, s, d] times a weight", {2, 3, 8}, {8, 5}, {{2}, {0}, {}, {}}},
      {"a weight gradient over [b, s, d]", {2, 3, 4}, {2, 3, 5}, {{0, 1}, {0, 1}, {}, {}}},
      {"heads: q k^T", {2, 3, 6, 8}, {2, 3, 7, 8}, {{3}, {3}, {0, 1}, {0, 1}}},
      {"heads: p v", {2, 3, 6, 7}, {2, 3, 7, 8}, {{3}, {2}, {0, 1}, {0, 1}}},
      {"heads: dS^T q (dk)", {2, 3, 6, 7}, {2, 3, 6, 8}, {{2}, {2}, {0, 1}, {0, 1}}},
      {"rhs free dims before its contracted one", {4, 8}, {5, 2, 8}, {{1}, {2}, {}, {}}},
      {"a batch dim not leading", {4, 2, 8}, {2, 8, 5}, {{2}, {1}, {1}, {0}}},
      {"size-1 dims", {1, 8}, {8, 1}, {{1}, {0}, {}, {}}},
      {"a vector", {8}, {8, 5}, {{0}, {0}, {}, {}}},
  };
  for (const Form& f : forms) {
    std::string why;
    const std::optional<cuda::GemmLayout> L = cuda::gemm_layout(f.lhs, f.rhs, f.dims, &why);
    ASSERT_TRUE(L) << f.what << ": " << why;
    const Array x = testing::random_array(f.lhs, DType::f32, 1), y = testing::random_array(f.rhs, DType::f32, 2);
    const std::vector<float> want = on_ref(f.lhs, f.rhs, f.dims, x, y);
    // cuBLAS's a is the dot_general's rhs, its b the lhs (C^T = rhs^T lhs^T).
    const std::vector<float> got = host_gemm(*L, y.to_f32(), x.to_f32());
    ASSERT_EQ(got.size(), want.size()) << f.what;
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << f.what << ", element " << i;
    // cuBLAS's own requirements: leading dimensions at least the stored rows.
    EXPECT_GE(L->a.ld, std::max<int64_t>(L->a.rows, 1)) << f.what;
    EXPECT_GE(L->b.ld, std::max<int64_t>(L->b.rows, 1)) << f.what;
  }
}

TEST(CudaGemmLayout, DimsThatDoNotNestAreRefusedWithTheReason) {
  std::string why;
  // Contracted dims 0 and 2 of [3, 4, 5] with the free dim 1 between them: no single stride.
  EXPECT_FALSE(cuda::gemm_layout({3, 4, 5}, {3, 5, 2}, {{0, 2}, {0, 1}, {}, {}}, &why));
  EXPECT_NE(why.find("lhs's free or contracted dims do not nest"), std::string::npos) << why;
}

}  // namespace
}  // namespace px
