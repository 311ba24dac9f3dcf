// The zarr Python package (the test venv's, scripts/setup_test_venv.sh) reads a sharded checkpoint
// as it is: every array bit for bit, with the dtype zarr reports, and the group lists them all.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "ckpt_testing.h"
#include "io/zarr.h"
#include "testing.h"

namespace px {
namespace {

using testing::CheckpointTest;

// test_python(), or the repository's .venv-test when PX_TEST_PYTHON does not reach this test
// (CMake 3.25's gtest_discover_tests splits the ENVIRONMENT list of tests/CMakeLists.txt).
std::string python() {
  if (std::getenv("PX_TEST_PYTHON")) return testing::test_python();
  namespace fs = std::filesystem;
  // The build folder is usually <repo>/build: the binary is <repo>/build/tests/<name>.
  fs::path exe = fs::read_symlink("/proc/self/exe");
  for (fs::path repo : {exe.parent_path().parent_path().parent_path(),
                        fs::absolute(__FILE__).parent_path().parent_path().parent_path()}) {
    fs::path venv = repo / ".venv-test/bin/python";
    if (fs::exists(venv)) return venv.string();
  }
  return testing::test_python();
}

TEST_F(CheckpointTest, ZarrPythonReadsEveryArrayBitForBit) {
  const Mesh mesh = Mesh::cpu({{"data", 4}, {"model", 2}});
  struct Spec {
    const char* name;
    DType dtype;
    Shape shape;
    PartitionSpec spec;
  };
  const std::vector<Spec> specs = {
      {"blocks.0.w", DType::f32, {16, 8}, {"data", "model"}},   {"blocks.0.w.m", DType::f32, {16, 8}, {"data"}},
      {"emb", DType::bf16, {8, 6}, {"data", px::none}},         {"half", DType::f16, {4, 10}, {px::none, "model"}},
      {"ids", DType::i32, {24}, {{"data", "model"}}},           {"bias", DType::f32, {5}, {}},
      {"scalar", DType::f32, {}, {}},                            {"mask", DType::boolean, {8, 2}, {"data"}},
      {"empty", DType::f32, {0, 4}, {}},
  };
  Checkpoint c(42);
  std::filesystem::create_directories(path("expect"));
  std::string listing = "{";
  uint32_t seed = 3;
  for (const Spec& s : specs) {
    Array a = testing::random_bits(s.dtype, s.shape, seed++);
    c.add(s.name, shard(a, Sharding(mesh, s.spec)));
    testing::write_bytes(path("expect/") + s.name + ".bin",
                         std::string(static_cast<const char*>(a.raw()), static_cast<size_t>(a.nbytes())));
    listing += std::string(listing.size() > 1 ? ", " : "") + "\"" + s.name + "\": [\"" + zarr::data_type_name(s.dtype) +
               "\", \"" + (s.dtype == DType::bf16 ? "bfloat16" : dtype_name(s.dtype)) + "\"]";
  }
  testing::write_bytes(path("expect/names.json"), listing + "}");
  CheckpointManager m(path("ckpt"));
  m.save(c);

  const std::string script = path("read.py");
  testing::write_bytes(script, R"(
import json, sys
import numpy as np
import zarr
root, expect = sys.argv[1], sys.argv[2]
names = json.load(open(expect + "/names.json"))
group = zarr.open_group(root, mode="r")
assert sorted(group.array_keys()) == sorted(names), (sorted(group.array_keys()), sorted(names))
assert group.attrs["parallax"]["step"] == 42
for name, (zdtype, pxdtype) in names.items():
    a = zarr.open_array(root + "/" + name, mode="r")
    assert str(a.dtype) == zdtype, (name, a.dtype, zdtype)
    assert a.attrs["parallax"]["dtype"] == pxdtype, (name, a.attrs["parallax"])
    got = np.ascontiguousarray(a[...]).tobytes()
    want = open(expect + "/" + name + ".bin", "rb").read()
    assert got == want, name + ": bytes differ"
print("zarr read", len(names), "arrays bit for bit")
)");
  std::string cmd = python() + " " + script + " " + m.path(42) + " " + path("expect") + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  int rc = ::pclose(p);
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  EXPECT_NE(out.find("zarr read 9 arrays bit for bit"), std::string::npos) << out;
}

}  // namespace
}  // namespace px
