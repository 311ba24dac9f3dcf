// Zarr v3 metadata (zarr.json) for checkpoint arrays and groups, and the default chunk keys.
#include <nlohmann/json.hpp>

#include "core/enum_names.h"
#include "io/json_number.h"
#include "io/zarr.h"

namespace px::zarr {

using nlohmann::json;

const char* data_type_name(DType d) {
  static constexpr const char* names[] = {"float32", "uint16", "float16", "int32", "bool"};  // in DType's order
  static_assert(std::size(names) == static_cast<size_t>(DType::boolean) + 1);
  return enum_name(d, names);
}

std::string array_metadata(const ArrayMeta& m) {
  json attrs = json::parse(m.attributes_json);
  attrs["parallax"]["dtype"] = m.type.dtype == DType::bf16 ? "bfloat16" : dtype_name(m.type.dtype);
  json codecs = json::array();
  json bytes = {{"name", "bytes"}};
  if (dtype_size(m.type.dtype) > 1) bytes["configuration"] = {{"endian", "little"}};
  codecs.push_back(bytes);
  codecs.push_back({{"name", "zstd"}, {"configuration", {{"level", m.zstd_level}, {"checksum", false}}}});
  codecs.push_back({{"name", "crc32c"}});
  json fill = m.type.dtype == DType::boolean ? json(false) : is_float(m.type.dtype) && m.type.dtype != DType::bf16 ? json(0.0) : json(0);
  json meta = {
      {"zarr_format", 3},
      {"node_type", "array"},
      {"shape", m.type.shape},
      {"data_type", data_type_name(m.type.dtype)},
      {"chunk_grid", {{"name", "regular"}, {"configuration", {{"chunk_shape", m.chunk_shape}}}}},
      {"chunk_key_encoding", {{"name", "default"}, {"configuration", {{"separator", "/"}}}}},
      {"fill_value", fill},
      {"codecs", codecs},
      {"attributes", attrs},
  };
  return meta.dump(2) + "\n";
}

std::string group_metadata(const std::string& attributes_json) {
  json meta = {{"zarr_format", 3}, {"node_type", "group"}, {"attributes", json::parse(attributes_json)}};
  return meta.dump(2) + "\n";
}

ArrayMeta parse_array_metadata(const std::string& text, const std::string& where) {
  auto fail = [&](const std::string& what) -> void { throw Error(where + ": " + what); };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(std::string("not valid JSON (truncated?): ") + e.what());
  }
  try {
    if (!j.is_object() || !j.contains("zarr_format") || j.at("zarr_format") != 3 || !j.contains("node_type") ||
        j.at("node_type") != "array")
      fail("not a Zarr v3 array (zarr_format 3, node_type array)");
    ArrayMeta m;
    std::string attr_dtype = j.at("attributes").at("parallax").at("dtype").get<std::string>();
    m.type.dtype = attr_dtype == "bfloat16" ? DType::bf16 : dtype_from_name(attr_dtype);
    if (j.at("data_type").get<std::string>() != data_type_name(m.type.dtype))
      fail("data_type '" + j.at("data_type").get<std::string>() + "' does not store " + attr_dtype);
    m.type.shape = json_shape(j.at("shape"), where + ": shape");
    const json& grid = j.at("chunk_grid");
    if (grid.at("name") != "regular") fail("only the regular chunk grid is supported");
    m.chunk_shape = json_shape(grid.at("configuration").at("chunk_shape"), where + ": chunk_shape");
    if (m.chunk_shape.size() != m.type.shape.size()) fail("chunk_shape and shape differ in rank");
    for (int64_t c : m.chunk_shape)
      if (c < 1) fail("chunk_shape entries must be >= 1");
    const json& keys = j.at("chunk_key_encoding");
    if (keys.at("name") != "default" || keys.value("configuration", json::object()).value("separator", "/") != "/")
      fail("only the default chunk key encoding with '/' is supported");
    const json& codecs = j.at("codecs");
    if (!codecs.is_array() || codecs.size() != 3 || codecs[0].at("name") != "bytes" ||
        codecs[1].at("name") != "zstd" || codecs[2].at("name") != "crc32c")
      fail("codecs must be bytes, zstd, crc32c (as parallax writes them), got " + codecs.dump());
    if (codecs[0].contains("configuration") && codecs[0]["configuration"].value("endian", "little") != "little")
      fail("only little-endian chunks are supported");
    const json& zconf = codecs[1].at("configuration");
    const int64_t level = zconf.contains("level") ? json_int(zconf.at("level"), where + ": zstd level") : 0;
    if (level < -(1 << 17) || level > 22) fail("zstd level must be at most 22, got " + std::to_string(level));
    m.zstd_level = static_cast<int>(level);
    m.attributes_json = j.at("attributes").dump();
    return m;
  } catch (const json::exception& e) {
    fail(std::string("malformed Zarr metadata: ") + e.what());
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(where, 0) == 0) throw;
    fail(e.what());
  }
  return {};
}

std::string chunk_key(const std::vector<int64_t>& index) {
  std::string k = "c";
  for (int64_t i : index) k += "/" + std::to_string(i);
  return k;
}

std::vector<int64_t> chunk_grid(const Shape& shape, const Shape& chunk_shape) {
  std::vector<int64_t> g(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) g[d] = (shape[d] + chunk_shape[d] - 1) / chunk_shape[d];
  return g;
}

}  // namespace px::zarr
