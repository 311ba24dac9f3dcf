// Scopes, the param store, bindings and tracing with params.
#include <cstdio>
#include <sstream>

#include "parallax/nn/module.h"

namespace px::nn {

// ---- ParamStore ------------------------------------------------------------------------------

Param ParamStore::declare(std::shared_ptr<ParamStore> self, ParamSpec spec) {
  if (find(spec.path) >= 0) throw Error("[nn] param '" + spec.path + "' declared twice (two modules share a scope)");
  for (int64_t d : spec.type.shape)
    if (d < 0) throw Error("[nn] param '" + spec.path + "' has a negative dim in " + shape_str(spec.type.shape));
  if (!bound_.empty()) throw Error("[nn] param '" + spec.path + "' declared while the store is bound to a trace");
  specs_.push_back(std::move(spec));
  return Param(std::move(self), size() - 1);
}

int ParamStore::find(const std::string& path) const {
  for (int i = 0; i < size(); ++i)
    if (specs_[i].path == path) return i;
  return -1;
}

int ParamStore::index_of(const std::string& path) const {
  int i = find(path);
  if (i < 0) throw Error("[nn] no param named '" + path + "'");
  return i;
}

std::vector<TensorType> ParamStore::types() const {
  std::vector<TensorType> t;
  for (auto& s : specs_) t.push_back(s.type);
  return t;
}

std::vector<std::string> ParamStore::paths() const {
  std::vector<std::string> p;
  for (auto& s : specs_) p.push_back(s.path);
  return p;
}

int64_t ParamStore::param_count() const {
  int64_t n = 0;
  for (auto& s : specs_) n += s.type.numel();
  return n;
}

int64_t ParamStore::param_bytes() const {
  int64_t n = 0;
  for (auto& s : specs_) n += s.type.nbytes();
  return n;
}

std::string ParamStore::table() const {
  size_t w = 4;
  for (auto& s : specs_) w = std::max(w, s.path.size());
  std::ostringstream os;
  auto row = [&](const std::string& path, const std::string& shape, const std::string& dtype, const std::string& count,
                 const std::string& init) {
    char buf[512];
    std::snprintf(buf, sizeof buf, "%-*s  %-16s %-6s %12s  %s\n", static_cast<int>(w), path.c_str(), shape.c_str(),
                  dtype.c_str(), count.c_str(), init.c_str());
    os << buf;
  };
  row("path", "shape", "dtype", "count", "init");
  for (auto& s : specs_)
    row(s.path, shape_str(s.type.shape), dtype_name(s.type.dtype), std::to_string(s.type.numel()), s.init.to_string());
  os << "total: " << param_count() << " params in " << size() << " tensors, " << param_bytes() << " bytes\n";
  return os.str();
}

std::vector<Array> ParamStore::init(uint64_t seed) const {
  std::vector<Array> out;
  out.reserve(specs_.size());
  for (auto& s : specs_) out.push_back(init_array(s, seed));
  return out;
}

ParamBinding ParamStore::bind(Graph& g) {
  std::vector<Tensor> values;
  values.reserve(specs_.size());
  for (auto& s : specs_) values.push_back(g.input(s.type, s.path));
  return ParamBinding(this, std::move(values));
}

ParamBinding ParamStore::bind(const std::vector<Tensor>& values) {
  if (values.size() != specs_.size())
    throw Error("[nn] binding " + std::to_string(values.size()) + " tensors to a store of " +
                std::to_string(specs_.size()) + " params");
  for (size_t i = 0; i < values.size(); ++i) {
    if (!values[i].defined()) throw Error("[nn] binding an undefined tensor to param '" + specs_[i].path + "'");
    if (values[i].type() != specs_[i].type)
      throw Error("[nn] param '" + specs_[i].path + "' is " + type_str(specs_[i].type) + " but is bound to a " +
                  type_str(values[i].type()) + " tensor");
  }
  return ParamBinding(this, values);
}

const Tensor& ParamStore::value(int i) const {
  if (bound_.empty())
    throw Error("[nn] param '" + specs_.at(i).path +
                "' used outside a trace binding: bind the model's params first (ParamStore::bind or "
                "nn::trace_with_params)");
  return bound_.at(i);
}

// ---- ParamBinding ----------------------------------------------------------------------------

ParamBinding::ParamBinding(ParamStore* store, std::vector<Tensor> values) : store_(store) {
  previous_ = std::move(store_->bound_);
  store_->bound_ = std::move(values);
}

ParamBinding::ParamBinding(ParamBinding&& o) noexcept : store_(o.store_), previous_(std::move(o.previous_)) {
  o.store_ = nullptr;
}

ParamBinding::~ParamBinding() {
  if (store_) store_->bound_ = std::move(previous_);
}

const std::vector<Tensor>& ParamBinding::tensors() const { return store_->bound_; }

// ---- Param, Scope, Module --------------------------------------------------------------------

const ParamSpec& Param::spec() const {
  if (!store_) throw Error("[nn] use of an undefined Param (a module member that was never constructed)");
  return store_->spec(index_);
}

Tensor Param::value() const {
  spec();
  return store_->value(index_);
}

Scope::Scope() : store_(std::make_shared<ParamStore>()) {}
Scope::Scope(std::shared_ptr<ParamStore> store, std::string path) : store_(std::move(store)), path_(std::move(path)) {}

std::string Scope::path_of(const std::string& name) const { return path_.empty() ? name : path_ + "." + name; }

Scope Scope::sub(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error("[nn] scope name '" + name + "' under '" + path_ + "' must be non-empty and contain no '.'");
  if (!store_) throw Error("[nn] sub('" + name + "') of a scope without a ParamStore");
  return Scope(store_, path_of(name));
}

Param Scope::param(const std::string& name, const TensorType& type, const Init& init) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw Error("[nn] param name '" + name + "' under '" + path_ + "' must be non-empty and contain no '.'");
  if (!store_) throw Error("[nn] param '" + path_of(name) + "' declared in a scope without a ParamStore");
  return store_->declare(store_, ParamSpec{path_of(name), type, init});
}

std::vector<Param> Module::params() const {
  std::vector<Param> out;
  if (!scope_.store_ptr()) return out;
  const std::string& p = scope_.path();
  const ParamStore& st = scope_.store();
  for (int i = 0; i < st.size(); ++i) {
    const std::string& q = st.spec(i).path;
    if (p.empty() || (q.size() > p.size() && q.compare(0, p.size(), p) == 0 && q[p.size()] == '.'))
      out.emplace_back(scope_.store_ptr(), i);
  }
  return out;
}

int64_t Module::param_count() const {
  int64_t n = 0;
  for (auto& p : params()) n += p.type().numel();
  return n;
}

std::unique_ptr<Graph> trace_with_params(ParamStore& store, const BatchFn& fn,
                                         const std::vector<TensorType>& batch_types,
                                         const std::vector<std::string>& batch_names) {
  std::vector<TensorType> types = store.types();
  std::vector<std::string> names = store.paths();
  types.insert(types.end(), batch_types.begin(), batch_types.end());
  for (size_t i = 0; i < batch_types.size(); ++i) names.push_back(i < batch_names.size() ? batch_names[i] : "");
  const size_t np = store.specs().size();
  return trace(
      [&](const std::vector<Tensor>& in) {
        ParamBinding b = store.bind(std::vector<Tensor>(in.begin(), in.begin() + np));
        return fn(std::vector<Tensor>(in.begin() + np, in.end()));
      },
      types, names);
}

}  // namespace px::nn
