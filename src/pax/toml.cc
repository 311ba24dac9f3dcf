// ExperimentConfig <-> TOML with toml++: one table per section, every field written, so a
// resolved config read back gives the same experiment.
#include <fmt/format.h>

#include <toml++/toml.h>
#include <fstream>
#include <sstream>
#include <string_view>

#include "io/regular_file.h"
#include "io/toml_guard.h"
#include "parallax/pax.h"

namespace px::pax {
namespace {

std::string section_of(const std::string& path) { return path.substr(0, path.find('.')); }
std::string key_of(const std::string& path) { return path.substr(path.find('.') + 1); }

// A TOML value converted to the field's type; ints are accepted for floats.
FieldValue from_node(const FieldInfo& f, const toml::node& n, const std::string& file) {
  auto bad = [&](const char* got) {
    return Error("[pax] " + file + ": " + f.path + " must be " + field_type_name(f.type) + " (" + f.allowed() +
                 "), got a " + got);
  };
  auto kind = [&]() -> const char* {
    switch (n.type()) {
      case toml::node_type::string:
        return "string";
      case toml::node_type::integer:
        return "integer";
      case toml::node_type::floating_point:
        return "float";
      case toml::node_type::boolean:
        return "bool";
      case toml::node_type::array:
        return "array";
      case toml::node_type::table:
        return "table";
      default:
        return "date or time";
    }
  };
  switch (f.type) {
    case FieldType::integer:
      if (auto v = n.value_exact<int64_t>()) return *v;
      throw bad(kind());
    case FieldType::floating:
      if (n.is_floating_point()) return *n.value<double>();
      if (n.is_integer()) return static_cast<double>(*n.value<int64_t>());
      throw bad(kind());
    case FieldType::boolean:
      if (auto v = n.value_exact<bool>()) return *v;
      throw bad(kind());
    case FieldType::list: {
      const toml::array* a = n.as_array();
      if (!a) throw bad(kind());
      std::vector<std::string> items;
      for (const toml::node& e : *a) {
        auto s = e.value_exact<std::string>();
        if (!s) throw Error("[pax] " + file + ": " + f.path + " must be an array of strings");
        items.push_back(*s);
      }
      return items;
    }
    default:
      if (auto v = n.value_exact<std::string>()) return *v;
      throw bad(kind());
  }
}

}  // namespace

std::string to_toml(const ExperimentConfig& c) {
  toml::table root;
  root.insert("experiment", c.name);
  for (const FieldInfo& f : fields()) {
    std::string sec = section_of(f.path);
    if (!root.contains(sec)) root.insert(sec, toml::table{});
    toml::table& t = *root[sec].as_table();
    FieldValue v = get_field(c, f.path);
    std::string key = key_of(f.path);
    if (auto* i = std::get_if<int64_t>(&v))
      t.insert(key, *i);
    else if (auto* d = std::get_if<double>(&v))
      t.insert(key, *d);
    else if (auto* b = std::get_if<bool>(&v))
      t.insert(key, *b);
    else if (auto* s = std::get_if<std::string>(&v))
      t.insert(key, *s);
    else {
      toml::array a;
      for (auto& s : std::get<std::vector<std::string>>(v)) a.push_back(s);
      t.insert(key, std::move(a));
    }
  }
  std::ostringstream os;
  os << "# pax experiment config: `pax train --config <this file> --job_log_dir=DIR` reproduces it\n";
  if (!c.summary.empty()) os << "# " << c.summary << "\n";
  // Non-ASCII characters as escapes: the file reads back whatever they are (io/toml_guard.h).
  os << toml::toml_formatter(root, toml::toml_formatter::default_flags & ~toml::format_flags::allow_unicode_strings)
     << "\n";
  return os.str();
}


// The file's table; a syntax error names the file and the line.
static toml::table parse_toml_file(const std::string& path) {
  io::require_regular_file(path, "[pax] config file ");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("[pax] cannot read config file '" + path + "'");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  check_toml_text(text, path);
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "[pax] " << path << ": " << e.description() << " at line " << e.source().begin.line;
    throw Error(os.str());
  }
}

void apply_toml_file(ExperimentConfig& c, const std::string& path) {
  toml::table root = parse_toml_file(path);
  for (auto&& [k, node] : root) {
    std::string key(k.str());
    if (key == "experiment") continue;
    const toml::table* t = node.as_table();
    if (!t) {
      try {
        field_info(key);  // a dotted key at the top level names the field in the message
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + " (in " + path + ")");
      }
      throw Error("[pax] " + path + ": '" + key + "' must be a [section] table");
    }
    for (auto&& [sk, sn] : *t) {
      std::string fpath = key + "." + std::string(sk.str());
      const FieldInfo* f = nullptr;
      try {
        f = &field_info(fpath);
      } catch (const Error& e) {
        throw Error(std::string(e.what()) + " (in " + path + ")");
      }
      set_field_value(c, fpath, from_node(*f, sn, path));
    }
  }
}

ExperimentConfig from_toml_file(const std::string& path, const ExperimentConfig* base) {
  io::require_regular_file(path, "[pax] config file ");  // a directory opens, and reads as an empty config
  if (!std::ifstream(path)) throw Error("[pax] cannot read config file '" + path + "'");
  ExperimentConfig c;
  if (base) {
    c = *base;
  } else {
    toml::table root = parse_toml_file(path);
    auto name = root["experiment"].value<std::string>();
    if (!name || name->empty())
      throw Error("[pax] " + path + " names no experiment: add experiment = \"<name>\" or pass --exp");
    c = experiment(*name);
  }
  apply_toml_file(c, path);
  return c;
}

}  // namespace px::pax
