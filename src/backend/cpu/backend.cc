// The CPU backend: counted host allocations per placement (device memory is a pool of host memory
// with its own accounting and capacity), the kernel registry (by primitive), and a copy stream: one thread that
// runs copies between memory kinds in order while the compute threads go on.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "backend/cpu/kernel.h"
#include "core/box.h"
#include "ir/primitive.h"
#include "parallax/backend.h"

namespace px {

namespace {

class CopyStream {
 public:
  ~CopyStream() {
    {
      std::lock_guard<std::mutex> l(m_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  Event submit(std::vector<CopyJob> jobs) {
    int64_t bytes = 0;
    for (const CopyJob& j : jobs) bytes += j.bytes;
    // Small copies cost less than a hand-off to the copy thread: done at once.
    if (bytes < kInlineBytes) {
      run(jobs);
      return Event();
    }
    auto batch = std::make_shared<Batch>();
    batch->jobs = std::move(jobs);
    {
      std::lock_guard<std::mutex> l(m_);
      if (!worker_.joinable()) worker_ = std::thread([this] { loop(); });
      queue_.push_back(batch);
    }
    cv_.notify_one();
    return Event([batch] {
      std::unique_lock<std::mutex> l(batch->m);
      batch->cv.wait(l, [&] { return batch->done; });
    });
  }

 private:
  static constexpr int64_t kInlineBytes = 256 << 10;
  struct Batch {
    std::vector<CopyJob> jobs;
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
  };

  static void run(const std::vector<CopyJob>& jobs) {
    for (const CopyJob& j : jobs)
      if (j.bytes > 0 && j.dst != j.src) std::memmove(j.dst, j.src, static_cast<size_t>(j.bytes));
  }

  void loop() {
    for (;;) {
      std::shared_ptr<Batch> b;
      {
        std::unique_lock<std::mutex> l(m_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        b = std::move(queue_.front());
        queue_.pop_front();
      }
      run(b->jobs);
      {
        std::lock_guard<std::mutex> l(b->m);
        b->done = true;
      }
      b->cv.notify_all();
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Batch>> queue_;
  std::thread worker_;
  bool stop_ = false;
};

// A node's operand and result types, as a kernel spec takes them.
struct NodeTypes {
  std::vector<TensorType> in, out;
  NodeTypes(const Graph& g, const Node& n) {
    for (int v : n.inputs) in.push_back(g.type(v));
    for (int v : n.outputs) out.push_back(g.type(v));
  }
};

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }
  bool can_fuse(const Graph& g, const Node& n) const override {
    if (!n.prim->elementwise || n.outputs.size() != 1) return false;
    const cpu::EltwiseKernel* ek = cpu::find_eltwise(n.prim);
    if (!ek || !ek->f32) return false;
    // Integer-only nodes take the exact i32 path, which is not fused.
    auto int_like = [](DType d) { return d == DType::i32 || d == DType::boolean; };
    bool all_int = int_like(g.type(n.outputs[0]).dtype);
    for (int v : n.inputs) all_int = all_int && int_like(g.type(v).dtype);
    return !(all_int && ek->i32);
  }
  bool has_kernel(const Primitive* primitive) const override { return cpu::find_kernel(primitive) != nullptr; }
  // A reduction joins the loop that computes its operand (src/backend/cpu/reduce_feed.h).
  FusionLimits fusion() const override {
    FusionLimits l;
    l.reductions = true;
    return l;
  }

  Kernel make_kernel(const Graph& g, const Unit& unit, const Placement&) override {
    if (unit.kind == Unit::Kind::fused) return cpu::make_fused_kernel(g, {unit.nodes, unit.in_values, unit.out_values});
    const Node& n = g.nodes()[unit.nodes.at(0)];
    const cpu::KernelFactory* f = cpu::find_kernel(n.prim);
    if (!f) throw Error("[compile] no CPU kernel for primitive '" + n.prim->name + "'");
    const NodeTypes t(g, n);
    return (*f)(cpu::KernelSpec{t.in, t.out, n.attrs});
  }
  int64_t scratch_bytes(const Graph& g, const Unit& unit, const Placement&) const override {
    if (unit.kind == Unit::Kind::fused) return cpu::fused_scratch_bytes(g, {unit.nodes, unit.in_values, unit.out_values});
    const Node& n = g.nodes()[unit.nodes.at(0)];
    const NodeTypes t(g, n);
    return cpu::scratch_bytes(n.prim, cpu::KernelSpec{t.in, t.out, n.attrs});
  }

  Event copy(std::vector<CopyJob> jobs) override { return stream_.submit(std::move(jobs)); }
  // Spread over the threads when they move enough bytes to pay for it.
  void copy_boxes(const std::vector<BoxCopy>& jobs) override {
    int64_t bytes = 0;
    for (const BoxCopy& j : jobs) bytes += numel(j.extent) * j.element_bytes;
    const int64_t n = static_cast<int64_t>(jobs.size());
#pragma omp parallel for schedule(static) if (n > 1 && bytes > (int64_t{1} << 18))
    for (int64_t i = 0; i < n; ++i) {
      const BoxCopy& j = jobs[i];
      copy_box(j.src, j.src_shape, j.src_offset.data(), j.dst, j.dst_shape, j.dst_offset.data(), j.extent,
               j.element_bytes);
    }
  }
  int num_threads() const override { return cpu::num_threads(); }
  // Devices share the cores: one OpenMP thread each; their kernels run on that calling thread.
  void for_each_device(int devices, const std::function<void(int)>& body) override {
    std::exception_ptr failure;
    const int threads = cpu::num_threads();
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int d = 0; d < devices; ++d) {
      try {
        body(d);
      } catch (...) {
#pragma omp critical(px_device_run)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }

 private:
  CopyStream stream_;
};

}  // namespace

Backend& cpu_backend() {
  static CpuBackend b;
  return b;
}

}  // namespace px
