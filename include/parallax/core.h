// Core value types: DType, Shape, Error and Array (concrete host data).
//
//   px::Array a = px::Array::from_f32({1, 2, 3, 4}, {2, 2});
//   std::vector<float> v = a.to_f32();     // {1, 2, 3, 4}
//   px::Array z = px::Array::zeros(px::DType::bf16, {8, 16});
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "parallax/memory.h"

namespace px {

// The base of every exception the library throws: `catch (const px::Error&)` sees them all.
// Thrown as is for bad user input in older code; new code throws one of the categories below.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};
// Bad input (shapes, dtypes, configs, options): the message names the thing at fault and the fix.
class UserError : public Error {
 public:
  using Error::Error;
};
// A file or the operating system failed (cannot open, truncated, disk full); names the path.
class IoError : public Error {
 public:
  using Error::Error;
};
// A broken invariant inside the library: a bug. The message says so and asks for a report with
// the context given; catch it to log, never to carry on.
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& what);
};

enum class DType : uint8_t { f32, bf16, f16, i32, boolean };

int64_t dtype_size(DType d);
const char* dtype_name(DType d);
DType dtype_from_name(const std::string& name);  // throws px::Error on unknown names
inline bool is_float(DType d) { return d == DType::f32 || d == DType::bf16 || d == DType::f16; }

using Shape = std::vector<int64_t>;
// The element count; throws px::UserError naming the shape when a dim is negative or the
// count does not fit in int64.
int64_t numel(const Shape& s);
// The byte size of `count` elements of `d`; throws px::UserError naming `what` on overflow.
int64_t checked_nbytes(int64_t count, DType d, const std::string& what);
std::string shape_str(const Shape& s);  // "[2,3]"
// Normalizes a possibly negative axis against `rank`; throws naming `op` when out of range.
int normalize_axis(int64_t axis, int rank, const char* op);

// The one glob syntax of the library (optimizer masks, sharding rules): '*' matches any run of
// characters (dots included), '?' exactly one character, anything else itself.
bool glob_match(const std::string& pattern, const std::string& text);

struct TensorType {
  DType dtype = DType::f32;
  Shape shape;
  int64_t numel() const { return px::numel(shape); }
  int64_t nbytes() const;  // checked like numel()
  int rank() const { return static_cast<int>(shape.size()); }
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorType& o) const { return !(*this == o); }
};
std::string type_str(const TensorType& t);  // "f32[2,3]"

// bf16 / f16 conversions (round to nearest even).
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);

// Dense, contiguous, row-major host data. Copies share the buffer (like a handle);
// use clone() for a deep copy.
class Array {
 public:
  Array() = default;
  // Uninitialized, 64-byte aligned, counted at `where` (memory_stats).
  Array(DType dtype, Shape shape, Placement where = {});
  static Array zeros(DType dtype, const Shape& shape);
  static Array from_f32(const std::vector<float>& v, const Shape& shape, DType dtype = DType::f32);
  static Array from_i32(const std::vector<int32_t>& v, const Shape& shape);
  static Array scalar(float v, DType dtype = DType::f32) { return from_f32({v}, {}, dtype); }
  // Adopts `data`, host memory another library allocated (a NumPy array, a torch tensor), without a
  // copy: the Array views it as `type` (dense, row-major) and holds `owner` until the last Array
  // sharing the buffer is gone, then lets go of it (owner's deleter releases the memory; Parallax
  // never frees it, and memory_stats does not count it). `data` must be aligned to the element
  // size (adoptable(); the kernels load vectors unaligned, so Parallax's own 64-byte alignment is
  // a speed-up, not a need); else px::UserError: copy it instead. An adopted Array is never its
  // buffer's sole_owner() (the other library holds the memory too), so programs never write their
  // results into it unless it is donated explicitly; a `read_only` one is never written at all:
  // donating it is a px::UserError.
  static Array adopt(void* data, TensorType type, std::shared_ptr<void> owner, bool read_only = false);
  static bool adoptable(const void* data, DType dtype) {
    return data != nullptr && reinterpret_cast<uintptr_t>(data) % static_cast<uintptr_t>(dtype_size(dtype)) == 0;
  }
  bool adopted() const;    // made by adopt(): the memory belongs to another library
  bool read_only() const;  // adopted read-only: nothing may write into it

  DType dtype() const { return type_.dtype; }
  const Shape& shape() const { return type_.shape; }
  const TensorType& type() const { return type_; }
  int64_t numel() const { return type_.numel(); }
  int64_t nbytes() const { return type_.nbytes(); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  const Placement& placement() const { return where_; }  // device and memory kind

  void* raw() { return data_.get(); }
  const void* raw() const { return data_.get(); }
  template <class T> T* data() { return static_cast<T*>(raw()); }
  template <class T> const T* data() const { return static_cast<const T*>(raw()); }

  std::vector<float> to_f32() const;    // converts any dtype
  std::vector<int32_t> to_i32() const;  // i32 and bool only
  Array astype(DType d) const;
  Array clone() const;
  Array to(const Placement& p) const;  // a copy at p (another device or memory kind); *this when already there
  // *this when the host may read and write its memory through raw() (px::host_visible), else a
  // copy in host memory: what host code that reads an array's bytes takes first.
  Array on_host() const;
  Array reshape(const Shape& s) const;  // shares the buffer
  // True when no other Array shares this buffer (so writing into it is invisible elsewhere).
  // Never for adopted memory, which its library also holds.
  bool sole_owner() const { return data_.use_count() <= 1 && !adopted(); }

 private:
  TensorType type_;
  Placement where_;
  std::shared_ptr<std::byte> data_;
};

// An array that is not in memory (a tensor in a file): `read(offsets, out)` fills `out` with the
// box of the array that starts at `offsets` and has out's shape (px::shard reads a shard this way,
// nn::load_pretrained_slices hands them out).
using BoxReader = std::function<void(const std::vector<int64_t>& offsets, Array& out)>;

}  // namespace px
