// The only file that calls getenv: each variable is declared in the table below.
#include "core/env.h"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>
#include <tuple>
#include <unistd.h>

namespace px {

namespace {

bool parse_bool(const char* name, const char* v) {
  std::string s(v);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  throw Error(std::string("[env] ") + name + "='" + s + "' is not a boolean; use 1 or 0");
}

constexpr int64_t kMaxDevices = 65536;

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

}  // namespace

bool valid_platform_name(const std::string& name) {
  return !name.empty() && std::islower(static_cast<unsigned char>(name[0])) &&
         std::all_of(name.begin(), name.end(),
                     [](unsigned char c) { return std::islower(c) || std::isdigit(c) || c == '_'; });
}

std::pair<std::string, int64_t> parse_device_text(const std::string& text, const std::string& where) {
  std::string t = trim(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string forms = "use cpu (one device) or cpu:N with 1 <= N <= " + std::to_string(kMaxDevices) +
                            " (N virtual CPU devices, e.g. cpu:8); another backend's devices likewise (ref:2)";
  size_t colon = t.find(':');
  std::string platform = trim(t.substr(0, colon));
  // The platform is a backend's name (checked against the registered backends where a program
  // compiles for it).
  if (!valid_platform_name(platform)) throw Error(where + "'" + text + "' is not a device set; " + forms);
  if (colon == std::string::npos) return {platform, 1};
  std::string count = trim(t.substr(colon + 1));
  bool digits = !count.empty() && count.size() <= 6 &&
                std::all_of(count.begin(), count.end(), [](unsigned char c) { return std::isdigit(c); });
  int64_t n = digits ? std::stoll(count) : 0;
  if (n < 1 || n > kMaxDevices) throw Error(where + "'" + text + "' is not a device set; " + forms);
  return {platform, n};
}

int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

EnvConfig parse_env(const std::function<const char*(const char*)>& get_raw, int cores) {
  auto get = [&](const char* name) -> const char* {
    const char* v = get_raw(name);
    return (v && *v) ? v : nullptr;  // set but empty counts as unset
  };
  EnvConfig c;
  if (const char* v = get("PX_NUM_THREADS")) {
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 0 || n > 4096)
      throw Error(std::string("[env] PX_NUM_THREADS='") + v +
                  "' is not a thread count; use an integer >= 1 (0 = default)");
    c.num_threads = static_cast<int>(n);
    // More threads than cores: every parallel loop waits for workers the OS has descheduled (about
    // 1000x slower for 4096 threads on 2 cores). Capped, with a warning when the threads are set.
    if (cores <= 0) cores = available_cores();
    if (n > cores) {
      c.num_threads = cores;
      c.num_threads_note = std::string("[env] PX_NUM_THREADS=") + v + " is more than the " + std::to_string(cores) +
                           " cores this process may run on; using " + std::to_string(cores) +
                           " threads (more threads than cores only wait for each other); set PX_NUM_THREADS <= " +
                           std::to_string(cores) + " or 0 for the default";
    }
  }
  if (const char* v = get("PX_LOG_LEVEL")) {
    try {
      c.log_level = log_level_from_name(v);
    } catch (const Error&) {
      throw Error(std::string("[env] PX_LOG_LEVEL='") + v +
                  "' is not a log level; use debug, info, warn, error or off");
    }
  }
  if (const char* v = get("PX_DUMP")) {
    std::error_code ec;
    if (std::filesystem::exists(v, ec) && !std::filesystem::is_directory(v, ec))
      throw Error(std::string("[env] PX_DUMP='") + v +
                  "' is a file, not a folder; set PX_DUMP to a folder (made when missing) for the programs' text");
    c.dump_dir = v;
  }
  if (const char* v = get("PX_DUMP_CANDIDATES")) c.dump_candidates = parse_bool("PX_DUMP_CANDIDATES", v);
  if (const char* v = get("PX_RECALIBRATE")) {
    // Only 0 and 1: the cluster cache's reader (sharding/auto/cluster.cc) takes any other value for 1.
    if (std::string(v) != "0" && std::string(v) != "1")
      throw Error(std::string("[env] PX_RECALIBRATE='") + v + "' is not 0 or 1; use 1 to measure the clusters again");
    c.recalibrate = std::string(v) == "1";
  }
  if (const char* v = get("PX_DISABLE_FUSION")) c.disable_fusion = parse_bool("PX_DISABLE_FUSION", v);
  if (const char* v = get("PX_REF_DISCRETE")) c.ref_discrete = parse_bool("PX_REF_DISCRETE", v);
  if (const char* v = get("PX_CUDA_TF32")) c.cuda_tf32 = parse_bool("PX_CUDA_TF32", v);
  if (const char* v = get("PX_PROFILE")) c.profile = parse_bool("PX_PROFILE", v);
  if (const char* v = get("PX_DEVICES")) {
    c.device_text = v;
    try {
      std::tie(c.device_platform, c.device_count) = parse_device_text(v, "[env] PX_DEVICES=");
    } catch (const Error& e) {
      c.devices_error = e.what();
    }
  }
  if (const char* v = get("PX_COLLECTIVE_TIMEOUT_S")) {
    char* end = nullptr;
    double t = std::strtod(v, &end);
    if (*end != '\0' || !(t > 0) || t > 1e6)
      throw Error(std::string("[env] PX_COLLECTIVE_TIMEOUT_S='") + v +
                  "' is not a timeout; use a number of seconds > 0, e.g. 60");
    c.collective_timeout_s = t;
  }
  // The launcher's rank and size (first match wins); a malformed value is not ours to reject.
  auto as_int = [](const char* v) {
    char* end = nullptr;
    long n = v ? std::strtol(v, &end, 10) : -1;
    return (v && *end == '\0' && n >= 0 && n < (1 << 24)) ? static_cast<int>(n) : -1;
  };
  struct Source {
    const char* rank;
    const char* size;
    const char* name;
  };
  for (Source src : {Source{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"},
                     Source{"PMIX_RANK", "OMPI_UNIVERSE_SIZE", "pmix"}, Source{"SLURM_PROCID", "SLURM_NTASKS", "srun"}}) {
    if (std::string(src.name) == "srun" && !get("SLURM_STEP_ID")) continue;  // sbatch's shell is no rank
    int r = as_int(get(src.rank)), n = as_int(get(src.size));
    if (r >= 0 && n > r) {
      c.launch_rank = r;
      c.launch_size = n;
      c.launcher = src.name;
      break;
    }
  }
  return c;
}

EnvConfig env_now(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return EnvConfig();
  return parse_env([v, name](const char* n) { return std::string(n) == name ? v : nullptr; });
}

bool recalibrate_requested() { return env_now("PX_RECALIBRATE").recalibrate; }

std::string user_cache_dir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return xdg;
  if (const char* home = std::getenv("HOME"); home && *home) return (std::filesystem::path(home) / ".cache").string();
  return "";
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string misspelt_env_note(const std::vector<std::string>& set_names) {
  std::string note;
  for (const std::string& name : set_names) {
    std::string upper = name;
    std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char ch) { return std::toupper(ch); });
    if (upper.rfind("PX_", 0) != 0) continue;
    const EnvVariable* best = nullptr;
    size_t best_d = 3;  // two edits at most: further off, it is some tool's own variable
    bool known = false;
    for (const EnvVariable& v : env_variables()) {
      known = known || name == v.name;
      const size_t d = edit_distance(upper, v.name);
      if (d < best_d) best = &v, best_d = d;
    }
    if (known || !best) continue;
    note += std::string(note.empty() ? "" : "\n") + "[env] " + name + " is set but parallax reads no such variable; did you mean " +
            best->name + "? (px::env_variables() and docs/conventions.md list the ones it reads)";
  }
  return note;
}

const EnvConfig& env() {
  static const EnvConfig c = [] {
    EnvConfig e = parse_env([](const char* name) { return std::getenv(name); });
    std::vector<std::string> names;
    for (char** v = environ; v && *v; ++v) {
      const std::string kv(*v);
      names.push_back(kv.substr(0, kv.find('=')));
    }
    e.misspelt_note = misspelt_env_note(names);
    return e;
  }();
  return c;
}

const std::vector<EnvVariable>& env_variables() {
  static const std::vector<EnvVariable> vars = {
      {"PX_NUM_THREADS", "number of OpenMP threads the CPU kernels use (default: OpenMP's, usually all cores)"},
      {"PX_LOG_LEVEL", "least severe log records shown: debug, info, warn (default), error, off"},
      {"PX_DUMP", "directory where the program after every compiler pass (trace, sharding decision, partition, autocast, schedule, buffer plan) is written as text"},
      {"PX_DISABLE_FUSION", "1 compiles every elementwise op as its own kernel (for debugging and benchmarks)"},
      {"PX_REF_DISCRETE",
       "1 maps the ref backend's device memory inaccessible to the host, as an accelerator's is: a host "
       "read of a device buffer faults, naming it (for testing device-memory paths on a CPU)"},
      {"PX_PROFILE", "1 times every kernel; Executable::profile_report() prints the totals"},
      {"PX_CUDA_TF32",
       "1 lets the CUDA backend's f32 matmuls round their inputs to TF32 (faster, ~1e-3 relative); default exact f32"},
      {"PX_DUMP_CANDIDATES",
       "1 also dumps the candidate programs that remat auto and AUTO sharding plan on the way (PX_DUMP/candidates/)"},
      {"PX_RECALIBRATE", "1 measures the platform clusters again instead of reading their cached rates (0 or 1)"},
      {"PX_DEVICES",
       "devices meshes are made on by default (Mesh::create, Mesh::parse): cpu (default, one device) or "
       "cpu:N for N virtual CPU devices in this process, e.g. cpu:8 (under mpirun or srun: each process's "
       "own devices; the global mesh spans every process's)"},
      {"PX_COLLECTIVE_TIMEOUT_S",
       "seconds a collective across processes waits for a peer before failing with an error that names the "
       "missing rank (default 60)"},
  };
  return vars;
}

void apply_thread_settings() {
  static std::once_flag warned;
  std::call_once(warned, [] {
    if (!env().num_threads_note.empty()) PX_LOG(warn) << env().num_threads_note;
    if (!env().misspelt_note.empty()) PX_LOG(warn) << env().misspelt_note;
  });
  if (ThreadBudget::current() > 0) return;
  int n = env().num_threads;
  if (n > 0 && omp_get_max_threads() != n) omp_set_num_threads(n);
}

namespace {
thread_local int t_budget = 0;
}  // namespace

ThreadBudget::ThreadBudget(int threads)
    : active_(threads > 0), prev_budget_(t_budget), prev_omp_(omp_get_max_threads()) {
  if (!active_) return;
  t_budget = threads;
  omp_set_num_threads(t_budget);  // what oneDNN and nested regions started by this thread take
}

ThreadBudget::~ThreadBudget() {
  if (!active_) return;
  t_budget = prev_budget_;
  omp_set_num_threads(prev_omp_);
}

int ThreadBudget::current() { return t_budget; }

int process_threads() {
  apply_thread_settings();
  return omp_get_max_threads();
}

}  // namespace px
