#include "io/json.h"

#include <charconv>
#include <cmath>
#include <set>

#include "core/enum_names.h"
#include "parallax/core.h"

namespace px::json {

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::boolean;
  v.b_ = b;
  return v;
}
Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::integer;
  v.i_ = i;
  return v;
}
Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::number;
  v.d_ = d;
  return v;
}
Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::string;
  v.s_ = std::move(s);
  return v;
}
Value Value::array(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::array;
  v.items_ = std::move(items);
  return v;
}
Value Value::object(std::vector<std::pair<std::string, Value>> members) {
  Value v;
  v.kind_ = Kind::object;
  v.members_ = std::move(members);
  return v;
}

const Value* Value::find(const std::string& key) const {
  for (auto& [k, v] : members_)
    if (k == key) return &v;
  return nullptr;
}

constexpr const char* kKindNames[] = {"null",     "a boolean", "an integer", "a number",
                                      "a string", "an array",  "an object"};
static_assert(std::size(kKindNames) == static_cast<size_t>(Value::Kind::object) + 1);

const char* kind_name(Value::Kind k) { return enum_name(k, kKindNames); }

void write_string(std::string& out, const std::string& s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

namespace {

// Length of the valid UTF-8 sequence at t[p], or 0 when invalid (overlongs and surrogates too).
size_t utf8_seq_len(const std::string& t, size_t p) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(p + k < t.size() ? t[p + k] : 0); };
  auto cont = [&](size_t k) { return (b(k) & 0xc0) == 0x80; };
  unsigned c = b(0);
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c >= 0xe0 && c <= 0xef) {
    if (!cont(1) || !cont(2)) return 0;
    unsigned cp = ((c & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f);
    return (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff)) ? 0 : 3;
  }
  if (c >= 0xf0 && c <= 0xf4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    unsigned cp = ((c & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f);
    return (cp < 0x10000 || cp > 0x10ffff) ? 0 : 4;
  }
  return 0;
}

void dump_to(const Value& v, std::string& out) {
  switch (v.kind()) {
    case Value::Kind::null:
      out += "null";
      break;
    case Value::Kind::boolean:
      out += v.as_bool() ? "true" : "false";
      break;
    case Value::Kind::integer:
      out += std::to_string(v.as_int());
      break;
    case Value::Kind::number: {
      double d = v.as_number();
      if (!std::isfinite(d)) {
        out += "null";  // JSON has no inf/nan
        break;
      }
      char buf[64];
      auto r = std::to_chars(buf, buf + sizeof(buf), d);
      out.append(buf, r.ptr);
      break;
    }
    case Value::Kind::string:
      write_string(out, v.as_string());
      break;
    case Value::Kind::array:
      out += '[';
      for (size_t i = 0; i < v.items().size(); ++i) {
        if (i) out += ',';
        dump_to(v.items()[i], out);
      }
      out += ']';
      break;
    case Value::Kind::object:
      out += '{';
      for (size_t i = 0; i < v.members().size(); ++i) {
        if (i) out += ',';
        write_string(out, v.members()[i].first);
        out += ':';
        dump_to(v.members()[i].second, out);
      }
      out += '}';
      break;
  }
}

class Parser {
 public:
  Parser(const std::string& text, const std::string& where) : t_(text), where_(where) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (p_ != t_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(where_ + ": bad JSON: " + what + " at byte " + std::to_string(p_));
  }
  void skip_ws() {
    while (p_ < t_.size() && (t_[p_] == ' ' || t_[p_] == '\t' || t_[p_] == '\n' || t_[p_] == '\r')) ++p_;
  }
  bool consume(const char* word) {
    size_t n = std::char_traits<char>::length(word);
    if (t_.compare(p_, n, word) != 0) return false;
    p_ += n;
    return true;
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nesting deeper than " + std::to_string(kMaxDepth));
    if (p_ >= t_.size()) fail("unexpected end of text");
    char c = t_[p_];
    if (c == '{') return parse_object(depth);
    if (c == '[') return parse_array(depth);
    if (c == '"') return Value::string(parse_string());
    if (c == '-' || (c >= '0' && c <= '9')) return parse_number();
    if (consume("true")) return Value::boolean(true);
    if (consume("false")) return Value::boolean(false);
    if (consume("null")) return Value();
    fail(std::string("unexpected character '") + c + "'");
  }

  Value parse_object(int depth) {
    ++p_;  // '{'
    Value obj = Value::object();
    std::set<std::string> seen;
    skip_ws();
    if (p_ < t_.size() && t_[p_] == '}') {
      ++p_;
      return obj;
    }
    while (true) {
      skip_ws();
      if (p_ >= t_.size() || t_[p_] != '"') fail("expected a quoted key");
      size_t key_pos = p_;
      std::string key = parse_string();
      if (!seen.insert(key).second) {
        p_ = key_pos;
        fail("duplicate key \"" + key + "\"");
      }
      skip_ws();
      if (p_ >= t_.size() || t_[p_] != ':') fail("expected ':' after a key");
      ++p_;
      skip_ws();
      Value v = parse_value(depth + 1);
      obj.add(std::move(key), std::move(v));
      skip_ws();
      if (p_ < t_.size() && t_[p_] == ',') {
        ++p_;
        continue;
      }
      if (p_ < t_.size() && t_[p_] == '}') {
        ++p_;
        return obj;
      }
      fail("expected ',' or '}' in an object");
    }
  }

  Value parse_array(int depth) {
    ++p_;  // '['
    Value arr = Value::array();
    skip_ws();
    if (p_ < t_.size() && t_[p_] == ']') {
      ++p_;
      return arr;
    }
    while (true) {
      skip_ws();
      arr.push_back(parse_value(depth + 1));
      skip_ws();
      if (p_ < t_.size() && t_[p_] == ',') {
        ++p_;
        continue;
      }
      if (p_ < t_.size() && t_[p_] == ']') {
        ++p_;
        return arr;
      }
      fail("expected ',' or ']' in an array");
    }
  }

  unsigned hex4() {
    if (p_ + 4 > t_.size()) fail("truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = t_[p_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        fail("bad hex digit in a \\u escape");
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }

  std::string parse_string() {
    ++p_;  // opening quote
    std::string out;
    while (true) {
      if (p_ >= t_.size()) fail("unterminated string");
      unsigned char c = static_cast<unsigned char>(t_[p_]);
      if (c == '"') {
        ++p_;
        return out;
      }
      if (c < 0x20) fail("raw control character in a string");
      if (c >= 0x80) {
        size_t n = utf8_seq_len(t_, p_);
        if (n == 0) fail("invalid UTF-8 in a string");
        out.append(t_, p_, n);
        p_ += n;
        continue;
      }
      if (c != '\\') {
        out += static_cast<char>(c);
        ++p_;
        continue;
      }
      ++p_;
      if (p_ >= t_.size()) fail("unterminated escape");
      char e = t_[p_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xd800 && cp <= 0xdbff) {
            if (!consume("\\u")) fail("unpaired surrogate in a \\u escape");
            unsigned lo = hex4();
            if (lo < 0xdc00 || lo > 0xdfff) fail("unpaired surrogate in a \\u escape");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp <= 0xdfff) {
            fail("unpaired surrogate in a \\u escape");
          }
          put_utf8(out, cp);
          break;
        }
        default:
          fail(std::string("unknown escape '\\") + e + "'");
      }
    }
  }

  Value parse_number() {
    size_t start = p_;
    if (t_[p_] == '-') ++p_;
    if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("bad number");
    if (t_[p_] == '0' && p_ + 1 < t_.size() && t_[p_ + 1] >= '0' && t_[p_ + 1] <= '9') fail("leading zero in a number");
    while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
    bool is_int = true;
    if (p_ < t_.size() && t_[p_] == '.') {
      is_int = false;
      ++p_;
      if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("bad number");
      while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
    }
    if (p_ < t_.size() && (t_[p_] == 'e' || t_[p_] == 'E')) {
      is_int = false;
      ++p_;
      if (p_ < t_.size() && (t_[p_] == '+' || t_[p_] == '-')) ++p_;
      if (p_ >= t_.size() || !(t_[p_] >= '0' && t_[p_] <= '9')) fail("bad number");
      while (p_ < t_.size() && t_[p_] >= '0' && t_[p_] <= '9') ++p_;
    }
    const char* b = t_.data() + start;
    const char* e = t_.data() + p_;
    if (is_int) {
      int64_t i = 0;
      auto r = std::from_chars(b, e, i);
      if (r.ec == std::errc() && r.ptr == e) return Value::integer(i);
      // Too large for int64: keep it as a double.
    }
    double d = 0;
    auto r = std::from_chars(b, e, d);
    if (r.ptr != e) {
      p_ = start;
      fail("bad number");
    }
    return Value::number(d);
  }

  const std::string& t_;
  const std::string& where_;
  size_t p_ = 0;
};

}  // namespace

std::string Value::dump() const {
  std::string out;
  dump_to(*this, out);
  return out;
}

bool valid_utf8(const std::string& s) {
  for (size_t p = 0; p < s.size();) {
    size_t n = utf8_seq_len(s, p);
    if (n == 0) return false;
    p += n;
  }
  return true;
}

Value parse(const std::string& text, const std::string& where) { return Parser(text, where).parse_document(); }

}  // namespace px::json
