// Every kernel the CUDA backend's generator emits (src/backend/cuda/codegen.h), compiled by NVRTC
// to cubin for sm_80 and sm_90: each primitive family as a single node in f32, bf16 and f16 (and
// i32 and bool where the primitive takes them), and the fused groups and kernels of real programs
// (an MLP with GELU, a transformer block's norms, softmax and residuals, a loss, their gradients,
// dropout and an AdamW step) as the schedule forms them. No GPU is needed: NVRTC is a library.
// A failure names the kernel and prints NVRTC's log and the source. Built only with PX_WITH_CUDA.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/codegen.h"
#include "backend/cuda/nvrtc.h"
#include "ops/prims.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "runtime/schedule.h"

namespace px {
namespace {

constexpr int kArchs[] = {80, 90};

// The distinct kernels compiled per architecture, over the whole test program (printed at the end).
std::map<int, std::set<std::string>>& compiled() {
  static std::map<int, std::set<std::string>> m;
  return m;
}

void expect_compiles(const cuda::KernelSource& k) {
  for (int sm : kArchs) {
    const cuda::Cubin c = cuda::compile_cubin(k, sm, /*disk=*/false);  // compiled here, not read back
    ASSERT_TRUE(c.ok) << "kernel " << k.name << " (" << k.label << ") does not compile for sm_" << sm
                      << "; NVRTC's log:\n"
                      << c.log << "\nsource:\n"
                      << k.source;
    EXPECT_GT(c.image.size(), 0u) << k.name;
    compiled()[sm].insert(k.name);
  }
}

// One node of `prim` on inputs of the given types, generated as its own kernel and compiled.
void node(const Primitive* prim, const std::vector<TensorType>& in, Attrs attrs = {}) {
  Graph g;
  std::vector<Tensor> ins;
  for (const TensorType& t : in) ins.push_back(g.input(t));
  const std::vector<Tensor> outs = g.emit(*prim, ins, std::move(attrs));
  g.set_outputs(outs);
  Unit u;
  u.kind = Unit::Kind::kernel;
  u.nodes = {0};
  for (const Tensor& t : ins) u.in_values.push_back(t.id());
  for (const Tensor& t : outs) u.out_values.push_back(t.id());
  SCOPED_TRACE(prim->name + " on " + (in.empty() ? std::string("nothing") : type_str(in[0])));
  expect_compiles(cuda::generate(g, u));
}

const DType kFloats[] = {DType::f32, DType::bf16, DType::f16};

TEST(CudaCodegen, ElementwisePrimitivesCompileInEveryDtype) {
  const Shape s{3, 5, 7};
  for (DType t : kFloats) {
    const TensorType x{t, s};
    for (const Primitive* p : {prims::neg(), prims::abs(), prims::exp(), prims::log(), prims::tanh(), prims::sqrt(),
                               prims::rsqrt(), prims::sigmoid(), prims::silu(), prims::stop_gradient()})
      node(p, {x});
    node(prims::tag(), {x}, Attrs{{"name", std::string("h")}});
    for (const char* form : {"erf", "tanh"}) {
      node(prims::gelu(), {x}, Attrs{{"approximate", std::string(form)}});
      node(prims::gelu_grad(), {x}, Attrs{{"approximate", std::string(form)}});
    }
    for (const Primitive* p :
         {prims::add(), prims::sub(), prims::mul(), prims::div(), prims::pow(), prims::maximum(), prims::minimum(),
          prims::eq(), prims::ne(), prims::lt(), prims::le(), prims::gt(), prims::ge()})
      node(p, {x, x});
    node(prims::select(), {TensorType{DType::boolean, s}, x, x});
    for (DType to : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean})
      node(prims::cast(), {x}, Attrs{{"dtype", to}});
    node(prims::full(), {}, Attrs{{"shape", s}, {"value", 0.1}, {"dtype", t}});
    node(prims::full(), {}, Attrs{{"shape", s}, {"value", -std::numeric_limits<double>::infinity()}, {"dtype", t}});
    node(prims::iota(), {}, Attrs{{"shape", s}, {"axis", int64_t{1}}, {"dtype", t}});
    node(prims::broadcast_in_dim(), {TensorType{t, {5}}}, Attrs{{"shape", s}, {"dims", std::vector<int64_t>{1}}});
  }
  // The exact integer and boolean forms.
  const TensorType i{DType::i32, s}, b{DType::boolean, s};
  for (const Primitive* p : {prims::add(), prims::sub(), prims::mul(), prims::div(), prims::maximum(), prims::minimum(),
                             prims::eq(), prims::lt(), prims::ge()})
    node(p, {i, i});
  for (const Primitive* p : {prims::neg(), prims::abs()}) node(p, {i});
  for (const Primitive* p : {prims::logical_and(), prims::logical_or(), prims::eq()}) node(p, {b, b});
  node(prims::logical_not(), {b});
  node(prims::select(), {b, i, i});
  for (DType to : {DType::f32, DType::bf16, DType::i32, DType::boolean}) {
    node(prims::cast(), {i}, Attrs{{"dtype", to}});
    node(prims::cast(), {b}, Attrs{{"dtype", to}});
  }
  node(prims::full(), {}, Attrs{{"shape", s}, {"value", -3e9}, {"dtype", DType::i32}});
  node(prims::full(), {}, Attrs{{"shape", s}, {"value", 1.0}, {"dtype", DType::boolean}});
  node(prims::iota(), {}, Attrs{{"shape", s}, {"axis", int64_t{2}}, {"dtype", DType::i32}});
}

TEST(CudaCodegen, RowKernelsCompileInEveryDtype) {
  for (DType t : kFloats) {
    const TensorType x{t, {6, 33}}, x3{t, {4, 3, 33}};
    for (const Primitive* p : {prims::reduce_sum(), prims::reduce_max()}) {
      node(p, {x3}, Attrs{{"axes", std::vector<int64_t>{2}}});  // trailing: one block per row
      node(p, {x3}, Attrs{{"axes", std::vector<int64_t>{1, 2}}});
      node(p, {x3}, Attrs{{"axes", std::vector<int64_t>{0}}});  // leading: one thread per result
      node(p, {x3}, Attrs{{"axes", std::vector<int64_t>{0, 2}}});
    }
    node(prims::reduce_sum(), {x3}, Attrs{{"axes", std::vector<int64_t>{2}}, {"out_dtype", DType::f32}});
    for (const Primitive* p : {prims::softmax(), prims::log_softmax()}) {
      node(p, {x3}, Attrs{{"axis", int64_t{2}}});
      node(p, {x3}, Attrs{{"axis", int64_t{1}}});
    }
    const TensorType gamma{t, {33}}, stat{DType::f32, {6}};
    node(prims::layer_norm(), {x, gamma, gamma}, Attrs{{"eps", 1e-5}});
    node(prims::rms_norm(), {x, gamma}, Attrs{{"eps", 1e-6}});
    node(prims::layer_norm_grad(), {x, gamma, stat, stat, x});
    node(prims::rms_norm_grad(), {x, gamma, stat, x});
    const TensorType labels{DType::i32, {6}};
    node(prims::softmax_cross_entropy(), {x, labels}, Attrs{{"ignore_index", int64_t{-100}}});
    node(prims::softmax_cross_entropy_grad(), {x, labels, stat}, Attrs{{"ignore_index", int64_t{-100}}});
  }
}

TEST(CudaCodegen, IndexOptimizerAndRandomKernelsCompile) {
  const TensorType idx{DType::i32, {2, 5}};
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32}) {
    node(prims::take(), {TensorType{t, {11, 8}}, idx});
    node(prims::scatter_add(), {idx, TensorType{t, {2, 5, 8}}}, Attrs{{"num_rows", int64_t{11}}});
    node(prims::one_hot(), {idx}, Attrs{{"depth", int64_t{7}}, {"dtype", t}});
  }
  const TensorType key{DType::i32, {2}}, scalar{DType::f32, {}};
  for (DType t : kFloats) {
    for (int64_t decay : {0, 1}) {
      std::vector<TensorType> in{TensorType{t, {9, 4}},
                                 TensorType{t, {9, 4}},
                                 TensorType{DType::f32, {9, 4}},
                                 TensorType{DType::f32, {9, 4}},
                                 scalar,
                                 scalar};
      if (decay) in.push_back(scalar);
      node(prims::adamw_update(), in, Attrs{{"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"decay", decay}});
    }
    const std::vector<int64_t> shape{4, 6};
    node(prims::random_uniform(), {key}, Attrs{{"shape", shape}, {"dtype", t}, {"lo", 0.0}, {"hi", 1.0}});
    node(prims::random_normal(), {key}, Attrs{{"shape", shape}, {"dtype", t}});
    // A block of a larger draw: at a fixed offset, and at a run-time origin (a sharded draw).
    node(prims::random_uniform(), {key},
         Attrs{{"shape", shape},
               {"dtype", t},
               {"lo", -1.0},
               {"hi", 1.0},
               {"global_shape", std::vector<int64_t>{8, 12}},
               {"offset", std::vector<int64_t>{4, 6}}});
    node(prims::random_normal(), {key, TensorType{DType::i32, {2}}},
         Attrs{{"shape", shape}, {"dtype", t}, {"global_shape", std::vector<int64_t>{8, 12}}});
  }
  node(prims::fold_in(), {key}, Attrs{{"data", int64_t{42}}});
}

TEST(CudaCodegen, ShapeKernelsCompile) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean}) {
    const TensorType x{t, {3, 5, 7}};
    node(prims::transpose(), {x}, Attrs{{"perm", std::vector<int64_t>{2, 0, 1}}});
    node(prims::slice(), {x},
         Attrs{{"starts", std::vector<int64_t>{1, 0, 2}},
               {"limits", std::vector<int64_t>{3, 5, 7}},
               {"strides", std::vector<int64_t>{1, 2, 2}}});
    node(prims::pad(), {x},
         Attrs{{"lo", std::vector<int64_t>{1, 0, 2}},
               {"hi", std::vector<int64_t>{0, 1, 1}},
               {"interior", std::vector<int64_t>{0, 1, 0}},
               {"value", 0.5}});
    node(prims::concat(), {x, TensorType{t, {3, 2, 7}}, x}, Attrs{{"axis", int64_t{1}}});
  }
}

// A kernel that does not compile is reported with NVRTC's log, not as a cubin.
TEST(CudaCodegen, ACompileErrorIsReportedWithItsLog) {
  cuda::KernelSource k;
  k.name = "px_broken";
  k.source =
      "#include \"px_element_math.h\"\nextern \"C\" __global__ void px_broken(float* out0) { out0[0] = "
      "em::no_such(1.0f); }\n";
  const cuda::Cubin c = cuda::compile_cubin(k, 80, /*disk=*/false);
  EXPECT_FALSE(c.ok);
  EXPECT_TRUE(c.image.empty());
  EXPECT_NE(c.log.find("no_such"), std::string::npos) << c.log;
}

// The on-disk cache: a compiled kernel's cubin is written under XDG_CACHE_HOME, and a kernel whose
// file is there is read back instead of compiled (a planted file proves which).
TEST(CudaCodegen, CubinsAreCachedOnDisk) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("px_cubins_" + std::to_string(::getpid()));
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  Graph g;
  Tensor x = g.input(TensorType{DType::f32, {17}});
  Tensor y = g.emit(*prims::exp(), {x})[0];
  g.set_outputs({y});
  Unit u{Unit::Kind::kernel, {0}, {x.id()}, {y.id()}};
  const cuda::KernelSource k = cuda::generate(g, u);
  const std::string path = cuda::cubin_cache_path(k, 80);
  EXPECT_EQ(path.rfind(dir.string(), 0), 0u) << path;
  const cuda::Cubin c = cuda::compile_cubin(k, 80);
  ASSERT_TRUE(c.ok) << c.log;
  std::ifstream f(path, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(f), {}), c.image);
  // Another architecture's file, planted before its first compile in this process, is what comes back.
  const std::string planted = cuda::cubin_cache_path(k, 90);
  std::ofstream(planted, std::ios::binary) << "planted";
  EXPECT_EQ(cuda::compile_cubin(k, 90).image, "planted");
  if (old)
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    ::unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
}

// The units of a real program as the schedule forms them (the CPU backend's fusion decisions, with
// reductions kept out of the loops as the CUDA backend keeps them):
// every fused group, and every kernel of a primitive the generator has.
int compile_program(const TracedFn& fn, const std::vector<TensorType>& in) {
  auto g = trace(fn, in);
  ScheduleOptions opt;
  opt.backend = &cpu_backend();
  opt.fusion = cpu_backend().fusion();  // the CUDA backend's: reductions stay kernels of their own
  opt.fusion->reductions = false;
  int fused = 0;
  for (const Unit& u : make_schedule(*g, opt)) {
    if (u.kind == Unit::Kind::fused) {
      ++fused;
    } else if (u.kind != Unit::Kind::kernel || !cuda::can_generate(g->nodes()[u.nodes[0]].prim)) {
      continue;
    }
    SCOPED_TRACE(u.label);
    expect_compiles(cuda::generate(*g, u));
  }
  return fused;
}

TEST(CudaCodegen, FusedGroupsOfRealProgramsCompile) {
  for (DType t : kFloats) {
    SCOPED_TRACE(dtype_name(t));
    // An MLP block with GELU and a residual, forward and backward, and a norm.
    auto mlp = [](const std::vector<Tensor>& a) {
      auto f = [](const std::vector<Tensor>& p) {
        Tensor h = gelu(p[0] * p[1] + p[2], true);
        Tensor y = layer_norm(h + p[0], p[3], p[4]);
        return std::vector<Tensor>{sum(silu(y) * sigmoid(y))};
      };
      return grad(f, {0, 1, 2})(a);
    };
    const TensorType x{t, {8, 16}}, row{t, {16}};
    EXPECT_GT(compile_program(mlp, {x, x, row, row, row}), 0);
    // Attention-like rows: scores, a mask by where, softmax, RMS norm, a loss and its gradient.
    auto block = [](const std::vector<Tensor>& a) {
      auto f = [&](const std::vector<Tensor>& p) {
        Tensor s = tanh(p[0]) * 0.125 + exp(p[0] * -0.5);
        Tensor m = where(greater(p[0], full_like(p[0], 0.0)), s, full_like(s, -1e4));
        Tensor y = rms_norm(softmax(m, -1) + p[0], p[1]);
        return std::vector<Tensor>{mean(softmax_cross_entropy(cast(y, DType::f32), a[2]))};
      };
      return value_and_grad(f, {0, 1})({a[0], a[1]});
    };
    EXPECT_GT(compile_program(block, {x, row, TensorType{DType::i32, {8}}}), 0);
    // Dropout: a uniform draw compared with the keep rate, and a scaled select.
    auto drop = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{dropout(a[0], a[1], 0.1)}; };
    compile_program(drop, {TensorType{DType::i32, {2}}, x});
  }
}

// Printed once, after every test: the counts the report quotes.
class PrintCounts : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const auto& [sm, names] : compiled())
      std::printf("NVRTC %s: %zu distinct kernels compiled for sm_%d\n", cuda::nvrtc_version().c_str(), names.size(),
                  sm);
  }
};
const auto* const kPrintCounts = ::testing::AddGlobalTestEnvironment(new PrintCounts);

}  // namespace
}  // namespace px
