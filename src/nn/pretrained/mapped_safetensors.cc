// Memory-mapped safetensors reading for pretrained checkpoints.
#include "nn/pretrained/mapped_safetensors.h"
#include "io/regular_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

namespace px::nn::detail {

namespace {
int64_t dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return -1;
}

}  // namespace

float read_f16(const std::byte* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      uint32_t m = man;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400u) == 0);
      bits = sign | ((127 - 15 - e) << 23) | ((m & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

int64_t MappedTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

MappedSafetensors::MappedSafetensors(const std::string& path) : path_(path) {
  const std::string refetch = "; download or copy the file again (it must be a complete safetensors file)";
  int fd = io::open_for_reading(path, "[safetensors] ");
  if (fd < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(path + ": cannot stat: " + std::strerror(errno));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw Error(path + ": truncated: " + std::to_string(size_) + " bytes, shorter than the 8-byte header length" +
                refetch);
  }
  base_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw Error(path + ": mmap failed: " + std::strerror(errno));
  }
  auto fail = [&](const std::string& m) {
    ::munmap(base_, size_);
    base_ = nullptr;
    throw Error(path + ": " + m);
  };
  const auto* bytes = static_cast<const std::byte*>(base_);
  uint64_t header_len;
  std::memcpy(&header_len, bytes, 8);
  if (header_len > size_ - 8)
    fail("truncated: the header claims " + std::to_string(header_len) + " bytes but the file has " +
         std::to_string(size_) + refetch);
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(reinterpret_cast<const char*>(bytes) + 8,
                                   reinterpret_cast<const char*>(bytes) + 8 + header_len);
  } catch (const std::exception& e) {
    fail(std::string("bad safetensors header (") + e.what() + ")" + refetch);
  }
  if (!header.is_object()) fail("bad safetensors header: not a JSON object" + refetch);
  const uint64_t data_begin = 8 + header_len, data_bytes = size_ - data_begin;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    try {
      MappedTensor t;
      t.dtype = v.at("dtype").get<std::string>();
      t.shape = v.at("shape").get<std::vector<int64_t>>();
      auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
      if (off.size() != 2 || off[0] > off[1]) fail("tensor '" + name + "' has bad data_offsets" + refetch);
      if (off[1] > data_bytes)
        fail("truncated: tensor '" + name + "' ends at byte " + std::to_string(data_begin + off[1]) +
             " but the file has " + std::to_string(size_) + refetch);
      t.nbytes = off[1] - off[0];
      const int64_t eb = dtype_bytes(t.dtype);
      if (eb > 0 && static_cast<uint64_t>(t.numel() * eb) != t.nbytes)
        fail("tensor '" + name + "' of shape and dtype " + t.dtype + " needs " + std::to_string(t.numel() * eb) +
             " bytes but its offsets span " + std::to_string(t.nbytes) + refetch);
      t.data = bytes + data_begin + off[0];
      tensors_.emplace(name, std::move(t));
    } catch (const nlohmann::json::exception& e) {
      fail("bad entry for tensor '" + name + "' (" + e.what() + ")" + refetch);
    }
  }
}

MappedSafetensors::~MappedSafetensors() {
  if (base_) ::munmap(base_, size_);
}

const MappedTensor* MappedSafetensors::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

ElementReader element_reader(const MappedTensor& t, const std::string& file, const std::string& name) {
  if (t.dtype == "F32") return read_f32;
  if (t.dtype == "BF16") return read_bf16;
  if (t.dtype == "F16") return read_f16;
  if (t.dtype == "F64") return read_f64;
  throw Error(file + ": tensor '" + name + "' has dtype " + t.dtype +
              "; pretrained weights must be F32, BF16, F16 or F64 (save the model in one of them)");
}

}  // namespace px::nn::detail
