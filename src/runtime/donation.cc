// Donation: output o is written into the array of the input the caller donated to it. In place
// when the input's last reader runs before the unit that writes the output (or is that unit, when
// it may alias); otherwise the output is computed into the arena and copied into the array at the
// end of the run.
#include "runtime/compile_passes.h"

namespace px {

Donation donate(const Graph& g, const std::vector<Unit>& units, const ProgramBuffers& buffers,
                const std::vector<int>& output_donors) {
  const size_t nv = g.values().size(), n_out = g.outputs().size();
  const std::vector<int>& root = buffers.root;
  Donation d;
  d.output_donor.assign(n_out, -1);
  d.copy_at_end.assign(n_out, 0);
  if (output_donors.empty()) return d;
  if (output_donors.size() != n_out)
    throw Error("[compile] output_donors needs one entry per output (" + std::to_string(n_out) + "), got " +
                std::to_string(output_donors.size()));
  std::vector<int> writer(nv, -1), last_read(nv, -1);
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].kind == Unit::Kind::view) continue;  // reads nothing: its readers read the root
    for (int v : units[u].in_values) last_read[root[v]] = static_cast<int>(u);
    for (int v : units[u].out_values)
      if (writer[v] < 0) writer[v] = static_cast<int>(u);
  }
  std::vector<char> returned(nv, 0), taken(g.inputs().size(), 0);
  for (int v : g.outputs()) returned[root[v]] = 1;
  for (size_t o = 0; o < n_out; ++o) {
    const int i = output_donors[o];
    if (i < 0) continue;
    const int v = g.outputs()[o];
    if (i >= static_cast<int>(g.inputs().size()) || taken[i])
      throw Error("[compile] output_donors[" + std::to_string(o) + "] = " + std::to_string(i) +
                  ": not an input, or an input donated to two outputs");
    const int in = g.inputs()[i];
    const MemoryKind kin = buffers.kind[in], kout = buffers.kind[v];
    if (g.type(in) != g.type(v) || kin != kout)
      throw Error("[compile] output " + std::to_string(o) + " (" + type_str(g.type(v)) + " in " +
                  memory_kind_name(kout) + " memory) cannot be written into input " + std::to_string(i) + " (" +
                  type_str(g.type(in)) + " in " + memory_kind_name(kin) + " memory)");
    taken[i] = 1;
    d.output_donor[o] = i;
    if (g.values()[v].producer < 0) continue;  // an input returned: copied at the end
    const int w = writer[v], last = last_read[in];
    const bool in_place = !returned[in] && (last < w || (last == w && w >= 0 && units[w].alias_safe));
    d.copy_at_end[o] = !in_place;
  }
  return d;
}

}  // namespace px
