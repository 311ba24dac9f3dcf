// A world of several "processes" inside one OS process, for tests: each process is a thread with
// its own Communicator over a shared rendezvous, so code that will run under MPI (one process per
// rank, each holding only its mesh positions) runs and is checked here first. The executable only
// sees a Communicator; it cannot tell this one from the in-process or a future MPI one.
//
//   auto world = px::make_threaded_world(mesh.process_layout());   // e.g. cpu:4 over 2 processes
//   world->run([&](int process, px::Communicator& comm) {
//     auto exe = px::ShardedExecutable::compile(program, {}, px::DeviceParallelism::automatic, &comm);
//     ...                                    // this process's shards only
//   });
//
// A call is a rendezvous of all processes when any of its groups (or permute pairs) spans more
// than one process: each deposits its local buffers, waits until every process has arrived, checks
// that all made the same call, computes its own positions' outputs from everyone's inputs (the
// in-process memory operations, in group order, so results are bitwise those of one process), and
// waits again before returning, so that no process reuses an input another is still reading. A
// call whose groups all stay inside their processes runs locally, without waiting. As under MPI,
// every process must make the same collective calls in the same order.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "parallax/communicator.h"

namespace px {

class ThreadedWorld {
 public:
  virtual ~ThreadedWorld() = default;
  virtual int num_processes() const = 0;
  virtual Communicator& communicator(int process) = 0;
  // Runs fn(process, communicator) on one thread per process and joins them. When one throws, the
  // others' waiting and later rendezvous calls fail at once (instead of waiting for it forever);
  // the first error is rethrown here.
  virtual void run(const std::function<void(int process, Communicator& comm)>& fn) = 0;
};

// One communicator per process; process_of_position[p] is the process of mesh position p
// (Mesh::process_layout()), processes numbered 0..n-1 with at least one position each.
// `timeout_s`: how long a rendezvous waits for the other processes before it fails.
std::unique_ptr<ThreadedWorld> make_threaded_world(const std::vector<int>& process_of_position, double timeout_s = 300);

}  // namespace px
