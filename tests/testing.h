// Helpers shared by the test suites: run a traced function, compare with a reference, and
// check gradients against central finite differences.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>

#include <unistd.h>

#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "parallax/runtime.h"
#include "parallax/train.h"

namespace px::testing {

// A training step's options on a mesh: `rest` with the mesh, the strategy and its options set.
inline TrainStepOptions on_mesh(Mesh mesh, ShardingStrategy strategy, ShardingOptions sharding = {},
                                TrainStepOptions rest = {}) {
  rest.mesh = std::move(mesh);
  rest.strategy = strategy;
  rest.sharding = std::move(sharding);
  return rest;
}

// The message of the px::Error that f throws, or "<no error>".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

// A cluster file (as a user writes one) of devices slow at compute beside fast links: splitting the
// work pays for the tests' micro models, whatever the speed of the machine running the test. The
// caller removes it.
inline std::string compute_bound_cluster() {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("px_compute_bound_" + std::to_string(::getpid()) + ".toml")).string();
  std::ofstream(path) << R"(name = "compute_bound"
overlap_collectives = false
[device]
matmul_flops_f32 = 1e9
vector_flops = 1e9
memory_bandwidth = 1e11
memory_bytes = 16e9
launch_s = 1e-6
[intra_node]
bandwidth_bytes_per_s = 1e11
latency_s = 1e-6
)";
  return path;
}

// The message of the px::UserError that f throws (bad input must throw one), "not a UserError: ..."
// for another exception, "" for none.
inline std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a UserError: ") + e.what();
  }
  return "";
}

// The Python of the test virtual environment (scripts/setup_test_venv.sh makes it): PX_TEST_PYTHON
// when set, else <repo>/.venv-test/bin/python (PX_TEST_VENV_PYTHON, compiled in by
// tests/CMakeLists.txt). Interop tests fail, not skip, when it lacks a package: CI runs the
// set-up script, and a newcomer's test command does too.
inline std::string test_python() {
  const char* p = std::getenv("PX_TEST_PYTHON");
  if (p && *p) return p;
#ifdef PX_TEST_VENV_PYTHON
  return PX_TEST_VENV_PYTHON;
#else
  return "python3";
#endif
}

inline std::vector<TensorType> types_of(const std::vector<Array>& xs) {
  std::vector<TensorType> t;
  for (auto& x : xs) t.push_back(x.type());
  return t;
}

// Traces fn on the inputs' types, compiles and runs it once.
inline std::vector<Array> eval(const TracedFn& fn, const std::vector<Array>& inputs, const CompileOptions& opt = {}) {
  auto g = trace(fn, types_of(inputs));
  auto exe = Executable::compile(*g, opt);
  return exe->run(inputs);
}
inline Array eval1(const TracedFn& fn, const std::vector<Array>& inputs, const CompileOptions& opt = {}) {
  return eval(fn, inputs, opt).at(0);
}

// Compiles fn's trace as it is (CompileOptions::optimize off) and with every pass, runs both on the
// inputs and expects each result to keep its type and bits; returns the optimized executable (for
// what its graph holds).
inline std::unique_ptr<Executable> compile_keeping_bits(const TracedFn& fn, const std::vector<Array>& inputs) {
  auto g = trace(fn, types_of(inputs));
  CompileOptions off;
  off.optimize = false;
  std::vector<Array> want = Executable::compile(*g, off)->run(inputs);
  auto exe = Executable::compile(*g);
  std::vector<Array> got = exe->run(inputs);
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    EXPECT_EQ(got[i].type(), want[i].type()) << "result " << i;
    EXPECT_EQ(got[i].to_f32(), want[i].to_f32()) << "result " << i;
  }
  return exe;
}

inline Array random_array(const Shape& shape, DType dtype = DType::f32, uint32_t seed = 1, float lo = -1.0f,
                          float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(numel(shape)));
  for (auto& x : v) x = dtype == DType::i32 ? std::floor(u(rng)) : u(rng);
  return Array::from_f32(v, shape, dtype);
}

inline ::testing::AssertionResult all_close(const std::vector<float>& got, const std::vector<float>& want,
                                            double atol = 1e-5, double rtol = 1e-5) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs expected " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    bool same_inf = std::isinf(got[i]) && got[i] == want[i];
    if (both_nan || same_inf) continue;
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])))
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << ", expected " << want[i]
                                           << " (atol " << atol << ", rtol " << rtol << ")";
  }
  return ::testing::AssertionSuccess();
}

// Checks d(sum(fn(x)[0] * r))/dx for the float inputs in `wrt` (default: all float inputs)
// against central differences, with a fixed random cotangent r. Inputs must be f32.
inline ::testing::AssertionResult check_grads(const TracedFn& fn, const std::vector<Array>& inputs,
                                              std::vector<int> wrt = {}, double eps = 1e-3, double atol = 2e-3,
                                              double rtol = 2e-2) {
  if (wrt.empty())
    for (size_t i = 0; i < inputs.size(); ++i)
      if (inputs[i].dtype() == DType::f32) wrt.push_back(static_cast<int>(i));
  auto probe = trace(fn, types_of(inputs));
  TensorType out_t = probe->type(probe->outputs().at(0));
  Array r = random_array(out_t.shape, DType::f32, 1234);
  // Scalar objective L(x) = sum(f(x) * r).
  TracedFn objective = [&](const std::vector<Tensor>& in) {
    std::vector<Tensor> real(in.begin(), in.end() - 1);
    Tensor y = cast(fn(real).at(0), DType::f32);
    return std::vector<Tensor>{sum(y * in.back())};
  };
  std::vector<Array> args = inputs;
  args.push_back(r);
  TracedFn with_grads = [&](const std::vector<Tensor>& in) {
    Tensor l = objective(in).at(0);
    std::vector<Tensor> xs;
    for (int w : wrt) xs.push_back(in[w]);
    std::vector<Tensor> d = gradients(l, xs);
    d.insert(d.begin(), l);
    return d;
  };
  std::vector<Array> analytic = eval(with_grads, args);
  auto obj_exe = Executable::compile(*trace(objective, types_of(args)));
  for (size_t k = 0; k < wrt.size(); ++k) {
    Array x = args[wrt[k]].clone();
    std::vector<Array> a = args;
    a[wrt[k]] = x;
    std::vector<float> got = analytic[k + 1].to_f32();
    for (int64_t i = 0; i < x.numel(); ++i) {
      float orig = x.data<float>()[i];
      x.data<float>()[i] = orig + static_cast<float>(eps);
      double lp = obj_exe->run(a)[0].to_f32()[0];
      x.data<float>()[i] = orig - static_cast<float>(eps);
      double lm = obj_exe->run(a)[0].to_f32()[0];
      x.data<float>()[i] = orig;
      double fd = (lp - lm) / (2 * eps);
      if (!(std::fabs(got[i] - fd) <= atol + rtol * std::fabs(fd)))
        return ::testing::AssertionFailure()
               << "d/d(input " << wrt[k] << ")[" << i << "]: autodiff " << got[i] << ", finite difference " << fd;
    }
  }
  return ::testing::AssertionSuccess();
}

// Expects fn to throw px::Error at trace time with a message containing every fragment.
inline ::testing::AssertionResult throws_error(const TracedFn& fn, const std::vector<TensorType>& types,
                                               const std::vector<std::string>& fragments) {
  try {
    trace(fn, types);
  } catch (const Error& e) {
    std::string msg = e.what();
    for (auto& f : fragments)
      if (msg.find(f) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << f << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no px::Error was thrown";
}

}  // namespace px::testing
