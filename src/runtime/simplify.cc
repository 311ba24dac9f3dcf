// The first compile pass: autocast to the compute dtype (with all-gathers narrowed to it), then
// common-subexpression and dead-code elimination, keeping per value of the source its new id.
#include "core/dump.h"
#include "parallax/passes.h"
#include "runtime/compile_passes.h"
#include "runtime/program.h"

namespace px {

Simplified simplify(const Graph& src, const CompileOptions& opt) {
  Simplified s;
  std::unique_ptr<Graph> cast;
  std::vector<int> to_cast;  // per value of src, its id in cast (-1: dropped)
  if (opt.compute_dtype != DType::f32) {
    std::vector<int> cast_map, narrow_map;
    cast = narrow_gathers(*autocast(src, opt.compute_dtype, &cast_map), &narrow_map);
    to_cast.assign(src.values().size(), -1);
    for (size_t v = 0; v < cast_map.size(); ++v)
      if (cast_map[v] >= 0) to_cast[v] = narrow_map[cast_map[v]];
    dump_pass("autocast", [&] { return cast->to_string(); });
  }
  const Graph& in = cast ? *cast : src;
  std::vector<int> to_cse, to_dce;
  if (opt.optimize) {
    s.graph = dce(*cse(in, &to_cse), &to_dce);
  } else {
    s.graph = in.clone();
  }
  s.value_of.assign(src.values().size(), -1);
  for (size_t v = 0; v < src.values().size(); ++v) {
    const int c = cast ? to_cast[v] : static_cast<int>(v);
    if (c >= 0) s.value_of[v] = opt.optimize ? (to_cse[c] >= 0 ? to_dce[to_cse[c]] : -1) : c;
  }
  return s;
}

}  // namespace px
