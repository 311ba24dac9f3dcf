// In-process collectives: every participant is a virtual device of this process, so a collective
// is a memory operation over all of their buffers at once. Reductions run in group order (the
// result is bitwise deterministic) and are parallelized over elements with OpenMP.
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernel.h"
#include "distributed/communicator.h"

namespace px {

namespace {

constexpr int64_t kChunk = 2048;

template <class T>
inline T combine(T a, T b, ReduceOp op) {
  return op == ReduceOp::sum ? a + b : std::max(a, b);
}

// dsts[*][0..count) = reduction of srcs[*][0..count); srcs may alias dsts element for element.
void reduce_into(const std::vector<const std::byte*>& srcs, const std::vector<std::byte*>& dsts, int64_t count, DType t,
                 ReduceOp op) {
  const int64_t nchunks = (count + kChunk - 1) / kChunk;
  const int64_t es = dtype_size(t);
#pragma omp parallel for schedule(static) if (nchunks > 4)
  for (int64_t c = 0; c < nchunks; ++c) {
    const int64_t off = c * kChunk, len = std::min(kChunk, count - off);
    if (t == DType::i32 || t == DType::boolean) {
      int32_t acc[kChunk], v[kChunk];
      cpu::convert(srcs[0] + off * es, t, acc, DType::i32, len);
      for (size_t k = 1; k < srcs.size(); ++k) {
        cpu::convert(srcs[k] + off * es, t, v, DType::i32, len);
        for (int64_t i = 0; i < len; ++i) acc[i] = combine(acc[i], v[i], op);
      }
      if (t == DType::boolean)
        for (int64_t i = 0; i < len; ++i) acc[i] = acc[i] != 0;
      for (std::byte* d : dsts) cpu::convert(acc, DType::i32, d + off * es, t, len);
    } else if (t == DType::f32) {
      float acc[kChunk];
      std::memcpy(acc, srcs[0] + off * es, static_cast<size_t>(len * es));
      for (size_t k = 1; k < srcs.size(); ++k) {
        const float* s = reinterpret_cast<const float*>(srcs[k] + off * es);
        if (op == ReduceOp::sum)
          for (int64_t i = 0; i < len; ++i) acc[i] += s[i];
        else
          for (int64_t i = 0; i < len; ++i) acc[i] = std::max(acc[i], s[i]);
      }
      for (std::byte* d : dsts) std::memcpy(d + off * es, acc, static_cast<size_t>(len * es));
    } else {
      // 16-bit floats accumulate in f32 and round once.
      float acc[kChunk], v[kChunk];
      cpu::load_f32(srcs[0], t, off, acc, len);
      for (size_t k = 1; k < srcs.size(); ++k) {
        cpu::load_f32(srcs[k], t, off, v, len);
        for (int64_t i = 0; i < len; ++i) acc[i] = combine(acc[i], v[i], op);
      }
      for (std::byte* d : dsts) cpu::store_f32(acc, d, t, off, len);
    }
  }
}

// Runs `copies` (dst, src, bytes) in parallel when there is enough to move.
struct Copy {
  std::byte* dst;
  const std::byte* src;
  int64_t bytes;
};
void run_copies(const std::vector<Copy>& copies) {
  int64_t total = 0;
  for (auto& c : copies) total += c.bytes;
  const int64_t n = static_cast<int64_t>(copies.size());
#pragma omp parallel for schedule(static) if (total > (1 << 18) && n > 1)
  for (int64_t i = 0; i < n; ++i)
    if (copies[i].bytes) std::memcpy(copies[i].dst, copies[i].src, static_cast<size_t>(copies[i].bytes));
}

class InprocCommunicator final : public Communicator {
 public:
  explicit InprocCommunicator(int64_t n) : Communicator(iota_positions(n), n) {}
  std::string name() const override { return "inproc"; }
  void barrier() override {}  // lockstep execution: every participant is already here

 protected:
  void do_all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                     const DeviceGroups& groups) override {
    for (const auto& g : groups) {
      std::vector<const std::byte*> s;
      std::vector<std::byte*> d;
      for (int p : g) {
        s.push_back(in(ins, p));
        d.push_back(out(outs, p));
      }
      reduce_into(s, d, count, t, op);
    }
  }

  void do_all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                     const DeviceGroups& groups) override {
    const int64_t bytes = count * dtype_size(t);
    std::vector<Copy> copies;
    for (const auto& g : groups)
      for (int dst : g)
        for (size_t j = 0; j < g.size(); ++j) copies.push_back({out(outs, dst) + j * bytes, in(ins, g[j]), bytes});
    run_copies(copies);
  }

  void do_reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                         const DeviceGroups& groups) override {
    for (const auto& g : groups) {
      const int64_t block = count / static_cast<int64_t>(g.size());
      const int64_t bytes = block * dtype_size(t);
      for (size_t k = 0; k < g.size(); ++k) {
        std::vector<const std::byte*> s;
        for (int p : g) s.push_back(in(ins, p) + k * bytes);
        reduce_into(s, {out(outs, g[k])}, block, t, op);
      }
    }
  }

  void do_all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                     const DeviceGroups& groups) override {
    std::vector<Copy> copies;
    for (const auto& g : groups) {
      const int64_t bytes = count / static_cast<int64_t>(g.size()) * dtype_size(t);
      for (size_t k = 0; k < g.size(); ++k)
        for (size_t j = 0; j < g.size(); ++j)
          copies.push_back({out(outs, g[k]) + j * bytes, in(ins, g[j]) + k * bytes, bytes});
    }
    run_copies(copies);
  }

  void do_permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                  const std::vector<std::pair<int, int>>& pairs) override {
    const int64_t bytes = count * dtype_size(t);
    std::vector<char> receives(static_cast<size_t>(world_size()), 0);
    std::vector<Copy> copies;
    for (auto [src, dst] : pairs) {
      receives.at(dst) = 1;
      copies.push_back({out(outs, dst), in(ins, src), bytes});
    }
    for (int p : local_positions())
      if (!receives[p]) std::memset(out(outs, p), 0, static_cast<size_t>(bytes));
    run_copies(copies);
  }

  void do_broadcast(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, int root,
                    const DeviceGroups& groups) override {
    const int64_t bytes = count * dtype_size(t);
    std::vector<Copy> copies;
    for (const auto& g : groups)
      for (int p : g)
        if (out(outs, p) != in(ins, g.at(root))) copies.push_back({out(outs, p), in(ins, g.at(root)), bytes});
    run_copies(copies);
  }

 private:
  static std::vector<int> iota_positions(int64_t n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int>(i);
    return v;
  }
  const std::byte* in(const Buffers& b, int position) const {
    return static_cast<const std::byte*>(b[local_index(position)]);
  }
  std::byte* out(const MutBuffers& b, int position) const { return static_cast<std::byte*>(b[local_index(position)]); }
};

}  // namespace

std::unique_ptr<Communicator> make_inproc_communicator(int64_t num_devices) {
  if (num_devices < 1) throw Error("[inproc] needs at least one device, got " + std::to_string(num_devices));
  return std::make_unique<InprocCommunicator>(num_devices);
}

}  // namespace px
