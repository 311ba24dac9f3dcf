// A check of TOML text before toml++ parses it (pax configs, cluster files).
//
// toml++ 3.3 (Debian 12) tests characters for whitespace with a generated table that reaches an
// unreachable branch (undefined behaviour) for many non-ASCII code points (U+00A1..U+0499 among
// them). It makes that test on characters outside strings (also on the whole unquoted run it
// reads as a value, quotes included) and in a multi-line basic string after a backslash. So a non-ASCII character is
// let through only where TOML allows one and toml++ reads it as data: inside a string that starts where a string may
// start, and in a comment (found by fuzz/fuzz_toml.cc).
#pragma once

#include <fmt/format.h>

#include <cctype>
#include <string>
#include <vector>

#include "parallax/core.h"

namespace px {

// Throws px::Error naming `where` and the line of the first non-ASCII character toml++ would not
// read as data. The scan follows TOML's grammar just enough to know where strings are: keys and
// values, arrays and inline tables, table headers, comments, the four kinds of string.
inline void check_toml_text(const std::string& text, const std::string& where) {
  enum Expect { key, value, other };
  Expect expect = key;
  std::vector<char> open;  // '[' arrays and '{' inline tables around this point
  char prev = '\n';        // the last character that is not a space or a tab
  size_t line = 1;
  const size_t n = text.size();
  auto fail = [&](const std::string& what) { throw Error(fmt::format("[toml] {}: line {}: {}", where, line, what)); };
  auto outside = [&] {
    fail(
        "a non-ASCII character outside a quoted string or comment; TOML allows them only there (quote the key "
        "or value)");
  };
  // From i to the end of the line, everything counts as outside a string (no string may start at
  // i, so toml++ reads on as something else); returns the index before the newline.
  auto rest_of_line = [&](size_t i) {
    for (; i < n && text[i] != '\n'; ++i)
      if (static_cast<unsigned char>(text[i]) >= 0x80) outside();
    return i - 1;
  };
  for (size_t i = 0; i < n; ++i) {
    const char ch = text[i];
    if (ch == ' ' || ch == '\t' || ch == '\r') continue;
    const char before = prev;
    prev = ch;
    if (ch == '\n') {
      ++line;
      if (open.empty()) expect = key;
    } else if (ch == '#') {
      while (i + 1 < n && text[i + 1] != '\n') ++i;
    } else if (ch == '"' || ch == '\'') {
      const bool may_start =
          expect == value || (expect == key && std::string("\n.[{,").find(before) != std::string::npos);
      if (!may_start) {
        i = rest_of_line(i);
        continue;
      }
      const bool multi = text.compare(i, 3, std::string(3, ch)) == 0;
      const std::string close = multi ? std::string(3, ch) : std::string(1, ch);
      i += close.size();
      while (i < n && text.compare(i, close.size(), close) != 0) {
        if (ch == '"' && text[i] == '\\' && i + 1 < n) {
          if (multi) {
            // A line-ending backslash: toml++ skips the whitespace after it, testing each character.
            size_t j = i + 1;
            while (j < n && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r' || text[j] == '\n')) ++j;
            if (j < n && static_cast<unsigned char>(text[j]) >= 0x80)
              fail("a non-ASCII character after a backslash in a multi-line string; write it as an escape (\\uXXXX)");
          }
          ++i;  // the escaped character
        }
        if (text[i] == '\n') {
          if (!multi) break;  // an unterminated string: toml++ reports it
          ++line;
        }
        ++i;
      }
      if (i < n && text[i] == '\n') ++line;
      if (multi)  // a closing run may carry up to two more quotes that belong to the string
        while (i + close.size() < n && text[i + close.size()] == ch) ++i;
      i += close.size() - 1;
      if (expect == value) expect = other;
    } else if (static_cast<unsigned char>(ch) >= 0x80) {
      outside();
    } else if (ch == '=') {
      expect = value;
    } else if (ch == '[' && expect == value) {
      open.push_back('[');
    } else if (ch == '[' && expect == key && open.empty() && (before == '\n' || before == '[')) {
      // a table header, [a."b c".d] or [[a]]: keys up to the closing bracket
    } else if (ch == '{' && expect == value) {
      open.push_back('{');
      expect = key;
    } else if (ch == ',' && !open.empty()) {
      expect = open.back() == '[' ? value : key;
    } else if ((ch == ']' || ch == '}') && (open.empty() || open.back() == (ch == ']' ? '[' : '{'))) {
      if (!open.empty()) open.pop_back();
      expect = other;
    } else if (expect == value && ch != '[' && ch != '{' && ch != ',' && ch != ']' && ch != '}') {
      // An unquoted value (a number, a boolean, a date): toml++ reads it up to a terminator.
      for (; i < n; ++i) {
        const char c = text[i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ']' || c == '}' || c == ',' || c == '#') break;
        if (static_cast<unsigned char>(c) >= 0x80) outside();
      }
      --i;
      prev = text[i];
      expect = other;
    } else if (expect == key && (std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-' || ch == '.')) {
      // a bare key or a dot between keys
    } else {
      // Anything else is a syntax error toml++ reports; what follows on the line is outside a string.
      i = rest_of_line(i);
    }
  }
}

}  // namespace px
