#include "core/dump.h"

#include <atomic>
#include <cstdio>
#include <fstream>

#include "core/env.h"
#include "core/log.h"

namespace px {

bool dumping() { return !env().dump_dir.empty(); }

void dump_pass(const std::string& pass, const std::function<std::string()>& text) {
  if (!dumping()) return;
  static std::atomic<int> counter{0};
  char prefix[16];
  std::snprintf(prefix, sizeof prefix, "%04d_", counter++);
  std::string path = env().dump_dir + "/" + prefix + pass + ".txt";
  std::ofstream f(path);
  if (!f) {
    PX_LOG(warn) << "PX_DUMP: cannot write " << path << " (does the directory exist?)";
    return;
  }
  f << "# pass: " << pass << "\n" << text();
}

}  // namespace px
