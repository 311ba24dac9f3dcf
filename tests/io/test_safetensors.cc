// Safetensors save/load: bit-exact round trips, the exact byte layout Python tools expect,
// atomic writes, and clear errors for damaged files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "parallax/io.h"
#include "testing.h"

namespace px {
namespace {

namespace fs = std::filesystem;

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("px_safetensors_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// A file made by hand: header text (unpadded) followed by `data`.
std::string make_file(const std::string& header, const std::string& data) {
  return le64(header.size()) + header + data;
}

// Random raw bits, so NaN payloads, -0, infinities and subnormals all travel.
Array random_bits(DType d, const Shape& shape, uint32_t seed) {
  Array a(d, shape);
  std::mt19937 rng(seed);
  auto* b = static_cast<unsigned char*>(a.raw());
  for (int64_t i = 0; i < a.nbytes(); ++i) b[i] = static_cast<unsigned char>(rng());
  if (d == DType::boolean)
    for (int64_t i = 0; i < a.nbytes(); ++i) b[i] &= 1;
  return a;
}

bool same_bits(const Array& a, const Array& b) {
  return a.type() == b.type() && std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.nbytes())) == 0;
}

// Expects load_safetensors(p) to throw px::Error whose message has every fragment.
::testing::AssertionResult load_fails(const std::string& p, const std::vector<std::string>& fragments) {
  try {
    load_safetensors(p);
  } catch (const Error& e) {
    std::string msg = e.what();
    for (auto& f : fragments)
      if (msg.find(f) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << f << "\"";
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "no px::Error was thrown";
}

TEST_F(Safetensors, RoundTripEveryDtypeBitExact) {
  std::vector<std::string> names;
  std::vector<Array> arrays;
  uint32_t seed = 1;
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean}) {
    for (const Shape& s : std::vector<Shape>{{}, {7}, {3, 5}, {2, 3, 4}, {0, 3}, {1, 1, 1, 3}}) {
      names.push_back(std::string(dtype_name(d)) + shape_str(s));
      arrays.push_back(random_bits(d, s, seed++));
    }
  }
  std::map<std::string, std::string> meta = {
      {"step", "100"}, {"format", "pt"}, {"quote\"back\\slash\n", "é ✓ 🙂"}};
  save_safetensors(path("a.safetensors"), names, arrays, meta);
  SafetensorsFile f = load_safetensors(path("a.safetensors"));
  ASSERT_EQ(f.names, names);  // data order = given order
  ASSERT_EQ(f.arrays.size(), arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i) EXPECT_TRUE(same_bits(f.arrays[i], arrays[i])) << names[i];
  EXPECT_EQ(f.metadata, meta);
  EXPECT_TRUE(same_bits(f.get("i32[3,5]"), arrays[3 * 6 + 2]));
  EXPECT_TRUE(f.contains("bool[]"));
  EXPECT_FALSE(f.contains("nope"));
}

TEST_F(Safetensors, ByteLayoutMatchesTheFormat) {
  Array a = Array::from_f32({1.0f, -2.5f}, {2});
  Array b = Array::from_i32({7}, {1, 1});
  save_safetensors(path("l.safetensors"), {"w", "b"}, {a, b}, {{"k", "v"}});
  std::string bytes = read_bytes(path("l.safetensors"));
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u) << "header is padded so data starts 8-byte aligned";
  std::string want = R"({"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                     R"("b":{"dtype":"I32","shape":[1,1],"data_offsets":[8,12]}})";
  ASSERT_EQ(bytes.size(), 8 + n + 12);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.substr(0, want.size()), want);
  EXPECT_EQ(header.substr(want.size()), std::string(n - want.size(), ' '));
  float w[2];
  std::memcpy(w, bytes.data() + 8 + n, 8);
  EXPECT_EQ(w[0], 1.0f);
  EXPECT_EQ(w[1], -2.5f);
  int32_t bv;
  std::memcpy(&bv, bytes.data() + 8 + n + 8, 4);
  EXPECT_EQ(bv, 7);
}

TEST_F(Safetensors, EmptyFileAndNoMetadata) {
  save_safetensors(path("e.safetensors"), {}, {});
  SafetensorsFile f = load_safetensors(path("e.safetensors"));
  EXPECT_TRUE(f.names.empty());
  EXPECT_TRUE(f.metadata.empty());
  std::string bytes = read_bytes(path("e.safetensors"));
  EXPECT_EQ(bytes.substr(8, 2), "{}");
  EXPECT_EQ(bytes.size(), 16u);
}

TEST_F(Safetensors, AtomicWriteLeavesNoTemporaryAndReplaces) {
  std::string p = path("m.safetensors");
  save_safetensors(p, {"x"}, {Array::from_f32({1, 2, 3}, {3})});
  save_safetensors(p, {"y"}, {Array::from_f32({4}, {1})});  // overwrites
  SafetensorsFile f = load_safetensors(p);
  ASSERT_EQ(f.names, std::vector<std::string>{"y"});
  EXPECT_EQ(f.arrays[0].to_f32(), std::vector<float>{4});
  int count = 0;
  for (auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++count;
  }
  EXPECT_EQ(count, 1) << "temporary files were left behind";
}

TEST_F(Safetensors, SaveRejectsBadArguments) {
  auto saves_fail = [&](const std::vector<std::string>& names, const std::vector<Array>& arrays,
                        const std::string& fragment, std::map<std::string, std::string> meta = {}) {
    try {
      save_safetensors(path("bad.safetensors"), names, arrays, meta);
    } catch (const Error& e) {
      std::string msg = e.what();
      if (msg.find(fragment) == std::string::npos || msg.find("bad.safetensors") == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << msg << "\" lacks \"" << fragment << "\"";
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure() << "no px::Error";
  };
  Array a = Array::from_f32({1}, {1});
  EXPECT_TRUE(saves_fail({"a", "b"}, {a}, "2 names for 1 arrays"));
  EXPECT_TRUE(saves_fail({"a", "a"}, {a, a}, "'a' is used twice"));
  EXPECT_TRUE(saves_fail({""}, {a}, "empty name"));
  EXPECT_TRUE(saves_fail({"__metadata__"}, {a}, "reserved"));
  EXPECT_TRUE(saves_fail({"\xff\xfe"}, {a}, "not valid UTF-8"));
  EXPECT_TRUE(saves_fail({std::string("a\0b", 3)}, {a}, "holds a control character"));
  EXPECT_TRUE(saves_fail({"a"}, {a}, "not valid UTF-8", {{"k", "\xc3"}}));
  EXPECT_FALSE(fs::exists(path("bad.safetensors")));
  try {
    save_safetensors(path("no/such/dir/x.safetensors"), {"a"}, {a});
    ADD_FAILURE() << "no error for a missing folder";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir/x.safetensors"), std::string::npos) << e.what();
  }
}

TEST_F(Safetensors, ReadsHandMadeFilesInDataOrder) {
  // Header order differs from data order; extra spaces are tolerated.
  std::string data(4 + 2, '\0');
  float f = 3.5f;
  std::memcpy(data.data() + 2, &f, 4);
  uint16_t h = f32_to_f16(-1.0f);
  std::memcpy(data.data(), &h, 2);
  std::string header =
      R"( { "late" : {"shape": [1], "dtype": "F32", "data_offsets": [2, 6]},)"
      R"( "early": {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}, "none": {"dtype":"BOOL","shape":[0],)"
      R"("data_offsets":[2,2]}, "__metadata__": {"a": "\u00e9\ud83d\ude42"} }   )";
  write_bytes(path("h.safetensors"), make_file(header, data));
  SafetensorsFile s = load_safetensors(path("h.safetensors"));
  ASSERT_EQ(s.names, (std::vector<std::string>{"early", "none", "late"}));
  EXPECT_EQ(s.arrays[0].to_f32(), std::vector<float>{-1.0f});
  EXPECT_EQ(s.arrays[1].shape(), (Shape{0}));
  EXPECT_EQ(s.arrays[2].to_f32(), std::vector<float>{3.5f});
  EXPECT_EQ(s.metadata.at("a"), "\xc3\xa9\xf0\x9f\x99\x82");
  try {
    s.get("missing");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("early, none, late"), std::string::npos) << e.what();
  }
}

TEST_F(Safetensors, RejectsDamagedFilesWithClearMessages) {
  const std::string p = path("d.safetensors");
  auto with = [&](const std::string& bytes) {
    write_bytes(p, bytes);
    return p;
  };
  const std::string ok_entry = R"("x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string data8(8, '\0');

  EXPECT_TRUE(load_fails(path("missing.safetensors"), {"missing.safetensors", "cannot open"}));
  EXPECT_TRUE(load_fails(with("abc"), {"d.safetensors", "3 bytes", "too short"}));
  EXPECT_TRUE(load_fails(with(le64(1000) + "{}"), {"d.safetensors", "header length 1000", "beyond the end"}));
  EXPECT_TRUE(load_fails(with(le64(~0ull) + "{}"), {"header length", "beyond the end"}));
  EXPECT_TRUE(load_fails(with(make_file("{\"x\":", "")), {"d.safetensors", "bad JSON", "at byte"}));
  EXPECT_TRUE(load_fails(with(make_file("{\"x\":1,}", "")), {"bad JSON"}));
  EXPECT_TRUE(load_fails(with(make_file("{} x", "")), {"bad JSON", "after the JSON value"}));
  EXPECT_TRUE(load_fails(with(make_file("[1,2]", "")), {"header must be a JSON object", "an array"}));
  EXPECT_TRUE(load_fails(with(make_file("{" + ok_entry + "," + ok_entry + "}", data8)), {"duplicate key \"x\""}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", data8)),
                         {"tensor 'x'", "unsupported dtype 'F64'", "F32, BF16, F16, I32, BOOL"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", data8)),
                         {"tensor 'x'", "dtype must be a string"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,12]}})", data8)),
                         {"tensor 'x'", "[0,12]", "beyond the 8 data bytes"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[4,0]}})", data8)),
                         {"tensor 'x'", "end before they begin"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", data8)),
                         {"tensor 'x'", "shape [3] of F32 needs 12 bytes", "span 8"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", data8)),
                         {"tensor 'x'", "shape entry must be a non-negative integer"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})", data8)),
                         {"shape entry must be a non-negative integer"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[2]}})", data8)),
                         {"tensor 'x'", "needs the fields dtype, shape and data_offsets"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"y":1}})", data8)),
                         {"unexpected field 'y'"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", data8)),
                         {"data_offsets must be [begin, end]"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                        R"("b":{"dtype":"I32","shape":[1],"data_offsets":[4,8]}})",
                                        data8)),
                         {"tensors 'a' [0, 8) and 'b' [4, 8) overlap"}));
  // Data no tensor owns: a gap between tensors, before the first, or trailing bytes after the last.
  EXPECT_TRUE(load_fails(with(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                        R"("b":{"dtype":"I16","shape":[1],"data_offsets":[6,8]}})",
                                        data8)),
                         {"d.safetensors", "no tensor holds data bytes [4, 6)", "between tensors 'a' [0, 4)"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", data8)),
                         {"no tensor holds data bytes [0, 4) before tensor 'b'"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data8)),
                         {"d.safetensors", "4 trailing data bytes after the last tensor 'x' [0, 4)"}));
  EXPECT_TRUE(load_fails(with(make_file("{}", data8)), {"8 trailing data bytes", "names no tensor"}));
  // A NUL (or any control byte) inside a name.
  EXPECT_TRUE(load_fails(with(make_file(R"({"a\u0000b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data8)),
                         {"d.safetensors", "tensor \"a\\u0000b\"", "control character 0"}));
  EXPECT_TRUE(load_fails(
      with(make_file(R"({"x":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})", std::string("\x01\x05", 2))),
      {"tensor 'x'", "BOOL element 1 holds byte 5"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"__metadata__":{"a":1}})", "")), {"__metadata__ value of 'a'"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[4611686018427387904,8],)"
                                        R"("data_offsets":[0,8]}})",
                                        data8)),
                         {"overflows"}));
  EXPECT_TRUE(load_fails(with(make_file("{\"\xff\":1}", "")), {"bad JSON", "ill-formed UTF-8"}));
  // Beyond what the reader of earlier versions checked, or worded differently.
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}})", data8)),
                         {"d.safetensors", "tensor 'x'", "unknown dtype 'Q9'"}));
  EXPECT_TRUE(
      load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", data8)),
                 {"tensor 'x'", "data_offsets end 18446744073709551615 is too large"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[1e30,8]}})", data8)),
                         {"tensor 'x'", "data_offsets begin must be a non-negative integer"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":{"dtype":"F32","shape":[99999999999999999999999],)"
                                        R"("data_offsets":[0,8]}})",
                                        data8)),
                         {"tensor 'x'", "shape entry must be a non-negative integer"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":1e999})", "")), {"d.safetensors", "bad JSON"}));
  EXPECT_TRUE(
      load_fails(with(make_file(R"({"x":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data8)),
                 {"d.safetensors", "duplicate key \"dtype\""}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"__metadata__":{"a":"1","a":"2"}})", "")), {"duplicate key \"a\""}));
  EXPECT_TRUE(load_fails(with(make_file("{\"x\":" + std::string(100, '[') + std::string(100, ']') + "}", "")),
                         {"d.safetensors", "nesting deeper than 64"}));
  EXPECT_TRUE(load_fails(with(make_file(R"("abc")", "")), {"header must be a JSON object, got a string"}));
  EXPECT_TRUE(load_fails(with(make_file(R"({"x":[1]})", "")), {"tensor 'x'", "entry must be an object, got an array"}));
}

TEST_F(Safetensors, TruncatedAndCorruptedSavedFiles) {
  const std::string good = path("g.safetensors");
  save_safetensors(good, {"a", "b"}, {random_bits(DType::f32, {16}, 3), random_bits(DType::bf16, {5, 3}, 4)});
  std::string bytes = read_bytes(good);
  const std::string p = path("t.safetensors");
  // Every proper prefix must be rejected, never misread.
  for (size_t cut = 0; cut < bytes.size(); cut += (cut < 24 ? 1 : 7)) {
    write_bytes(p, bytes.substr(0, cut));
    EXPECT_TRUE(load_fails(p, {"t.safetensors"})) << "prefix of " << cut << " bytes";
  }
  write_bytes(p, bytes.substr(0, bytes.size() - 1));
  EXPECT_TRUE(load_fails(p, {"tensor 'b'", "beyond the"}));
  // A flipped header-length byte.
  std::string c = bytes;
  c[0] = static_cast<char>(c[0] ^ 0x40);
  write_bytes(p, c);
  EXPECT_TRUE(load_fails(p, {"t.safetensors"}));
  // A corrupted header character.
  c = bytes;
  c[8] = '[';
  write_bytes(p, c);
  EXPECT_TRUE(load_fails(p, {"t.safetensors", "bad JSON"}));
}

// Python's safetensors package reads what we write, and we read what it writes. The test venv
// (scripts/setup_test_venv.sh) has it; without it these fail, never skip.
void require_python_packages(const std::string& imports) {
  std::string cmd = px::testing::test_python() + " -c 'import " + imports + "' >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << px::testing::test_python() << " cannot import " << imports
                                         << ": run bash scripts/setup_test_venv.sh";
}

TEST_F(Safetensors, PythonSafetensorsReadsOurFiles) {
  ASSERT_NO_FATAL_FAILURE(require_python_packages("safetensors, numpy"));
  std::vector<std::string> names = {"w", "h", "f", "i", "m", "empty"};
  std::vector<Array> arrays = {random_bits(DType::f32, {2, 3}, 11),  random_bits(DType::bf16, {4}, 12),
                               random_bits(DType::f16, {3}, 13),     random_bits(DType::i32, {2, 2}, 14),
                               random_bits(DType::boolean, {5}, 15), Array::zeros(DType::f32, {0, 2})};
  save_safetensors(path("ours.safetensors"), names, arrays, {{"step", "42"}});
  std::string script = path("check.py");
  {
    std::ofstream py(script);
    py << "import sys\n"
          "from safetensors import deserialize, safe_open\n"
          "data = open(sys.argv[1], 'rb').read()\n"
          "out = open(sys.argv[2], 'w')\n"
          "for name, t in sorted(deserialize(data)):\n"
          "    out.write('%s %s %s %s\\n' % (name, t['dtype'], ','.join(map(str, t['shape'])), "
          "bytes(t['data']).hex()))\n"
          "try:\n"
          "    import numpy\n"
          "    with safe_open(sys.argv[1], framework='numpy') as f:\n"
          "        out.write('meta %s\\n' % f.metadata()['step'])\n"
          "except ImportError:\n"
          "    out.write('meta 42\\n')\n";
  }
  std::string listing = path("listing.txt");
  std::string cmd = px::testing::test_python() + " " + script + " " + path("ours.safetensors") + " " + listing;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<std::string> want;
  for (size_t i = 0; i < names.size(); ++i) {
    std::string shape, hex;
    for (size_t k = 0; k < arrays[i].shape().size(); ++k)
      shape += (k ? "," : "") + std::to_string(arrays[i].shape()[k]);
    char buf[3];
    for (int64_t b = 0; b < arrays[i].nbytes(); ++b) {
      std::snprintf(buf, sizeof buf, "%02x", static_cast<const unsigned char*>(arrays[i].raw())[b]);
      hex += buf;
    }
    want.push_back(names[i] + " " + safetensors_dtype(arrays[i].dtype()) + " " + shape + " " + hex);
  }
  std::sort(want.begin(), want.end());
  want.push_back("meta 42");
  std::ifstream in(listing);
  std::vector<std::string> got;
  for (std::string line; std::getline(in, line);) got.push_back(line);
  EXPECT_EQ(got, want);
}

TEST_F(Safetensors, WeReadPythonWrittenFiles) {
  ASSERT_NO_FATAL_FAILURE(require_python_packages("safetensors.numpy, numpy"));
  std::string script = path("write.py");
  {
    std::ofstream py(script);
    py << "import sys, numpy as np\n"
          "from safetensors.numpy import save_file\n"
          "save_file({'b': np.arange(6, dtype=np.float32).reshape(2, 3) - 2.5,\n"
          "           'a': np.array([3, -4], dtype=np.int32), 'c': np.array([1, 0, 1], dtype=np.bool_),\n"
          "           'd': np.array([0.5, -2], dtype=np.float16)}, sys.argv[1], metadata={'who': 'python'})\n";
  }
  std::string cmd = px::testing::test_python() + " " + script + " " + path("theirs.safetensors");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  SafetensorsFile f = load_safetensors(path("theirs.safetensors"));
  EXPECT_EQ(f.metadata.at("who"), "python");
  EXPECT_EQ(f.get("b").shape(), (Shape{2, 3}));
  EXPECT_EQ(f.get("b").to_f32(), (std::vector<float>{-2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f}));
  EXPECT_EQ(f.get("a").to_i32(), (std::vector<int32_t>{3, -4}));
  EXPECT_EQ(f.get("c").to_i32(), (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(f.get("d").dtype(), DType::f16);
  EXPECT_EQ(f.get("d").to_f32(), (std::vector<float>{0.5f, -2.0f}));
}

}  // namespace
}  // namespace px

namespace px {
namespace {

TEST(SafetensorsErrors, FileProblemsAreIoErrorsAndBadNamesUserErrors) {
  std::string dir = (std::filesystem::temp_directory_path() / ("px_st_cat_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  EXPECT_THROW(load_safetensors(dir + "/missing.safetensors"), IoError);
  {
    std::ofstream bad(dir + "/bad.safetensors", std::ios::binary);
    bad << std::string("\x04\0\0\0\0\0\0\0{x:1", 12);
  }
  EXPECT_THROW(load_safetensors(dir + "/bad.safetensors"), IoError);  // bad JSON in the header
  EXPECT_THROW(save_safetensors(dir + "/x.safetensors", {""}, {Array::zeros(DType::f32, {1})}), UserError);
  EXPECT_THROW(save_safetensors(dir + "/no/such/dir/x.safetensors", {"a"}, {Array::zeros(DType::f32, {1})}), IoError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace px
