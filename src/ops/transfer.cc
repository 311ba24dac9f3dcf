// The transfer primitive: a copy of a value into another memory kind (attr "to": device,
// pinned_host). The offload pass (src/memory/offload.cc) inserts it; the runtime runs it on the
// backend's copy stream.
#include "ir/primitive.h"

namespace px {

void register_memory_primitives() {
  Primitive t;
  t.name = "transfer";
  // group: the prefetch group (a layer's params) whose fetches the schedule counts as one slot.
  t.attrs = {{"to", AttrKind::string}, {"group", AttrKind::string, false}};
  t.infer = [](const std::vector<TensorType>& in, const Attrs& attrs) {
    if (in.size() != 1) throw Error("[transfer] takes one operand, got " + std::to_string(in.size()));
    parse_memory_kind(attrs.s("to"));
    return std::vector<TensorType>{in[0]};
  };
  // The cotangent goes back to where the operand lives; on one memory it is the same value.
  t.vjp = [](const VjpArgs& a) { return std::vector<Tensor>{a.cotangents[0]}; };
  t.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return elementwise_rule(in, out);
  };
  t.cost = [](const std::vector<TensorType>& in, const std::vector<TensorType>&, const Attrs&) {
    Cost c;
    c.bytes_read = c.bytes_written = static_cast<double>(in[0].nbytes());
    return c;
  };
  t.no_cse = true;  // two fetches of one param (forward and backward) must stay two
  t.spmd.linear = kLinearJointly;
  t.tp.view = TpTraits::View::same_dims;
  register_primitive(std::move(t));
}

}  // namespace px
