// A backend's kernels by primitive: keyed by the primitive itself (the Primitive the registry
// holds, a handle of src/ops/prims.h), never by its name, so a misspelt or removed primitive is a
// compile error where its kernel is registered. The cpu and ref backends each keep their tables in
// one of these; a lookup takes the node's `prim`.
//
// A primitive registered above the backends (the SPMD ones, which src/sharding registers on its
// first use) is added with its handle getter (`add_late`): the getter returns null until the
// primitive exists, and the table resolves it when a lookup first misses after that. A node of it
// only exists once it is registered, so its kernel is always found.
#pragma once

#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "parallax/core.h"
#include "ir/primitive.h"

namespace px {

template <class Entry>
class KernelTable {
 public:
  using Handle = const Primitive* (*)();

  // `what` names the table in errors ("cpu", "ref elementwise").
  explicit KernelTable(std::string what) : what_(std::move(what)) {}

  // Throws px::Error when the primitive has a kernel here already.
  void add(const Primitive* p, Entry e) {
    if (!p) throw Error("[" + what_ + "] a kernel registered without a primitive");
    std::unique_lock lock(mutex_);
    if (!entries_.emplace(p, std::move(e)).second)
      throw Error("[" + what_ + "] kernel '" + p->name + "' registered twice");
  }
  void add_late(Handle h, Entry e) {
    std::unique_lock lock(mutex_);
    pending_.emplace_back(h, std::move(e));
  }

  // nullptr when the primitive has none. Entries are never removed and the map is node-based, so
  // the pointer stays valid while other threads register.
  const Entry* find(const Primitive* p) {
    {
      std::shared_lock lock(mutex_);
      auto it = entries_.find(p);
      if (it != entries_.end()) return &it->second;
      if (pending_.empty()) return nullptr;
    }
    std::unique_lock lock(mutex_);
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (const Primitive* q = it->first()) {
        if (!entries_.emplace(q, std::move(it->second)).second)
          throw Error("[" + what_ + "] kernel '" + q->name + "' registered twice");
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    auto it = entries_.find(p);
    return it == entries_.end() ? nullptr : &it->second;
  }

 private:
  std::string what_;
  std::shared_mutex mutex_;
  std::map<const Primitive*, Entry> entries_;
  std::vector<std::pair<Handle, Entry>> pending_;
};

}  // namespace px
