// Helpers for the checkpoint tests: a fresh directory per test, random raw bits, exact equality.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "parallax/checkpoint.h"

namespace px::testing {

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("px_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::filesystem::path dir_;
};

// Random raw bits, so NaN payloads, -0, infinities and subnormals all travel (bool: 0 or 1).
inline Array random_bits(DType d, const Shape& shape, uint32_t seed) {
  Array a(d, shape);
  std::mt19937 rng(seed);
  auto* b = static_cast<unsigned char*>(a.raw());
  for (int64_t i = 0; i < a.nbytes(); ++i) b[i] = static_cast<unsigned char>(d == DType::boolean ? rng() & 1 : rng());
  return a;
}

inline ::testing::AssertionResult same_bits(const Array& got, const Array& want) {
  if (got.type() != want.type())
    return ::testing::AssertionFailure() << "type " << type_str(got.type()) << " vs " << type_str(want.type());
  if (want.nbytes() > 0 && std::memcmp(got.raw(), want.raw(), static_cast<size_t>(want.nbytes())) != 0)
    return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

inline std::string read_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace px::testing
