// process_world(): this process's place in a job launched by mpirun or srun (parallax/distributed.h),
// and the check that every process runs the same thing.
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

// The first line where a and b differ, both shown.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  auto line_at = [&](const std::string& s) {
    size_t begin = s.rfind('\n', i == 0 ? 0 : i - 1);
    begin = (begin == std::string::npos || i == 0) ? 0 : begin + 1;
    if (i > 0 && i <= s.size() && s[i - 1] == '\n') begin = i;
    size_t end = s.find('\n', begin);
    std::string line = s.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    return line.empty() && begin >= s.size() ? std::string("(end of text)") : "'" + line + "'";
  };
  return fmt::format("{} against {}", line_at(b), line_at(a));
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

void check_same_on_every_process(Communicator& comm, int rank, const std::string& what, const std::string& text) {
  const int64_t world = comm.world_size();
  const size_t nlocal = comm.local_positions().size();
  DeviceGroups all(1);
  for (int p = 0; p < world; ++p) all[0].push_back(p);
  // The longest text, then everyone's text padded to it (as i32 words: the length comes first).
  std::vector<int32_t> len(nlocal, static_cast<int32_t>(text.size())), longest(nlocal);
  Buffers ins;
  MutBuffers outs;
  for (size_t i = 0; i < nlocal; ++i) {
    ins.push_back(&len[i]);
    outs.push_back(&longest[i]);
  }
  comm.all_reduce(ins, outs, 1, DType::i32, ReduceOp::max, all);
  const int64_t words = 2 + (static_cast<int64_t>(longest[0]) + 3) / 4;  // rank, length, text
  std::vector<int32_t> block(static_cast<size_t>(words), 0);
  block[0] = rank;
  block[1] = static_cast<int32_t>(text.size());
  std::memcpy(block.data() + 2, text.data(), text.size());
  std::vector<std::vector<int32_t>> got(nlocal, std::vector<int32_t>(static_cast<size_t>(words * world)));
  ins.assign(nlocal, block.data());
  outs.clear();
  for (auto& g : got) outs.push_back(g.data());
  comm.all_gather(ins, outs, words, DType::i32, all);
  auto text_of = [&](int64_t p) {
    const int32_t* b = got[0].data() + p * words;
    return std::string(reinterpret_cast<const char*>(b + 2), static_cast<size_t>(b[1]));
  };
  auto rank_of = [&](int64_t p) { return got[0][static_cast<size_t>(p * words)]; };
  const std::string first = text_of(0);
  for (int64_t p = 1; p < world; ++p) {
    std::string other = text_of(p);
    if (other != first)
      throw Error(fmt::format(
          "[distributed] the processes run with different {}: rank {} differs from rank {}: {}; launch every "
          "process with the same program, configuration and devices",
          what, rank_of(p), rank_of(0), first_difference(first, other)));
  }
}

std::string share_from_first_process(Communicator& comm, const std::string& text) {
  const std::vector<int>& local = comm.local_positions();
  const size_t nlocal = local.size();
  const bool first = std::find(local.begin(), local.end(), 0) != local.end();
  if (first && text.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw UserError(
        fmt::format("[distributed] cannot share {} bytes between processes (at most 2^31 - 1)", text.size()));
  DeviceGroups all(1);
  for (int p = 0; p < comm.world_size(); ++p) all[0].push_back(p);
  // The length, then the bytes as i32 words, both broadcast from position 0 (member 0 of the group).
  std::vector<int32_t> len(nlocal, first ? static_cast<int32_t>(text.size()) : 0), got_len(nlocal);
  Buffers ins;
  MutBuffers outs;
  for (size_t i = 0; i < nlocal; ++i) {
    ins.push_back(&len[i]);
    outs.push_back(&got_len[i]);
  }
  comm.broadcast(ins, outs, 1, DType::i32, 0, all);
  const int64_t words = (static_cast<int64_t>(got_len[0]) + 3) / 4;
  if (words == 0) return {};
  std::vector<int32_t> mine(static_cast<size_t>(words), 0);
  if (first) std::memcpy(mine.data(), text.data(), text.size());
  std::vector<std::vector<int32_t>> got(nlocal, std::vector<int32_t>(static_cast<size_t>(words)));
  ins.assign(nlocal, mine.data());
  outs.clear();
  for (auto& g : got) outs.push_back(g.data());
  comm.broadcast(ins, outs, words, DType::i32, 0, all);
  return std::string(reinterpret_cast<const char*>(got[0].data()), static_cast<size_t>(got_len[0]));
}

}  // namespace px
