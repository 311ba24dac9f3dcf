// Several processes, on one machine or many: launch the same program with mpirun (or Slurm's
// srun) and build meshes over process_world().devices, the devices of every process.
//
//   const px::ProcessWorld& w = px::process_world();   // initializes MPI once when launched
//   px::Mesh mesh = px::Mesh::create({{"data", -1}}, w.devices);
//   px::TrainStepOptions o{.mesh = mesh, .strategy = px::ShardingStrategy::DDP};
//   o.sharding.communicator = w.communicator;          // nullptr in a single process: in-process
//   // px::TrainStep step(store, opt, loss, batch_types, o);
//   if (w.rank == 0) std::cout << mesh.to_string() << "\n";
//
// Each process contributes its own PX_DEVICES (cpu:N, the same N on every process); mesh positions
// are numbered rank by rank: rank 0's devices are positions 0..N-1, rank 1's N..2N-1, and so on,
// so that the last (fastest) mesh axes stay inside a process. See docs/distributed.md.
#pragma once

#include <string>
#include <vector>

#include "parallax/memory.h"  // DeviceSet

namespace px {

class Communicator;

struct ProcessWorld {
  int rank = 0;  // this process (MPI rank)
  int size = 1;  // processes in the job
  // Every process's devices: cpu:(N * size) over `size` processes (cpu:N when not launched).
  DeviceSet devices;
  // This process's communicator over MPI (see src/distributed/mpi/mpi.h); nullptr when the program
  // was not launched by mpirun / srun, where the in-process collectives are used.
  Communicator* communicator = nullptr;
  std::string launcher;            // "mpirun", "pmix", "srun", or "" (not launched)
  std::vector<std::string> hosts;  // host name of each rank
};

// The job this process belongs to. On first use, when launched by mpirun or srun (their rank
// variables are set), initializes MPI (with thread support), checks that every process has the
// same device count, and builds the communicator (collective timeout: PX_COLLECTIVE_TIMEOUT_S,
// default 60 s). At exit MPI is finalized, or, after a failed collective, the job is aborted so
// that no process waits forever. Not launched: one process, no MPI. Throws px::Error when the
// processes disagree (naming the rank and what differs).
const ProcessWorld& process_world();

// A collective over every process of `comm`'s world: each passes `text` (a config, a version, a
// mesh) and its rank; throws px::Error on every process when the texts differ, naming `what`, the
// first rank whose text differs from that of the process holding mesh position 0, and the first
// differing line of both.
void check_same_on_every_process(Communicator& comm, int rank, const std::string& what, const std::string& text);

// A collective over every process of `comm`'s world: returns, on every process, the `text` of the
// process holding mesh position 0 (what the others pass is not read). For a decision made once
// and used everywhere, e.g. AUTO's plan (one solve, not one per process that could differ).
std::string share_from_first_process(Communicator& comm, const std::string& text);

}  // namespace px
