// Modules, scopes and params: a model is a tree of Modules built once, outside any trace. A
// Scope gives stable dotted path names and declares params in the root's ParamStore; tracing
// binds one graph input per param.
//
//   px::nn::Scope root;                                         // owns a new ParamStore
//   px::nn::Linear fc(root.sub("blocks").sub(3).sub("fc"), 128, 512);   // "blocks.3.fc.w", ".b"
//   std::vector<px::Array> params = root.store().init(/*seed=*/0);  // same values on any mesh
//   auto g = px::nn::trace_with_params(root.store(), [&](const std::vector<px::Tensor>& batch) {
//     return std::vector<px::Tensor>{px::sum(fc(batch[0]))};
//   }, {{px::DType::f32, {8, 128}}}, {"x"});                   // inputs: params, then batch
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px::nn {

// How a param's initial values are drawn. Random kinds use a counter-based generator keyed by
// (seed, param path, element index), so a value never depends on sharding or on other params.
struct Init {
  enum class Kind { zeros, ones, constant, normal, truncated_normal, uniform };
  Kind kind = Kind::zeros;
  double a = 0.0;  // constant value, std (normal kinds) or lower bound (uniform)
  double b = 0.0;  // upper bound (uniform)
  // When set, std (or the uniform bounds) are divided by sqrt(fan_in), where fan_in is the
  // product of all dims but the last (1 for scalars and vectors of rank <= 1).
  bool fan_in_scaled = false;

  static Init zeros() { return {Kind::zeros}; }
  static Init ones() { return {Kind::ones}; }
  static Init constant(double v) { return {Kind::constant, v}; }
  static Init normal(double std) { return {Kind::normal, std}; }
  // Normal truncated at +-2 std, rescaled so the resulting std is `std`.
  static Init truncated_normal(double std) { return {Kind::truncated_normal, std}; }
  static Init uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
  // Truncated normal with std = scale / sqrt(fan_in): the default for Linear weights.
  static Init lecun_normal(double scale = 1.0) { return {Kind::truncated_normal, scale, 0.0, true}; }
  std::string to_string() const;  // "normal(0.02)", "lecun_normal(1)", "zeros", ...
};

struct ParamSpec {
  std::string path;  // "blocks.3.attn.wq"
  TensorType type;
  Init init;
};

// Fan-in used by Init::fan_in_scaled for a param of shape s.
int64_t fan_in(const Shape& s);
// Initial values of elements [begin, end) of a param (as f32), written to out; a shard of a
// param can be initialized alone and matches the corresponding slice of the whole.
void init_range(const ParamSpec& p, uint64_t seed, int64_t begin, int64_t end, float* out);
// The whole param as an Array of its dtype.
Array init_array(const ParamSpec& p, uint64_t seed);
// The box of the param at `offsets` whose shape is out's, written into `out` (of the param's
// dtype): the same bits as that box of init_array, without the whole param ever existing (each
// device generates its own shard; a px::BoxReader for shard()).
void init_box(const ParamSpec& p, uint64_t seed, const std::vector<int64_t>& offsets, Array& out);

class ParamStore;
class Param;

// RAII: while alive, the store's params read as the bound Tensors; on destruction the previous
// binding (if any) is restored, so bindings nest (e.g. tracing a nested graph).
class ParamBinding {
 public:
  ParamBinding(ParamBinding&& o) noexcept;
  ParamBinding& operator=(ParamBinding&&) = delete;
  ParamBinding(const ParamBinding&) = delete;
  ~ParamBinding();
  const std::vector<Tensor>& tensors() const;  // one per param, in declaration order

 private:
  friend class ParamStore;
  ParamBinding(ParamStore* store, std::vector<Tensor> values);
  ParamStore* store_ = nullptr;
  std::vector<Tensor> previous_;
};

// The params of one model, in declaration order. Paths are unique.
class ParamStore {
 public:
  ParamStore() = default;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  int size() const { return static_cast<int>(specs_.size()); }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const ParamSpec& spec(int i) const { return specs_.at(i); }
  int find(const std::string& path) const;      // -1 when absent
  int index_of(const std::string& path) const;  // throws px::Error naming the path when absent
  std::vector<TensorType> types() const;
  std::vector<std::string> paths() const;
  int64_t param_count() const;  // total number of elements
  int64_t param_bytes() const;
  // A table with one row per param (path, shape, dtype, count, init) and a total line.
  std::string table() const;

  // Initial values of every param, in declaration order.
  std::vector<Array> init(uint64_t seed) const;

  // Creates one input of g per param, in declaration order, named by its path, and binds them.
  ParamBinding bind(Graph& g);
  // Binds existing tensors (e.g. the first inputs of a traced function); checks their types.
  ParamBinding bind(const std::vector<Tensor>& values);
  bool bound() const { return !bound_.empty() || specs_.empty(); }
  // The Tensor bound to param i; throws px::Error naming the param when unbound.
  const Tensor& value(int i) const;

 private:
  friend class Scope;
  friend class ParamBinding;
  Param declare(std::shared_ptr<ParamStore> self, ParamSpec spec);
  std::vector<ParamSpec> specs_;
  std::vector<Tensor> bound_;
};

// A handle to one declared param. Converts to its bound Tensor while tracing.
class Param {
 public:
  Param() = default;
  Param(std::shared_ptr<ParamStore> store, int index) : store_(std::move(store)), index_(index) {}
  bool defined() const { return store_ != nullptr; }
  int index() const { return index_; }
  const ParamSpec& spec() const;
  const std::string& path() const { return spec().path; }
  const TensorType& type() const { return spec().type; }
  const Shape& shape() const { return type().shape; }
  Tensor value() const;  // throws px::Error naming the param when it is unbound or undefined
  operator Tensor() const { return value(); }

 private:
  std::shared_ptr<ParamStore> store_;
  int index_ = -1;
};

// A position in the module tree: a ParamStore shared by the whole tree plus a dotted path.
// Scope() starts a new tree with its own store.
class Scope {
 public:
  Scope();
  explicit Scope(std::shared_ptr<ParamStore> store, std::string path = "");
  Scope sub(const std::string& name) const;  // name: non-empty, no '.'
  Scope sub(int64_t index) const { return sub(std::to_string(index)); }
  const std::string& path() const { return path_; }
  std::string path_of(const std::string& name) const;  // path() + "." + name
  ParamStore& store() const { return *store_; }
  const std::shared_ptr<ParamStore>& store_ptr() const { return store_; }
  // Declares param `name` under this scope; throws px::Error when the path already exists.
  Param param(const std::string& name, const TensorType& type, const Init& init) const;

 private:
  std::shared_ptr<ParamStore> store_;
  std::string path_;
};

// Base of modules. A module built from a Scope remembers it, which gives it a path and lets
// params()/param_count() list the params declared under it.
class Module {
 public:
  Module() = default;
  explicit Module(Scope s) : scope_(std::move(s)) {}
  virtual ~Module() = default;
  const Scope& scope() const { return scope_; }
  const std::string& path() const { return scope_.path(); }
  std::vector<Param> params() const;  // params whose path lies under this module's path
  int64_t param_count() const;

 private:
  Scope scope_{nullptr};
};

using BatchFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& batch)>;
// Traces fn into a new, verified Graph whose inputs are the store's params (named by path, in
// declaration order) followed by the batch inputs; the params are bound while fn runs.
std::unique_ptr<Graph> trace_with_params(ParamStore& store, const BatchFn& fn,
                                         const std::vector<TensorType>& batch_types,
                                         const std::vector<std::string>& batch_names = {});

}  // namespace px::nn
