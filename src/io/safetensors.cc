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
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/enum_names.h"
#include "io/json_number.h"
#include "io/regular_file.h"
#include "io/safetensors.h"

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

using Json = nlohmann::ordered_json;  // keeps the header's key order

// Strings go out as JSON only when they are UTF-8: nlohmann's writer checks it.
bool valid_utf8(const std::string& s) {
  try {
    (void)Json(s).dump();
    return true;
  } catch (const Json::exception&) {
    return false;
  }
}

// nlohmann's "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..."
// without its prefixes and echo of the input, for a message that names the byte itself.
std::string json_problem(const Json::exception& e) {
  std::string m = e.what();
  if (m.find("expected end of input") != std::string::npos) return "unexpected text after the JSON value";
  size_t p = m.find("] ");
  if (p != std::string::npos) m = m.substr(p + 2);
  p = m.find(": ");
  if (m.rfind("parse error", 0) == 0 && p != std::string::npos) m = m.substr(p + 2);
  const size_t last = m.find("; last read: ");  // the raw bytes (maybe not UTF-8): the byte offset says where
  if (last != std::string::npos) {
    const size_t expected = m.rfind("; expected");
    m.erase(last, (expected != std::string::npos && expected > last ? expected : m.size()) - last);
  }
  return m;
}

// A header is at most three deep ({name: {shape: [...]}}); deeper nesting is refused early.
constexpr int kMaxDepth = 64;

// The header text as JSON; duplicate keys are refused (nlohmann would keep one of them).
Json parse_header_json(const std::string& text, const std::string& where) {
  std::vector<std::set<std::string>> keys;  // of each object being parsed
  Json::parser_callback_t check = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start || event == Json::parse_event_t::array_start) {
      if (depth >= kMaxDepth) throw IoError(where + ": bad JSON: nesting deeper than " + std::to_string(kMaxDepth));
      if (event == Json::parse_event_t::object_start) keys.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      keys.pop_back();
    } else if (event == Json::parse_event_t::key) {
      const std::string& k = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(k).second) throw IoError(where + ": bad JSON: duplicate key \"" + k + "\"");
    }
    return true;
  };
  try {
    return Json::parse(text, check);
  } catch (const Json::parse_error& e) {
    throw IoError(where + ": bad JSON at byte " + std::to_string(e.byte) + ": " + json_problem(e));
  } catch (const Json::exception& e) {  // e.g. a number past double's range
    throw IoError(where + ": bad JSON: " + json_problem(e));
  }
}

// "an array", "a string", ... for messages.
std::string kind_of(const Json& v) {
  const std::string t = v.type_name();
  if (v.is_null()) return t;
  return (t[0] == 'a' || t[0] == 'o' ? "an " : "a ") + t;
}

// A non-negative integer that fits int64 (shape dims and offsets), else fail().
template <class Fail>
uint64_t non_negative(const Json& v, const std::string& what, const Fail& fail) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail(what + " " + json_excerpt(v) + " is too large");
    return u;
  }
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    fail(what + " must be a non-negative integer, got " + json_excerpt(v));
  return static_cast<uint64_t>(v.get<int64_t>());
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
    if (!valid_utf8(n)) throw UserError(where + ": the name of array " + std::to_string(i) + " is not valid UTF-8");
    if (std::any_of(n.begin(), n.end(), [](unsigned char c) { return c < 0x20 || c == 0x7f; }))
      throw UserError(where + ": the name of array " + std::to_string(i) + " holds a control character (NUL, newline, ...)");
    if (!seen.insert(n).second) throw UserError(where + ": the name '" + n + "' is used twice");
    if (!arrays[i].defined()) throw UserError(where + ": array '" + n + "' is undefined (no data)");
  }
  for (auto& [k, v] : metadata)
    if (!valid_utf8(k) || !valid_utf8(v))
      throw UserError(where + ": metadata key or value is not valid UTF-8 (key '" + k + "')");

  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const Array& a = arrays[i];
    const uint64_t n = static_cast<uint64_t>(a.nbytes());
    header[names[i]] = {
        {"dtype", safetensors_dtype(a.dtype())}, {"shape", a.shape()}, {"data_offsets", {offset, offset + n}}};
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
      for (const Array& device_array : arrays)
        if (const Array a = device_array.on_host(); a.nbytes() > 0)
          write_all(f.fd, a.raw(), static_cast<size_t>(a.nbytes()), where);
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

namespace io {

int64_t safetensors_dtype_bytes(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

SafetensorsHeader read_safetensors_header(const std::string& path, uint64_t file_size, const ReadAt& read) {
  auto fail = [&](const std::string& what) -> void { throw IoError(path + ": " + what); };
  if (file_size < 8)
    fail("file is " + std::to_string(file_size) +
         " bytes, too short for the 8-byte header length (truncated, or not a safetensors file)");
  unsigned char len[8];
  if (!read(len, 8, 0)) fail("file is truncated");
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
  if (!read(text.data(), text.size(), 8)) fail("file is truncated inside the header");
  const Json header = parse_header_json(text, path + ": header");
  if (!header.is_object()) fail("header must be a JSON object, got " + kind_of(header));

  SafetensorsHeader out;
  out.data_offset = 8 + header_len;
  const uint64_t data_size = file_size - out.data_offset;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ must be an object of strings, got " + kind_of(v));
      for (auto& [k, s] : v.items()) {
        if (!s.is_string()) fail("__metadata__ value of '" + k + "' must be a string, got " + json_excerpt(s));
        out.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string tw = "tensor '" + name + "': ";  // (clang lambdas cannot capture a structured binding)
    auto tfail = [&](const std::string& what) { fail(tw + what); };
    if (name.empty()) fail("a tensor has an empty name");
    for (unsigned char c : name)
      if (c < 0x20 || c == 0x7f)
        fail("tensor " + Json(name).dump() + ": the name holds control character " + std::to_string(c) +
             " (a NUL or control byte in a name is a damaged header: such a name cannot be matched or printed)");
    if (!v.is_object()) tfail("entry must be an object, got " + kind_of(v));
    for (auto& [k, unused] : v.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets") tfail("unexpected field '" + k + "'");
    if (!v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      tfail("entry needs the fields dtype, shape and data_offsets");
    const Json &dt = v.at("dtype"), &sh = v.at("shape"), &of = v.at("data_offsets");
    SafetensorsTensor t;
    t.name = name;
    if (!dt.is_string()) tfail("dtype must be a string, got " + json_excerpt(dt));
    t.dtype = dt.get<std::string>();
    const int64_t element_bytes = safetensors_dtype_bytes(t.dtype);
    if (element_bytes == 0)
      tfail("unknown dtype '" + t.dtype +
            "' (safetensors defines F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL, F8_E4M3, "
            "F8_E5M2)");
    if (!sh.is_array()) tfail("shape must be an array of integers, got " + json_excerpt(sh));
    uint64_t count = 1;
    for (const Json& d : sh) {
      const uint64_t n = non_negative(d, "shape entry", tfail);
      t.shape.push_back(static_cast<int64_t>(n));
      if (__builtin_mul_overflow(count, n, &count)) tfail("shape " + json_excerpt(sh) + " overflows");
    }
    if (!of.is_array() || of.size() != 2) tfail("data_offsets must be [begin, end], got " + json_excerpt(of));
    t.begin = non_negative(of[0], "data_offsets begin", tfail);
    t.end = non_negative(of[1], "data_offsets end", tfail);
    if (t.begin > t.end) tfail("data_offsets " + of.dump() + " end before they begin");
    if (t.end > data_size)
      tfail("data_offsets " + of.dump() + " go beyond the " + std::to_string(data_size) +
            " data bytes in the file (truncated?)");
    uint64_t want = 0;
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(element_bytes), &want))
      tfail("shape " + json_excerpt(sh) + " overflows");
    if (want != t.end - t.begin)
      tfail("shape " + shape_str(t.shape) + " of " + t.dtype + " needs " + std::to_string(want) +
            " bytes but data_offsets " + of.dump() + " span " + std::to_string(t.end - t.begin));
    out.tensors.push_back(std::move(t));
  }

  // Data order (an empty tensor before a non-empty one at its offset); stable so that empty
  // tensors at the same offset keep their header order. As the
  // format's reference reader does, the tensors must tile the data exactly: each begins where the
  // one before it ends, the first at 0, the last at the end of the file. A gap or trailing bytes
  // are data no tensor owns (a damaged or hand-edited header), refused rather than skipped.
  std::stable_sort(out.tensors.begin(), out.tensors.end(),
                   [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  const SafetensorsTensor* last = nullptr;  // the tensor ending where the data read so far ends
  auto span = [](const SafetensorsTensor& t) {
    return "'" + t.name + "' [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + ")";
  };
  for (const SafetensorsTensor& t : out.tensors) {
    const uint64_t at = last ? last->end : 0;
    if (t.begin < at)
      fail("tensors " + span(*last) + " and " + span(t) + " overlap");
    if (t.begin > at)
      fail("no tensor holds data bytes [" + std::to_string(at) + ", " + std::to_string(t.begin) + ") " +
           (last ? "between tensors " + span(*last) + " and " + span(t) : "before tensor " + span(t)) +
           ": the tensors must follow each other without gaps (a damaged or hand-edited header)");
    last = &t;
  }
  const uint64_t end = last ? last->end : 0;
  if (end != data_size)
    fail(std::to_string(data_size - end) + " trailing data bytes after " +
         (last ? "the last tensor " + span(*last) : std::string("the header (which names no tensor)")) +
         ": no tensor holds them (a damaged or hand-edited header, or bytes appended to the file)");
  return out;
}

}  // namespace io

SafetensorsFile load_safetensors(const std::string& path) {
  auto fail = [&](const std::string& what) -> void { throw IoError(path + ": " + what); };
  Fd f;
  f.fd = io::open_for_reading(path, "");
  if (f.fd < 0) fail("cannot open: " + errno_text());
  struct stat st;
  if (::fstat(f.fd, &st) != 0) fail("cannot stat: " + errno_text());
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  const io::SafetensorsHeader header = io::read_safetensors_header(
      path, static_cast<uint64_t>(st.st_size),
      [&](void* dst, size_t n, uint64_t offset) { return read_at(f.fd, dst, n, offset, path); });

  SafetensorsFile out;
  out.metadata = header.metadata;
  for (const io::SafetensorsTensor& t : header.tensors) {
    DType dtype;
    if (!dtype_from_safetensors(t.dtype, dtype))
      fail("tensor '" + t.name + "': unsupported dtype '" + t.dtype + "' (parallax reads F32, BF16, F16, I32, BOOL)");
    Array a(dtype, t.shape);
    const size_t n = static_cast<size_t>(t.end - t.begin);
    if (n > 0 && !read_at(f.fd, a.raw(), n, header.data_offset + t.begin, path))
      fail("file is truncated inside tensor '" + t.name + "'");
    if (dtype == DType::boolean) {
      const uint8_t* b = a.data<uint8_t>();
      for (size_t i = 0; i < n; ++i)
        if (b[i] > 1)
          fail("tensor '" + t.name + "': BOOL element " + std::to_string(i) + " holds byte " + std::to_string(b[i]) +
               " (must be 0 or 1)");
    }
    out.names.push_back(t.name);
    out.arrays.push_back(std::move(a));
  }
  return out;
}

}  // namespace px
