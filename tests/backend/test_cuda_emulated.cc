// The CUDA backend's generated kernels run on the CPU against the ref backend: their CUDA C is
// compiled by the host C++ compiler as one block of one thread (a shim defines blockIdx and the
// other built-ins; PX_EMULATED_BLOCK turns a block's reduction into its one thread's value), and
// each kernel runs block by block over buffers that the ref backend filled by running the same
// graph, node by node. What this checks is the generator's logic (indexing, broadcasts, casts,
// 16-bit rounding, the row kernels' formulas, the random streams' global indices); what it cannot
// check is anything a GPU adds: many threads per block, the warp reductions and the device's
// memory (no GPU was available to this project; the NVRTC test compiles the same sources for
// sm_80 and sm_90). Built only with PX_WITH_CUDA; skips when the host compiler is not found.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/codegen.h"
#include "backend/ref/ref.h"
#include "ops/prims.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "runtime/schedule.h"

namespace px {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<std::byte>;

// The built-ins of one thread of one block, and a setter for the launch loop.
constexpr const char* kShim = R"(#include <cstdint>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define PX_EMULATED_BLOCK 1
struct PxDim { unsigned x; };
inline PxDim blockIdx{0}, threadIdx{0}, blockDim{1}, gridDim{1};
extern "C" void px_emu_launch(unsigned block, unsigned grid) { blockIdx.x = block; gridDim.x = grid; }
template <class T> inline T atomicAdd(T* p, T v) { const T old = *p; *p = old + v; return old; }
)";

// ---- the ref backend over a whole graph -------------------------------------------------------

Bytes random_bytes(const TensorType& t, std::mt19937& rng) {
  Bytes b(static_cast<size_t>(t.nbytes()));
  std::normal_distribution<double> nd(0.0, 1.5);
  std::uniform_int_distribution<int> id(-1, 12);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.dtype == DType::i32 || t.dtype == DType::boolean)
      ref::store(b.data(), t.dtype, i, t.dtype == DType::boolean ? id(rng) % 2 : id(rng));
    else
      ref::store(b.data(), t.dtype, i, nd(rng));
  }
  return b;
}

// Every value of the graph, computed by the ref backend's kernels in node order from random inputs.
std::map<int, Bytes> run_ref(const Graph& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::map<int, Bytes> v;
  for (int in : g.inputs()) v[in] = random_bytes(g.type(in), rng);
  for (const Node& n : g.nodes()) {
    std::vector<TensorType> it, ot;
    std::vector<const void*> ip;
    std::vector<void*> op;
    for (int x : n.inputs) {
      it.push_back(g.type(x));
      ip.push_back(v.at(x).data());
    }
    for (int y : n.outputs) {
      ot.push_back(g.type(y));
      v[y].resize(static_cast<size_t>(g.type(y).nbytes()));
      op.push_back(v[y].data());
    }
    const ref::Factory* f = ref::find_kernel(n.prim);
    if (!f) throw std::runtime_error("no ref kernel for " + n.prim->name);
    (*f)(ref::Spec{it, ot, n.attrs})(ip.data(), op.data());
  }
  return v;
}

// ---- compiling and running generated kernels on the host --------------------------------------

struct Case {
  std::unique_ptr<Graph> g;
  Unit unit;
  cuda::KernelSource k;
};

class Library {
 public:
  // Compiles the kernels into one shared object; false when there is no host compiler.
  bool build(const std::vector<Case>& cases) {
    dir_ = fs::temp_directory_path() / ("px_cuda_emulated_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / cuda::kElementMathInclude) << cuda::element_math_text();
    std::ofstream(dir_ / "shim.h") << kShim;
    std::ofstream src(dir_ / "kernels.cc");
    std::set<std::string> written;  // the same kernel may come from several programs
    for (const Case& c : cases)
      if (written.insert(c.k.name).second) src << c.k.source << "\n";
    src.close();
    const std::string cmd = std::string(PX_HOST_CXX) + " -std=c++17 -O1 -ffp-contract=off -fPIC -shared -include " +
                            (dir_ / "shim.h").string() + " -I" + dir_.string() + " -o " + (dir_ / "k.so").string() +
                            " " + (dir_ / "kernels.cc").string() + " 2> " + (dir_ / "log.txt").string();
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir_ / "log.txt");
      ADD_FAILURE() << "the host compiler rejected the generated kernels:\n"
                    << std::string(std::istreambuf_iterator<char>(log), {}).substr(0, 6000);
      return false;
    }
    handle_ = dlopen((dir_ / "k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    return handle_ != nullptr;
  }
  ~Library() {
    if (handle_) dlclose(handle_);
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // Runs the kernel block by block, one thread each.
  void run(const cuda::KernelSource& k, std::vector<void*> args) {
    void* fn = dlsym(handle_, k.name.c_str());
    auto* launch = reinterpret_cast<void (*)(unsigned, unsigned)>(dlsym(handle_, "px_emu_launch"));
    ASSERT_TRUE(fn && launch) << k.name;
    args.resize(10, nullptr);
    using F = void (*)(void*, void*, void*, void*, void*, void*, void*, void*, void*, void*);
    ASSERT_LE(k.num_inputs + k.num_outputs, 10);
    for (int64_t b = 0; b < k.launch.blocks; ++b) {
      launch(static_cast<unsigned>(b), static_cast<unsigned>(k.launch.blocks));
      reinterpret_cast<F>(fn)(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9]);
    }
  }

 private:
  fs::path dir_;
  void* handle_ = nullptr;
};

// Whether a kernel's result equals the ref backend's: integers and bools exactly, floats within
// the dtype's rounding (the ref backend computes in double, the kernels in f32).
bool close(double got, double want, DType t, bool rows) {
  if (std::isnan(got) || std::isnan(want)) return std::isnan(got) && std::isnan(want);
  if (got == want) return true;
  if (t == DType::i32 || t == DType::boolean) return false;
  const double rtol = t == DType::f32 ? 1e-5 : t == DType::bf16 ? 8e-3 : 1e-3;
  const double atol = (t == DType::f32 ? 1e-6 : t == DType::bf16 ? 1e-2 : 1e-3) * (rows ? 10 : 1);
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

void check(Library& lib, const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.k.label + " (" + c.k.name + ")");
  std::map<int, Bytes> ref = run_ref(*c.g, seed);
  std::vector<Bytes> outs;
  std::vector<void*> args;
  for (int v : c.unit.in_values) args.push_back(ref.at(v).data());
  for (int v : c.unit.out_values) outs.emplace_back(ref.at(v).size(), std::byte{0x5a});  // poisoned
  for (Bytes& o : outs) {
    if (c.k.zero_outputs) std::fill(o.begin(), o.end(), std::byte{0});  // as the launcher does
    args.push_back(o.data());
  }
  lib.run(c.k, args);
  if (::testing::Test::HasFatalFailure()) return;
  const bool rows = c.unit.kind == Unit::Kind::kernel && !c.g->nodes()[c.unit.nodes[0]].prim->elementwise;
  for (size_t k = 0; k < outs.size(); ++k) {
    const TensorType& t = c.g->type(c.unit.out_values[k]);
    const Bytes& want = ref.at(c.unit.out_values[k]);
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double g = ref::load(outs[k].data(), t.dtype, i), w = ref::load(want.data(), t.dtype, i);
      ASSERT_TRUE(close(g, w, t.dtype, rows))
          << "result " << k << " (" << type_str(t) << ") element " << i << ": got " << g << ", the ref backend " << w;
    }
  }
}

// ---- the cases --------------------------------------------------------------------------------

Case single(const Primitive* prim, const std::vector<TensorType>& in, Attrs attrs = {}) {
  Case c;
  c.g = std::make_unique<Graph>();
  std::vector<Tensor> ins;
  for (const TensorType& t : in) ins.push_back(c.g->input(t));
  const std::vector<Tensor> outs = c.g->emit(*prim, ins, std::move(attrs));
  c.g->set_outputs(outs);
  c.unit.kind = Unit::Kind::kernel;
  c.unit.nodes = {0};
  for (const Tensor& t : ins) c.unit.in_values.push_back(t.id());
  for (const Tensor& t : outs) c.unit.out_values.push_back(t.id());
  c.k = cuda::generate(*c.g, c.unit);
  return c;
}

std::vector<Case> single_node_cases() {
  std::vector<Case> cs;
  const Shape s{3, 5, 7};
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    const TensorType x{t, s};
    for (const Primitive* p : {prims::neg(), prims::abs(), prims::exp(), prims::log(), prims::tanh(), prims::sqrt(),
                               prims::rsqrt(), prims::sigmoid(), prims::silu()})
      cs.push_back(single(p, {x}));
    for (const char* form : {"erf", "tanh"}) {
      cs.push_back(single(prims::gelu(), {x}, Attrs{{"approximate", std::string(form)}}));
      cs.push_back(single(prims::gelu_grad(), {x}, Attrs{{"approximate", std::string(form)}}));
    }
    for (const Primitive* p : {prims::add(), prims::sub(), prims::mul(), prims::div(), prims::pow(), prims::maximum(),
                               prims::minimum(), prims::lt(), prims::ge(), prims::ne()})
      cs.push_back(single(p, {x, x}));
    cs.push_back(single(prims::select(), {TensorType{DType::boolean, s}, x, x}));
    for (DType to : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean})
      cs.push_back(single(prims::cast(), {x}, Attrs{{"dtype", to}}));
    cs.push_back(single(prims::full(), {}, Attrs{{"shape", s}, {"value", 0.1}, {"dtype", t}}));
    cs.push_back(single(prims::iota(), {}, Attrs{{"shape", s}, {"axis", int64_t{1}}, {"dtype", t}}));
    cs.push_back(single(prims::broadcast_in_dim(), {TensorType{t, {5}}},
                        Attrs{{"shape", s}, {"dims", std::vector<int64_t>{1}}}));
    cs.push_back(single(prims::broadcast_in_dim(), {TensorType{t, {3, 7}}},
                        Attrs{{"shape", s}, {"dims", std::vector<int64_t>{0, 2}}}));
    // Row kernels.
    const TensorType x3{t, {4, 3, 33}}, x2{t, {6, 33}}, gamma{t, {33}}, stat{DType::f32, {6}};
    for (const Primitive* p : {prims::reduce_sum(), prims::reduce_max()})
      for (const std::vector<int64_t>& axes : {std::vector<int64_t>{2}, {1, 2}, {0}, {0, 2}})
        cs.push_back(single(p, {x3}, Attrs{{"axes", axes}}));
    for (const Primitive* p : {prims::softmax(), prims::log_softmax()})
      for (int64_t axis : {2, 1}) cs.push_back(single(p, {x3}, Attrs{{"axis", axis}}));
    cs.push_back(single(prims::layer_norm(), {x2, gamma, gamma}, Attrs{{"eps", 1e-5}}));
    cs.push_back(single(prims::rms_norm(), {x2, gamma}, Attrs{{"eps", 1e-6}}));
    cs.push_back(single(prims::layer_norm_grad(), {x2, gamma, stat, stat, x2}));
    cs.push_back(single(prims::rms_norm_grad(), {x2, gamma, stat, x2}));
    const TensorType labels{DType::i32, {6}};
    cs.push_back(single(prims::softmax_cross_entropy(), {x2, labels}, Attrs{{"ignore_index", int64_t{-1}}}));
    cs.push_back(single(prims::softmax_cross_entropy_grad(), {x2, labels, stat}, Attrs{{"ignore_index", int64_t{-1}}}));
    // Index, optimizer and random kernels.
    const TensorType idx{DType::i32, {2, 5}};
    cs.push_back(single(prims::take(), {TensorType{t, {11, 8}}, idx}));
    cs.push_back(single(prims::scatter_add(), {idx, TensorType{t, {2, 5, 8}}}, Attrs{{"num_rows", int64_t{11}}}));
    cs.push_back(single(prims::one_hot(), {idx}, Attrs{{"depth", int64_t{7}}, {"dtype", t}}));
    const TensorType scalar{DType::f32, {}}, key{DType::i32, {2}};
    cs.push_back(single(prims::adamw_update(),
                        {TensorType{t, {9, 4}}, TensorType{t, {9, 4}}, TensorType{DType::f32, {9, 4}},
                         TensorType{DType::f32, {9, 4}}, scalar, scalar, scalar},
                        Attrs{{"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"decay", int64_t{1}}}));
    const std::vector<int64_t> shape{4, 6};
    cs.push_back(
        single(prims::random_uniform(), {key}, Attrs{{"shape", shape}, {"dtype", t}, {"lo", -1.0}, {"hi", 1.0}}));
    cs.push_back(single(prims::random_uniform(), {key},
                        Attrs{{"shape", shape},
                              {"dtype", t},
                              {"lo", 0.0},
                              {"hi", 1.0},
                              {"global_shape", std::vector<int64_t>{8, 12}},
                              {"offset", std::vector<int64_t>{4, 6}}}));
    cs.push_back(single(prims::random_normal(), {key}, Attrs{{"shape", shape}, {"dtype", t}}));
  }
  const TensorType i{DType::i32, s}, b{DType::boolean, s};
  for (const Primitive* p : {prims::add(), prims::sub(), prims::mul(), prims::div(), prims::maximum(), prims::lt()})
    cs.push_back(single(p, {i, i}));
  cs.push_back(single(prims::neg(), {i}));
  cs.push_back(single(prims::logical_and(), {b, b}));
  cs.push_back(single(prims::logical_not(), {b}));
  cs.push_back(single(prims::select(), {b, i, i}));
  cs.push_back(single(prims::cast(), {i}, Attrs{{"dtype", DType::bf16}}));
  cs.push_back(
      single(prims::reduce_sum(), {TensorType{DType::i32, {4, 3, 33}}}, Attrs{{"axes", std::vector<int64_t>{2}}}));
  cs.push_back(
      single(prims::reduce_max(), {TensorType{DType::i32, {4, 3, 33}}}, Attrs{{"axes", std::vector<int64_t>{0}}}));
  cs.push_back(single(prims::fold_in(), {TensorType{DType::i32, {2}}}, Attrs{{"data", int64_t{42}}}));
  for (DType t : {DType::f32, DType::bf16, DType::i32, DType::boolean}) {
    const TensorType x{t, {3, 5, 7}};
    cs.push_back(single(prims::transpose(), {x}, Attrs{{"perm", std::vector<int64_t>{2, 0, 1}}}));
    cs.push_back(single(prims::slice(), {x},
                        Attrs{{"starts", std::vector<int64_t>{1, 0, 2}},
                              {"limits", std::vector<int64_t>{3, 5, 7}},
                              {"strides", std::vector<int64_t>{1, 2, 2}}}));
    cs.push_back(single(prims::pad(), {x},
                        Attrs{{"lo", std::vector<int64_t>{1, 0, 2}},
                              {"hi", std::vector<int64_t>{0, 1, 1}},
                              {"interior", std::vector<int64_t>{0, 1, 0}},
                              {"value", 0.5}}));
    cs.push_back(single(prims::concat(), {x, TensorType{t, {3, 2, 7}}, x}, Attrs{{"axis", int64_t{1}}}));
  }
  return cs;
}

// The fused groups and generated kernels of real programs, as the schedule forms them.
void program_cases(const TracedFn& fn, const std::vector<TensorType>& in, std::vector<Case>& cs) {
  auto g = trace(fn, in);
  ScheduleOptions opt;
  opt.backend = &cpu_backend();
  opt.fusion = cpu_backend().fusion();  // the CUDA backend's: reductions stay kernels of their own
  opt.fusion->reductions = false;
  std::shared_ptr<Graph> shared(std::move(g));
  for (const Unit& u : make_schedule(*shared, opt)) {
    const bool gen = u.kind == Unit::Kind::fused ||
                     (u.kind == Unit::Kind::kernel && cuda::can_generate(shared->nodes()[u.nodes[0]].prim));
    if (!gen) continue;
    Case c;
    c.g = shared->clone();
    c.unit = u;
    c.k = cuda::generate(*c.g, c.unit);
    cs.push_back(std::move(c));
  }
}

TEST(CudaEmulated, GeneratedKernelsEqualTheRefBackendOnTheCpu) {
  std::vector<Case> cs = single_node_cases();
  for (DType t : {DType::f32, DType::bf16}) {
    auto mlp = [](const std::vector<Tensor>& a) {
      auto f = [](const std::vector<Tensor>& p) {
        Tensor h = gelu(p[0] * p[1] + p[2], true);
        Tensor y = layer_norm(h + p[0], p[3], p[4]);
        return std::vector<Tensor>{sum(silu(y) * sigmoid(y))};
      };
      return grad(f, {0, 1, 2})(a);
    };
    const TensorType x{t, {8, 16}}, row{t, {16}};
    program_cases(mlp, {x, x, row, row, row}, cs);
    auto block = [](const std::vector<Tensor>& a) {
      auto f = [&](const std::vector<Tensor>& p) {
        Tensor s = tanh(p[0]) * 0.125 + exp(p[0] * -0.5);
        Tensor m = where(greater(p[0], full_like(p[0], 0.0)), s, full_like(s, -1e4));
        Tensor y = rms_norm(softmax(m, -1) + p[0], p[1]);
        return std::vector<Tensor>{mean(softmax_cross_entropy(cast(y, DType::f32), a[2]))};
      };
      return value_and_grad(f, {0, 1})({a[0], a[1]});
    };
    program_cases(block, {x, row, TensorType{DType::i32, {8}}}, cs);
    auto drop = [](const std::vector<Tensor>& a) { return std::vector<Tensor>{dropout(a[0], a[1], 0.1)}; };
    program_cases(drop, {TensorType{DType::i32, {2}}, x}, cs);
  }
  Library lib;
  if (!lib.build(cs)) return;
  int fused = 0;
  for (size_t i = 0; i < cs.size(); ++i) {
    check(lib, cs[i], static_cast<uint32_t>(i + 1));
    fused += cs[i].unit.kind == Unit::Kind::fused;
    if (HasFatalFailure()) return;
  }
  std::printf("%zu generated kernels (%d fused groups) ran on the host and equal the ref backend\n", cs.size(), fused);
  EXPECT_GT(fused, 4);
}

}  // namespace
}  // namespace px
