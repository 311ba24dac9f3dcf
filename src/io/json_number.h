// Integers read from nlohmann::json without its unchecked conversions: get<int64_t>() of 1e300 or
// of an unsigned value past int64 is undefined behaviour (a cast), so readers of files check here.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <string>

#include "parallax/core.h"

namespace px {

// nlohmann::json or nlohmann::ordered_json.
template <class Json>
std::string json_excerpt(const Json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 60) + "..." : s;
}

// `what` names the field in the error ("<file>: shape").
inline int64_t json_int(const nlohmann::json& v, const std::string& what) {
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    throw Error(what + " is too large: " + json_excerpt(v));
  if (!v.is_number_integer()) throw Error(what + " must be an integer, got " + json_excerpt(v));
  return v.get<int64_t>();
}

inline Shape json_shape(const nlohmann::json& v, const std::string& what) {
  if (!v.is_array()) throw Error(what + " must be an array of integers, got " + json_excerpt(v));
  Shape s;
  for (const nlohmann::json& e : v) s.push_back(json_int(e, what));
  return s;
}

}  // namespace px
