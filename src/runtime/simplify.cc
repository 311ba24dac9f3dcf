// The first compile pass: autocast to the compute dtype, values that every reader casts to 16 bits
// made in 16 bits (gathers, the loss gradient: also where the model casts itself), layout ops
// moved to the 16-bit side of casts, then common-subexpression elimination, a widened value's far
// readers widening it themselves, and dead-code elimination. Each keeps the values' facts (ValueInfo).
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
  if (!opt.optimize) return in->clone();
  // Layout ops moved to the 16-bit side of casts leave the f32 ones they replace dead: DCE removes them.
  std::unique_ptr<Graph> layouts = narrow_layouts(*in);
  if (layouts) in = layouts.get();
  std::unique_ptr<Graph> merged = cse(*in);
  // After CSE, which would merge the casts it makes again.
  std::unique_ptr<Graph> widened = widen_near_readers(*merged);
  return dce(widened ? *widened : *merged);
}

}  // namespace px
