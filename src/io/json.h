// A small JSON value with a strict parser and a compact writer, for file headers we own
// (safetensors). Objects keep their key order; duplicate keys are a parse error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace px::json {

class Value {
 public:
  enum class Kind { null, boolean, integer, number, string, array, object };

  Value() = default;
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value array(std::vector<Value> items = {});
  static Value object(std::vector<std::pair<std::string, Value>> members = {});

  Kind kind() const { return kind_; }
  bool is_integer() const { return kind_ == Kind::integer; }
  bool is_string() const { return kind_ == Kind::string; }
  bool is_array() const { return kind_ == Kind::array; }
  bool is_object() const { return kind_ == Kind::object; }
  bool as_bool() const { return b_; }
  int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::integer ? static_cast<double>(i_) : d_; }
  const std::string& as_string() const { return s_; }
  const std::vector<Value>& items() const { return items_; }
  const std::vector<std::pair<std::string, Value>>& members() const { return members_; }
  const Value* find(const std::string& key) const;  // nullptr when absent (objects only)

  void push_back(Value v) { items_.push_back(std::move(v)); }
  void add(std::string key, Value v) { members_.emplace_back(std::move(key), std::move(v)); }

  std::string dump() const;  // compact, no spaces

 private:
  Kind kind_ = Kind::null;
  bool b_ = false;
  int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::vector<Value> items_;
  std::vector<std::pair<std::string, Value>> members_;
};

const char* kind_name(Value::Kind k);

// Parses the whole text (trailing whitespace allowed). Throws px::Error("<where>: ... at byte N").
Value parse(const std::string& text, const std::string& where);

// True when s is well-formed UTF-8 (no overlong forms, no surrogates).
bool valid_utf8(const std::string& s);

// Appends s as a quoted JSON string with the required escapes.
void write_string(std::string& out, const std::string& s);

}  // namespace px::json
