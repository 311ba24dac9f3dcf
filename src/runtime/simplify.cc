// The first compile pass: autocast to the compute dtype (with all-gathers narrowed to it), then
// common-subexpression and dead-code elimination. Each keeps the values' facts (ValueInfo).
#include "core/dump.h"
#include "parallax/passes.h"
#include "runtime/compile_passes.h"
#include "runtime/program.h"

namespace px {

std::unique_ptr<Graph> simplify(const Graph& src, const CompileOptions& opt) {
  std::unique_ptr<Graph> cast;
  if (opt.compute_dtype != DType::f32) {
    cast = narrow_gathers(*autocast(src, opt.compute_dtype));
    dump_pass("autocast", [&] { return cast->to_string(); });
  }
  const Graph& in = cast ? *cast : src;
  return opt.optimize ? dce(*cse(in)) : in.clone();
}

}  // namespace px
