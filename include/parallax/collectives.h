// The kinds of collective and the bytes they moved, shared by the communicators (below the
// sharding layer) and the sharded executables that report them (parallax/spmd.h includes this).
//
//   const px::CollectiveStats& st = exe->stats();
//   auto ar = st.total(px::CollectiveKind::all_reduce);   // summed over devices
//   std::cout << px::collective_name(px::CollectiveKind::all_reduce) << ": " << ar.wire_bytes << "\n";
//   std::cout << st.to_string();                          // one line per kind that ran
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "parallax/graph.h"  // CollectiveKind

namespace px {

const char* collective_name(CollectiveKind k);

// Bytes moved by collectives, per device (mesh position) and kind. `payload` is the size of the
// buffer a device contributes (all_gather: the gathered result), `wire` what a ring algorithm
// sends per device: all_reduce 2(n-1)/n, all_gather / reduce_scatter / all_to_all (n-1)/n of
// the larger side; permute and broadcast the bytes a device sends or receives.
struct CollectiveStats {
  struct Entry {
    int64_t calls = 0;
    int64_t payload_bytes = 0;
    int64_t wire_bytes = 0;
  };
  std::vector<std::array<Entry, kNumCollectiveKinds>> per_device;

  const Entry& at(int position, CollectiveKind k) const { return per_device.at(position)[static_cast<int>(k)]; }
  Entry total(CollectiveKind k) const;  // summed over devices
  void reset();
  std::string to_string() const;  // one line per kind that ran
};

}  // namespace px
