// The IR: a Graph of SSA nodes over values with global shapes, and the tracer that builds it.
//
//   std::unique_ptr<px::Graph> g = px::trace([](const std::vector<px::Tensor>& in) {
//     return std::vector<px::Tensor>{px::tanh(in[0]) * 2.0f};
//   }, {{px::DType::f32, {4, 8}}});
//   std::cout << g->to_string();   // jaxpr-like text
//   g->verify();                   // throws px::Error naming the first broken node
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "parallax/core.h"

namespace px {

struct Primitive;
class Graph;

// The collectives of local (per-device) programs: what a collective primitive is
// (Primitive::spmd.collective) and what parallax/collectives.h counts.
enum class CollectiveKind { all_reduce, all_gather, reduce_scatter, all_to_all, permute, broadcast };
constexpr int kNumCollectiveKinds = 6;

using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>, DType, std::shared_ptr<const Array>>;

// Node attributes, kept sorted by key so that printing and hashing are canonical.
class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> l) : m_(l) {}
  Attrs& set(const std::string& k, AttrValue v) {
    m_[k] = std::move(v);
    return *this;
  }
  bool has(const std::string& k) const { return m_.count(k) != 0; }
  int64_t i(const std::string& k) const;
  double f(const std::string& k) const;
  const std::string& s(const std::string& k) const;
  const std::vector<int64_t>& ints(const std::string& k) const;
  DType dtype(const std::string& k) const;
  const Array& array(const std::string& k) const;
  int64_t i(const std::string& k, int64_t dflt) const { return has(k) ? i(k) : dflt; }
  double f(const std::string& k, double dflt) const { return has(k) ? f(k) : dflt; }
  const std::map<std::string, AttrValue>& items() const { return m_; }
  std::string to_string() const;  // "[axes=(0,1) keepdims=0]" or "" when empty
  bool operator==(const Attrs& o) const;
  size_t hash() const;

 private:
  std::map<std::string, AttrValue> m_;
};

// The part of a training step a node belongs to (src/train/trace_step.cc); none outside one.
enum class StepPhase : uint8_t { none, forward, backward, update };
const char* step_phase_name(StepPhase p);

// What the passes decided about a node, carried by every pass that rebuilds the graph (a node
// emitted in place of another takes its facts: NodeFactsScope) and shown by Graph::to_string
// when set: the phase of the training step it belongs to, its microbatch (-1: none, as the
// clipping and update) and the pipeline stage that runs it (the stage cut; -1: not cut). CSE
// never merges nodes of two microbatches, so that each microbatch computes its own values and
// frees them before the next.
struct NodeFacts {
  StepPhase phase = StepPhase::none;
  int microbatch = -1;
  int stage = -1;
  bool in(StepPhase p, int k) const { return phase == p && microbatch == k; }  // microbatch k's p
};

struct Node {
  const Primitive* prim = nullptr;
  Attrs attrs;
  std::vector<int> inputs;   // value ids
  std::vector<int> outputs;  // value ids
  std::string name;          // optional, for tags (remat names) and debugging
  NodeFacts facts;
};
// The name n's primitive is registered under ("add", "dot_general"), for messages: a backend keys
// its kernels by the primitive itself (n.prim; px::primitive_handle, parallax/backend.h).
const std::string& primitive_name(const Node& n);

struct ValueInfo {
  TensorType type;
  int producer = -1;  // node index, -1 for graph inputs
  int output_index = 0;
  // What the passes decided about the value, carried by every pass that rebuilds the graph and
  // shown by Graph::to_string (when not the default): the memory it lives in (offload), what it
  // holds (a training step's params, gradients, ...: the memory report's categories) and the
  // layer it belongs to ("blocks.3"; "" when none).
  MemoryKind kind = MemoryKind::device;
  MemoryCategory category = MemoryCategory::temporaries;
  std::string layer{};
  // In a training step, the param (its index among the step's inputs) whose gradient this value
  // is: of the step (`grad_of`: the mean over the microbatches, before clipping) and of its
  // microbatch's loss (`micro_grad_of`; with one microbatch, the same value). -1: none. Each is
  // one value's identity: a value derived from this one (a transfer, a constraint) does not take it.
  int grad_of = -1, micro_grad_of = -1;
  // A value derived from o holds what o holds, where o lives.
  void copy_facts(const ValueInfo& o) {
    kind = o.kind;
    category = o.category;
    layer = o.layer;
  }
};

// A symbolic value during tracing: a handle to a value of a Graph. Ops on Tensors validate
// eagerly and throw px::Error with the op's name ("[add] ...").
class Tensor {
 public:
  Tensor() = default;
  Tensor(Graph* g, int id);
  bool defined() const { return g_ != nullptr; }
  // False once its Graph is destroyed (or moved from): using it then throws px::UserError.
  bool alive() const { return g_ != nullptr && !alive_.expired(); }
  Graph* graph() const { return g_; }
  int id() const { return id_; }
  // By value: the graph's value table grows as ops are traced, so a reference into it would dangle.
  TensorType type() const;
  Shape shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  int rank() const { return type().rank(); }
  int64_t dim(int64_t axis) const;  // negative axes count from the end
  int64_t numel() const { return type().numel(); }

 private:
  Graph* g_ = nullptr;
  std::weak_ptr<const bool> alive_;  // the graph's token: expires with the graph
  int id_ = -1;
};

class Graph {
 public:
  Graph() = default;
  Graph(const Graph&) = delete;  // Tensors point at their Graph; copy with clone()
  Graph& operator=(const Graph&) = delete;
  // Moving expires the Tensors of the source (they point at its address).
  Graph(Graph&& o);
  Graph& operator=(Graph&& o);

  // Building.
  Tensor input(const TensorType& t, const std::string& name = "");
  // Appends a node after running the primitive's shape rule (which throws on bad input).
  // The node takes the facts set by the innermost NodeFactsScope on this graph.
  std::vector<Tensor> emit(const Primitive& p, const std::vector<Tensor>& inputs, Attrs attrs = {});
  void set_outputs(const std::vector<Tensor>& outs);

  // Reading.
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& mutable_nodes() { return nodes_; }
  const std::vector<ValueInfo>& values() const { return values_; }
  const TensorType& type(int value) const { return values_.at(value).type; }
  ValueInfo& mutable_value(int value) { return values_.at(value); }  // for passes that set facts
  // Copies the facts of every value of `from` (a gradient's identity included) onto its new id in
  // this graph (new_id[v] < 0: dropped).
  void copy_facts(const Graph& from, const std::vector<int>& new_id);
  const std::vector<int>& inputs() const { return inputs_; }
  const std::vector<std::string>& input_names() const { return input_names_; }
  const std::vector<int>& outputs() const { return outputs_; }
  Tensor tensor(int value) { return Tensor(this, value); }

  std::string to_string() const;
  void verify() const;  // throws px::Error naming the first broken node
  std::unique_ptr<Graph> clone() const;

  // Internal: raw append used by passes that rebuild graphs (no shape rule run).
  int add_value(const TensorType& t, int producer, int out_index);
  void add_node(Node n) { nodes_.push_back(std::move(n)); }
  void reset_ids(std::vector<Node> nodes, std::vector<ValueInfo> values, std::vector<int> inputs,
                 std::vector<std::string> input_names, std::vector<int> outputs);

 private:
  std::vector<Node> nodes_;
  std::vector<ValueInfo> values_;
  std::vector<int> inputs_;
  std::vector<std::string> input_names_;
  std::vector<int> outputs_;
  NodeFacts emitting_;  // what emit() writes on new nodes (NodeFactsScope)
  std::shared_ptr<const bool> alive_ = std::make_shared<const bool>(true);  // Tensors hold it weakly

  friend class Tensor;
  friend class NodeFactsScope;
};

// While it lives, the nodes emitted into g take these facts (a tracer marking the phase it traces,
// a pass emitting the nodes that replace one); nested scopes restore the outer facts.
class NodeFactsScope {
 public:
  NodeFactsScope(Graph& g, NodeFacts facts) : g_(g), prev_(g.emitting_) { g.emitting_ = facts; }
  ~NodeFactsScope() { g_.emitting_ = prev_; }
  NodeFactsScope(const NodeFactsScope&) = delete;
  NodeFactsScope& operator=(const NodeFactsScope&) = delete;

 private:
  Graph& g_;
  NodeFacts prev_;
};

// The graph that ops without tensor inputs (constants, iota, rng) emit into. Set by trace()
// and by TraceScope; nested scopes restore the outer graph.
Graph* current_graph();
class TraceScope {
 public:
  explicit TraceScope(Graph* g);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Graph* prev_;
};

using TracedFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
// Traces fn on symbolic inputs of the given types into a new, verified Graph.
std::unique_ptr<Graph> trace(const TracedFn& fn, const std::vector<TensorType>& input_types,
                             const std::vector<std::string>& input_names = {});

// Passes (pure: return a new graph).
// With value_map set, each also returns, per value of g, its id in the result (-1 when dropped).
std::unique_ptr<Graph> dce(const Graph& g, std::vector<int>* value_map = nullptr);  // drops unused nodes
std::unique_ptr<Graph> cse(const Graph& g, std::vector<int>* value_map = nullptr);  // merges identical nodes

}  // namespace px
