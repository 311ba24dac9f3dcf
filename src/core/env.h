// Every environment variable the library reads, read in one place (env.cc) and once.
//
//   int n = px::env().num_threads;           // PX_NUM_THREADS, 0 = OpenMP's default
//   for (auto& v : px::env_variables()) std::cout << v.name << ": " << v.help << "\n";
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"

namespace px {

struct EnvConfig {
  int num_threads = 0;                  // PX_NUM_THREADS: OpenMP threads for kernels (0 = default)
  // Set when PX_NUM_THREADS asked for more threads than the cores available (num_threads is then
  // the core count): the warning apply_thread_settings() logs once.
  std::string num_threads_note;
  // Set by env() when a PX_ variable it does not read is within two edits of one it does (PX_DEVICE
  // for PX_DEVICES): the warning apply_thread_settings() logs once, naming the likely one.
  std::string misspelt_note;
  LogLevel log_level = LogLevel::warn;  // PX_LOG_LEVEL: debug | info | warn | error | off
  std::string dump_dir;                 // PX_DUMP: where each pass writes its program as text ("" = nowhere)
  bool disable_fusion = false;          // PX_DISABLE_FUSION=1: compile every elementwise op alone
  // PX_REF_DISCRETE=1: the `ref` backend's device memory is mapped inaccessible to the host outside
  // its kernels and copies, as an accelerator's is (src/backend/ref/discrete.cc).
  bool ref_discrete = false;
  // PX_CUDA_TF32=1: the CUDA backend's f32 matmuls may round their inputs to TF32 (cuBLASLt's
  // fast TF32 compute; faster, ~1e-3 relative); default exact f32.
  bool cuda_tf32 = false;
  bool profile = false;                 // PX_PROFILE=1: time every kernel (Executable::profile_report)
  bool dump_candidates = false;         // PX_DUMP_CANDIDATES=1: PX_DUMP also writes the plans' candidates
  bool recalibrate = false;             // PX_RECALIBRATE=1: measure the platform clusters again (0 or 1)
  std::string device_platform = "cpu";  // PX_DEVICES: "cpu" or "cpu:N" (N virtual CPU devices), "ref:N", ...
  int64_t device_count = 1;
  std::string device_text = "cpu";      // PX_DEVICES as given, for errors
  // A malformed PX_DEVICES is reported only where devices are used (default_devices()), so that
  // plain compiles, which need no devices, still work: this holds the error, "" when valid.
  std::string devices_error;
  // PX_COLLECTIVE_TIMEOUT_S: how long a collective across processes waits for a peer before it
  // fails naming the missing rank (default 60 s).
  double collective_timeout_s = 60;
  // Set by a launcher, not by the user: this process's rank and the job's process count, from
  // Open MPI's mpirun (OMPI_COMM_WORLD_RANK / _SIZE), PMIx (PMIX_RANK) or Slurm's srun
  // (SLURM_PROCID / SLURM_NTASKS, with SLURM_STEP_ID: inside a job step). -1 / 0 when not launched.
  int launch_rank = -1;
  int launch_size = 0;
  std::string launcher;  // "mpirun", "pmix", "srun" or ""
};

// Parsed on first use; a malformed value throws px::Error naming the variable and what it accepts
// (except PX_DEVICES: see EnvConfig::devices_error).
const EnvConfig& env();
// Parses a device set "cpu" (one device) or "cpu:N" (N >= 1) into (platform, count). Errors start
// with `where` and the quoted text, e.g. where = "[env] PX_DEVICES=" gives "[env] PX_DEVICES='x' ...".
std::pair<std::string, int64_t> parse_device_text(const std::string& text, const std::string& where);
// A backend's platform name: lower-case letters, digits and '_', starting with a letter ("cpu", "ref").
bool valid_platform_name(const std::string& name);

// The parser behind env(), reading variables through `get` (which returns nullptr when unset).
// PX_NUM_THREADS is capped at `cores` (0: available_cores()).
EnvConfig parse_env(const std::function<const char*(const char*)>& get, int cores = 0);
// For each of `set_names` (the environment's variable names) that starts with PX_, is not one the
// library reads and is within two edits of one it does: a line naming it and that one ("" if none).
std::string misspelt_env_note(const std::vector<std::string>& set_names);
// The one variable `name` as set now, parsed and checked as env() does (the other fields are
// their defaults): for variables a program may set between two calls (PX_DUMP_CANDIDATES).
EnvConfig env_now(const char* name);
// PX_RECALIBRATE as set now (a program may set it between two calls that read a measured cluster
// or peak from their cache).
bool recalibrate_requested();
// $XDG_CACHE_HOME, else $HOME/.cache, else "" (the caller's fallback): where parallax/ caches live.
std::string user_cache_dir();
// The cores this process may run on (its CPU affinity), at least 1.
int available_cores();

struct EnvVariable {
  const char* name;
  const char* help;
};
const std::vector<EnvVariable>& env_variables();  // for --help texts and docs

// Applies PX_NUM_THREADS to the calling thread's OpenMP settings (idempotent and cheap), unless
// a ThreadBudget holds the calling thread.
void apply_thread_settings();

// The threads the calling thread's kernels take: its ThreadBudget, else PX_NUM_THREADS, else
// OpenMP's count.
int process_threads();

// While alive, the calling thread's kernels are made for and run on `threads` threads (none:
// threads <= 0 changes nothing), whatever PX_NUM_THREADS says: a pipeline's device groups in one process share the cores,
// each group's thread compiling and running its programs under its share. Nests; restores the
// thread's OpenMP setting on destruction.
class ThreadBudget {
 public:
  explicit ThreadBudget(int threads);
  ~ThreadBudget();
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;
  static int current();  // the budget holding the calling thread, 0 when none

 private:
  bool active_ = false;
  int prev_budget_ = 0, prev_omp_ = 1;
};

}  // namespace px
