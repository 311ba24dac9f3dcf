#include "ir/primitive.h"

#include <sstream>

#include "core/enum_names.h"

namespace px {

Cost default_cost(const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  Cost c;
  for (auto& t : in) c.bytes_read += static_cast<double>(t.nbytes());
  for (auto& t : out) {
    c.bytes_written += static_cast<double>(t.nbytes());
    c.flops += static_cast<double>(t.numel());
  }
  return c;
}

Cost cost_of(const Primitive& p, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
             const Attrs& attrs) {
  return p.cost ? p.cost(in, out, attrs) : default_cost(in, out);
}

ShardingRule sharding_of(const Primitive& p, const std::vector<TensorType>& in, const std::vector<TensorType>& out,
                         const Attrs& attrs) {
  return p.sharding ? p.sharding(in, out, attrs) : whole_rule(in, out);
}

ShardingRule whole_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  ShardingRule r;
  auto label = [&](const TensorType& t) {
    std::vector<int> f;
    for (int64_t d : t.shape) {
      f.push_back(static_cast<int>(r.factor_sizes.size()));
      r.factor_sizes.push_back(d);
      r.factor_kinds.push_back(ShardingRule::Kind::whole);
    }
    return f;
  };
  for (auto& t : in) r.operands.push_back(label(t));
  for (auto& t : out) r.results.push_back(label(t));
  return r;
}

ShardingRule elementwise_rule(const std::vector<TensorType>& in, const std::vector<TensorType>& out) {
  ShardingRule r;
  const Shape& s = out.at(0).shape;
  std::vector<int> f;
  for (size_t d = 0; d < s.size(); ++d) {
    f.push_back(static_cast<int>(d));
    r.factor_sizes.push_back(s[d]);
    r.factor_kinds.push_back(ShardingRule::Kind::parallel);
  }
  for (size_t i = 0; i < in.size(); ++i) r.operands.push_back(f);
  for (size_t i = 0; i < out.size(); ++i) r.results.push_back(f);
  return r;
}

std::vector<int> positional_factors(const Primitive& p, const ShardingRule& r, const Attrs& attrs) {
  std::vector<int> out;
  if (!p.spmd.positional.factors) return out;
  for (int f : p.spmd.positional.factors(r, attrs))
    if (f >= 0 && f < static_cast<int>(r.factor_kinds.size())) out.push_back(f);
  return out;
}

const char* partial_reduce_name(PartialReduce r) {
  static constexpr const char* names[] = {"", "sum", "max"};
  static_assert(std::size(names) == static_cast<size_t>(PartialReduce::max) + 1);
  return enum_name(r, names, "");
}

std::string ShardingRule::to_string() const {
  auto letter = [](int f) { return f < 0 ? std::string("1") : std::string(1, static_cast<char>('a' + f % 26)); };
  std::ostringstream os;
  auto side = [&](const std::vector<std::vector<int>>& xs) {
    for (size_t i = 0; i < xs.size(); ++i) {
      os << (i ? "," : "");
      for (int f : xs[i]) os << letter(f);
    }
  };
  side(operands);
  os << "->";
  side(results);
  bool any = false;
  for (size_t f = 0; f < factor_kinds.size(); ++f) {
    if (factor_kinds[f] == Kind::parallel) continue;
    os << (any ? ", " : " {") << letter(static_cast<int>(f)) << ": "
       << (factor_kinds[f] == Kind::reduction ? "reduction" : "whole");
    any = true;
  }
  if (any) os << "}";
  return os.str();
}

std::vector<Tensor> emit(const std::string& name, const std::vector<Tensor>& inputs, Attrs attrs) {
  const Primitive& p = get_primitive(name);
  for (size_t i = 0; i < inputs.size(); ++i)
    if (!inputs[i].defined()) throw Error("[" + name + "] operand " + std::to_string(i) + " is an undefined tensor");
  Graph* cur = current_graph();
  Graph* g = inputs.empty() ? cur : inputs[0].graph();
  if (!g) throw Error("[" + name + "] called outside of a trace: use px::trace or a px::TraceScope");
  // While a trace is open, a tensor of another graph (captured from an earlier trace) must not
  // silently grow that graph.
  if (cur && g != cur)
    throw Error("[" + name + "] operand 0 belongs to a different graph than the trace in progress "
                "(mixing tensors from two traces)");
  return g->emit(p, inputs, std::move(attrs));
}

}  // namespace px

namespace px {

namespace {

// Attributes the passes put on nodes of any primitive: a recomputed copy (src/memory/remat.cc),
// which CSE must not merge back into its original.
const std::vector<AttrSpec>& annotations() {
  static const std::vector<AttrSpec> a = {{"remat", AttrKind::integer, false}};
  return a;
}

bool holds(const AttrValue& v, AttrKind k) {
  switch (k) {
    case AttrKind::integer:
      return std::holds_alternative<int64_t>(v);
    case AttrKind::number:
      return std::holds_alternative<double>(v) || std::holds_alternative<int64_t>(v);
    case AttrKind::string:
      return std::holds_alternative<std::string>(v);
    case AttrKind::ints:
      return std::holds_alternative<std::vector<int64_t>>(v);
    case AttrKind::dtype:
      return std::holds_alternative<DType>(v);
    case AttrKind::array:
      return std::holds_alternative<std::shared_ptr<const Array>>(v);
  }
  return false;
}

std::string takes(const Primitive& p) {
  if (p.attrs.empty()) return "it takes no attributes";
  std::string s = "it takes ";
  for (size_t i = 0; i < p.attrs.size(); ++i)
    s += (i ? ", " : "") + p.attrs[i].name + " (" + attr_kind_name(p.attrs[i].kind) +
         (p.attrs[i].required ? "" : ", optional") + ")";
  return s;
}

}  // namespace

const char* attr_kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::integer:
      return "an integer";
    case AttrKind::number:
      return "a number";
    case AttrKind::string:
      return "a string";
    case AttrKind::ints:
      return "an integer list";
    case AttrKind::dtype:
      return "a dtype";
    case AttrKind::array:
      return "an array";
  }
  return "?";
}

void check_attrs(const Primitive& p, const Attrs& attrs) {
  auto spec_of = [&](const std::string& name) -> const AttrSpec* {
    for (const AttrSpec& a : p.attrs)
      if (a.name == name) return &a;
    for (const AttrSpec& a : annotations())
      if (a.name == name) return &a;
    return nullptr;
  };
  for (const auto& [name, value] : attrs.items()) {
    const AttrSpec* a = spec_of(name);
    if (!a) throw Error("[" + p.name + "] unknown attribute '" + name + "'; " + takes(p));
    if (!holds(value, a->kind))
      throw Error("[" + p.name + "] attribute '" + name + "' must be " + attr_kind_name(a->kind) + "; " + takes(p));
  }
  for (const AttrSpec& a : p.attrs)
    if (a.required && !attrs.has(a.name))
      throw Error("[" + p.name + "] missing attribute '" + a.name + "' (" + attr_kind_name(a.kind) + "); " + takes(p));
}

}  // namespace px
