// Byte-level BPE from a Hugging Face tokenizer.json. Encoding: added tokens are cut out of the raw
// text first; each remaining segment is normalized (NFC via ICU, or not at all), split by the
// pre-tokenizers' regexes (PCRE2 in UTF mode), mapped byte by byte to the printable characters of
// the byte-level alphabet, and merged pair by pair in merge-rank order.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "io/json_number.h"
#include "io/regular_file.h"
#include "parallax/core.h"
#include "parallax/text.h"

namespace px::text {

namespace {

using nlohmann::json;

// The GPT-2 split pattern, which ByteLevel(use_regex = true) applies.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one (overlong, surrogate, > U+10FFFF,
// truncated); `cp` gets its code point.
size_t utf8_at(std::string_view s, size_t i, uint32_t& cp) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  size_t n;
  uint32_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char d = b(i + k);
    if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xBF)) return 0;
    cp = (cp << 6) | (d & 0x3F);
  }
  return n;
}

// Bytes to text, each maximal invalid subpart replaced by U+FFFD (Rust's from_utf8_lossy).
std::string lossy_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    size_t n = utf8_at(s, i, cp);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // Skip the longest prefix of a valid sequence (at least one byte).
    size_t skip = 1;
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t want = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
    for (size_t k = 1; k < want && i + k < s.size(); ++k) {
      std::string probe(s.substr(i, k + 1));
      probe.append(want - k - 1, static_cast<char>(0x80));  // complete it with continuation bytes
      uint32_t tmp;
      if (utf8_at(probe, 0, tmp) == 0) break;
      skip = k + 1;
    }
    out += "\xEF\xBF\xBD";
    i += skip;
  }
  return out;
}

// The byte-level alphabet: printable bytes stand for themselves, the others for U+0100 upwards.
struct ByteAlphabet {
  std::string byte_to_char[256];
  std::unordered_map<uint32_t, unsigned char> char_to_byte;
  ByteAlphabet() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      append_utf8(byte_to_char[b], cp);
      char_to_byte[cp] = static_cast<unsigned char>(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

struct Regex {
  pcre2_code* code = nullptr;
  bool isolated = true;  // Split behaviour: "Isolated" keeps matches as pieces; "Removed" drops them
  Regex(const std::string& pattern, const std::string& file) {
    int err;
    PCRE2_SIZE at;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &at, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Error(file + ": pre-tokenizer regex '" + pattern + "' does not compile (" +
                  reinterpret_cast<const char*>(msg) + " at offset " + std::to_string(at) + ")");
    }
  }
  Regex(Regex&& o) noexcept : code(o.code), isolated(o.isolated) { o.code = nullptr; }
  Regex(const Regex&) = delete;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
  // Splits piece into matches and the gaps between them, in order.
  void split(std::string_view piece, std::vector<std::string_view>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t pos = 0, last = 0;
    while (pos <= piece.size()) {
      int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(piece.data()), piece.size(), pos, 0, md, nullptr);
      if (rc < 0) break;
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (e == b) {  // an empty match: step over one character
        pos = b + 1;
        while (pos < piece.size() && (static_cast<unsigned char>(piece[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      if (b > last) out.push_back(piece.substr(last, b - last));
      if (isolated) out.push_back(piece.substr(b, e - b));
      last = pos = e;
    }
    if (last < piece.size()) out.push_back(piece.substr(last));
    pcre2_match_data_free(md);
  }
};

// The code point that ends s (0 when s is empty or does not end in valid UTF-8) and its byte length.
uint32_t last_code_point(std::string_view s, size_t* len = nullptr) {
  size_t i = s.size();
  while (i > 0 && s.size() - i < 4) {
    --i;
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) break;
  }
  uint32_t cp = 0;
  const size_t n = i < s.size() ? utf8_at(s, i, cp) : 0;
  if (n == 0 || i + n != s.size()) return 0;
  if (len) *len = n;
  return cp;
}

// Word and space characters as the `tokenizers` package's regexes (Rust's Unicode \w and \s) see them.
bool is_word_char(uint32_t cp) {
  const auto c = static_cast<UChar32>(cp);
  const int8_t t = u_charType(c);
  return u_hasBinaryProperty(c, UCHAR_ALPHABETIC) || t == U_NON_SPACING_MARK || t == U_ENCLOSING_MARK ||
         t == U_COMBINING_SPACING_MARK || t == U_DECIMAL_DIGIT_NUMBER || t == U_CONNECTOR_PUNCTUATION ||
         u_hasBinaryProperty(c, UCHAR_JOIN_CONTROL);
}
bool is_space_char(uint32_t cp) { return u_hasBinaryProperty(static_cast<UChar32>(cp), UCHAR_WHITE_SPACE); }

bool ends_with_word(std::string_view s) {
  const uint32_t cp = last_code_point(s);
  return cp != 0 && is_word_char(cp);
}
bool starts_with_word(std::string_view s) {
  uint32_t cp = 0;
  return !s.empty() && utf8_at(s, 0, cp) > 0 && is_word_char(cp);
}
// Where the run of whitespace that ends s starts.
size_t trailing_space_start(std::string_view s) {
  size_t end = s.size(), n = 0;
  for (uint32_t cp; (cp = last_code_point(s.substr(0, end), &n)) != 0 && is_space_char(cp);) end -= n;
  return end;
}
// The byte length of the run of whitespace that starts s.
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  for (uint32_t cp = 0; i < s.size();) {
    const size_t n = utf8_at(s, i, cp);
    if (n == 0 || !is_space_char(cp)) break;
    i += n;
  }
  return i;
}

// The part of tokenizer.json's post_processor that acts on a single sequence: a chain of templates,
// each a list of pieces (the sequence itself, or special ids), applied in order.
struct PostProcessor {
  struct Piece {
    bool sequence = false;
    std::vector<int32_t> ids;
  };
  std::vector<std::vector<Piece>> templates;
  std::vector<int32_t> apply(std::vector<int32_t> ids) const {
    for (const auto& t : templates) {
      std::vector<int32_t> next;
      for (const Piece& p : t)
        next.insert(next.end(), p.sequence ? ids.begin() : p.ids.begin(), p.sequence ? ids.end() : p.ids.end());
      ids.swap(next);
    }
    return ids;
  }
};

[[noreturn]] void unsupported(const std::string& file, const std::string& what);

// Reads post_processor `pp` (null, ByteLevel, TemplateProcessing, RobertaProcessing, BertProcessing or
// a Sequence of them); `vocab` is the number of ids, which every special id must be below.
void read_post_processor(const json& pp, const std::string& file, int64_t vocab, PostProcessor& out) {
  if (pp.is_null()) return;
  const std::string type = pp.value("type", "");
  auto check = [&](const json& v, const std::string& what) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
      throw Error(file + ": post_processor " + what + " has id " + v.dump() + ", outside the vocabulary [0, " +
                  std::to_string(vocab) + "); restore the file");
    return static_cast<int32_t>(v.get<int64_t>());
  };
  if (type == "ByteLevel") return;  // trims offsets; adds no token
  if (type == "Sequence") {
    for (const json& p : pp.at("processors")) read_post_processor(p, file, vocab, out);
  } else if (type == "TemplateProcessing") {
    std::vector<PostProcessor::Piece> t;
    for (const json& item : pp.at("single")) {
      if (item.contains("Sequence")) {
        t.push_back({true, {}});
      } else if (item.contains("SpecialToken")) {
        const std::string name = item["SpecialToken"].at("id").get<std::string>();
        const json& specials = pp.at("special_tokens");
        if (!specials.contains(name))
          throw Error(file + ": post_processor template names special token '" + name +
                      "' missing from its special_tokens; restore the file");
        PostProcessor::Piece piece;
        for (const json& id : specials[name].at("ids")) piece.ids.push_back(check(id, "token '" + name + "'"));
        t.push_back(piece);
      } else {
        throw Error(file + ": post_processor template item " + item.dump() +
                    " is neither a Sequence nor a SpecialToken");
      }
    }
    out.templates.push_back(t);
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    const json &cls = pp.at("cls"), &sep = pp.at("sep");  // ["<s>", 0]
    out.templates.push_back({{false, {check(cls.at(1), "cls")}}, {true, {}}, {false, {check(sep.at(1), "sep")}}});
  } else {
    unsupported(file, "post_processor '" + type + "'");
  }
}

// A tokenizer.json the SentencePiece model beside it stands for: a Metaspace pre-tokenizer, a Prepend
// normalizer (Llama 2 and Mistral spell "▁" in one of these) or a Unigram model.
bool sentencepiece_style(const json& j) {
  std::function<bool(const json&, const char*, const char*)> has = [&](const json& n, const char* list,
                                                                       const char* type) {
    if (!n.is_object()) return false;
    if (n.value("type", "") == type) return true;
    if (n.contains(list) && n[list].is_array())
      for (const json& c : n[list])
        if (has(c, list, type)) return true;
    return false;
  };
  return has(j.value("pre_tokenizer", json()), "pretokenizers", "Metaspace") ||
         has(j.value("normalizer", json()), "normalizers", "Prepend") ||
         (j.contains("model") && j["model"].is_object() && j["model"].value("type", "") == "Unigram");
}

// Whether tokenizer.json's Metaspace pre-tokenizer prepends "▁" (prepend_scheme first or always;
// add_prefix_space in older files). It does so only where the text does not start with a space
// already, unlike SentencePiece's dummy prefix, which is always added.
bool metaspace_prepends(const json& j) {
  std::function<bool(const json&)> find = [&](const json& n) {
    if (!n.is_object()) return false;
    if (n.value("type", "") == "Metaspace") {
      if (n.contains("prepend_scheme") && n["prepend_scheme"].is_string()) return n["prepend_scheme"] != "never";
      return n.value("add_prefix_space", true);
    }
    if (n.contains("pretokenizers") && n["pretokenizers"].is_array())
      for (const json& c : n["pretokenizers"])
        if (find(c)) return true;
    return false;
  };
  return find(j.value("pre_tokenizer", json()));
}

class BpeTokenizer : public Tokenizer {
 public:
  BpeTokenizer(const json& j, const std::string& file);
  std::string kind() const override { return "bpe"; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t pad_id() const override { return pad_; }
  std::vector<int32_t> add_special_tokens(std::vector<int32_t> ids) const override { return post_.apply(ids); }
  void set_specials(int32_t bos, int32_t eos, int32_t pad) { bos_ = bos, eos_ = eos, pad_ = pad; }
  int32_t id_of(const std::string& token) const {
    auto it = vocab_.find(token);
    if (it != vocab_.end()) return it->second;
    for (auto& a : added_)
      if (a.content == token) return a.id;
    return -1;
  }

 private:
  struct Added {
    Added(std::string c, int32_t i) : content(std::move(c)), id(i) {}
    std::string content;
    int32_t id;
    bool lstrip = false, rstrip = false, single_word = false, normalized = false;
    std::string match;  // the content, normalized when `normalized`
  };
  struct Piece {
    std::string_view text;
    int32_t id;  // an added token, or -1 for text
  };
  std::vector<Piece> split_added(std::string_view s, bool normalized) const;
  std::string normalize(std::string_view seg) const;
  void encode_segment(std::string_view seg, std::vector<int32_t>& out) const;
  void encode_word(const std::string& word, std::vector<int32_t>& out) const;
  std::string file_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<bool> is_added_;
  std::unordered_map<std::string, int> ranks_;  // "a\x01b" -> merge rank
  std::vector<Added> added_;                    // longest match first
  bool first_byte_[2][256] = {};                // [normalized][b]: some added token's match starts with b
  PostProcessor post_;
  std::vector<Regex> splits_;
  bool nfc_ = false, prefix_space_ = false, ignore_merges_ = false;
  int32_t unk_ = -1, bos_ = -1, eos_ = -1, pad_ = -1;
};

[[noreturn]] void unsupported(const std::string& file, const std::string& what) {
  throw Error(file + ": " + what +
              " is not supported by px::text::load_bpe_tokenizer (byte-level BPE only: GPT-2, "
              "Llama 3, Qwen2 style); use a SentencePiece tokenizer.model for other models");
}

BpeTokenizer::BpeTokenizer(const json& j, const std::string& file) : file_(file) {
  const json& model = j.at("model");
  if (model.value("type", "") != "BPE") unsupported(file, "model type '" + model.value("type", "?") + "'");
  if (!model.value("continuing_subword_prefix", json()).is_null() && model["continuing_subword_prefix"] != "")
    unsupported(file, "continuing_subword_prefix");
  if (!model.value("end_of_word_suffix", json()).is_null() && model["end_of_word_suffix"] != "")
    unsupported(file, "end_of_word_suffix");
  ignore_merges_ = model.value("ignore_merges", false);
  // Ids index the decoding table, so each is checked before anything is sized by it: negative ids
  // and ids far past the number of tokens (a table of 2^31 entries for one token) are refused.
  std::vector<std::pair<std::string, int64_t>> ids;  // every (token, id), vocab then added tokens
  const json& vocab = model.at("vocab");
  if (!vocab.is_object()) throw Error(file + ": model.vocab must be an object of token: id");
  for (auto& [tok, id] : vocab.items()) ids.emplace_back(tok, json_int(id, file + ": the vocab id of '" + tok + "'"));
  const json added = j.value("added_tokens", json::array());
  if (!added.is_array()) throw Error(file + ": added_tokens must be an array");
  for (auto& t : added) {
    if (!t.is_object() || !t.contains("content") || !t["content"].is_string() || !t.contains("id"))
      throw Error(file + ": added token " + json_excerpt(t) +
                  " must be an object with a string \"content\" and an \"id\"");
    const std::string content = t["content"].get<std::string>();
    ids.emplace_back(content, json_int(t["id"], file + ": the id of added token '" + content + "'"));
  }
  const int64_t max_ok = 2 * static_cast<int64_t>(ids.size()) + 1024;  // holes allowed, not mostly holes
  for (auto& [tok, id] : ids)
    if (id < 0 || id >= max_ok)
      throw Error(file + ": token '" + tok + "' has id " + std::to_string(id) + ", outside [0, " +
                  std::to_string(max_ok) + "): ids are non-negative and at most about twice the " +
                  std::to_string(ids.size()) + " tokens of the file; the file is corrupt: restore it");
  int32_t max_id = -1;
  const size_t n_vocab = vocab.size();
  for (size_t k = 0; k < ids.size(); ++k) {
    const int32_t id = static_cast<int32_t>(ids[k].second);
    if (k < n_vocab)
      vocab_[ids[k].first] = id;
    else
      added_.push_back({ids[k].first, id});
    max_id = std::max(max_id, id);
  }
  // Merges: both parts and their concatenation must be tokens (as tokenizers requires when it
  // loads the file); otherwise a merged symbol would have no id and could only be dropped.
  int rank = 0;
  for (auto& m : model.at("merges")) {
    std::string a, b;
    if (m.is_string()) {  // "a b"
      std::string s = m.get<std::string>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos) throw Error(file + ": merge '" + s + "' is not two tokens separated by a space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {  // ["a", "b"]
      a = m.at(0).get<std::string>(), b = m.at(1).get<std::string>();
    }
    for (const std::string& t : {a, b, a + b})
      if (!vocab_.count(t))
        throw Error(file + ": merge '" + a + " " + b + "' (rank " + std::to_string(rank) + ") needs the token '" + t +
                    "', which is not in model.vocab; the merges and the vocabulary do not match: restore the file");
    ranks_.emplace(a + '\x01' + b, rank++);
  }
  // Added-token flags, as the tokenizers package applies them (added_ is in the file's order here).
  for (size_t k = 0; k < added_.size(); ++k) {
    const json& t = added[k];
    Added& a = added_[k];
    a.lstrip = t.value("lstrip", false), a.rstrip = t.value("rstrip", false);
    a.single_word = t.value("single_word", false), a.normalized = t.value("normalized", !t.value("special", false));
  }
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  is_added_.assign(id_to_token_.size(), false);
  for (auto& [tok, id] : vocab_) id_to_token_[id] = tok;
  for (auto& a : added_) id_to_token_[a.id] = a.content, is_added_[a.id] = true;
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const std::string unk = model["unk_token"].get<std::string>();
    unk_ = id_of(unk);
    if (unk_ < 0)
      throw Error(file + ": model.unk_token '" + unk +
                  "' is not a token of the file; add it to model.vocab or "
                  "set unk_token to null");
  }

  // Normalizer: none or NFC (possibly inside a one-element Sequence).
  json norm = j.value("normalizer", json());
  if (norm.is_object() && norm.value("type", "") == "Sequence") {
    json inner = json::array();
    for (auto& n : norm.at("normalizers")) inner.push_back(n);
    norm = inner.size() == 1 ? inner[0] : inner.empty() ? json() : norm;
  }
  if (norm.is_object()) {
    if (norm.value("type", "") != "NFC") unsupported(file, "normalizer '" + norm.dump() + "'");
    nfc_ = true;
  }

  // Pre-tokenizers: Split regexes and one ByteLevel, alone or in a Sequence.
  std::vector<json> pres;
  json pre = j.value("pre_tokenizer", json());
  if (pre.is_object() && pre.value("type", "") == "Sequence")
    for (auto& p : pre.at("pretokenizers")) pres.push_back(p);
  else if (pre.is_object())
    pres.push_back(pre);
  bool byte_level = false;
  for (auto& p : pres) {
    const std::string type = p.value("type", "");
    if (type == "Split") {
      const json& pat = p.at("pattern");
      if (!pat.contains("Regex")) unsupported(file, "a Split with a literal pattern");
      if (p.value("invert", false)) unsupported(file, "an inverted Split");
      const std::string behavior = p.value("behavior", "Isolated");
      if (behavior != "Isolated" && behavior != "Removed") unsupported(file, "Split behavior '" + behavior + "'");
      splits_.emplace_back(pat["Regex"].get<std::string>(), file);
      splits_.back().isolated = behavior == "Isolated";
    } else if (type == "ByteLevel") {
      byte_level = true;
      prefix_space_ = p.value("add_prefix_space", false);
      if (p.value("use_regex", true)) splits_.emplace_back(kGpt2Pattern, file);
    } else {
      unsupported(file, "pre-tokenizer '" + type + "'");
    }
  }
  if (!byte_level) unsupported(file, "a tokenizer without a ByteLevel pre-tokenizer");

  // Added tokens match as their normalized form when `normalized` (tokenizers normalizes them too).
  for (Added& a : added_) a.match = a.normalized ? normalize(a.content) : a.content;
  std::stable_sort(added_.begin(), added_.end(),
                   [](const Added& x, const Added& y) { return x.match.size() > y.match.size(); });
  for (const Added& a : added_)
    if (!a.match.empty()) first_byte_[a.normalized][static_cast<unsigned char>(a.match[0])] = true;
  read_post_processor(j.value("post_processor", json()), file, static_cast<int64_t>(id_to_token_.size()), post_);
}

void BpeTokenizer::encode_word(const std::string& word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Symbols start as single characters of the byte-level string.
  std::vector<std::string> sym;
  for (size_t i = 0; i < word.size();) {
    uint32_t cp;
    size_t n = std::max<size_t>(utf8_at(word, i, cp), 1);
    sym.push_back(word.substr(i, n));
    i += n;
  }
  while (sym.size() > 1) {
    int best = std::numeric_limits<int>::max();
    size_t at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = ranks_.find(sym[i] + '\x01' + sym[i + 1]);
      if (it != ranks_.end() && it->second < best) best = it->second, at = i;
    }
    if (best == std::numeric_limits<int>::max()) break;
    // Merge every occurrence of the best pair, left to right.
    const std::string a = sym[at], b = sym[at + 1];
    std::vector<std::string> next;
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && sym[i] == a && sym[i + 1] == b) {
        next.push_back(a + b);
        i += 2;
      } else {
        next.push_back(sym[i++]);
      }
    }
    sym.swap(next);
  }
  for (auto& s : sym) {
    auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      out.push_back(it->second);
    } else if (unk_ >= 0) {
      out.push_back(unk_);
    } else {
      // tokenizers drops such a piece without a word; losing text silently is worse than stopping.
      std::string raw, hex;
      for (size_t i = 0; i < s.size();) {
        uint32_t cp;
        size_t n = utf8_at(s, i, cp);
        auto b = n ? alphabet().char_to_byte.find(cp) : alphabet().char_to_byte.end();
        if (b == alphabet().char_to_byte.end()) break;
        char h[4];
        std::snprintf(h, sizeof h, "%02x", static_cast<unsigned>(b->second));
        hex += (hex.empty() ? "" : " ") + std::string(h);
        raw += static_cast<char>(b->second);
        i += n;
      }
      throw Error(file_ + ": cannot encode the text '" + lossy_utf8(raw) + "' (bytes " + hex +
                  "): it is not in the vocabulary and the tokenizer has no unk_token; use a tokenizer.json whose "
                  "vocabulary holds all 256 byte-level characters (or that names an unk_token)");
    }
  }
}

std::string BpeTokenizer::normalize(std::string_view seg) const {
  std::string text(seg);
  if (!nfc_) return text;
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(st);
  if (U_FAILURE(st)) throw Error(file_ + ": ICU has no NFC normalizer (" + u_errorName(st) + ")");
  icu::UnicodeString u = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  icu::UnicodeString normed = n->normalize(u, st);
  if (U_SUCCESS(st)) {
    text.clear();
    normed.toUTF8String(text);
  }
  return text;
}

// Pre-tokenizes and merges one normalized piece of text (no added token inside).
void BpeTokenizer::encode_segment(std::string_view seg, std::vector<int32_t>& out) const {
  std::string text(seg);
  if (prefix_space_ && !text.empty() && text[0] != ' ') text.insert(text.begin(), ' ');
  std::vector<std::string_view> pieces{text}, next;
  for (const Regex& r : splits_) {
    next.clear();
    for (auto p : pieces) r.split(p, next);
    pieces.swap(next);
  }
  const ByteAlphabet& ab = alphabet();
  for (auto p : pieces) {
    std::string word;
    for (unsigned char c : p) word += ab.byte_to_char[c];
    encode_word(word, out);
  }
}

// Cuts the added tokens of one kind (normalized or not) out of s, as tokenizers' AddedVocabulary
// does: leftmost-longest matches, scanned left to right without overlap; a single_word token that
// touches a word character on either side is passed over (the scan resumes after it); lstrip and
// rstrip take the whitespace beside the match into the token (not past the previous token).
std::vector<BpeTokenizer::Piece> BpeTokenizer::split_added(std::string_view s, bool normalized) const {
  std::vector<Piece> out;
  size_t done = 0, pos = 0;  // text before `done` is emitted; the scan resumes at `pos`
  while (pos < s.size()) {
    const Added* hit = nullptr;
    size_t at = pos;
    for (; at < s.size(); ++at) {
      if (!first_byte_[normalized][static_cast<unsigned char>(s[at])]) continue;
      for (const Added& a : added_)
        if (a.normalized == normalized && !a.match.empty() && s.compare(at, a.match.size(), a.match) == 0) {
          hit = &a;  // added_ is longest first
          break;
        }
      if (hit) break;
    }
    if (!hit) break;
    size_t start = at, stop = at + hit->match.size();
    pos = stop;
    if (hit->single_word && (ends_with_word(s.substr(0, start)) || starts_with_word(s.substr(stop)))) continue;
    if (hit->lstrip) start = std::max(trailing_space_start(s.substr(0, start)), done);
    if (hit->rstrip) pos = stop = stop + leading_space_len(s.substr(stop));
    if (done < start) out.push_back({s.substr(done, start - done), -1});
    out.push_back({{}, hit->id});
    done = stop;
  }
  if (done < s.size()) out.push_back({s.substr(done), -1});
  return out;
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  for (const Piece& raw : split_added(text, false)) {
    if (raw.id >= 0) {
      out.push_back(raw.id);
      continue;
    }
    const std::string norm = normalize(raw.text);
    for (const Piece& p : split_added(norm, true)) {
      if (p.id >= 0)
        out.push_back(p.id);
      else
        encode_segment(p.text, out);
    }
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  const ByteAlphabet& ab = alphabet();
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(id_to_token_.size()))
      throw Error(file_ + ": token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                  std::to_string(id_to_token_.size()) + ")");
    const std::string& t = id_to_token_[id];
    // A token maps back through the byte alphabet when all its characters belong to it, else as is.
    std::string mapped;
    bool all = true;
    for (size_t i = 0; i < t.size() && all;) {
      uint32_t cp;
      size_t n = utf8_at(t, i, cp);
      auto it = n ? ab.char_to_byte.find(cp) : ab.char_to_byte.end();
      if (it == ab.char_to_byte.end()) {
        all = false;
      } else {
        mapped += static_cast<char>(it->second);
        i += n;
      }
    }
    bytes += all ? mapped : t;
  }
  return lossy_utf8(bytes);
}

// bos/eos/pad tokens from tokenizer_config.json: a string or {"content": ...}; -2 when absent.
int32_t special_from(const json& cfg, const char* key, const std::function<int32_t(const std::string&)>& id_of) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return -2;
  if (it->is_string()) return id_of(it->get<std::string>());
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return id_of((*it)["content"].get<std::string>());
  return -1;
}

json read_json_file(const std::string& path, const std::string& missing_fix) {
  io::require_regular_file(path, "[tokenizer] ");
  std::ifstream in(path);
  if (!in) throw Error(path + ": not found; " + missing_fix);
  try {
    return json::parse(in);
  } catch (const std::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + "); restore the file");
  }
}

// tokenizer_config.json beside the tokenizer, or null.
json read_config(const std::string& dir) {
  const std::string path = dir + "/tokenizer_config.json";
  if (!std::filesystem::exists(path)) return json();
  json cfg = read_json_file(path, "");
  if (!cfg.is_object()) throw Error(path + ": expected a JSON object; restore the file");
  return cfg;
}

std::unique_ptr<BpeTokenizer> make_bpe(const json& j, const std::string& path, const std::string& dir) {
  std::unique_ptr<BpeTokenizer> tok;
  try {
    tok = std::make_unique<BpeTokenizer>(j, path);
  } catch (const json::exception& e) {
    throw Error(path + ": malformed tokenizer.json (" + e.what() + ")");
  }
  json cfg = read_config(dir);
  if (cfg.is_object()) {
    auto id_of = [&](const std::string& t) { return tok->id_of(t); };
    auto get = [&](const char* key) { return std::max(special_from(cfg, key, id_of), -1); };
    tok->set_specials(get("bos_token"), get("eos_token"), get("pad_token"));
  }
  return tok;
}

// A Hugging Face SentencePiece tokenizer (Llama 2, Mistral): the .model does the encoding; the
// special ids and which ones encode_with_special_tokens adds come from the directory's tokenizer.json
// (post_processor, added tokens) and tokenizer_config.json.
class HfSentencePiece : public Tokenizer {
 public:
  HfSentencePiece(std::unique_ptr<Tokenizer> sp, const json* tokenizer_json, const json& cfg, const std::string& dir)
      : sp_(std::move(sp)) {
    bos_ = sp_->bos_id(), eos_ = sp_->eos_id(), pad_ = sp_->pad_id();
    const std::string json_path = dir + "/tokenizer.json";
    if (tokenizer_json) {
      metaspace_prepend_ = metaspace_prepends(*tokenizer_json);
      try {
        read_post_processor(tokenizer_json->value("post_processor", json()), json_path, sp_->vocab_size(), post_);
        has_post_ = tokenizer_json->contains("post_processor") && !(*tokenizer_json)["post_processor"].is_null();
      } catch (const json::exception& e) {
        throw Error(json_path + ": malformed post_processor (" + e.what() + ")");
      }
    }
    if (cfg.is_object()) {
      auto id_of = [&](const std::string& t) { return tokenizer_json ? id_in(*tokenizer_json, t) : -1; };
      // A token found in tokenizer.json replaces the .model's id; null means none.
      auto set = [&](const char* key, int32_t& field) {
        const int32_t id = special_from(cfg, key, id_of);
        if (id >= 0 || (cfg.contains(key) && cfg[key].is_null())) field = std::max(id, -1);
      };
      set("bos_token", bos_);
      set("eos_token", eos_);
      set("pad_token", pad_);
      auto flag = [&](const char* key, bool fallback) {
        if (!cfg.contains(key) || cfg[key].is_null()) return fallback;
        if (!cfg[key].is_boolean())
          throw Error(dir + "/tokenizer_config.json: '" + key + "' must be true or false, got " + cfg[key].dump() +
                      "; fix the file");
        return cfg[key].get<bool>();
      };
      add_bos_ = flag("add_bos_token", true);
      add_eos_ = flag("add_eos_token", false);
    }
  }
  std::string kind() const override { return "sentencepiece"; }
  // A text that starts with a space gets no second "▁" from tokenizer.json's Metaspace, while the
  // model's dummy prefix would add one: "  two" is "▁▁two" in transformers, so one space less here.
  std::vector<int32_t> encode(std::string_view text) const override {
    if (metaspace_prepend_ && !text.empty() && text[0] == ' ') text.remove_prefix(1);
    return sp_->encode(text);
  }
  std::string decode(const std::vector<int32_t>& ids) const override { return sp_->decode(ids); }
  int64_t vocab_size() const override { return sp_->vocab_size(); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  int32_t pad_id() const override { return pad_; }
  std::vector<int32_t> add_special_tokens(std::vector<int32_t> ids) const override {
    if (has_post_) return post_.apply(std::move(ids));
    if (add_bos_ && bos_ >= 0) ids.insert(ids.begin(), bos_);
    if (add_eos_ && eos_ >= 0) ids.push_back(eos_);
    return ids;
  }

 private:
  // The id of `token` in tokenizer.json: an added token, or the model's vocab (an object for BPE, a
  // list of [piece, score] for Unigram); -1 when absent.
  static int32_t id_in(const json& j, const std::string& token) {
    for (const json& t : j.value("added_tokens", json::array()))
      if (t.is_object() && t.value("content", "") == token && t.contains("id") && t["id"].is_number_integer())
        return t["id"].get<int32_t>();
    const json& vocab = j.contains("model") && j["model"].is_object() ? j["model"].value("vocab", json()) : json();
    if (vocab.is_object() && vocab.contains(token) && vocab[token].is_number_integer())
      return vocab[token].get<int32_t>();
    if (vocab.is_array())
      for (size_t i = 0; i < vocab.size(); ++i)
        if (vocab[i].is_array() && !vocab[i].empty() && vocab[i][0] == token) return static_cast<int32_t>(i);
    return -1;
  }
  std::unique_ptr<Tokenizer> sp_;
  int32_t bos_, eos_, pad_;
  PostProcessor post_;
  bool has_post_ = false, add_bos_ = true, add_eos_ = false, metaspace_prepend_ = false;
};

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& path) {
  json j = read_json_file(path, "give the tokenizer.json of the model");
  const std::string dir = path.find('/') == std::string::npos ? "." : path.substr(0, path.find_last_of('/'));
  return make_bpe(j, path, dir);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string json_path = (fs::path(dir) / "tokenizer.json").string();
  const std::string model_path = (fs::path(dir) / "tokenizer.model").string();
  const bool has_model = fs::exists(model_path);
  if (fs::exists(json_path)) {
    json j = read_json_file(json_path, "");
    if (!j.is_object()) throw Error(json_path + ": expected a JSON object; restore the file");
    if (!sentencepiece_style(j)) return make_bpe(j, json_path, dir);
    if (!has_model)
      throw Error(json_path +
                  ": a SentencePiece-style tokenizer (Metaspace pre-tokenizer, Prepend normalizer or Unigram model) "
                  "is read from its tokenizer.model, which is not in " +
                  dir + "; copy the model's tokenizer.model beside tokenizer.json");
    return std::make_unique<HfSentencePiece>(load_sentencepiece(model_path), &j, read_config(dir), dir);
  }
  if (has_model)
    return std::make_unique<HfSentencePiece>(load_sentencepiece(model_path), nullptr, read_config(dir), dir);
  throw Error(dir + ": no tokenizer.json or tokenizer.model; copy the model's tokenizer files into it");
}

}  // namespace px::text
