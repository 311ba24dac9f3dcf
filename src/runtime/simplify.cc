// The first compile pass: autocast to the compute dtype, values that every reader casts to 16 bits
// made in 16 bits (gathers, the loss gradient: also where the model casts itself), then
// common-subexpression and dead-code elimination. Each keeps the values' facts (ValueInfo).
#include "core/dump.h"
#include "parallax/passes.h"
#include "runtime/compile_passes.h"
#include "runtime/program.h"

namespace px {

std::unique_ptr<Graph> simplify(const Graph& src, const CompileOptions& opt) {
  std::unique_ptr<Graph> cast = opt.compute_dtype != DType::f32 ? autocast(src, opt.compute_dtype) : nullptr;
  const Graph* in = cast ? cast.get() : &src;
  std::unique_ptr<Graph> narrow = narrow_producers(*in);
  if (narrow) in = narrow.get();
  if (cast) dump_pass("autocast", [&] { return in->to_string(); });
  return opt.optimize ? dce(*cse(*in)) : in->clone();
}

}  // namespace px
