// The Communicator's non-virtual front: argument checks and byte accounting, shared by every
// implementation so that all of them count the same way.
#include "parallax/communicator.h"

#include <sstream>

#include "core/enum_names.h"

namespace px {

const char* collective_name(CollectiveKind k) {
  static constexpr const char* names[] = {"all_reduce", "all_gather", "reduce_scatter",
                                          "all_to_all", "permute",    "broadcast"};
  static_assert(std::size(names) == kNumCollectiveKinds);
  return enum_name(k, names);
}

CollectiveStats::Entry CollectiveStats::total(CollectiveKind k) const {
  Entry t;
  for (auto& d : per_device) {
    const Entry& e = d[static_cast<int>(k)];
    t.calls += e.calls;
    t.payload_bytes += e.payload_bytes;
    t.wire_bytes += e.wire_bytes;
  }
  return t;
}

void CollectiveStats::reset() {
  for (auto& d : per_device) d.fill(Entry{});
}

std::string CollectiveStats::to_string() const {
  std::ostringstream os;
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    Entry t = total(static_cast<CollectiveKind>(k));
    if (t.calls == 0) continue;
    os << collective_name(static_cast<CollectiveKind>(k)) << ": " << t.calls << " device-calls, payload "
       << t.payload_bytes << " bytes, wire " << t.wire_bytes << " bytes over " << per_device.size() << " devices\n";
  }
  return os.str();
}

void Communicator::send(int to, int64_t, const void*, int64_t) {
  throw Error("[" + name() + "] has no point-to-point messages (to process " + std::to_string(to) +
              "): its positions are all in one process");
}

void Communicator::receive(int from, int64_t, void*, int64_t) {
  throw Error("[" + name() + "] has no point-to-point messages (from process " + std::to_string(from) +
              "): its positions are all in one process");
}

Communicator::Communicator(std::vector<int> local_positions, int64_t world_size)
    : local_(std::move(local_positions)), world_(world_size) {
  index_.assign(static_cast<size_t>(world_), -1);
  for (size_t i = 0; i < local_.size(); ++i) index_.at(local_[i]) = static_cast<int>(i);
  stats_.per_device.resize(static_cast<size_t>(world_));
}

void Communicator::bind_streams(std::vector<void*> streams) {
  if (streams.size() != local_.size())
    throw Error("[communicator] " + std::to_string(streams.size()) + " streams bound for " +
                std::to_string(local_.size()) + " local participants: give one per local position");
  streams_ = std::move(streams);
}

namespace {
void check_buffers(const char* op, size_t nin, size_t nout, size_t nlocal) {
  if (nin != nlocal || nout != nlocal)
    throw Error(std::string("[") + op + "] expects one input and one output buffer per local participant (" +
                std::to_string(nlocal) + "), got " + std::to_string(nin) + " and " + std::to_string(nout));
}
}  // namespace

// Per local member of each group: payload bytes, and wire bytes = bytes * num / den with num/den
// given per group size n by the caller's formula.
void Communicator::account(CollectiveKind k, const DeviceGroups& groups, int64_t payload, int64_t wire_num,
                           int64_t wire_den) {
  for (const auto& g : groups)
    for (int p : g) {
      if (local_index(p) < 0) continue;
      auto& e = stats_.per_device[p][static_cast<int>(k)];
      e.calls += 1;
      e.payload_bytes += payload;
      e.wire_bytes += wire_den ? payload * wire_num / wire_den : 0;
    }
}

void Communicator::check_call(CollectiveKind k, const Buffers& ins, const MutBuffers& outs, int64_t count,
                              const DeviceGroups& groups) const {
  const char* op = collective_name(k);
  check_buffers(op, ins.size(), outs.size(), local_.size());
  if (k != CollectiveKind::reduce_scatter && k != CollectiveKind::all_to_all) return;
  int64_t n = groups.empty() ? 1 : static_cast<int64_t>(groups[0].size());
  if (count % n)
    throw Error(std::string("[") + op + "] " + std::to_string(count) + " elements do not split over " +
                std::to_string(n) + " devices");
}

void Communicator::record_call(CollectiveKind k, int64_t count, DType t, const DeviceGroups& groups,
                               const std::vector<std::pair<int, int>>& pairs) {
  const int64_t n = groups.empty() ? 1 : static_cast<int64_t>(groups[0].size());
  const int64_t bytes = count * dtype_size(t);
  switch (k) {
    case CollectiveKind::all_reduce:
      return account(k, groups, bytes, 2 * (n - 1), n);
    case CollectiveKind::all_gather:
      return account(k, groups, n * bytes, n - 1, n);
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all:
      return account(k, groups, bytes, n - 1, n);
    case CollectiveKind::permute:
      for (auto [src, dst] : pairs)
        if (src != dst) account(k, {{src}}, bytes, 1, 1);
      return;
    case CollectiveKind::broadcast:
      // Receivers count the bytes they receive; roots count what they send once.
      for (const auto& g : groups)
        for (size_t r = 0; r < g.size(); ++r)
          if (g.size() > 1) account(k, {{g[r]}}, bytes, 1, 1);
      return;
  }
}

void Communicator::all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                              const DeviceGroups& groups) {
  check_call(CollectiveKind::all_reduce, ins, outs, count, groups);
  do_all_reduce(ins, outs, count, t, op, groups);
  record_call(CollectiveKind::all_reduce, count, t, groups);
}

void Communicator::all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                              const DeviceGroups& groups) {
  check_call(CollectiveKind::all_gather, ins, outs, count, groups);
  do_all_gather(ins, outs, count, t, groups);
  record_call(CollectiveKind::all_gather, count, t, groups);
}

void Communicator::reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                                  const DeviceGroups& groups) {
  check_call(CollectiveKind::reduce_scatter, ins, outs, count, groups);
  do_reduce_scatter(ins, outs, count, t, op, groups);
  record_call(CollectiveKind::reduce_scatter, count, t, groups);
}

void Communicator::all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                              const DeviceGroups& groups) {
  check_call(CollectiveKind::all_to_all, ins, outs, count, groups);
  do_all_to_all(ins, outs, count, t, groups);
  record_call(CollectiveKind::all_to_all, count, t, groups);
}

void Communicator::permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                           const std::vector<std::pair<int, int>>& pairs) {
  check_call(CollectiveKind::permute, ins, outs, count, {});
  do_permute(ins, outs, count, t, pairs);
  record_call(CollectiveKind::permute, count, t, {}, pairs);
}

void Communicator::broadcast(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, int root,
                             const DeviceGroups& groups) {
  check_call(CollectiveKind::broadcast, ins, outs, count, groups);
  do_broadcast(ins, outs, count, t, root, groups);
  record_call(CollectiveKind::broadcast, count, t, groups);
}

}  // namespace px
