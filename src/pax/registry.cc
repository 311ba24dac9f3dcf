// The experiment registry: names -> functions returning configs. The built-ins are added on first
// use (not by static initializers, which a static library may drop).
#include <algorithm>
#include <map>
#include <mutex>

#include "parallax/pax.h"
#include "pax/experiments.h"
#include "pax/suggest.h"

namespace px::pax {
namespace {

struct Entry {
  std::string summary;
  ExperimentFn fn;
};

std::map<std::string, Entry>& entries() {
  static std::map<std::string, Entry> m;
  return m;
}
std::recursive_mutex& mu() {
  static std::recursive_mutex m;
  return m;
}

void ensure_builtins() {
  static bool done = false;
  if (done) return;
  done = true;
  register_builtin_experiments();
}

bool valid_name(const std::string& n) {
  if (n.empty() || n.front() == '.' || n.back() == '.') return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; });
}

}  // namespace

void register_experiment(const std::string& name, const std::string& summary, ExperimentFn fn) {
  std::lock_guard<std::recursive_mutex> lock(mu());
  ensure_builtins();
  if (!valid_name(name))
    throw Error("[pax] experiment name '" + name + "' must be dotted words of letters, digits and '_', e.g. my.TinyLm");
  if (entries().count(name)) throw Error("[pax] experiment '" + name + "' is already registered");
  if (!fn) throw Error("[pax] experiment '" + name + "' has no config function");
  entries()[name] = Entry{summary, std::move(fn)};
}

std::vector<ExperimentInfo> list_experiments() {
  std::lock_guard<std::recursive_mutex> lock(mu());
  ensure_builtins();
  std::vector<ExperimentInfo> out;
  for (auto& [name, e] : entries()) out.push_back({name, e.summary});
  return out;
}

ExperimentConfig experiment(const std::string& name) {
  ExperimentFn fn;
  std::string summary;
  {
    std::lock_guard<std::recursive_mutex> lock(mu());
    ensure_builtins();
    auto it = entries().find(name);
    if (it == entries().end()) {
      std::vector<std::string> names;
      for (auto& [n, e] : entries()) names.push_back(n);
      const std::string near = closest(name, names);
      throw UserError("[pax] unknown experiment '" + name + "'" +
                      (near.empty() ? "; see 'pax list'" : "; did you mean '" + near + "'? (see 'pax list')"));
    }
    fn = it->second.fn;
    summary = it->second.summary;
  }
  ExperimentConfig c = fn();
  c.name = name;
  c.summary = summary;
  return c;
}

}  // namespace px::pax
