// The primitive registry: each family registers its primitives once, on first use.
#include <algorithm>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "ir/primitive.h"

namespace px {

namespace {
// Primitives may be registered (e.g. by tests or extensions) while other threads trace: writers
// take the lock alone. Entries are never removed and live behind unique_ptrs, so references stay valid.
std::shared_mutex& table_mutex() {
  static std::shared_mutex m;
  return m;
}
std::unordered_map<std::string, std::unique_ptr<Primitive>>& table() {
  static std::unordered_map<std::string, std::unique_ptr<Primitive>> t;
  return t;
}

void ensure_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_elementwise_primitives();
    register_shape_primitives();
    register_reduce_primitives();
    register_matmul_primitives();
    register_nn_primitives();
    register_optim_primitives();
    register_index_primitives();
    register_rng_primitives();
    register_memory_primitives();
  });
}
}  // namespace

void register_primitive(Primitive p) {
  if (p.name.empty() || !p.infer) throw Error("[registry] a primitive needs a name and a shape rule");
  std::unique_lock lock(table_mutex());
  auto& t = table();
  if (t.count(p.name)) throw Error("[registry] primitive '" + p.name + "' registered twice");
  std::string name = p.name;
  t[name] = std::make_unique<Primitive>(std::move(p));
}

const Primitive& get_primitive(const std::string& name) {
  ensure_registered();
  std::shared_lock lock(table_mutex());
  auto it = table().find(name);
  if (it == table().end()) throw Error("[registry] unknown primitive '" + name + "'");
  return *it->second;
}

std::vector<std::string> primitive_names() {
  ensure_registered();
  std::shared_lock lock(table_mutex());
  std::vector<std::string> names;
  for (auto& [k, v] : table()) names.push_back(k);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace px
