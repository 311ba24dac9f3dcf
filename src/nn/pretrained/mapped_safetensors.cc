// Memory-mapped safetensors reading for pretrained checkpoints.
#include "nn/pretrained/mapped_safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "io/regular_file.h"
#include "io/safetensors.h"

namespace px::nn::detail {

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
  if (fd < 0) throw IoError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError(path + ": cannot stat: " + std::strerror(err));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {  // an empty file cannot be mapped; the header check below refuses it
    base_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base_ == MAP_FAILED) {
      base_ = nullptr;
      const int err = errno;
      ::close(fd);
      throw IoError(path + ": mmap failed: " + std::strerror(err));
    }
  }
  ::close(fd);
  const auto* bytes = static_cast<const std::byte*>(base_);
  io::SafetensorsHeader header;
  try {
    header = io::read_safetensors_header(path, size_, [&](void* dst, size_t n, uint64_t offset) {
      if (offset > size_ || n > size_ - offset) return false;
      std::memcpy(dst, bytes + offset, n);
      return true;
    });
  } catch (const IoError& e) {
    if (base_) ::munmap(base_, size_);
    base_ = nullptr;
    throw IoError(e.what() + refetch);
  }
  for (const io::SafetensorsTensor& h : header.tensors) {
    MappedTensor t;
    t.dtype = h.dtype;
    t.shape = h.shape;
    t.data = bytes + header.data_offset + h.begin;
    t.nbytes = h.end - h.begin;
    tensors_.emplace(h.name, std::move(t));
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
