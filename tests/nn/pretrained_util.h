// Shared by the pretrained tests: temporary folders and the Python helper tests/python/hf_models.py.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "testing.h"

namespace px::testing {

// A fresh folder under the system temp dir, removed with its contents on destruction, unless the
// test has failed by then: its files stay for inspection (the path is printed).
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) {
    path = std::filesystem::temp_directory_path() / ("px_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    if (::testing::Test::HasFailure()) {
      std::fprintf(stderr, "the test failed: its files stay in %s\n", path.c_str());
      return;
    }
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

// Whether the test venv's python exists; tests that need it skip with no_test_python_reason()
// where it does not (scripts/setup_test_venv.sh makes it).
inline bool has_test_python() {
  const std::string py = test_python();
  return py.find('/') == std::string::npos || ::access(py.c_str(), X_OK) == 0;
}
inline std::string no_test_python_reason() {
  return "no test venv python at " + test_python() + "; run scripts/setup_test_venv.sh (or set PX_TEST_PYTHON)";
}

// Runs tests/python/<script> with the test venv's python; returns its exit code and output.
inline int run_test_script(const std::string& script_name, const std::string& args, std::string* output) {
  // __FILE__ is relative to the build folder when ccache rewrites paths; binaries live in <build>/tests.
  std::filesystem::path here(__FILE__);
  if (here.is_relative()) here = std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path() / here;
  const std::string script = (here.parent_path().parent_path() / "python" / script_name).string();
  const std::string cmd = test_python() + " " + script + " " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  return ::pclose(p);
}
inline int hf_python(const std::string& args, std::string* output) {
  return run_test_script("hf_models.py", args, output);
}

// max |got - want| <= tol * max |want| (errors relative to the tensor's scale).
inline ::testing::AssertionResult rel_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs expected " << want.size();
  double scale = 0, worst = 0;
  size_t at = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= worst)) worst = e, at = i;
  }
  if (worst <= tol * std::max(scale, 1e-30)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": got " << got[at] << ", expected " << want[at]
                                       << " (max error " << worst << " > " << tol << " x scale " << scale << ")";
}

}  // namespace px::testing
