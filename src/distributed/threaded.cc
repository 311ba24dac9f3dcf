// The threaded world: N "processes" as N threads, each with its own Communicator, meeting at a
// shared rendezvous for every call that crosses processes (see threaded.h).
#include "distributed/threaded.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "distributed/position_collectives.h"

namespace px {
namespace {

using collective_math::PositionBuffers;

// Where the processes meet: a reusable barrier plus each process's deposit for the current call.
class Rendezvous {
 public:
  struct Call {
    const char* op = "";
    int64_t count = 0;
    DType dtype = DType::f32;
    int64_t seq = 0;
    const Buffers* ins = nullptr;
  };

  Rendezvous(std::vector<int> process_of, int n, double timeout_s)
      : process_of_(std::move(process_of)),
        positions_(static_cast<size_t>(n)),
        calls_(static_cast<size_t>(n)),
        n_(n),
        timeout_(timeout_s) {
    for (size_t p = 0; p < process_of_.size(); ++p) positions_[process_of_[p]].push_back(static_cast<int>(p));
  }

  int size() const { return n_; }
  const std::vector<int>& process_of() const { return process_of_; }
  const std::vector<int>& positions(int process) const { return positions_[process]; }
  const Call& call(int process) const { return calls_[process]; }

  void deposit(int process, const Call& c) {
    std::lock_guard<std::mutex> l(m_);
    calls_[process] = c;
  }

  // Returns once every process has arrived here (the same number of times); throws when the world
  // is broken (a process failed or a wait timed out).
  void wait(int process, const Call& c) {
    std::unique_lock<std::mutex> l(m_);
    if (broken_) throw Error(why_);
    const uint64_t gen = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    auto done = [&] { return generation_ != gen || broken_; };
    if (!cv_.wait_for(l, std::chrono::duration<double>(timeout_), done)) {
      set_broken(
          fmt::format("[threaded] process {} waited {} s in call #{} ({}) for the other processes; a process "
                      "stopped making collective calls (every process must make the same calls in the same "
                      "order)",
                      process, timeout_, c.seq, c.op));
      throw Error(why_);
    }
    if (generation_ == gen) throw Error(why_);
  }

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> l(m_);
    set_broken(why);
  }

  // Point-to-point: a mailbox of copies, keyed by (from, to, tag), each key a queue in send order.
  void post(int from, int to, int64_t tag, const void* data, int64_t bytes) {
    const auto* b = static_cast<const std::byte*>(data);
    std::lock_guard<std::mutex> l(m_);
    mail_[{from, to, tag}].emplace_back(b, b + bytes);
    cv_.notify_all();
  }
  void take(int from, int to, int64_t tag, void* out, int64_t bytes) {
    std::unique_lock<std::mutex> l(m_);
    const std::tuple<int, int, int64_t> key{from, to, tag};
    auto arrived = [&] { return broken_ || !mail_[key].empty(); };
    if (!cv_.wait_for(l, std::chrono::duration<double>(timeout_), arrived))
      set_broken(fmt::format("[threaded] process {} waited {} s for message {} from process {}; the sender stopped", to,
                             timeout_, tag, from));
    if (mail_[key].empty()) throw Error(why_);
    std::vector<std::byte> m = std::move(mail_[key].front());
    mail_[key].pop_front();
    if (static_cast<int64_t>(m.size()) != bytes)
      throw Error(fmt::format("[threaded] message {} from process {} has {} bytes; process {} expected {}", tag, from,
                              m.size(), to, bytes));
    if (bytes) std::memcpy(out, m.data(), static_cast<size_t>(bytes));
  }

  // Before a new run: nobody is waiting, the barrier starts afresh.
  void reset() {
    std::lock_guard<std::mutex> l(m_);
    mail_.clear();
    broken_ = false;
    why_.clear();
    arrived_ = 0;
  }

 private:
  void set_broken(const std::string& why) {  // m_ held
    if (!broken_) {
      broken_ = true;
      why_ = why;
    }
    cv_.notify_all();
  }

  std::vector<int> process_of_;
  std::vector<std::vector<int>> positions_;
  std::vector<Call> calls_;
  const int n_;
  const double timeout_;
  std::mutex m_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
  std::string why_;
  std::map<std::tuple<int, int, int64_t>, std::deque<std::vector<std::byte>>> mail_;
};

class ThreadedCommunicator final : public Communicator {
 public:
  ThreadedCommunicator(std::shared_ptr<Rendezvous> rv, int process)
      : Communicator(rv->positions(process), static_cast<int64_t>(rv->process_of().size())),
        rv_(std::move(rv)),
        process_(process) {}
  std::string name() const override {
    return "threaded(process " + std::to_string(process_) + " of " + std::to_string(rv_->size()) + ")";
  }
  void restart() { seq_ = 0; }  // a new run: calls are numbered afresh on every process
  int process_index() const override { return process_; }
  void send(int to, int64_t tag, const void* data, int64_t bytes) override {
    check_peer(to);
    rv_->post(process_, to, tag, data, bytes);
  }
  void receive(int from, int64_t tag, void* out, int64_t bytes) override {
    check_peer(from);
    rv_->take(from, process_, tag, out, bytes);
  }
  void barrier() override {
    if (rv_->size() == 1) return;
    Rendezvous::Call c{"barrier", 0, DType::f32, ++seq_, nullptr};
    rv_->deposit(process_, c);
    rv_->wait(process_, c);
    check_same_call(c);
    rv_->wait(process_, c);
  }

 protected:
  void do_all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                     const DeviceGroups& groups) override {
    call("all_reduce", ins, outs, count, t, crosses(groups),
         [&](const PositionBuffers& b) { collective_math::all_reduce(b, count, t, op, groups); });
  }
  void do_all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                     const DeviceGroups& groups) override {
    call("all_gather", ins, outs, count, t, crosses(groups),
         [&](const PositionBuffers& b) { collective_math::all_gather(b, count, t, groups); });
  }
  void do_reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                         const DeviceGroups& groups) override {
    call("reduce_scatter", ins, outs, count, t, crosses(groups),
         [&](const PositionBuffers& b) { collective_math::reduce_scatter(b, count, t, op, groups); });
  }
  void do_all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                     const DeviceGroups& groups) override {
    call("all_to_all", ins, outs, count, t, crosses(groups),
         [&](const PositionBuffers& b) { collective_math::all_to_all(b, count, t, groups); });
  }
  void do_permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                  const std::vector<std::pair<int, int>>& pairs) override {
    bool cross = false;
    for (auto [src, dst] : pairs) cross = cross || rv_->process_of().at(src) != rv_->process_of().at(dst);
    call("permute", ins, outs, count, t, cross,
         [&](const PositionBuffers& b) { collective_math::permute(b, count, t, pairs); });
  }
  void do_broadcast(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, int root,
                    const DeviceGroups& groups) override {
    call("broadcast", ins, outs, count, t, crosses(groups),
         [&](const PositionBuffers& b) { collective_math::broadcast(b, count, t, root, groups); });
  }

 private:
  void check_peer(int q) const {
    if (q < 0 || q >= rv_->size() || q == process_)
      throw Error(fmt::format("[threaded] process {} cannot message process {} (processes 0..{})", process_, q,
                              rv_->size() - 1));
  }

  // Whether any group has members in two processes. Every process decides the same (the groups
  // are the same everywhere), so they all meet, or none does.
  bool crosses(const DeviceGroups& groups) const {
    const std::vector<int>& proc = rv_->process_of();
    for (const auto& g : groups)
      for (int p : g)
        if (proc.at(p) != proc.at(g[0])) return true;
    return false;
  }

  void check_same_call(const Rendezvous::Call& c) {
    for (int q = 0; q < rv_->size(); ++q) {
      const Rendezvous::Call& o = rv_->call(q);
      if (std::strcmp(o.op, c.op) != 0 || o.count != c.count || o.dtype != c.dtype || o.seq != c.seq) {
        std::string why = fmt::format(
            "[threaded] processes made different collective calls: process {} made call #{} {} of {} {} elements, "
            "process {} made call #{} {} of {} {} elements; every process must make the same calls in the same order",
            process_, c.seq, c.op, c.count, dtype_name(c.dtype), q, o.seq, o.op, o.count, dtype_name(o.dtype));
        rv_->fail(why);
        throw Error(why);
      }
    }
  }

  template <class Compute>
  void call(const char* op, const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, bool cross,
            const Compute& compute) {
    const std::vector<int>& mine = local_positions();
    const size_t world = static_cast<size_t>(world_size());
    PositionBuffers b;
    b.in.assign(world, nullptr);
    b.out.assign(world, nullptr);
    if (!cross || rv_->size() == 1) {
      for (size_t i = 0; i < mine.size(); ++i) {
        b.in[mine[i]] = static_cast<const std::byte*>(ins[i]);
        b.out[mine[i]] = static_cast<std::byte*>(outs[i]);
      }
      compute(b);
      return;
    }
    Rendezvous::Call c{op, count, t, ++seq_, &ins};
    rv_->deposit(process_, c);
    rv_->wait(process_, c);
    check_same_call(c);
    for (int q = 0; q < rv_->size(); ++q) {
      const std::vector<int>& ps = rv_->positions(q);
      const Buffers& qin = *rv_->call(q).ins;
      for (size_t i = 0; i < ps.size(); ++i) b.in[ps[i]] = static_cast<const std::byte*>(qin[i]);
    }
    // An in-place output is written only after everyone has read its input: computed into scratch
    // and copied after the second meeting.
    const int64_t bytes = count * dtype_size(t);
    scratch_.resize(mine.size());
    std::vector<size_t> in_place;
    for (size_t i = 0; i < mine.size(); ++i) {
      b.out[mine[i]] = static_cast<std::byte*>(outs[i]);
      if (outs[i] == ins[i] && bytes > 0) {
        scratch_[i].resize(static_cast<size_t>(bytes));
        b.out[mine[i]] = scratch_[i].data();
        in_place.push_back(i);
      }
    }
    compute(b);
    rv_->wait(process_, c);
    for (size_t i : in_place) std::memcpy(outs[i], scratch_[i].data(), static_cast<size_t>(bytes));
  }

  std::shared_ptr<Rendezvous> rv_;
  int process_;
  int64_t seq_ = 0;  // calls that met the other processes
  std::vector<std::vector<std::byte>> scratch_;
};

class World final : public ThreadedWorld {
 public:
  World(std::shared_ptr<Rendezvous> rv) : rv_(std::move(rv)) {
    for (int p = 0; p < rv_->size(); ++p) comms_.push_back(std::make_unique<ThreadedCommunicator>(rv_, p));
  }
  int num_processes() const override { return rv_->size(); }
  Communicator& communicator(int process) override {
    if (process < 0 || process >= num_processes())
      throw Error(
          fmt::format("[threaded] process {} is not one of the {} processes of this world", process, num_processes()));
    return *comms_[process];
  }
  void run(const std::function<void(int process, Communicator& comm)>& fn) override {
    rv_->reset();
    for (auto& c : comms_) c->restart();
    std::mutex m;
    std::exception_ptr first;
    std::vector<std::thread> threads;
    for (int p = 0; p < num_processes(); ++p)
      threads.emplace_back([&, p] {
        try {
          fn(p, *comms_[p]);
        } catch (...) {
          std::string what = "unknown error";
          try {
            throw;
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          {
            std::lock_guard<std::mutex> l(m);
            if (!first) first = std::current_exception();
          }
          rv_->fail(fmt::format("[threaded] process {} failed, so the collective call cannot complete: {}", p, what));
        }
      });
    for (auto& t : threads) t.join();
    if (first) std::rethrow_exception(first);
  }

 private:
  std::shared_ptr<Rendezvous> rv_;
  std::vector<std::unique_ptr<ThreadedCommunicator>> comms_;
};

}  // namespace

std::unique_ptr<ThreadedWorld> make_threaded_world(const std::vector<int>& process_of_position, double timeout_s) {
  if (process_of_position.empty()) throw Error("[threaded] a world needs at least one mesh position");
  if (!(timeout_s > 0))
    throw Error(fmt::format("[threaded] timeout_s is {}; give a positive number of seconds", timeout_s));
  int n = 0;
  for (int p : process_of_position) {
    if (p < 0) throw Error(fmt::format("[threaded] process index {} is negative; processes are numbered 0..n-1", p));
    n = std::max(n, p + 1);
  }
  std::vector<int> count(static_cast<size_t>(n), 0);
  for (int p : process_of_position) ++count[p];
  for (int p = 0; p < n; ++p)
    if (!count[p])
      throw Error(
          fmt::format("[threaded] process {} holds no mesh position; number the processes 0..n-1 with at "
                      "least one position each",
                      p));
  return std::make_unique<World>(std::make_shared<Rendezvous>(process_of_position, n, timeout_s));
}

}  // namespace px
