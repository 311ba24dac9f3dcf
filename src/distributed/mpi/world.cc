// process_world(): this process's place in a job launched by mpirun or srun (parallax/distributed.h).
// Built with PX_WITH_MPI only (world_off.cc stands in without it); the checks over every process
// that need no MPI are in agree.cc.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "core/env.h"
#include "distributed/mpi/mpi.h"
#include "parallax/distributed.h"

#ifndef PX_VERSION
#define PX_VERSION "unknown"
#endif

#if defined(__SANITIZE_ADDRESS__)
// LeakSanitizer (scripts/sanitize.sh): Open MPI keeps allocations for the life of the process in
// components it unloads at MPI_Finalize, so every process that initialized MPI would report them
// at exit, from frames without a name to suppress. Such processes skip the leak check; the same
// parallax code runs leak-checked in the threaded-world tests (make_threaded_world).
namespace {
bool g_mpi_started = false;
}
extern "C" int __lsan_is_turned_off() { return g_mpi_started ? 1 : 0; }
#define PX_NOTE_MPI_STARTED() (g_mpi_started = true)
#else
#define PX_NOTE_MPI_STARTED() ((void)0)
#endif

namespace px {
namespace {

// Held by a plain pointer, not a static object: it must still be there when shut_down() runs
// at exit, whatever the order of static destructors.
Communicator* g_communicator = nullptr;

// At exit: stop the communicator's progress thread, then finalize MPI, or abort the job when a
// collective failed (MPI_Finalize would wait for the lost rank forever).
void shut_down() {
  delete std::exchange(g_communicator, nullptr);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (mpi_communicator_broken())
    MPI_Abort(MPI_COMM_WORLD, 1);
  else
    MPI_Finalize();
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "?";
  return buf;
}

void init_world(ProcessWorld& w) {
  const EnvConfig& e = env();
  const DeviceSet local = default_devices();
  w.hosts = {host_name()};
  w.devices = local;
  if (e.launch_size == 0) return;  // not launched: one process, no MPI
  int initialized = 0, provided = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    PX_NOTE_MPI_STARTED();
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
      throw Error("[mpi] MPI_Init_thread failed: run the program with mpirun (or srun) from Open MPI");
    std::atexit(shut_down);
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED)
    throw Error("[mpi] this MPI library gives no thread support (MPI_THREAD_SERIALIZED); use Open MPI 4 or later");
  MPI_Comm_rank(MPI_COMM_WORLD, &w.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &w.size);
  w.launcher = e.launcher;

  // Every rank's device count and host, in rank order.
  struct Info {
    int64_t devices;
    char host[120];
  };
  Info mine{local.count, {}};
  std::strncpy(mine.host, w.hosts[0].c_str(), sizeof(mine.host) - 1);
  std::vector<Info> all(static_cast<size_t>(w.size));
  MPI_Allgather(&mine, sizeof(Info), MPI_BYTE, all.data(), sizeof(Info), MPI_BYTE, MPI_COMM_WORLD);
  w.hosts.clear();
  for (const Info& i : all) w.hosts.emplace_back(i.host);
  for (int r = 1; r < w.size; ++r)
    if (all[r].devices != all[0].devices)
      throw Error(fmt::format(
          "[mpi] rank {} (host {}) has {} device(s) (PX_DEVICES=cpu:{}) but rank 0 (host {}) has {}; every process "
          "of a job must have the same PX_DEVICES (export it to all of them: mpirun -x PX_DEVICES=cpu:N)",
          r, w.hosts[r], all[r].devices, all[r].devices, w.hosts[0], all[0].devices));
  const int64_t n = all[0].devices;
  w.devices = DeviceSet{local.platform, n * w.size, w.size};
  std::vector<int> process_of(static_cast<size_t>(n * w.size));
  for (size_t p = 0; p < process_of.size(); ++p) process_of[p] = static_cast<int>(static_cast<int64_t>(p) / n);
  g_communicator = make_mpi_communicator(process_of, w.hosts, {e.collective_timeout_s}).release();
  w.communicator = g_communicator;
  // The same library version and compiler everywhere (a stale copy on one machine fails here).
  check_same_on_every_process(*g_communicator, w.rank, "program versions",
                              "parallax " PX_VERSION " compiled by " __VERSION__ "\n");
}

}  // namespace

const ProcessWorld& process_world() {
  static ProcessWorld* world = [] {
    auto* w = new ProcessWorld;
    init_world(*w);
    return w;
  }();
  return *world;
}

}  // namespace px
