// process_world() in a build without MPI (-DPX_WITH_MPI=OFF; CMakeLists.txt compiles this file
// instead of world.cc and mpi.cc): one process with this machine's devices. A process started by
// mpirun or srun fails at once with what to rebuild, rather than running alone beside the others.
#include <unistd.h>

#include <fmt/format.h>

#include "core/env.h"
#include "parallax/distributed.h"

namespace px {

const ProcessWorld& process_world() {
  static ProcessWorld* world = [] {
    const EnvConfig& e = env();
    if (e.launch_size != 0)
      throw UserError(fmt::format(
          "[mpi] this process was started by {} as one of {} processes, but this parallax was built without "
          "MPI (-DPX_WITH_MPI=OFF); rebuild it with -DPX_WITH_MPI=ON (needs Open MPI: libopenmpi-dev), or run "
          "one process without {}",
          e.launcher.empty() ? std::string("a launcher") : e.launcher, e.launch_size,
          e.launcher.empty() ? std::string("the launcher") : e.launcher));
    auto* w = new ProcessWorld;
    char host[256] = {};
    w->hosts = {gethostname(host, sizeof(host) - 1) == 0 ? std::string(host) : std::string("?")};
    w->devices = default_devices();
    return w;
  }();
  return *world;
}

}  // namespace px
