// Collectives behind one interface: in process (inproc.cc, threaded.cc), over MPI (mpi/), and a
// communicator of your own (NCCL, say) implements it against the installed header (an extension
// point like parallax/backend.h; docs/adding-a-backend.md).
//
// A call is made once per process for all of its local participants: `ins` / `outs` hold one
// buffer per local participant, in the order of local_positions() (mesh positions). Groups list
// mesh positions; a participant's rank in its group is its index there. The in-process runtime
// runs the per-device programs in lockstep, so every participant's buffer is at hand in one call.
// A process holds the positions of one process of the mesh (Mesh::local_positions); the threaded
// world (threaded.h) runs several such processes as threads of this one, for tests.
// An MPI implementation receives its process's participants (usually one), combines the local
// ones in memory and exchanges with the other ranks (MPI_Allreduce / Allgather / Reduce_scatter /
// Alltoall on a communicator split per group, or per-group sub-communicators cached by group
// set); an NCCL one issues the same calls per GPU inside ncclGroupStart / ncclGroupEnd.
//
// Buffers are contiguous; layouts along other dims are the caller's concern. `count` is the
// number of elements of each participant's input. Outputs must not alias inputs, except that
// all_reduce may run in place. Every call records its bytes in stats().
#pragma once

#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parallax/backend.h"
#include "parallax/collectives.h"
#include "parallax/core.h"

namespace px {

enum class ReduceOp { sum, max };
using DeviceGroups = std::vector<std::vector<int>>;
using Buffers = std::vector<const void*>;
using MutBuffers = std::vector<void*>;

// A started collective (an Event, parallax/backend.h): wait() returns once its outputs are complete and its
// inputs may be reused. Wait exactly once per started call.
using CollectiveHandle = Event;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string name() const = 0;
  // How long a call waits for another process before it fails (infinite: it never gives up).
  virtual double timeout_s() const { return std::numeric_limits<double>::infinity(); }
  const std::vector<int>& local_positions() const { return local_; }
  int64_t world_size() const { return world_; }

  // out = reduction over the group of in (count elements each).
  void all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                  const DeviceGroups& groups);
  // out (count * n elements) = the group's inputs concatenated in group order.
  void all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, const DeviceGroups& groups);
  // in has count elements in n blocks; out (count / n) = reduction of block <own rank> over the group.
  void reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                      const DeviceGroups& groups);
  // in has count elements in n blocks; out block j = block <own rank> of member j's input.
  void all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, const DeviceGroups& groups);
  // (source, target) mesh positions; targets that receive nothing are zero-filled.
  void permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
               const std::vector<std::pair<int, int>>& pairs);
  // out = in of the member at index `root` of each group.
  void broadcast(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, int root,
                 const DeviceGroups& groups);
  virtual void barrier() = 0;
  // Whether the calls take device memory as it is (an NCCL communicator's device pointers). False,
  // the default: they read and write host memory, and the runtime stages device memory that the host
  // cannot reach (Backend::host_visible) through host buffers around each call.
  virtual bool reads_device_memory() const { return false; }

  // Point-to-point messages between processes, for values whose time only the sender knows (a
  // pipeline's activations and gradients between stages): send queues a copy of `bytes` bytes for
  // process `to` and returns at once; receive blocks until the message `from` sent with the same
  // tag is in `out` (it must be `bytes` long), and fails with a px::Error after timeout_s(). A tag
  // names one message between two processes until it is received; messages of one tag between two
  // processes arrive in the order sent. Unlike the collectives, any thread may call these, several
  // at once. A communicator of one process has nobody to message: these throw.
  virtual int process_index() const { return 0; }
  virtual void send(int to, int64_t tag, const void* data, int64_t bytes);
  virtual void receive(int from, int64_t tag, void* out, int64_t bytes);

  // Non-blocking forms: the schedule starts a collective, runs independent compute, then waits.
  // By default a call completes when it starts (the in-process communicator: its collectives are
  // memory copies on the same cores, so there is nothing to overlap); MPI and NCCL override these.
  virtual CollectiveHandle start_all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                                            ReduceOp op, const DeviceGroups& groups) {
    all_reduce(ins, outs, count, t, op, groups);
    return {};
  }
  virtual CollectiveHandle start_all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                                            const DeviceGroups& groups) {
    all_gather(ins, outs, count, t, groups);
    return {};
  }
  virtual CollectiveHandle start_reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                                                ReduceOp op, const DeviceGroups& groups) {
    reduce_scatter(ins, outs, count, t, op, groups);
    return {};
  }
  virtual CollectiveHandle start_all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                                            const DeviceGroups& groups) {
    all_to_all(ins, outs, count, t, groups);
    return {};
  }
  virtual CollectiveHandle start_permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                                         const std::vector<std::pair<int, int>>& pairs) {
    permute(ins, outs, count, t, pairs);
    return {};
  }

  const CollectiveStats& stats() const { return stats_; }
  void reset_stats() { stats_.reset(); }

  // The stream of each local participant's device (Backend::stream), in local_positions() order,
  // bound by the runtime when it compiles a program that runs collectives here: an NCCL
  // communicator enqueues each participant's part of a call on its device's stream, after the
  // kernels that produced the input. Empty until bound; nullptrs on host backends (their calls
  // run on the calling thread).
  const std::vector<void*>& streams() const { return streams_; }
  void bind_streams(std::vector<void*> streams);  // one per local participant; throws otherwise

 protected:
  Communicator(std::vector<int> local_positions, int64_t world_size);
  virtual void do_all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                             const DeviceGroups& groups) = 0;
  virtual void do_all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                             const DeviceGroups& groups) = 0;
  virtual void do_reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                                 const DeviceGroups& groups) = 0;
  virtual void do_all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                             const DeviceGroups& groups) = 0;
  virtual void do_permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                          const std::vector<std::pair<int, int>>& pairs) = 0;
  virtual void do_broadcast(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, int root,
                            const DeviceGroups& groups) = 0;
  int local_index(int position) const { return position < static_cast<int>(index_.size()) ? index_[position] : -1; }
  // What the blocking forms do around do_*, for implementations that override the start_* forms:
  // check the buffers and sizes (throws px::Error), and count the call's bytes in stats().
  void check_call(CollectiveKind k, const Buffers& ins, const MutBuffers& outs, int64_t count,
                  const DeviceGroups& groups) const;
  void record_call(CollectiveKind k, int64_t count, DType t, const DeviceGroups& groups,
                   const std::vector<std::pair<int, int>>& pairs = {});

 private:
  void account(CollectiveKind k, const DeviceGroups& groups, int64_t payload, int64_t wire_num, int64_t wire_den);
  std::vector<int> local_;
  std::vector<int> index_;  // mesh position -> local index, -1 when remote
  int64_t world_;
  std::vector<void*> streams_;
  CollectiveStats stats_;
};

// All `num_devices` mesh positions live in this process; collectives are memory operations,
// parallelized with OpenMP over elements (so they use the same threads as the kernels).
std::unique_ptr<Communicator> make_inproc_communicator(int64_t num_devices);

}  // namespace px
