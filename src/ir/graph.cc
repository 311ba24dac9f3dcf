#include <algorithm>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "core/enum_names.h"
#include "ir/primitive.h"
#include "parallax/graph.h"

namespace px {

// ---- Attrs ----------------------------------------------------------------------------------

namespace {
template <class T>
const T& attr_get(const std::map<std::string, AttrValue>& m, const std::string& k, const char* kind) {
  auto it = m.find(k);
  if (it == m.end()) throw Error("[attrs] missing attribute '" + k + "'");
  const T* v = std::get_if<T>(&it->second);
  if (!v) throw Error("[attrs] attribute '" + k + "' is not " + kind);
  return *v;
}

std::string attr_value_str(const AttrValue& v) {
  std::ostringstream os;
  if (auto p = std::get_if<int64_t>(&v)) {
    os << *p;
  } else if (auto p = std::get_if<double>(&v)) {
    os << *p;
  } else if (auto p = std::get_if<std::string>(&v)) {
    os << '"' << *p << '"';
  } else if (auto p = std::get_if<std::vector<int64_t>>(&v)) {
    os << "(";
    for (size_t i = 0; i < p->size(); ++i) os << (i ? "," : "") << (*p)[i];
    os << ")";
  } else if (auto p = std::get_if<DType>(&v)) {
    os << dtype_name(*p);
  } else if (auto p = std::get_if<std::shared_ptr<const Array>>(&v)) {
    os << "<" << type_str((*p)->type()) << ">";
  }
  return os.str();
}
}  // namespace

int64_t Attrs::i(const std::string& k) const { return attr_get<int64_t>(m_, k, "an integer"); }
double Attrs::f(const std::string& k) const {
  auto it = m_.find(k);
  if (it != m_.end())
    if (auto p = std::get_if<int64_t>(&it->second)) return static_cast<double>(*p);
  return attr_get<double>(m_, k, "a float");
}
const std::string& Attrs::s(const std::string& k) const { return attr_get<std::string>(m_, k, "a string"); }
const std::vector<int64_t>& Attrs::ints(const std::string& k) const {
  return attr_get<std::vector<int64_t>>(m_, k, "an integer list");
}
DType Attrs::dtype(const std::string& k) const { return attr_get<DType>(m_, k, "a dtype"); }
const Array& Attrs::array(const std::string& k) const {
  return *attr_get<std::shared_ptr<const Array>>(m_, k, "an array");
}

std::string Attrs::to_string() const {
  if (m_.empty()) return "";
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (auto& [k, v] : m_) {
    os << (first ? "" : " ") << k << "=" << attr_value_str(v);
    first = false;
  }
  os << "]";
  return os.str();
}

bool Attrs::operator==(const Attrs& o) const {
  if (m_.size() != o.m_.size()) return false;
  for (auto a = m_.begin(), b = o.m_.begin(); a != m_.end(); ++a, ++b) {
    if (a->first != b->first || a->second.index() != b->second.index()) return false;
    if (auto p = std::get_if<std::shared_ptr<const Array>>(&a->second)) {
      // Constants are equal only when they are the same buffer.
      if (p->get() != std::get<std::shared_ptr<const Array>>(b->second).get()) return false;
    } else if (a->second != b->second) {
      return false;
    }
  }
  return true;
}

size_t Attrs::hash() const {
  size_t h = 0;
  for (auto& [k, v] : m_) {
    // Constants compare by buffer, so hash the buffer: equal-typed constants must not all collide.
    auto p = std::get_if<std::shared_ptr<const Array>>(&v);
    size_t hv = p ? std::hash<const void*>()(p->get()) : std::hash<std::string>()(attr_value_str(v));
    h = h * 31 + std::hash<std::string>()(k) + hv;
  }
  return h;
}

// ---- Tensor ---------------------------------------------------------------------------------

Tensor::Tensor(Graph* g, int id) : g_(g), alive_(g ? std::weak_ptr<const bool>(g->alive_) : std::weak_ptr<const bool>()), id_(id) {}

TensorType Tensor::type() const {
  if (!g_) throw UserError("[Tensor] use of an undefined tensor");
  if (alive_.expired())
    throw UserError(fmt::format("[Tensor] value %{} belongs to a graph that was destroyed or moved; keep the graph "
                                "(the unique_ptr trace() returns) alive while its tensors are used",
                                id_));
  return g_->type(id_);
}

int64_t Tensor::dim(int64_t axis) const { return shape()[normalize_axis(axis, rank(), "Tensor::dim")]; }

// ---- Graph ----------------------------------------------------------------------------------

Graph::Graph(Graph&& o)
    : nodes_(std::move(o.nodes_)),
      values_(std::move(o.values_)),
      inputs_(std::move(o.inputs_)),
      input_names_(std::move(o.input_names_)),
      outputs_(std::move(o.outputs_)) {
  o.alive_ = std::make_shared<const bool>(true);
}

Graph& Graph::operator=(Graph&& o) {
  if (this == &o) return *this;
  nodes_ = std::move(o.nodes_);
  values_ = std::move(o.values_);
  inputs_ = std::move(o.inputs_);
  input_names_ = std::move(o.input_names_);
  outputs_ = std::move(o.outputs_);
  alive_ = std::make_shared<const bool>(true);  // this graph's old Tensors name values that are gone
  o.alive_ = std::make_shared<const bool>(true);
  return *this;
}

int Graph::add_value(const TensorType& t, int producer, int out_index) {
  values_.push_back({t, producer, out_index});
  return static_cast<int>(values_.size()) - 1;
}

Tensor Graph::input(const TensorType& t, const std::string& name) {
  try {
    (void)t.nbytes();  // no negative dims, and the count and bytes fit in int64
  } catch (const Error& e) {
    throw UserError(fmt::format("[trace] input {}{} has type {}: {}", inputs_.size(),
                                name.empty() ? "" : " '" + name + "'", type_str(t), e.what()));
  }
  int id = add_value(t, -1, static_cast<int>(inputs_.size()));
  inputs_.push_back(id);
  input_names_.push_back(name);
  return Tensor(this, id);
}

std::vector<Tensor> Graph::emit(const Primitive& p, const std::vector<Tensor>& inputs, Attrs attrs) {
  std::vector<TensorType> in_types;
  in_types.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined())
      throw Error("[" + p.name + "] operand " + std::to_string(i) + " is an undefined tensor");
    if (inputs[i].graph() != this || !inputs[i].alive())
      throw Error("[" + p.name + "] operand " + std::to_string(i) +
                  " belongs to a different graph (mixing tensors from two traces)");
    in_types.push_back(type(inputs[i].id()));
  }
  check_attrs(p, attrs);
  std::vector<TensorType> out_types;
  try {
    out_types = p.infer(in_types, attrs);
  } catch (const UserError& e) {
    // Checked shape arithmetic ("[shape] ...") inside a shape rule: name the op too.
    if (std::string(e.what()).rfind("[shape]", 0) == 0) throw UserError("[" + p.name + "] " + e.what());
    throw;
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // e.g. a missing attribute read with .at(): still name the op
    throw Error("[" + p.name + "] " + e.what());
  }
  Node n;
  n.prim = &p;
  n.attrs = std::move(attrs);
  n.facts = emitting_;
  for (auto& t : inputs) n.inputs.push_back(t.id());
  int node_index = static_cast<int>(nodes_.size());
  std::vector<Tensor> outs;
  for (size_t i = 0; i < out_types.size(); ++i) {
    // Every shape rule's result is checked here: no negative dims, counts and bytes fit in int64.
    try {
      (void)out_types[i].nbytes();
    } catch (const Error& e) {
      throw UserError(fmt::format("[{}] output {} has type {}: {}", p.name, i, type_str(out_types[i]), e.what()));
    }
    int id = add_value(out_types[i], node_index, static_cast<int>(i));
    n.outputs.push_back(id);
    outs.emplace_back(this, id);
  }
  nodes_.push_back(std::move(n));
  return outs;
}

void Graph::set_outputs(const std::vector<Tensor>& outs) {
  outputs_.clear();
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!outs[i].defined()) throw Error("[trace] output " + std::to_string(i) + " is an undefined tensor");
    if (outs[i].graph() != this || !outs[i].alive())
      throw Error("[trace] output " + std::to_string(i) + " belongs to another graph");
    outputs_.push_back(outs[i].id());
  }
}

void Graph::reset_ids(std::vector<Node> nodes, std::vector<ValueInfo> values, std::vector<int> inputs,
                      std::vector<std::string> input_names, std::vector<int> outputs) {
  nodes_ = std::move(nodes);
  values_ = std::move(values);
  inputs_ = std::move(inputs);
  input_names_ = std::move(input_names);
  outputs_ = std::move(outputs);
}

void Graph::copy_facts(const Graph& from, const std::vector<int>& new_id) {
  for (size_t v = 0; v < new_id.size() && v < from.values().size(); ++v)
    if (new_id[v] >= 0) {
      ValueInfo& to = values_.at(new_id[v]);
      to.copy_facts(from.values()[v]);
      to.grad_of = from.values()[v].grad_of;
      to.micro_grad_of = from.values()[v].micro_grad_of;
    }
}

namespace {
constexpr const char* kStepPhaseNames[] = {"none", "forward", "backward", "update"};
static_assert(std::size(kStepPhaseNames) == static_cast<size_t>(StepPhase::update) + 1);
}  // namespace

const char* step_phase_name(StepPhase p) {
  return enum_name(p, kStepPhaseNames);
}

namespace {
// " {params, pinned_host, blocks.3}": the value's facts that are not the defaults, else "".
std::string facts_str(const ValueInfo& info) {
  std::string s;
  auto add = [&](const std::string& f) { s += (s.empty() ? " {" : ", ") + f; };
  if (info.category != MemoryCategory::temporaries) add(memory_category_name(info.category));
  if (info.kind != MemoryKind::device) add(memory_kind_name(info.kind));
  if (!info.layer.empty()) add(info.layer);
  if (info.grad_of >= 0) add("gradient of input " + std::to_string(info.grad_of));
  if (info.micro_grad_of >= 0 && info.micro_grad_of != info.grad_of)
    add("microbatch gradient of input " + std::to_string(info.micro_grad_of));
  return s.empty() ? s : s + "}";
}

// "  # forward 1", "  # backward 0, stage 1": a node's facts (NodeFacts) when set.
std::string facts_str(const NodeFacts& f) {
  if (f.phase == StepPhase::none && f.microbatch < 0 && f.stage < 0) return "";
  std::string s = std::string("  # ") + step_phase_name(f.phase);
  if (f.microbatch >= 0) s += " " + std::to_string(f.microbatch);
  return f.stage >= 0 ? s + ", stage " + std::to_string(f.stage) : s;
}
}  // namespace

std::string Graph::to_string() const {
  std::ostringstream os;
  auto v = [&](int id) { return "%" + std::to_string(id); };
  auto typed = [&](int id) { return v(id) + ": " + type_str(type(id)) + facts_str(values_[id]); };
  os << "graph(";
  for (size_t i = 0; i < inputs_.size(); ++i) {
    os << (i ? ", " : "") << typed(inputs_[i]);
    if (!input_names_[i].empty()) os << " \"" << input_names_[i] << "\"";
  }
  os << ") {\n";
  for (const Node& n : nodes_) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << typed(n.outputs[i]);
    os << " = " << n.prim->name << n.attrs.to_string();
    for (int in : n.inputs) os << " " << v(in);
    if (!n.name.empty()) os << "  # " << n.name;
    os << facts_str(n.facts) << "\n";
  }
  os << "  return";
  for (size_t i = 0; i < outputs_.size(); ++i) os << (i ? ", " : " ") << v(outputs_[i]);
  os << "\n}\n";
  return os.str();
}

void Graph::verify() const {
  std::vector<char> defined(values_.size(), 0);
  if (input_names_.size() != inputs_.size()) throw Error("[verify] input names and inputs differ in number");
  for (size_t i = 0; i < inputs_.size(); ++i) {
    int id = inputs_[i];
    if (id < 0 || id >= static_cast<int>(values_.size())) throw Error("[verify] graph input id out of range");
    if (values_[id].producer != -1) throw Error("[verify] graph input %" + std::to_string(id) + " has a producer");
    if (defined[id]) throw Error("[verify] graph input %" + std::to_string(id) + " is listed twice");
    if (values_[id].output_index != static_cast<int>(i))
      throw Error("[verify] graph input %" + std::to_string(id) + " records position " +
                  std::to_string(values_[id].output_index) + " but is input " + std::to_string(i));
    defined[id] = 1;
  }
  for (size_t ni = 0; ni < nodes_.size(); ++ni) {
    const Node& n = nodes_[ni];
    // Built only for an error: verify runs after every pass.
    auto where = [&] { return "[verify] node " + std::to_string(ni) + " (" + (n.prim ? n.prim->name : "?") + ")"; };
    if (!n.prim) throw Error(where() + " has no primitive");
    try {
      check_attrs(*n.prim, n.attrs);  // nodes a pass built or changed by hand, too
    } catch (const Error& e) {
      throw Error(where() + ": " + e.what());
    }
    std::vector<TensorType> in_types;
    for (int in : n.inputs) {
      if (in < 0 || in >= static_cast<int>(values_.size()) || !defined[in])
        throw Error(where() + " uses %" + std::to_string(in) + " before it is defined");
      in_types.push_back(values_[in].type);
    }
    std::vector<TensorType> out_types;
    try {
      out_types = n.prim->infer(in_types, n.attrs);
    } catch (const std::exception& e) {
      throw Error(where() + ": shape rule fails: " + e.what());
    }
    if (out_types.size() != n.outputs.size())
      throw Error(where() + " has " + std::to_string(n.outputs.size()) + " outputs, its rule gives " +
                  std::to_string(out_types.size()));
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      int id = n.outputs[o];
      if (id < 0 || id >= static_cast<int>(values_.size()) || defined[id])
        throw Error(where() + " output %" + std::to_string(id) + " is out of range or defined twice");
      if (values_[id].type != out_types[o])
        throw Error(where() + " output %" + std::to_string(id) + " has type " + type_str(values_[id].type) +
                    " but its rule gives " + type_str(out_types[o]));
      if (values_[id].producer != static_cast<int>(ni) || values_[id].output_index != static_cast<int>(o))
        throw Error(where() + " output %" + std::to_string(id) + " records the wrong producer");
      defined[id] = 1;
    }
  }
  for (int id : outputs_)
    if (id < 0 || id >= static_cast<int>(values_.size()) || !defined[id])
      throw Error("[verify] graph output %" + std::to_string(id) + " is not defined");
}

std::unique_ptr<Graph> Graph::clone() const {
  auto g = std::make_unique<Graph>();
  g->reset_ids(nodes_, values_, inputs_, input_names_, outputs_);
  return g;
}

// ---- tracing --------------------------------------------------------------------------------

namespace {
thread_local Graph* g_current = nullptr;
}

Graph* current_graph() { return g_current; }
TraceScope::TraceScope(Graph* g) : prev_(g_current) { g_current = g; }
TraceScope::~TraceScope() { g_current = prev_; }

std::unique_ptr<Graph> trace(const TracedFn& fn, const std::vector<TensorType>& input_types,
                             const std::vector<std::string>& input_names) {
  auto g = std::make_unique<Graph>();
  TraceScope scope(g.get());
  std::vector<Tensor> ins;
  for (size_t i = 0; i < input_types.size(); ++i)
    ins.push_back(g->input(input_types[i], i < input_names.size() ? input_names[i] : ""));
  g->set_outputs(fn(ins));
  g->verify();
  return g;
}

// ---- passes ---------------------------------------------------------------------------------

namespace {
// Rebuilds g keeping only nodes with keep[i], renumbering values densely.
// When value_map is set it receives, per value of g, its id in the result (-1 when dropped).
std::unique_ptr<Graph> rebuild(const Graph& g, const std::vector<char>& keep, const std::vector<int>& remap_in,
                               std::vector<int>* value_map = nullptr) {
  std::vector<int> remap(remap_in);
  if (value_map) value_map->assign(g.values().size(), -1);
  std::vector<ValueInfo> values;
  std::vector<int> inputs;
  for (int id : g.inputs()) {
    remap[id] = static_cast<int>(values.size());
    if (value_map) (*value_map)[id] = remap[id];
    values.push_back(g.values()[id]);
    inputs.push_back(remap[id]);
  }
  std::vector<Node> nodes;
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    if (!keep[i]) continue;
    Node n = g.nodes()[i];
    for (int& in : n.inputs) in = remap[in];
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      int old = n.outputs[o];
      remap[old] = static_cast<int>(values.size());
      if (value_map) (*value_map)[old] = remap[old];
      values.push_back(g.values()[old]);
      values.back().producer = static_cast<int>(nodes.size());
      values.back().output_index = static_cast<int>(o);
      n.outputs[o] = remap[old];
    }
    nodes.push_back(std::move(n));
  }
  std::vector<int> outputs;
  for (int id : g.outputs()) outputs.push_back(remap[id]);
  auto out = std::make_unique<Graph>();
  out->reset_ids(std::move(nodes), std::move(values), std::move(inputs), g.input_names(), std::move(outputs));
  return out;
}

std::vector<int> identity_map(const Graph& g) {
  std::vector<int> m(g.values().size());
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<int>(i);
  return m;
}
}  // namespace

std::unique_ptr<Graph> dce(const Graph& g, std::vector<int>* value_map) {
  std::vector<char> live(g.values().size(), 0), keep(g.nodes().size(), 0);
  for (int id : g.outputs()) live[id] = 1;
  for (size_t i = g.nodes().size(); i-- > 0;) {
    const Node& n = g.nodes()[i];
    bool used = std::any_of(n.outputs.begin(), n.outputs.end(), [&](int o) { return live[o]; });
    if (!used) continue;
    keep[i] = 1;
    for (int in : n.inputs) live[in] = 1;
  }
  return rebuild(g, keep, identity_map(g), value_map);
}

std::unique_ptr<Graph> cse(const Graph& g, std::vector<int>* value_map) {
  std::vector<int> canon = identity_map(g);  // value -> canonical value
  std::vector<char> keep(g.nodes().size(), 1);
  std::unordered_multimap<size_t, int> seen;  // hash -> node index
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    std::vector<int> ins;
    for (int in : n.inputs) ins.push_back(canon[in]);
    size_t h = std::hash<std::string>()(n.prim->name) ^ (n.attrs.hash() * 1315423911u);
    for (int in : ins) h = h * 1000003u + static_cast<size_t>(in);
    bool merged = false;
    if (!n.prim->no_cse) {
      auto range = seen.equal_range(h);
      for (auto it = range.first; it != range.second && !merged; ++it) {
        const Node& m = g.nodes()[it->second];
        if (m.prim != n.prim || !(m.attrs == n.attrs) || m.inputs.size() != ins.size() ||
            m.facts.microbatch != n.facts.microbatch)
          continue;
        bool same = true;
        for (size_t k = 0; k < ins.size(); ++k) same = same && canon[m.inputs[k]] == ins[k];
        if (!same) continue;
        for (size_t o = 0; o < n.outputs.size(); ++o) canon[n.outputs[o]] = canon[m.outputs[o]];
        keep[i] = 0;
        merged = true;
      }
    }
    if (!merged) seen.emplace(h, static_cast<int>(i));
  }
  // Rewrite uses through canon, then drop merged nodes; a canonical value without a category takes
  // the one of a value merged into it.
  auto tmp = g.clone();
  for (size_t v = 0; v < canon.size(); ++v)
    if (ValueInfo& c = tmp->mutable_value(canon[v]); c.category == MemoryCategory::temporaries)
      c.copy_facts(g.values()[v]);
  for (Node& n : tmp->mutable_nodes())
    for (int& in : n.inputs) in = canon[in];
  std::vector<int> outs;
  for (int id : g.outputs()) outs.push_back(canon[id]);
  tmp->reset_ids(tmp->nodes(), tmp->values(), tmp->inputs(), tmp->input_names(), outs);
  std::vector<int> after;
  auto out = rebuild(*tmp, keep, identity_map(*tmp), value_map ? &after : nullptr);
  if (value_map) {
    value_map->assign(g.values().size(), -1);
    for (size_t v = 0; v < canon.size(); ++v) (*value_map)[v] = after[canon[v]];
  }
  return out;
}

const std::string& primitive_name(const Node& n) { return n.prim->name; }

}  // namespace px
