// "Did you mean": the closest of a list of names to a misspelt one.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace px::pax {

// Edits (insert, delete, substitute, swap two neighbours) from a to b, ignoring case.
inline size_t edit_distance(const std::string& a, const std::string& b) {
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i)
    for (size_t j = 1; j <= m; ++j) {
      const bool same = lower(a[i - 1]) == lower(b[j - 1]);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[n][m];
}

// Whether the letters of `a` appear in `b` in order, ignoring case ("job_dir" in "job_log_dir").
inline bool subsequence(const std::string& a, const std::string& b) {
  size_t j = 0;
  for (size_t i = 0; i < b.size() && j < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[j])) == std::tolower(static_cast<unsigned char>(b[i]))) ++j;
  return j == a.size();
}

// The closest name within about a third of the word's length in edits (or one that holds the
// word's letters in order, or whose letters the word holds, for words of 4 or more); "" when none
// is close.
inline std::string closest(const std::string& word, const std::vector<std::string>& names) {
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  std::string best;
  size_t best_d = limit + 1;
  for (const std::string& n : names) {
    size_t d = edit_distance(word, n);
    if (word.size() >= 4 && n.size() >= 4 && (subsequence(word, n) || subsequence(n, word))) d = std::min(d, limit);
    if (d < best_d) best = n, best_d = d;
  }
  return best;
}

// "; did you mean 'x'?" or "".
inline std::string did_you_mean(const std::string& word, const std::vector<std::string>& names) {
  const std::string c = closest(word, names);
  return c.empty() ? std::string() : "; did you mean '" + c + "'?";
}

}  // namespace px::pax
