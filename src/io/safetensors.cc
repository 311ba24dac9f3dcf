// The safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}),
// then the raw row-major little-endian data, offsets relative to the end of the header.
#include "parallax/io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>
#include <set>

#include "core/enum_names.h"
#include "io/json.h"
#include "io/regular_file.h"

namespace px {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // the reference implementation's limit

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

std::string errno_text() { return std::strerror(errno); }

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      throw IoError(path + ": write failed: " + errno_text());
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

// Reads exactly n bytes at offset; returns false on a short file.
bool read_at(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw IoError(path + ": read failed: " + errno_text());
    }
    if (r == 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

bool dtype_from_safetensors(const std::string& s, DType& d) {
  for (DType c : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean})
    if (s == safetensors_dtype(c)) {
      d = c;
      return true;
    }
  return false;
}

std::string parent_dir(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
  size_t header_index = 0;
};

int64_t to_nonneg_int(const json::Value& v, const std::string& what,
                      const std::function<void(const std::string&)>& fail) {
  if (!v.is_integer() || v.as_int() < 0) fail(what + " must be a non-negative integer, got " + v.dump());
  return v.as_int();
}

}  // namespace

const char* safetensors_dtype(DType d) {
  static constexpr const char* names[] = {"F32", "BF16", "F16", "I32", "BOOL"};  // in DType's order
  static_assert(std::size(names) == static_cast<size_t>(DType::boolean) + 1);
  return enum_name(d, names);
}

const Array& SafetensorsFile::get(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return arrays[i];
  std::string have;
  for (size_t i = 0; i < names.size() && i < 20; ++i) have += (i ? ", " : "") + names[i];
  if (names.size() > 20) have += ", ... (" + std::to_string(names.size()) + " in all)";
  throw UserError("[safetensors] no tensor named '" + name + "'; the file has: " + (have.empty() ? "(none)" : have));
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::find(names.begin(), names.end(), name) != names.end();
}

void save_safetensors(const std::string& path, const std::vector<std::string>& names, const std::vector<Array>& arrays,
                      const std::map<std::string, std::string>& metadata) {
  const std::string where = path;
  if (names.size() != arrays.size())
    throw UserError(where + ": " + std::to_string(names.size()) + " names for " + std::to_string(arrays.size()) +
                " arrays; pass one name per array");
  std::set<std::string> seen;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& n = names[i];
    if (n.empty()) throw UserError(where + ": array " + std::to_string(i) + " has an empty name");
    if (n == "__metadata__") throw UserError(where + ": '__metadata__' is reserved and cannot name a tensor");
    if (!json::valid_utf8(n)) throw UserError(where + ": the name of array " + std::to_string(i) + " is not valid UTF-8");
    if (!seen.insert(n).second) throw UserError(where + ": the name '" + n + "' is used twice");
    if (!arrays[i].defined()) throw UserError(where + ": array '" + n + "' is undefined (no data)");
  }
  for (auto& [k, v] : metadata)
    if (!json::valid_utf8(k) || !json::valid_utf8(v))
      throw UserError(where + ": metadata key or value is not valid UTF-8 (key '" + k + "')");

  json::Value header = json::Value::object();
  if (!metadata.empty()) {
    json::Value m = json::Value::object();
    for (auto& [k, v] : metadata) m.add(k, json::Value::string(v));
    header.add("__metadata__", std::move(m));
  }
  uint64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const Array& a = arrays[i];
    json::Value e = json::Value::object();
    e.add("dtype", json::Value::string(safetensors_dtype(a.dtype())));
    json::Value shape = json::Value::array();
    for (int64_t d : a.shape()) shape.push_back(json::Value::integer(d));
    e.add("shape", std::move(shape));
    uint64_t n = static_cast<uint64_t>(a.nbytes());
    json::Value offs = json::Value::array();
    offs.push_back(json::Value::integer(static_cast<int64_t>(offset)));
    offs.push_back(json::Value::integer(static_cast<int64_t>(offset + n)));
    e.add("data_offsets", std::move(offs));
    header.add(names[i], std::move(e));
    offset += n;
  }
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');

  static std::atomic<uint64_t> counter{0};
  std::string tmp = path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  {
    Fd f;
    f.fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (f.fd < 0) throw IoError(where + ": cannot create temporary file '" + tmp + "': " + errno_text());
    try {
      unsigned char len[8];
      uint64_t hl = text.size();
      for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(hl >> (8 * i));
      write_all(f.fd, len, 8, where);
      write_all(f.fd, text.data(), text.size(), where);
      for (const Array& a : arrays)
        if (a.nbytes() > 0) write_all(f.fd, a.raw(), static_cast<size_t>(a.nbytes()), where);
      if (::fsync(f.fd) != 0) throw IoError(where + ": fsync failed: " + errno_text());
      int fd = f.fd;
      f.fd = -1;
      if (::close(fd) != 0) throw IoError(where + ": close failed: " + errno_text());
    } catch (...) {
      ::unlink(tmp.c_str());
      throw;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string err = errno_text();
    ::unlink(tmp.c_str());
    throw IoError(where + ": cannot rename the temporary file into place: " + err);
  }
  // Make the rename itself durable; failure here leaves a complete file, so it is not an error.
  int dfd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string where = path;
  auto fail = [&](const std::string& what) -> void { throw IoError(where + ": " + what); };

  Fd f;
  f.fd = io::open_for_reading(path, "");
  if (f.fd < 0) fail("cannot open: " + errno_text());
  struct stat st;
  if (::fstat(f.fd, &st) != 0) fail("cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8)
    fail("file is " + std::to_string(file_size) +
         " bytes, too short for the 8-byte header length (truncated, or not a safetensors file)");

  unsigned char len[8];
  if (!read_at(f.fd, len, 8, 0, where)) fail("file is truncated");
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (header_len > file_size - 8)
    fail("header length " + std::to_string(header_len) + " goes beyond the end of the file (" +
         std::to_string(file_size) + " bytes): truncated, or not a safetensors file");
  if (header_len < 2) fail("header length " + std::to_string(header_len) + " is too small for a JSON object");
  if (header_len > kMaxHeaderBytes)
    fail("header length " + std::to_string(header_len) + " exceeds the " + std::to_string(kMaxHeaderBytes) +
         "-byte limit (not a safetensors file?)");
  std::string text(static_cast<size_t>(header_len), '\0');
  if (!read_at(f.fd, text.data(), text.size(), 8, where)) fail("file is truncated inside the header");
  json::Value header;
  try {
    header = json::parse(text, where + ": header");
  } catch (const IoError&) {
    throw;
  } catch (const Error& e) {  // a damaged file: an I/O error like every other problem of the file
    throw IoError(e.what());
  }
  if (!header.is_object()) fail("header must be a JSON object, got " + std::string(json::kind_name(header.kind())));

  const uint64_t data_size = file_size - 8 - header_len;
  SafetensorsFile out;
  std::vector<Entry> entries;
  for (auto& [name, v] : header.members()) {
    if (name == "__metadata__") {
      if (!v.is_object())
        fail("__metadata__ must be an object of strings, got " + std::string(json::kind_name(v.kind())));
      for (auto& [k, s] : v.members()) {
        if (!s.is_string()) fail("__metadata__ value of '" + k + "' must be a string, got " + s.dump());
        out.metadata[k] = s.as_string();
      }
      continue;
    }
    const std::string tw = "tensor '" + name + "': ";
    auto tfail = [&](const std::string& what) { fail(tw + what); };
    if (!v.is_object()) tfail("entry must be an object, got " + std::string(json::kind_name(v.kind())));
    for (auto& [k, unused] : v.members())
      if (k != "dtype" && k != "shape" && k != "data_offsets") tfail("unexpected field '" + k + "'");
    const json::Value* dt = v.find("dtype");
    const json::Value* sh = v.find("shape");
    const json::Value* of = v.find("data_offsets");
    if (!dt || !sh || !of) tfail("entry needs the fields dtype, shape and data_offsets");
    Entry e;
    e.name = name;
    e.header_index = entries.size();
    if (!dt->is_string()) tfail("dtype must be a string, got " + dt->dump());
    if (!dtype_from_safetensors(dt->as_string(), e.dtype))
      tfail("unknown or unsupported dtype '" + dt->as_string() + "' (parallax reads F32, BF16, F16, I32, BOOL)");
    if (!sh->is_array()) tfail("shape must be an array of integers, got " + sh->dump());
    uint64_t count = 1;
    for (auto& d : sh->items()) {
      int64_t n = to_nonneg_int(d, "shape entry", tfail);
      e.shape.push_back(n);
      if (__builtin_mul_overflow(count, static_cast<uint64_t>(n), &count)) tfail("shape " + sh->dump() + " overflows");
    }
    if (!of->is_array() || of->items().size() != 2) tfail("data_offsets must be [begin, end], got " + of->dump());
    e.begin = static_cast<uint64_t>(to_nonneg_int(of->items()[0], "data_offsets begin", tfail));
    e.end = static_cast<uint64_t>(to_nonneg_int(of->items()[1], "data_offsets end", tfail));
    if (e.begin > e.end) tfail("data_offsets " + of->dump() + " end before they begin");
    if (e.end > data_size)
      tfail("data_offsets " + of->dump() + " go beyond the " + std::to_string(data_size) +
            " data bytes in the file (truncated?)");
    uint64_t want = 0;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(dtype_size(e.dtype)), &want))
      tfail("shape " + sh->dump() + " overflows");
    if (want != e.end - e.begin)
      tfail("shape " + shape_str(e.shape) + " of " + dt->as_string() + " needs " + std::to_string(want) +
            " bytes but data_offsets " + of->dump() + " span " + std::to_string(e.end - e.begin));
    entries.push_back(std::move(e));
  }

  // File order; stable so that empty tensors at the same offset keep their header order.
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
  const Entry* last = nullptr;  // the non-empty tensor reaching furthest so far
  for (const Entry& e : entries) {
    if (e.begin == e.end) continue;
    if (last && e.begin < last->end)
      fail("tensors '" + last->name + "' [" + std::to_string(last->begin) + ", " + std::to_string(last->end) +
           ") and '" + e.name + "' [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + ") overlap");
    if (!last || e.end > last->end) last = &e;
  }

  for (const Entry& e : entries) {
    Array a(e.dtype, e.shape);
    size_t n = static_cast<size_t>(e.end - e.begin);
    if (n > 0 && !read_at(f.fd, a.raw(), n, 8 + header_len + e.begin, where))
      fail("file is truncated inside tensor '" + e.name + "'");
    if (e.dtype == DType::boolean) {
      const uint8_t* b = a.data<uint8_t>();
      for (size_t i = 0; i < n; ++i)
        if (b[i] > 1)
          fail("tensor '" + e.name + "': BOOL element " + std::to_string(i) + " holds byte " + std::to_string(b[i]) +
               " (must be 0 or 1)");
    }
    out.names.push_back(e.name);
    out.arrays.push_back(std::move(a));
  }
  return out;
}

}  // namespace px
