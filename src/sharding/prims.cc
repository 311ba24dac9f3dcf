// Registration of sharding_constraint, the collective primitives and local_slice. The kernels of
// the ones that run as ordinary kernels live with each backend's (src/backend/cpu/shape.cc,
// src/backend/ref/shape.cc).
#include "sharding/prims.h"

#include <mutex>

#include "ir/primitive.h"
#include "parallax/sharding.h"

namespace px {

std::string join_axes(const std::vector<std::string>& axes) {
  std::string s;
  for (auto& a : axes) s += (s.empty() ? "" : ",") + a;
  return s;
}

std::vector<std::string> split_axes(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}


namespace {

void expect_n(const std::string& op, const std::vector<TensorType>& in, size_t n) {
  if (in.size() != n)
    throw Error("[" + op + "] expects " + std::to_string(n) + " operand(s), got " + std::to_string(in.size()));
}

int checked_dim(const std::string& op, const TensorType& t, const Attrs& a, const char* key) {
  int64_t d = a.i(key);
  if (d < 0 || d >= t.rank())
    throw Error("[" + op + "] " + key + " " + std::to_string(d) + " is out of range for " + type_str(t));
  return static_cast<int>(d);
}

int64_t group_of(const std::string& op, const Attrs& a) {
  int64_t g = a.i("group");
  if (g < 1) throw Error("[" + op + "] group size " + std::to_string(g) + " must be >= 1");
  return g;
}

void check_divisible(const std::string& op, const TensorType& t, int dim, int64_t g) {
  if (t.shape[dim] % g != 0)
    throw Error("[" + op + "] dim " + std::to_string(dim) + " of " + type_str(t) +
                " is not divisible by the group size " + std::to_string(g));
}

void check_reduce(const std::string& op, const Attrs& a) {
  const std::string& r = a.s("reduce");
  if (r != "sum" && r != "max") throw Error("[" + op + "] reduce '" + r + "' is not one of sum, max");
}

std::vector<TensorType> identity_infer(const std::vector<TensorType>& in, const Attrs&) { return {in.at(0)}; }

// Local-graph primitives: not differentiable, never sharded again, default cost. Collectives run
// through the Communicator; local_slice is an ordinary kernel.
void register_local(const std::string& name, std::vector<AttrSpec> attrs, InferFn infer,
                    std::optional<CollectiveKind> collective, bool no_cse = false) {
  Primitive p;
  p.name = name;
  // Every one names the mesh axes it runs over ("data,model") and the size of their group.
  p.attrs = {{"axes", AttrKind::string}, {"group", AttrKind::integer}};
  p.attrs.insert(p.attrs.end(), attrs.begin(), attrs.end());
  p.infer = std::move(infer);
  p.spmd.collective = collective;
  p.no_cse = no_cse;
  register_primitive(std::move(p));
}

void register_prims() {
  Primitive sc;
  sc.name = "sharding_constraint";
  // reads: a layout for some readers only, not the value's own; regather: gather it again
  // (src/sharding/decision.cc).
  sc.attrs = {{"spec", AttrKind::string}, {"reads", AttrKind::integer, false}, {"regather", AttrKind::integer, false}};
  sc.infer = [](const std::vector<TensorType>& in, const Attrs& a) {
    expect_n("sharding_constraint", in, 1);
    PartitionSpec spec = PartitionSpec::parse(a.s("spec"));
    if (spec.size() > in[0].rank())
      throw Error("[sharding_constraint] spec " + spec.to_string() + " has " + std::to_string(spec.size()) +
                  " entries but the value " + type_str(in[0]) + " has rank " + std::to_string(in[0].rank()));
    return std::vector<TensorType>{in[0]};
  };
  sc.vjp = [](const VjpArgs& v) -> std::vector<Tensor> {
    if (!v.cotangents[0].defined()) return {Tensor()};
    return {with_sharding_constraint(v.cotangents[0], PartitionSpec::parse(v.attrs.s("spec")))};
  };
  sc.sharding = [](const std::vector<TensorType>& in, const std::vector<TensorType>& out, const Attrs&) {
    return elementwise_rule(in, out);
  };
  sc.cost = [](const std::vector<TensorType>&, const std::vector<TensorType>&, const Attrs&) { return Cost{}; };
  sc.no_cse = true;  // two constraints on one value may disagree on purpose
  sc.tp.view = TpTraits::View::same_dims;
  register_primitive(sc);

  register_local("all_reduce", {{"reduce", AttrKind::string}},
                 [](const std::vector<TensorType>& in, const Attrs& a) {
    expect_n("all_reduce", in, 1);
    group_of("all_reduce", a);
    check_reduce("all_reduce", a);
    return identity_infer(in, a);
  }, CollectiveKind::all_reduce);
  register_local("all_gather", {{"dim", AttrKind::integer}},
                 [](const std::vector<TensorType>& in, const Attrs& a) {
    expect_n("all_gather", in, 1);
    int d = checked_dim("all_gather", in[0], a, "dim");
    TensorType t = in[0];
    t.shape[d] *= group_of("all_gather", a);
    return std::vector<TensorType>{t};
  }, CollectiveKind::all_gather, /*no_cse=*/true);  // a second gather of one value is on purpose (ZeRO-3 gathers again for the backward pass)
  register_local("reduce_scatter", {{"dim", AttrKind::integer}, {"reduce", AttrKind::string}},
                 [](const std::vector<TensorType>& in, const Attrs& a) {
    expect_n("reduce_scatter", in, 1);
    check_reduce("reduce_scatter", a);
    int d = checked_dim("reduce_scatter", in[0], a, "dim");
    int64_t g = group_of("reduce_scatter", a);
    check_divisible("reduce_scatter", in[0], d, g);
    TensorType t = in[0];
    t.shape[d] /= g;
    return std::vector<TensorType>{t};
  }, CollectiveKind::reduce_scatter);
  register_local("all_to_all", {{"split_dim", AttrKind::integer}, {"concat_dim", AttrKind::integer}},
                 [](const std::vector<TensorType>& in, const Attrs& a) {
    expect_n("all_to_all", in, 1);
    int s = checked_dim("all_to_all", in[0], a, "split_dim");
    int c = checked_dim("all_to_all", in[0], a, "concat_dim");
    int64_t g = group_of("all_to_all", a);
    check_divisible("all_to_all", in[0], s, g);
    TensorType t = in[0];
    t.shape[s] /= g;
    t.shape[c] *= g;
    return std::vector<TensorType>{t};
  }, CollectiveKind::all_to_all);
  // pairs: flattened (source, target) indices within each group; targets not listed get zeros.
  register_local("collective_permute", {{"pairs", AttrKind::ints}},
                 [](const std::vector<TensorType>& in, const Attrs& a) {
    expect_n("collective_permute", in, 1);
    int64_t g = group_of("collective_permute", a);
    const auto& p = a.ints("pairs");
    if (p.size() % 2) throw Error("[collective_permute] pairs must hold (source, target) pairs");
    for (int64_t x : p)
      if (x < 0 || x >= g)
        throw Error("[collective_permute] index " + std::to_string(x) + " is outside the group of " +
                    std::to_string(g));
    return identity_infer(in, a);
  }, CollectiveKind::permute);
  register_local("local_slice", {{"dim", AttrKind::integer}, {"axis_ids", AttrKind::ints}, {"mesh", AttrKind::ints}},
                 [](const std::vector<TensorType>& in, const Attrs& a) {
    expect_n("local_slice", in, 2);
    if (in[1].dtype != DType::i32 || in[1].rank() != 1)
      throw Error("[local_slice] operand 1 must be the i32 device coordinates, got " + type_str(in[1]));
    int d = checked_dim("local_slice", in[0], a, "dim");
    int64_t g = group_of("local_slice", a);
    check_divisible("local_slice", in[0], d, g);
    TensorType t = in[0];
    t.shape[d] /= g;
    return std::vector<TensorType>{t};
  }, std::nullopt);
}

}  // namespace

void ensure_sharding_registered() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_prims();
  });
}

Tensor with_sharding_constraint(const Tensor& x, const PartitionSpec& spec) {
  ensure_sharding_registered();
  if (!x.defined()) throw Error("[sharding_constraint] the value is undefined");
  return emit1("sharding_constraint", {x}, Attrs{{"spec", spec.to_string()}});
}

namespace prims {
const Primitive* sharding_constraint() {
  static const Primitive* p = (ensure_sharding_registered(), &get_primitive("sharding_constraint"));
  return p;
}
const Primitive* collective_permute() {
  static const Primitive* p = (ensure_sharding_registered(), &get_primitive("collective_permute"));
  return p;
}
}  // namespace prims

}  // namespace px
