// The MPI communicator: one OS process per MPI rank, each holding its own mesh positions (often
// one, or several virtual CPU devices), exchanging with the other ranks over Open MPI.
//
// A call whose groups (or permute pairs) all stay inside this process runs at once, as the
// in-process memory operations. A call that crosses processes is handed to this communicator's
// progress thread, which posts point-to-point MPI_Isend / MPI_Irecv of exactly the input bytes
// each other process needs (the whole inputs for all_reduce, all_gather and broadcast; only the
// blocks a process's members reduce or receive for reduce_scatter and all_to_all; the sources of
// permute), and drives them to completion while the caller computes: start_* returns at once,
// and the handle's wait() returns when the bytes are in, after the caller has computed its own
// outputs from everyone's inputs with the shared memory operations (position_collectives.h), in
// group order. So every reduction is bitwise the in-process one, whatever the split over
// processes, and 16-bit floats are summed in f32 and rounded once.
//
// Messages of one call share a tag (the call's number: every process makes the same calls in the
// same order, and MPI keeps the order of messages between two ranks), on a duplicate of the world
// communicator that nothing else uses. A peer that sends nothing for `timeout_s` (dead, stopped,
// or making a different call) fails the call with a px::Error naming the operation, its groups,
// and the missing rank and host; the communicator is then broken: every later call fails at once,
// and process_world()'s exit handler aborts the job instead of waiting in MPI_Finalize.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallax/communicator.h"

namespace px {

struct MpiCommunicatorOptions {
  double timeout_s = 60;  // PX_COLLECTIVE_TIMEOUT_S
};

// One per process (its progress thread is the only one calling MPI after initialization), called
// from one thread at a time, like every communicator. Needs MPI initialized with at least
// MPI_THREAD_SERIALIZED (process_world() does it). The rank of
// this process is its process index: process_of_position[p] is the MPI rank holding mesh position
// p; every rank must hold at least one. `hosts[r]` names rank r in errors (may be empty).
std::unique_ptr<Communicator> make_mpi_communicator(const std::vector<int>& process_of_position,
                                                    const std::vector<std::string>& hosts = {},
                                                    MpiCommunicatorOptions options = {});

// Whether a collective of this process failed (a peer timed out): MPI can then not finalize.
bool mpi_communicator_broken();

}  // namespace px
