// The checks and hand-outs over every process of a communicator's world (parallax/distributed.h):
// collectives through the Communicator interface, so they need no MPI and are built with or
// without it (PX_WITH_MPI).
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "parallax/communicator.h"
#include "parallax/distributed.h"

namespace px {
namespace {

// The first line where a and b differ, both shown.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  auto line_at = [&](const std::string& s) {
    size_t begin = s.rfind('\n', i == 0 ? 0 : i - 1);
    begin = (begin == std::string::npos || i == 0) ? 0 : begin + 1;
    if (i > 0 && i <= s.size() && s[i - 1] == '\n') begin = i;
    size_t end = s.find('\n', begin);
    std::string line = s.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    return line.empty() && begin >= s.size() ? std::string("(end of text)") : "'" + line + "'";
  };
  return fmt::format("{} against {}", line_at(b), line_at(a));
}

}  // namespace

void check_same_on_every_process(Communicator& comm, int rank, const std::string& what, const std::string& text) {
  const int64_t world = comm.world_size();
  const size_t nlocal = comm.local_positions().size();
  DeviceGroups all(1);
  for (int p = 0; p < world; ++p) all[0].push_back(p);
  // The longest text, then everyone's text padded to it (as i32 words: the length comes first).
  std::vector<int32_t> len(nlocal, static_cast<int32_t>(text.size())), longest(nlocal);
  Buffers ins;
  MutBuffers outs;
  for (size_t i = 0; i < nlocal; ++i) {
    ins.push_back(&len[i]);
    outs.push_back(&longest[i]);
  }
  comm.all_reduce(ins, outs, 1, DType::i32, ReduceOp::max, all);
  const int64_t words = 2 + (static_cast<int64_t>(longest[0]) + 3) / 4;  // rank, length, text
  std::vector<int32_t> block(static_cast<size_t>(words), 0);
  block[0] = rank;
  block[1] = static_cast<int32_t>(text.size());
  std::memcpy(block.data() + 2, text.data(), text.size());
  std::vector<std::vector<int32_t>> got(nlocal, std::vector<int32_t>(static_cast<size_t>(words * world)));
  ins.assign(nlocal, block.data());
  outs.clear();
  for (auto& g : got) outs.push_back(g.data());
  comm.all_gather(ins, outs, words, DType::i32, all);
  auto text_of = [&](int64_t p) {
    const int32_t* b = got[0].data() + p * words;
    return std::string(reinterpret_cast<const char*>(b + 2), static_cast<size_t>(b[1]));
  };
  auto rank_of = [&](int64_t p) { return got[0][static_cast<size_t>(p * words)]; };
  const std::string first = text_of(0);
  for (int64_t p = 1; p < world; ++p) {
    std::string other = text_of(p);
    if (other != first)
      throw Error(fmt::format(
          "[distributed] the processes run with different {}: rank {} differs from rank {}: {}; launch every "
          "process with the same program, configuration and devices",
          what, rank_of(p), rank_of(0), first_difference(first, other)));
  }
}

std::string share_from_first_process(Communicator& comm, const std::string& text) {
  const std::vector<int>& local = comm.local_positions();
  const size_t nlocal = local.size();
  const bool first = std::find(local.begin(), local.end(), 0) != local.end();
  if (first && text.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw UserError(
        fmt::format("[distributed] cannot share {} bytes between processes (at most 2^31 - 1)", text.size()));
  DeviceGroups all(1);
  for (int p = 0; p < comm.world_size(); ++p) all[0].push_back(p);
  // The length, then the bytes as i32 words, both broadcast from position 0 (member 0 of the group).
  std::vector<int32_t> len(nlocal, first ? static_cast<int32_t>(text.size()) : 0), got_len(nlocal);
  Buffers ins;
  MutBuffers outs;
  for (size_t i = 0; i < nlocal; ++i) {
    ins.push_back(&len[i]);
    outs.push_back(&got_len[i]);
  }
  comm.broadcast(ins, outs, 1, DType::i32, 0, all);
  const int64_t words = (static_cast<int64_t>(got_len[0]) + 3) / 4;
  if (words == 0) return {};
  std::vector<int32_t> mine(static_cast<size_t>(words), 0);
  if (first) std::memcpy(mine.data(), text.data(), text.size());
  std::vector<std::vector<int32_t>> got(nlocal, std::vector<int32_t>(static_cast<size_t>(words)));
  ins.assign(nlocal, mine.data());
  outs.clear();
  for (auto& g : got) outs.push_back(g.data());
  comm.broadcast(ins, outs, words, DType::i32, 0, all);
  return std::string(reinterpret_cast<const char*>(got[0].data()), static_cast<size_t>(got_len[0]));
}

}  // namespace px
