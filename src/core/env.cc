// The only file that calls getenv: each variable is declared in the table below.
#include "core/env.h"

#include <omp.h>

#include <cstdlib>
#include <mutex>

namespace px {

namespace {

bool parse_bool(const char* name, const char* v) {
  std::string s(v);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  throw Error(std::string("[env] ") + name + "='" + s + "' is not a boolean; use 1 or 0");
}

}  // namespace

EnvConfig parse_env(const std::function<const char*(const char*)>& get_raw) {
  auto get = [&](const char* name) -> const char* {
    const char* v = get_raw(name);
    return (v && *v) ? v : nullptr;  // set but empty counts as unset
  };
  EnvConfig c;
  if (const char* v = get("PX_NUM_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 4096)
      throw Error(std::string("[env] PX_NUM_THREADS='") + v + "' is not a thread count; use an integer >= 1 (0 = default)");
    c.num_threads = static_cast<int>(n);
  }
  if (const char* v = get("PX_LOG_LEVEL")) {
    try {
      c.log_level = log_level_from_name(v);
    } catch (const Error&) {
      throw Error(std::string("[env] PX_LOG_LEVEL='") + v + "' is not a log level; use debug, info, warn, error or off");
    }
  }
  if (const char* v = get("PX_DUMP_DIR")) c.dump_dir = v;
  if (const char* v = get("PX_DISABLE_FUSION")) c.disable_fusion = parse_bool("PX_DISABLE_FUSION", v);
  if (const char* v = get("PX_PROFILE")) c.profile = parse_bool("PX_PROFILE", v);
  return c;
}

const EnvConfig& env() {
  static const EnvConfig c = parse_env([](const char* name) { return std::getenv(name); });
  return c;
}

const std::vector<EnvVariable>& env_variables() {
  static const std::vector<EnvVariable> vars = {
      {"PX_NUM_THREADS", "number of OpenMP threads the CPU kernels use (default: OpenMP's, usually all cores)"},
      {"PX_LOG_LEVEL", "least severe log records shown: debug, info, warn (default), error, off"},
      {"PX_DUMP_DIR", "directory where every compiled graph and its schedule are written as text"},
      {"PX_DISABLE_FUSION", "1 compiles every elementwise op as its own kernel (for debugging and benchmarks)"},
      {"PX_PROFILE", "1 times every kernel; Executable::profile_report() prints the totals"},
  };
  return vars;
}

void apply_thread_settings() {
  int n = env().num_threads;
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}

}  // namespace px
