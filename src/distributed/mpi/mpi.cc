// The MPI communicator (mpi.h): crossing calls go to a progress thread that moves exactly the
// bytes each process needs with point-to-point messages; the caller computes its outputs from
// everyone's inputs at wait(), with the in-process memory operations, so results are bitwise the
// in-process ones.
#include "distributed/mpi/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "distributed/position_collectives.h"

namespace px {
namespace {

std::atomic<bool> g_broken{false};

constexpr int64_t kMaxMessage = int64_t{1} << 30;  // MPI counts are ints: longer ranges go in pieces

// One call as every process sees it (the same on all of them), plus this process's buffers.
struct Call {
  CollectiveKind kind = CollectiveKind::all_reduce;
  bool barrier = false;
  int64_t count = 0;
  DType t = DType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  DeviceGroups groups;
  std::vector<std::pair<int, int>> pairs;
  Buffers ins;
  MutBuffers outs;
  int64_t seq = 0;
};

// Bytes [offset, offset + bytes) of mesh position `position`'s input.
struct Range {
  int position;
  int64_t offset;
  int64_t bytes;
};

// The input ranges of `source`'s positions that process `consumer` needs to compute its outputs,
// in one order both sides agree on (by position, then offset), each once.
std::vector<Range> wanted(const Call& c, const std::vector<int>& proc, int consumer, int source) {
  std::vector<Range> r;
  const int64_t bytes = c.count * dtype_size(c.t);
  auto add = [&](int pos, int64_t off, int64_t len) {
    if (len > 0 && proc.at(pos) == source) r.push_back({pos, off, len});
  };
  if (c.kind == CollectiveKind::permute) {
    for (auto [s, d] : c.pairs)
      if (s != d && proc.at(d) == consumer) add(s, 0, bytes);
  } else {
    for (const auto& g : c.groups) {
      const int64_t n = static_cast<int64_t>(g.size());
      for (int64_t ci = 0; ci < n; ++ci) {
        if (proc.at(g[ci]) != consumer) continue;
        switch (c.kind) {
          case CollectiveKind::all_reduce:
          case CollectiveKind::all_gather:
            for (int m : g) add(m, 0, bytes);
            break;
          case CollectiveKind::reduce_scatter:
          case CollectiveKind::all_to_all:
            for (int m : g) add(m, ci * (bytes / n), bytes / n);
            break;
          case CollectiveKind::broadcast:
            add(g.at(c.root), 0, bytes);
            break;
          case CollectiveKind::permute:
            break;
        }
      }
    }
  }
  std::sort(r.begin(), r.end(), [](const Range& a, const Range& b) {
    return a.position != b.position ? a.position < b.position : a.offset < b.offset;
  });
  r.erase(std::unique(r.begin(), r.end(),
                      [](const Range& a, const Range& b) { return a.position == b.position && a.offset == b.offset; }),
          r.end());
  return r;
}

std::string describe_groups(const Call& c) {
  std::string s;
  if (c.barrier) return "every process";
  if (c.kind == CollectiveKind::permute) {
    for (size_t i = 0; i < c.pairs.size() && i < 4; ++i)
      s += fmt::format("{}{}->{}", i ? ", " : "", c.pairs[i].first, c.pairs[i].second);
    if (c.pairs.size() > 4) s += fmt::format(", ... ({} pairs)", c.pairs.size());
    return "pairs " + s + " (mesh positions)";
  }
  for (size_t i = 0; i < c.groups.size() && i < 4; ++i)
    s += fmt::format("{}{{{}}}", i ? ", " : "", fmt::join(c.groups[i], ", "));
  if (c.groups.size() > 4) s += fmt::format(", ... ({} groups)", c.groups.size());
  return "groups " + s + " (mesh positions)";
}

// Receive space for a remote position's input; reused across calls (see ScratchPool).
struct Scratch {
  std::unique_ptr<std::byte[]> data;
  int64_t capacity = 0;
};

// Receive buffers kept for the next calls, so that a step's collectives do not fault in fresh
// pages every time; at most kPoolBytes are kept.
class ScratchPool {
 public:
  static constexpr int64_t kPoolBytes = int64_t{512} << 20;
  Scratch take(int64_t bytes) {
    {
      std::lock_guard<std::mutex> l(m_);
      // The smallest kept buffer that fits.
      size_t best = free_.size();
      for (size_t i = 0; i < free_.size(); ++i)
        if (free_[i].capacity >= bytes && (best == free_.size() || free_[i].capacity < free_[best].capacity)) best = i;
      if (best < free_.size()) {
        Scratch s = std::move(free_[best]);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
        kept_ -= s.capacity;
        return s;
      }
    }
    return {std::unique_ptr<std::byte[]>(new std::byte[static_cast<size_t>(std::max<int64_t>(bytes, 1))]), bytes};
  }
  void give(Scratch s) {
    std::lock_guard<std::mutex> l(m_);
    if (!s.data || kept_ + s.capacity > kPoolBytes) return;  // freed
    kept_ += s.capacity;
    free_.push_back(std::move(s));
  }

 private:
  std::mutex m_;
  std::vector<Scratch> free_;
  int64_t kept_ = 0;
};

// A started crossing call: the progress thread fills `remote` and sets `done` (or `error`).
struct Job {
  Call call;
  std::map<int, Scratch> remote;  // remote position -> its (needed parts of) input
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::string error;
};

// A point-to-point message (Communicator::send / receive): the progress thread posts it and
// tests it between collectives until it completes or times out.
struct Message {
  bool receive = false;
  int peer = 0;
  int tag = 0;
  std::vector<std::byte> copy;  // a send's bytes until they are out; a receive's as they come in
  int64_t bytes = 0;
  std::vector<MPI_Request> requests;
  std::chrono::steady_clock::time_point deadline;
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::string error;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(std::vector<int> proc, int rank, int nprocs, std::vector<std::string> hosts, MpiCommunicatorOptions o,
                  std::vector<int> local)
      : Communicator(std::move(local), static_cast<int64_t>(proc.size())),
        proc_(std::move(proc)),
        rank_(rank),
        nprocs_(nprocs),
        hosts_(std::move(hosts)),
        options_(o) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_dup(MPI_COMM_WORLD, &p2p_comm_);
    void* ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
    tag_ub_ = flag ? std::max(*static_cast<int*>(ub), 32767) : 32767;
    worker_ = std::thread([this] { loop(); });
  }

  ~MpiCommunicator() override {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && !g_broken) {
      MPI_Comm_free(&comm_);
      MPI_Comm_free(&p2p_comm_);
    }
  }

  int process_index() const override { return rank_; }
  void send(int to, int64_t tag, const void* data, int64_t bytes) override {
    auto msg = message(false, to, tag, bytes);
    const auto* b = static_cast<const std::byte*>(data);
    msg->copy.assign(b, b + bytes);
    queue_message(msg);
  }
  void receive(int from, int64_t tag, void* out, int64_t bytes) override {
    auto msg = message(true, from, tag, bytes);
    msg->copy.resize(static_cast<size_t>(bytes));  // received here: a receive that times out leaves no request on `out`
    queue_message(msg);
    std::unique_lock<std::mutex> l(msg->m);
    msg->cv.wait(l, [&] { return msg->done; });
    if (!msg->error.empty()) throw Error(msg->error);
    if (bytes) std::memcpy(out, msg->copy.data(), static_cast<size_t>(bytes));
  }

  std::string name() const override { return fmt::format("mpi(rank {} of {})", rank_, nprocs_); }
  double timeout_s() const override { return options_.timeout_s; }

  void barrier() override {
    if (nprocs_ == 1) return;
    Call c;
    c.barrier = true;
    launch(std::move(c)).wait();
  }

  CollectiveHandle start_all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                                    const DeviceGroups& groups) override {
    return start(CollectiveKind::all_reduce, ins, outs, count, t, op, groups);
  }
  CollectiveHandle start_all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                                    const DeviceGroups& groups) override {
    return start(CollectiveKind::all_gather, ins, outs, count, t, ReduceOp::sum, groups);
  }
  CollectiveHandle start_reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                                        const DeviceGroups& groups) override {
    return start(CollectiveKind::reduce_scatter, ins, outs, count, t, op, groups);
  }
  CollectiveHandle start_all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                                    const DeviceGroups& groups) override {
    return start(CollectiveKind::all_to_all, ins, outs, count, t, ReduceOp::sum, groups);
  }
  // The grouped kinds: checked, queued, counted.
  CollectiveHandle start(CollectiveKind kind, const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                         ReduceOp op, const DeviceGroups& groups) {
    check_call(kind, ins, outs, count, groups);
    CollectiveHandle h = launch(make(kind, ins, outs, count, t, op, 0, groups));
    record_call(kind, count, t, groups);
    return h;
  }
  CollectiveHandle start_permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                                 const std::vector<std::pair<int, int>>& pairs) override {
    check_call(CollectiveKind::permute, ins, outs, count, {});
    Call c = make(CollectiveKind::permute, ins, outs, count, t, ReduceOp::sum, 0, {});
    c.pairs = pairs;
    CollectiveHandle h = launch(std::move(c));
    record_call(CollectiveKind::permute, count, t, {}, pairs);
    return h;
  }

 protected:
  void do_all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                     const DeviceGroups& groups) override {
    launch(make(CollectiveKind::all_reduce, ins, outs, count, t, op, 0, groups)).wait();
  }
  void do_all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                     const DeviceGroups& groups) override {
    launch(make(CollectiveKind::all_gather, ins, outs, count, t, ReduceOp::sum, 0, groups)).wait();
  }
  void do_reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                         const DeviceGroups& groups) override {
    launch(make(CollectiveKind::reduce_scatter, ins, outs, count, t, op, 0, groups)).wait();
  }
  void do_all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                     const DeviceGroups& groups) override {
    launch(make(CollectiveKind::all_to_all, ins, outs, count, t, ReduceOp::sum, 0, groups)).wait();
  }
  void do_permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                  const std::vector<std::pair<int, int>>& pairs) override {
    Call c = make(CollectiveKind::permute, ins, outs, count, t, ReduceOp::sum, 0, {});
    c.pairs = pairs;
    launch(std::move(c)).wait();
  }
  void do_broadcast(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, int root,
                    const DeviceGroups& groups) override {
    launch(make(CollectiveKind::broadcast, ins, outs, count, t, ReduceOp::sum, root, groups)).wait();
  }

 private:
  static Call make(CollectiveKind k, const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                   int root, const DeviceGroups& groups) {
    Call c;
    c.kind = k;
    c.ins = ins;
    c.outs = outs;
    c.count = count;
    c.t = t;
    c.op = op;
    c.root = root;
    c.groups = groups;
    return c;
  }

  // Whether any group (or pair) has members in two processes: the same answer on every process.
  bool crosses(const Call& c) const {
    if (c.barrier) return nprocs_ > 1;
    if (c.kind == CollectiveKind::permute) {
      for (auto [s, d] : c.pairs)
        if (proc_.at(s) != proc_.at(d)) return true;
      return false;
    }
    for (const auto& g : c.groups)
      for (int p : g)
        if (proc_.at(p) != proc_.at(g.at(0))) return true;
    return false;
  }

  std::string broken_why() {
    std::lock_guard<std::mutex> l(m_);
    return why_;
  }

  CollectiveHandle launch(Call c) {
    if (g_broken) {
      std::string why = broken_why();
      throw Error(why.empty() ? "[mpi] a collective of this process failed before; the job cannot continue" : why);
    }
    if (!crosses(c)) {
      compute(c, nullptr);
      return {};
    }
    auto job = std::make_shared<Job>();
    c.seq = ++seq_;
    job->call = std::move(c);
    {
      std::lock_guard<std::mutex> l(m_);
      queue_.push_back(job);
    }
    cv_.notify_all();
    return CollectiveHandle([this, job] { finish(*job); });
  }

  void finish(Job& job) {
    {
      std::unique_lock<std::mutex> l(job.m);
      job.cv.wait(l, [&] { return job.done; });
    }
    if (!job.error.empty()) throw Error(job.error);
    if (!job.call.barrier) compute(job.call, &job.remote);
    for (auto& [pos, buf] : job.remote) pool_.give(std::move(buf));
  }

  // This process's outputs from its inputs and the received ones, with the in-process operations.
  void compute(const Call& c, const std::map<int, Scratch>* remote) {
    if (c.barrier) return;
    collective_math::PositionBuffers b;
    b.in.assign(proc_.size(), nullptr);
    b.out.assign(proc_.size(), nullptr);
    const std::vector<int>& mine = local_positions();
    for (size_t i = 0; i < mine.size(); ++i) {
      b.in[mine[i]] = static_cast<const std::byte*>(c.ins[i]);
      b.out[mine[i]] = static_cast<std::byte*>(c.outs[i]);
    }
    if (remote)
      for (const auto& [pos, buf] : *remote) b.in[pos] = buf.data.get();
    switch (c.kind) {
      case CollectiveKind::all_reduce:
        return collective_math::all_reduce(b, c.count, c.t, c.op, c.groups);
      case CollectiveKind::all_gather:
        return collective_math::all_gather(b, c.count, c.t, c.groups);
      case CollectiveKind::reduce_scatter:
        return collective_math::reduce_scatter(b, c.count, c.t, c.op, c.groups);
      case CollectiveKind::all_to_all:
        return collective_math::all_to_all(b, c.count, c.t, c.groups);
      case CollectiveKind::permute:
        return collective_math::permute(b, c.count, c.t, c.pairs);
      case CollectiveKind::broadcast:
        return collective_math::broadcast(b, c.count, c.t, c.root, c.groups);
    }
  }

  std::shared_ptr<Message> message(bool receive, int peer, int64_t tag, int64_t bytes) {
    if (peer < 0 || peer >= nprocs_ || peer == rank_)
      throw Error(fmt::format("[mpi] rank {} cannot message rank {} (ranks 0..{})", rank_, peer, nprocs_ - 1));
    if (g_broken) {
      std::string why = broken_why();
      throw Error(why.empty() ? "[mpi] a collective of this process failed before; the job cannot continue" : why);
    }
    auto msg = std::make_shared<Message>();
    msg->receive = receive;
    msg->peer = peer;
    msg->tag = static_cast<int>(tag % tag_ub_);
    msg->bytes = bytes;
    return msg;
  }
  void queue_message(const std::shared_ptr<Message>& msg) {
    {
      std::lock_guard<std::mutex> l(m_);
      messages_.push_back(msg);
    }
    cv_.notify_all();
  }

  // Posts a message's pieces (MPI counts are ints) on the point-to-point communicator.
  void post_message(Message& msg) {
    msg.deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                          std::chrono::duration<double>(options_.timeout_s));
    std::byte* p = msg.copy.data();
    for (int64_t off = 0; off == 0 || off < msg.bytes; off += kMaxMessage) {
      const int n = static_cast<int>(std::min(kMaxMessage, msg.bytes - off));
      MPI_Request r;
      const int rc = msg.receive ? MPI_Irecv(p + off, n, MPI_BYTE, msg.peer, msg.tag, p2p_comm_, &r)
                                 : MPI_Isend(p + off, n, MPI_BYTE, msg.peer, msg.tag, p2p_comm_, &r);
      if (rc != MPI_SUCCESS)
        throw Error(fmt::format("[mpi] posting a message to rank {} failed (MPI error {})", msg.peer, rc));
      msg.requests.push_back(r);
      if (msg.bytes == 0) break;
    }
  }

  static void complete(Message& msg, std::string error) {
    {
      std::lock_guard<std::mutex> l(msg.m);
      msg.error = std::move(error);
      msg.done = true;
    }
    msg.cv.notify_all();
  }

  // Tests the messages in flight: those complete are handed back; one past its deadline breaks
  // the communicator (its peer is gone or never sends).
  void progress_messages() {
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < in_flight_.size();) {
      Message& msg = *in_flight_[i];
      int flag = 0;
      MPI_Testall(static_cast<int>(msg.requests.size()), msg.requests.data(), &flag, MPI_STATUSES_IGNORE);
      if (!flag && now < msg.deadline) {
        ++i;
        continue;
      }
      std::string error;
      if (!flag) {
        error = fmt::format(
            "[mpi] rank {}: a message {} rank {}{} (tag {}, {} bytes) timed out after {} s: the rank has died, hangs, "
            "or runs another step; raise PX_COLLECTIVE_TIMEOUT_S if it is only slow",
            rank_, msg.receive ? "from" : "to", msg.peer,
            msg.peer < static_cast<int>(hosts_.size()) && !hosts_[msg.peer].empty() ? " (host " + hosts_[msg.peer] + ")"
                                                                                    : "",
            msg.tag, msg.bytes, options_.timeout_s);
        {
          std::lock_guard<std::mutex> l(m_);
          if (why_.empty()) why_ = error;
        }
        g_broken = true;
        lost_.push_back(in_flight_[i]);  // its requests may still touch its bytes: kept for the rest of the run
      }
      complete(msg, std::move(error));
      in_flight_.erase(in_flight_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  // The progress thread: runs the crossing calls' transfers one after another, in call order, and
  // posts and tests the point-to-point messages between them.
  void loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      std::deque<std::shared_ptr<Message>> posts;
      {
        std::unique_lock<std::mutex> l(m_);
        auto ready = [&] { return stop_ || !queue_.empty() || !messages_.empty(); };
        if (in_flight_.empty())
          cv_.wait(l, ready);
        else
          cv_.wait_for(l, std::chrono::microseconds(50), ready);
        if (stop_ && queue_.empty()) return;
        posts.swap(messages_);
        if (!queue_.empty()) {
          job = queue_.front();
          queue_.pop_front();
        }
      }
      for (auto& msg : posts) {
        try {
          if (g_broken) throw Error(broken_why());
          post_message(*msg);
          in_flight_.push_back(msg);
        } catch (const std::exception& e) {
          complete(*msg, e.what());
        }
      }
      if (!in_flight_.empty()) progress_messages();
      if (!job) continue;
      std::string error;
      try {
        if (g_broken)
          error = broken_why();
        else
          transfer(*job);
      } catch (const std::exception& e) {
        error = e.what();
      }
      {
        std::lock_guard<std::mutex> l(job->m);
        job->error = error;
        job->done = true;
      }
      job->cv.notify_all();
    }
  }

  void transfer(Job& job) {
    const Call& c = job.call;
    const int tag = static_cast<int>(c.seq % tag_ub_);
    const int64_t bytes = c.count * dtype_size(c.t);
    std::vector<MPI_Request> reqs;
    std::vector<int> peer;
    std::vector<char> is_recv;
    auto post = [&](bool recv, int q, std::byte* p, int64_t len) {
      for (int64_t off = 0; off == 0 || off < len; off += kMaxMessage) {
        const int n = static_cast<int>(std::min(kMaxMessage, len - off));
        MPI_Request r;
        int rc = recv ? MPI_Irecv(p + off, n, MPI_BYTE, q, tag, comm_, &r)
                      : MPI_Isend(p + off, n, MPI_BYTE, q, tag, comm_, &r);
        if (rc != MPI_SUCCESS)
          throw Error(fmt::format("[mpi] posting a message to rank {} failed (MPI error {})", q, rc));
        reqs.push_back(r);
        peer.push_back(q);
        is_recv.push_back(recv);
        if (len == 0) break;
      }
    };
    for (int q = 0; q < nprocs_; ++q) {
      if (q == rank_) continue;
      if (c.barrier) {
        post(true, q, nullptr, 0);
        post(false, q, nullptr, 0);
        continue;
      }
      for (const Range& r : wanted(c, proc_, rank_, q)) {
        Scratch& buf = job.remote[r.position];
        if (!buf.data) buf = pool_.take(bytes);
        post(true, q, buf.data.get() + r.offset, r.bytes);
      }
      for (const Range& r : wanted(c, proc_, q, rank_)) {
        const int li = local_index(r.position);
        post(false, q, const_cast<std::byte*>(static_cast<const std::byte*>(c.ins.at(li))) + r.offset, r.bytes);
      }
    }
    wait_all(job, reqs, peer, is_recv);
  }

  void wait_all(Job& job, std::vector<MPI_Request>& reqs, const std::vector<int>& peer,
                const std::vector<char>& is_recv) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline =
        start + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(options_.timeout_s));
    std::vector<int> done(reqs.size());
    size_t left = reqs.size();
    int idle = 0;
    while (left > 0) {
      int outcount = 0;
      MPI_Testsome(static_cast<int>(reqs.size()), reqs.data(), &outcount, done.data(), MPI_STATUSES_IGNORE);
      if (outcount == MPI_UNDEFINED) break;
      if (outcount > 0) {
        left -= static_cast<size_t>(outcount);
        idle = 0;
        continue;
      }
      if (clock::now() > deadline) return fail(job, reqs, peer, is_recv);
      // Spin briefly (small messages arrive within microseconds), then back off to spare the cores.
      if (++idle < 64)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(std::min(idle, 1000)));
    }
  }

  [[noreturn]] void fail(Job& job, std::vector<MPI_Request>& reqs, const std::vector<int>& peer,
                         const std::vector<char>& is_recv) {
    std::vector<int> silent, deaf;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (reqs[i] == MPI_REQUEST_NULL) continue;
      auto& v = is_recv[i] ? silent : deaf;
      if (std::find(v.begin(), v.end(), peer[i]) == v.end()) v.push_back(peer[i]);
    }
    std::vector<int>& lost = silent.empty() ? deaf : silent;
    std::sort(lost.begin(), lost.end());
    std::string who;
    for (size_t i = 0; i < lost.size(); ++i) {
      const int q = lost[i];
      who += fmt::format("{}rank {}", i ? ", " : "", q);
      if (q < static_cast<int>(hosts_.size()) && !hosts_[q].empty()) who += " (host " + hosts_[q] + ")";
    }
    const Call& c = job.call;
    const std::string op = c.barrier ? "barrier" : collective_name(c.kind);
    std::string why = fmt::format(
        "[mpi] rank {}: {} #{} ({} elements of {}) over {} timed out after {} s: {} {}; the rank has died, "
        "hangs, or made a different collective call. Every process must make the same collective calls in the same "
        "order; if a rank is only slow (e.g. writing a large checkpoint), raise PX_COLLECTIVE_TIMEOUT_S. This job "
        "cannot continue: run the same command again to resume from the last checkpoint",
        rank_, op, c.seq, c.count, dtype_name(c.t), describe_groups(c), options_.timeout_s, who,
        silent.empty() ? "received nothing" : "sent nothing");
    // The pending requests may still touch these buffers: keep them alive for the rest of the run.
    for (auto& [pos, buf] : job.remote) buf.data.release();
    {
      std::lock_guard<std::mutex> l(m_);
      if (why_.empty()) why_ = why;
    }
    g_broken = true;
    throw Error(why);
  }

  std::vector<int> proc_;
  int rank_, nprocs_;
  std::vector<std::string> hosts_;
  MpiCommunicatorOptions options_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm p2p_comm_ = MPI_COMM_NULL;  // point-to-point messages: their own tags
  int64_t tag_ub_ = 32767;
  int64_t seq_ = 0;  // crossing calls made (the caller's thread)

  ScratchPool pool_;
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::deque<std::shared_ptr<Message>> messages_;    // queued by callers, posted by the progress thread
  std::vector<std::shared_ptr<Message>> in_flight_;  // the progress thread's
  std::vector<std::shared_ptr<Message>> lost_;       // timed out
  bool stop_ = false;
  std::string why_;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(const std::vector<int>& process_of_position,
                                                    const std::vector<std::string>& hosts,
                                                    MpiCommunicatorOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    throw Error("[mpi] MPI is not initialized; use px::process_world() (it initializes MPI once per process)");
  int provided = 0;
  MPI_Query_thread(&provided);
  if (provided < MPI_THREAD_SERIALIZED)
    throw Error(
        "[mpi] MPI was initialized without thread support; initialize it with MPI_Init_thread and "
        "MPI_THREAD_SERIALIZED or more (px::process_world() does)");
  if (!(options.timeout_s > 0))
    throw Error(fmt::format("[mpi] timeout_s is {}; give a positive number of seconds", options.timeout_s));
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<int> count(static_cast<size_t>(size), 0), local;
  for (size_t p = 0; p < process_of_position.size(); ++p) {
    const int q = process_of_position[p];
    if (q < 0 || q >= size)
      throw Error(fmt::format("[mpi] mesh position {} is on process {}, but the job has ranks 0..{}", p, q, size - 1));
    ++count[q];
    if (q == rank) local.push_back(static_cast<int>(p));
  }
  for (int q = 0; q < size; ++q)
    if (!count[q])
      throw Error(fmt::format("[mpi] rank {} holds no mesh position; every rank of the job needs at least one", q));
  return std::make_unique<MpiCommunicator>(process_of_position, rank, size, hosts, options, std::move(local));
}

bool mpi_communicator_broken() { return g_broken; }

}  // namespace px
