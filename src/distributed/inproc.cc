// In-process collectives: every participant is a virtual device of this process, so a collective
// is a memory operation over all of their buffers at once. Reductions run in group order (the
// result is bitwise deterministic) and are parallelized over elements with OpenMP.
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernel.h"
#include "distributed/position_collectives.h"
#include "parallax/communicator.h"

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

}  // namespace

namespace collective_math {

void all_reduce(const PositionBuffers& b, int64_t count, DType t, ReduceOp op, const DeviceGroups& groups) {
  std::vector<const std::byte*> s;
  std::vector<std::byte*> d;
  for (const auto& g : groups) {
    s.clear();
    d.clear();
    for (int p : g) {
      s.push_back(b.in[p]);
      if (b.out[p]) d.push_back(b.out[p]);
    }
    if (!d.empty()) reduce_into(s, d, count, t, op);
  }
}

void all_gather(const PositionBuffers& b, int64_t count, DType t, const DeviceGroups& groups) {
  const int64_t bytes = count * dtype_size(t);
  std::vector<Copy> copies;
  for (const auto& g : groups)
    for (int dst : g)
      if (b.out[dst])
        for (size_t j = 0; j < g.size(); ++j) copies.push_back({b.out[dst] + j * bytes, b.in[g[j]], bytes});
  run_copies(copies);
}

void reduce_scatter(const PositionBuffers& b, int64_t count, DType t, ReduceOp op, const DeviceGroups& groups) {
  std::vector<const std::byte*> s;
  for (const auto& g : groups) {
    const int64_t block = count / static_cast<int64_t>(g.size());
    const int64_t bytes = block * dtype_size(t);
    for (size_t k = 0; k < g.size(); ++k) {
      if (!b.out[g[k]]) continue;
      s.clear();
      for (int p : g) s.push_back(b.in[p] + k * bytes);
      reduce_into(s, {b.out[g[k]]}, block, t, op);
    }
  }
}

void all_to_all(const PositionBuffers& b, int64_t count, DType t, const DeviceGroups& groups) {
  std::vector<Copy> copies;
  for (const auto& g : groups) {
    const int64_t bytes = count / static_cast<int64_t>(g.size()) * dtype_size(t);
    for (size_t k = 0; k < g.size(); ++k)
      if (b.out[g[k]])
        for (size_t j = 0; j < g.size(); ++j) copies.push_back({b.out[g[k]] + j * bytes, b.in[g[j]] + k * bytes, bytes});
  }
  run_copies(copies);
}

void permute(const PositionBuffers& b, int64_t count, DType t, const std::vector<std::pair<int, int>>& pairs) {
  const int64_t bytes = count * dtype_size(t);
  std::vector<char> receives(b.out.size(), 0);
  std::vector<Copy> copies;
  for (auto [src, dst] : pairs) {
    receives.at(dst) = 1;
    if (b.out[dst]) copies.push_back({b.out[dst], b.in[src], bytes});
  }
  for (size_t p = 0; p < b.out.size(); ++p)
    if (b.out[p] && !receives[p]) std::memset(b.out[p], 0, static_cast<size_t>(bytes));
  run_copies(copies);
}

void broadcast(const PositionBuffers& b, int64_t count, DType t, int root, const DeviceGroups& groups) {
  const int64_t bytes = count * dtype_size(t);
  std::vector<Copy> copies;
  for (const auto& g : groups)
    for (int p : g)
      if (b.out[p] && b.out[p] != b.in[g.at(root)]) copies.push_back({b.out[p], b.in[g.at(root)], bytes});
  run_copies(copies);
}

}  // namespace collective_math

namespace {

// Every participant is local: the call's buffers by position, then the shared memory operations.
class InprocCommunicator final : public Communicator {
 public:
  explicit InprocCommunicator(int64_t n) : Communicator(iota_positions(n), n) {}
  std::string name() const override { return "inproc"; }
  void barrier() override {}  // lockstep execution: every participant is already here

 protected:
  void do_all_reduce(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                     const DeviceGroups& groups) override {
    collective_math::all_reduce(by_position(ins, outs), count, t, op, groups);
  }
  void do_all_gather(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                     const DeviceGroups& groups) override {
    collective_math::all_gather(by_position(ins, outs), count, t, groups);
  }
  void do_reduce_scatter(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, ReduceOp op,
                         const DeviceGroups& groups) override {
    collective_math::reduce_scatter(by_position(ins, outs), count, t, op, groups);
  }
  void do_all_to_all(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                     const DeviceGroups& groups) override {
    collective_math::all_to_all(by_position(ins, outs), count, t, groups);
  }
  void do_permute(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t,
                  const std::vector<std::pair<int, int>>& pairs) override {
    collective_math::permute(by_position(ins, outs), count, t, pairs);
  }
  void do_broadcast(const Buffers& ins, const MutBuffers& outs, int64_t count, DType t, int root,
                    const DeviceGroups& groups) override {
    collective_math::broadcast(by_position(ins, outs), count, t, root, groups);
  }

 private:
  static std::vector<int> iota_positions(int64_t n) {
    std::vector<int> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int>(i);
    return v;
  }
  // Positions are the local indices here: the caller's lists are already by position.
  static collective_math::PositionBuffers by_position(const Buffers& ins, const MutBuffers& outs) {
    collective_math::PositionBuffers b;
    b.in.reserve(ins.size());
    b.out.reserve(outs.size());
    for (const void* p : ins) b.in.push_back(static_cast<const std::byte*>(p));
    for (void* p : outs) b.out.push_back(static_cast<std::byte*>(p));
    return b;
  }
};

}  // namespace

std::unique_ptr<Communicator> make_inproc_communicator(int64_t num_devices) {
  if (num_devices < 1) throw Error("[inproc] needs at least one device, got " + std::to_string(num_devices));
  return std::make_unique<InprocCommunicator>(num_devices);
}

}  // namespace px
