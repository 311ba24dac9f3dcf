// Reading documents: plain text (blank-line separated), JSON lines with a "text" field, either
// gzip-compressed or not, directories of them, and the GCIDE dictionary.
#include <zlib.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "data/text_internal.h"
#include "io/regular_file.h"
#include "parallax/text_data.h"

namespace px::data {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The name without a trailing ".gz", lower-cased.
std::string base_name(const fs::path& p) {
  std::string n = p.filename().string();
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return std::tolower(c); });
  if (ends_with(n, ".gz")) n.resize(n.size() - 3);
  return n;
}

bool is_jsonl(const fs::path& p) {
  std::string n = base_name(p);
  return ends_with(n, ".jsonl") || ends_with(n, ".json");
}

bool is_known_text_file(const fs::path& p) {
  std::string n = base_name(p);
  return is_jsonl(p) || ends_with(n, ".txt") || ends_with(n, ".text");
}

}  // namespace

GzReader::GzReader(const std::string& path, uint64_t inflate_floor) : path_(path), floor_(inflate_floor) {
  io::require_regular_file(path, "[data] ");
  std::error_code ec;
  stored_ = fs::file_size(path, ec);
  bound_ = std::max<uint64_t>(inflate_floor, ec ? 0 : stored_ * kMaxInflateRatio);
  f_ = gzopen(path.c_str(), "rb");
  if (!f_) throw Error("[data] cannot open '" + path + "'; check that it exists and is readable");
  gzbuffer(static_cast<gzFile>(f_), 1 << 17);
}

GzReader::~GzReader() {
  if (f_) gzclose(static_cast<gzFile>(f_));
}

size_t GzReader::read(char* out, size_t n) {
  gzFile f = static_cast<gzFile>(f_);
  const int got = gzread(f, out, static_cast<unsigned>(std::min<size_t>(n, 1 << 30)));
  int code = 0;
  if (got < 0) throw Error("[data] '" + path_ + "' is corrupt or truncated (" + gzerror(f, &code) + ")");
  if (got == 0) {
    // A truncated stream ends without a read error; zlib records it as Z_BUF_ERROR.
    std::string msg = gzerror(f, &code);
    if (code != Z_OK) throw Error("[data] '" + path_ + "' is corrupt or truncated (" + msg + ")");
    return 0;
  }
  inflated_ += static_cast<uint64_t>(got);
  if (inflated_ > bound_) {
    auto size = [](uint64_t b) {
      return b >= (1 << 20) && b % (1 << 20) == 0 ? std::to_string(b >> 20) + " MiB" : std::to_string(b) + " bytes";
    };
    throw UserError("[data] '" + path_ + "' inflates to more than " + size(bound_) + " from " + size(stored_) +
                    ": a compressed file may inflate to at most " + std::to_string(kMaxInflateRatio) +
                    "x its size (or " + size(floor_) +
                    "), text compresses about 3-10x and more is a decompression bomb; if the data is real, "
                    "decompress it yourself and give the plain file");
  }
  return static_cast<size_t>(got);
}

std::string read_maybe_gz(const std::string& path, size_t limit, uint64_t inflate_floor) {
  GzReader in(path, inflate_floor);
  std::string out;
  std::array<char, 1 << 16> buf;
  while (limit == 0 || out.size() < limit) {
    const size_t n = in.read(buf.data(), buf.size());
    if (n == 0) break;
    out.append(buf.data(), n);
  }
  return out;
}

namespace {

std::string trim(std::string_view s) {
  size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string_view::npos) return {};
  size_t b = s.find_last_not_of(" \t\r\n");
  return std::string(s.substr(a, b - a + 1));
}

// The lines of a file (gzip or not), read in pieces: memory holds one line, not the file. A
// line longer than `max_line` bytes is refused before it is held whole.
class LineStream {
 public:
  LineStream(const std::string& path, uint64_t max_line) : in_(path), path_(path), max_line_(max_line) {}
  // The next line without its '\n' (and '\r'); false at the end of the file.
  bool next(std::string& line) {
    line.clear();
    while (true) {
      const size_t nl = buf_.find('\n', pos_);
      const size_t end = nl == std::string::npos ? buf_.size() : nl;
      if (line.size() + (end - pos_) > max_line_) too_long(line_no_ + 1);
      line.append(buf_, pos_, end - pos_);
      pos_ = end;
      if (nl != std::string::npos) {
        ++pos_;
        break;
      }
      buf_.resize(1 << 16);
      buf_.resize(in_.read(buf_.data(), buf_.size()));
      pos_ = 0;
      if (buf_.empty()) {
        if (line.empty()) return false;
        break;
      }
    }
    ++line_no_;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    return true;
  }
  int64_t line_no() const { return line_no_; }
  [[noreturn]] void too_long(int64_t start_line) const {
    throw UserError("[data] " + path_ + ":" + std::to_string(start_line) + ": the document here is longer than " +
                    std::to_string(max_line_) + " bytes (max_document_bytes); a document is held whole to be "
                    "tokenized: split it (blank lines separate the documents of a text file), or raise "
                    "max_document_bytes (pax: data.max_document_bytes)");
  }

 private:
  GzReader in_;
  std::string path_, buf_;
  size_t pos_ = 0;
  uint64_t max_line_;
  int64_t line_no_ = 0;
};

bool full(const std::vector<std::string>& out, int64_t max_documents) {
  return max_documents > 0 && static_cast<int64_t>(out.size()) >= max_documents;
}

// Documents are separated by one or more blank lines; each keeps its inner line breaks.
void read_paragraph_documents(const std::string& path, std::vector<std::string>& out, int64_t max_documents,
                              uint64_t max_document_bytes) {
  LineStream lines(path, max_document_bytes);
  std::string doc, line;
  int64_t first_line = 0;  // where `doc` starts
  while (!full(out, max_documents) && lines.next(line)) {
    if (line.find_first_not_of(" \t") == std::string::npos) {
      if (!doc.empty()) out.push_back(std::move(doc));
      doc.clear();
      continue;
    }
    if (doc.empty()) first_line = lines.line_no();
    if ((doc.empty() ? 0 : doc.size() + 1) + line.size() > max_document_bytes) lines.too_long(first_line);
    if (!doc.empty()) doc += '\n';
    doc += line;
  }
  if (!doc.empty() && !full(out, max_documents)) out.push_back(std::move(doc));
}

void read_jsonl(const std::string& path, std::vector<std::string>& out, int64_t max_documents,
                uint64_t max_document_bytes) {
  LineStream lines(path, max_document_bytes);
  std::string line;
  while (!full(out, max_documents) && lines.next(line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto where = [&] { return "[data] " + path + ":" + std::to_string(lines.line_no()) + ": "; };
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(where() + "not valid JSON (" + e.what() + "); each line must be one JSON object");
    }
    if (!j.is_object() || !j.contains("text"))
      throw Error(where() + "no \"text\" field; each line must be an object like {\"text\": \"...\"}");
    if (!j["text"].is_string()) throw Error(where() + "the \"text\" field is not a string");
    std::string t = j["text"].get<std::string>();
    if (!t.empty()) out.push_back(std::move(t));
  }
}

}  // namespace

std::vector<fs::path> expand_paths(const std::vector<std::string>& paths) {
  if (paths.empty()) throw Error("[data] no data paths given; set data paths to files, directories or \"gcide\"");
  std::vector<fs::path> files;
  for (const auto& p : paths) {
    if (p == "gcide") {
      files.emplace_back("gcide");
      continue;
    }
    std::error_code ec;
    fs::file_status st = fs::status(p, ec);
    if (!fs::exists(st))
      throw Error("[data] data path '" + p + "' does not exist; give text (.txt), JSON-lines (.jsonl, .json) or " +
                  "gzip files, directories of them, or \"gcide\"");
    if (!fs::is_directory(st)) io::require_regular_file(p, "[data] data path ");
    if (fs::is_directory(st)) {
      std::vector<fs::path> found;
      for (auto it = fs::recursive_directory_iterator(p, fs::directory_options::follow_directory_symlink, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        if (it->is_regular_file() && it->path().filename().string()[0] != '.' && is_known_text_file(it->path()))
          found.push_back(it->path());
      }
      if (ec) throw Error("[data] cannot list directory '" + p + "': " + ec.message());
      if (found.empty())
        throw Error("[data] directory '" + p + "' has no .txt, .text, .jsonl or .json files (gzip or not)");
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.emplace_back(p);
    }
  }
  return files;
}

void read_file_documents(const fs::path& file, std::vector<std::string>& out, int64_t max_documents,
                         int64_t max_document_bytes) {
  if (max_document_bytes < 1)
    throw UserError("[data] max_document_bytes must be >= 1, got " + std::to_string(max_document_bytes));
  if (file == "gcide") {
    int64_t left = max_documents > 0 ? max_documents - static_cast<int64_t>(out.size()) : 0;
    auto docs = read_gcide(left);
    for (auto& d : docs) out.push_back(std::move(d));
    return;
  }
  const auto limit = static_cast<uint64_t>(max_document_bytes);
  if (is_jsonl(file))
    read_jsonl(file.string(), out, max_documents, limit);
  else
    read_paragraph_documents(file.string(), out, max_documents, limit);
}

std::vector<std::string> read_documents(const std::vector<std::string>& paths, int64_t max_documents,
                                        int64_t max_document_bytes) {
  std::vector<std::string> docs;
  for (const auto& f : expand_paths(paths)) {
    if (max_documents > 0 && static_cast<int64_t>(docs.size()) >= max_documents) break;
    read_file_documents(f, docs, max_documents, max_document_bytes);
  }
  return docs;
}

// ---- GCIDE ----------------------------------------------------------------------------------

std::string gcide_path() { return "/usr/share/dictd/gcide.dict.dz"; }

namespace {

const char* combining_mark(char m, bool suffix) {
  if (suffix) return "\u0306";  // x^: breve
  switch (m) {
    case '=': return "\u0304";  // macron
    case '\'': return "\u0301";
    case '`': return "\u0300";
    case '"': return "\u0308";
    case '^': return "\u0302";
    case '~': return "\u0303";
    case '.': return "\u0307";
    case ',': return "\u0327";
    default: return "";  // '-' and '*': semi-marks with no Unicode equivalent; keep the letter
  }
}

// GCIDE's bracketed character codes: [a^] (breve), [=e] (macron), ['e], [ae], [eth], ...
// Returns false for ordinary brackets such as [Obs.].
bool decode_char_code(std::string_view code, std::string& out) {
  static const std::map<std::string, std::string, std::less<>> named = {
      {"ae", "æ"}, {"AE", "Æ"},   {"oe", "œ"},   {"OE", "Œ"},    {"eth", "ð"}, {"thorn", "þ"},
      {"ng", "ŋ"}, {"deg", "°"},  {"root", "√"}, {"sect", "§"},  {"yogh", "ȝ"}, {"imac", "ī"},
      {"aum", "ä"}, {"asl", "a"}, {"add", "a"},  {"udd", "u"},   {"th", "th"}, {"oo", "oo"},
      {"sharp", "♯"}, {"flat", "♭"}, {"cre", "˘"}, {"frac12", "½"}, {"frac14", "¼"}, {"frac34", "¾"},
  };
  if (auto it = named.find(code); it != named.end()) {
    out += it->second;
    return true;
  }
  if (code.size() < 2 || code.size() > 4) return false;
  const std::string_view marks = "`'\"^=~.,-*";
  auto letters = [](std::string_view s) {
    return !s.empty() && s.size() <= 2 && std::all_of(s.begin(), s.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
  };
  if (marks.find(code.front()) != std::string_view::npos && letters(code.substr(1))) {
    out.append(code.substr(1));
    out += combining_mark(code.front(), false);
    return true;
  }
  if (code.back() == '^' && letters(code.substr(0, code.size() - 1))) {
    out.append(code.substr(0, code.size() - 1));
    out += combining_mark('^', true);
    return true;
  }
  return false;
}

bool is_source_tag(std::string_view line) {
  std::string t = trim(line);
  if (t.size() < 2 || t.front() != '[' || t.back() != ']') return false;
  return t.find("Webster") != std::string::npos || t.find("WordNet") != std::string::npos ||
         t.find("PJC") != std::string::npos || std::any_of(t.begin(), t.end(), ::isdigit);
}

}  // namespace

std::string gcide_entry_text(std::string_view block) {
  // 1. Drop source tags on their own lines and join each paragraph's lines.
  std::vector<std::string> paragraphs;
  std::string para;
  size_t start = 0;
  while (start < block.size()) {
    size_t end = block.find('\n', start);
    if (end == std::string_view::npos) end = block.size();
    std::string_view line = block.substr(start, end - start);
    start = end + 1;
    std::string t = trim(line);
    if (t.empty()) {
      if (!para.empty()) paragraphs.push_back(std::move(para));
      para.clear();
      continue;
    }
    if (is_source_tag(t)) continue;
    if (!para.empty()) para += ' ';
    para += t;
  }
  if (!para.empty()) paragraphs.push_back(std::move(para));

  // 2. Markup: \head*word\ and the pronunciation after it go; {cross refs} keep their words;
  // character codes become letters; stray Windows-1252 quotes become ASCII.
  std::string out;
  for (size_t pi = 0; pi < paragraphs.size(); ++pi) {
    const std::string& p = paragraphs[pi];
    std::string r;
    for (size_t i = 0; i < p.size(); ++i) {
      char c = p[i];
      if (c == '\\') {
        size_t close = p.find('\\', i + 1);
        if (close == std::string::npos) continue;
        i = close;
        size_t j = i + 1;
        while (j < p.size() && p[j] == ' ') ++j;
        if (j < p.size() && p[j] == '(') {
          size_t k = p.find(')', j);
          if (k != std::string::npos) {
            std::string_view inner(p.data() + j, k - j);
            if (inner.find_first_of("*\"`[") != std::string_view::npos) i = k;
          }
        }
        while (!r.empty() && r.back() == ' ' && i + 1 < p.size() && (p[i + 1] == ',' || p[i + 1] == ' ')) r.pop_back();
        continue;
      }
      if (c == '{' || c == '}') continue;
      if (c == '[') {
        size_t close = p.find(']', i + 1);
        if (close != std::string::npos && decode_char_code(std::string_view(p.data() + i + 1, close - i - 1), r)) {
          i = close;
          continue;
        }
      }
      unsigned char u = static_cast<unsigned char>(c);
      if (u >= 0x80) {
        r += (u == 0x93 || u == 0x94) ? '"' : '\'';
        continue;
      }
      if (c == ' ' && !r.empty() && r.back() == ' ') continue;  // right-aligned citations leave runs
      r += c;
    }
    std::string t = trim(r);
    if (t.empty()) continue;
    if (!out.empty()) out += '\n';
    out += t;
  }
  return out;
}

std::vector<std::string> read_gcide(int64_t max_documents) {
  const std::string dict = gcide_path();
  const std::string index = "/usr/share/dictd/gcide.index";
  std::error_code ec;
  if (!fs::exists(dict, ec) || !fs::exists(index, ec))
    throw Error("[data] the GCIDE corpus is not installed (" + dict +
                "); install the Debian package dict-gcide (scripts/install_deps.sh)");
  // The dictd index: headword, base64 offset, base64 length. Each (offset, length) is one entry.
  std::string idx = read_maybe_gz(index);
  auto b64 = [&](std::string_view s) {
    uint64_t v = 0;
    for (char c : s) {
      int d = c >= 'A' && c <= 'Z' ? c - 'A' : c >= 'a' && c <= 'z' ? c - 'a' + 26 : c >= '0' && c <= '9' ? c - '0' + 52
              : c == '+' ? 62 : c == '/' ? 63 : -1;
      if (d < 0) throw Error("[data] " + index + " is corrupt: bad number '" + std::string(s) + "'; reinstall dict-gcide");
      v = v * 64 + static_cast<uint64_t>(d);
    }
    return v;
  };
  std::set<std::pair<uint64_t, uint64_t>> blocks, skip;
  size_t start = 0;
  while (start < idx.size()) {
    size_t end = idx.find('\n', start);
    if (end == std::string::npos) end = idx.size();
    std::string_view line(idx.data() + start, end - start);
    start = end + 1;
    size_t t1 = line.find('\t'), t2 = t1 == std::string_view::npos ? t1 : line.find('\t', t1 + 1);
    if (t2 == std::string_view::npos) continue;
    std::pair<uint64_t, uint64_t> b{b64(line.substr(t1 + 1, t2 - t1 - 1)), b64(line.substr(t2 + 1))};
    // "00-database-*" entries are the database's own description and licence, not dictionary text.
    (line.substr(0, 3) == "00-" ? skip : blocks).insert(b);
  }
  for (auto& b : skip) blocks.erase(b);
  if (blocks.empty()) throw Error("[data] " + index + " lists no entries; reinstall dict-gcide");
  std::vector<std::pair<uint64_t, uint64_t>> order(blocks.begin(), blocks.end());
  if (max_documents > 0 && static_cast<int64_t>(order.size()) > max_documents) order.resize(max_documents);
  uint64_t need = 0;
  for (auto& [o, n] : order) need = std::max(need, o + n);
  std::string text = read_maybe_gz(dict, need);
  std::vector<std::string> docs;
  docs.reserve(order.size());
  for (auto& [o, n] : order) {
    if (o + n > text.size()) throw Error("[data] " + dict + " is shorter than its index says; reinstall dict-gcide");
    std::string d = gcide_entry_text(std::string_view(text.data() + o, n));
    if (!d.empty()) docs.push_back(std::move(d));
  }
  return docs;
}

}  // namespace px::data
