// The field table of ExperimentConfig: one entry per leaf, with its dotted path, type, validator
// and accessors. Parsing --set text and TOML values both end in set_field_value().
// Designated initializers leave the fields they do not name at their defaults, on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "core/enum_names.h"
#include "parallax/pax.h"
#include "pax/suggest.h"

namespace px::pax {
namespace {

using Getter = std::function<FieldValue(const ExperimentConfig&)>;
using Setter = std::function<void(ExperimentConfig&, const FieldValue&)>;

struct Field {
  FieldInfo info;
  Getter get;
  Setter set;
};

// Integral values exactly (a range bound like 2147483646 must not read as 2.14748e+09).
std::string fmt_num(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e18) return std::to_string(static_cast<int64_t>(v));
  std::ostringstream os;
  os.precision(15);
  os << v;
  return os.str();
}

// Builders: each binds a member of a section of the config.
template <class S, class T>
Field make(FieldInfo info, S ExperimentConfig::*sec, T S::*mem) {
  Field f{std::move(info), nullptr, nullptr};
  f.get = [sec, mem](const ExperimentConfig& c) -> FieldValue {
    if constexpr (std::is_same_v<T, uint64_t>)
      return static_cast<int64_t>(c.*sec.*mem);
    else
      return c.*sec.*mem;
  };
  f.set = [sec, mem](ExperimentConfig& c, const FieldValue& v) {
    if constexpr (std::is_same_v<T, uint64_t>)
      c.*sec.*mem = static_cast<uint64_t>(std::get<int64_t>(v));
    else
      c.*sec.*mem = std::get<T>(v);
  };
  return f;
}

template <class S, class T>
Field int_field(const std::string& path, S ExperimentConfig::*sec, T S::*mem, double lo, double hi, std::string doc) {
  return make(FieldInfo{path, FieldType::integer, std::move(doc), {}, lo, hi}, sec, mem);
}
template <class S>
Field float_field(const std::string& path, S ExperimentConfig::*sec, double S::*mem, double lo, double hi,
                  std::string doc) {
  return make(FieldInfo{path, FieldType::floating, std::move(doc), {}, lo, hi}, sec, mem);
}
template <class S>
Field str_field(const std::string& path, S ExperimentConfig::*sec, std::string S::*mem, std::string doc) {
  return make(FieldInfo{path, FieldType::string, std::move(doc)}, sec, mem);
}
template <class S>
Field bool_field(const std::string& path, S ExperimentConfig::*sec, bool S::*mem, std::string doc) {
  return make(FieldInfo{path, FieldType::boolean, std::move(doc)}, sec, mem);
}
template <class S>
Field enum_field(const std::string& path, S ExperimentConfig::*sec, std::string S::*mem,
                 std::vector<std::string> choices, std::string doc) {
  return make(FieldInfo{path, FieldType::enumeration, std::move(doc), std::move(choices)}, sec, mem);
}
template <class S>
Field list_field(const std::string& path, S ExperimentConfig::*sec, std::vector<std::string> S::*mem, std::string doc) {
  return make(FieldInfo{path, FieldType::list, std::move(doc)}, sec, mem);
}
template <class S>
Field mesh_field(const std::string& path, S ExperimentConfig::*sec, std::string S::*mem, std::string doc) {
  return make(FieldInfo{path, FieldType::mesh, std::move(doc)}, sec, mem);
}

constexpr double kBig = 1e12;
// The step counter is an int32 that counts to train.steps and one past it, so step counts and
// intervals stop below INT32_MAX: a larger value could never be reached.
constexpr double kMaxSteps = 2147483646;

const std::vector<Field>& table() {
  using E = ExperimentConfig;
  static const std::vector<Field> t = {
      enum_field("model.flavour", &E::model, &ModelConfig::flavour, {"gpt2", "llama"},
                 "GPT-2 (LayerNorm, GELU, learned positions, tied embedding) or Llama (RMSNorm, SwiGLU, rotary)"),
      int_field("model.vocab_size", &E::model, &ModelConfig::vocab_size, 2, 1e7, "vocabulary size"),
      int_field("model.d_model", &E::model, &ModelConfig::d_model, 1, 1e6, "width of the residual stream"),
      int_field("model.n_heads", &E::model, &ModelConfig::n_heads, 1, 1e4, "attention heads"),
      int_field("model.n_kv_heads", &E::model, &ModelConfig::n_kv_heads, 0, 1e4, "key/value heads (0: n_heads)"),
      int_field("model.n_layers", &E::model, &ModelConfig::n_layers, 1, 1e4, "Transformer blocks"),
      int_field("model.d_ff", &E::model, &ModelConfig::d_ff, 1, 1e7, "hidden width of the MLP"),
      int_field("model.seq_len", &E::model, &ModelConfig::seq_len, 2, 1e6, "sequence length"),
      float_field("model.init_std", &E::model, &ModelConfig::init_std, 0, 10, "std of the weight initializer"),
      bool_field("model.tied_embedding", &E::model, &ModelConfig::tied_embedding,
                 "the output head reuses the token embedding"),
      enum_field("model.dtype", &E::model, &ModelConfig::dtype, {"f32", "bf16"}, "matmul compute dtype"),
      bool_field("model.fused_head", &E::model, &ModelConfig::fused_head,
                 "the head and loss as one chunked primitive (no [batch, seq, vocab] logits buffer)"),
      enum_field("data.kind", &E::data, &DataConfig::kind, {"copy_task", "text"},
                 "the built-in copy task or text files through a SentencePiece tokenizer"),
      list_field("data.paths", &E::data, &DataConfig::paths, "text files or folders (.txt, .jsonl, .gz) or 'gcide'"),
      str_field("data.cache_dir", &E::data, &DataConfig::cache_dir,
                "tokenizer and token cache (\"\": the shared ~/.cache/parallax/data)"),
      int_field("data.batch", &E::data, &DataConfig::batch, 1, 1e7, "global batch in sequences"),
      float_field("data.eval_fraction", &E::data, &DataConfig::eval_fraction, 0, 0.5, "share of documents held out"),
      int_field("data.max_documents", &E::data, &DataConfig::max_documents, 0, kBig, "documents read (0: all)"),
      int_field("data.max_document_bytes", &E::data, &DataConfig::max_document_bytes, 1, kBig,
                "longest document read, in bytes (a longer one is an error naming its file and line)"),
      int_field("data.copy_eval_batches", &E::data, &DataConfig::copy_eval_batches, 1, 1e6,
                "copy_task: batches in the fixed eval set"),
      str_field("tokenizer.model", &E::tokenizer, &TokenizerConfig::model,
                "a SentencePiece .model (\"\": train one on the corpus)"),
      enum_field("optimizer.name", &E::optimizer, &OptimizerConfig::name, {"adamw", "adam", "sgd", "adafactor"},
                 "optimizer"),
      float_field("optimizer.lr", &E::optimizer, &OptimizerConfig::lr, 0, 10, "peak learning rate"),
      float_field("optimizer.beta1", &E::optimizer, &OptimizerConfig::beta1, 0, 0.999999, "Adam first moment decay"),
      float_field("optimizer.beta2", &E::optimizer, &OptimizerConfig::beta2, 0, 0.999999, "Adam second moment decay"),
      float_field("optimizer.eps", &E::optimizer, &OptimizerConfig::eps, 0, 1, "Adam epsilon"),
      float_field("optimizer.weight_decay", &E::optimizer, &OptimizerConfig::weight_decay, 0, 10,
                  "decoupled weight decay (matrices only)"),
      float_field("optimizer.momentum", &E::optimizer, &OptimizerConfig::momentum, 0, 0.999999, "SGD momentum"),
      float_field("optimizer.clip_norm", &E::optimizer, &OptimizerConfig::clip_norm, 0, 1e9,
                  "clip gradients to this global norm (0: off)"),
      enum_field("schedule.kind", &E::schedule, &ScheduleConfig::kind,
                 {"constant", "linear_warmup", "warmup_cosine", "warmup_exponential", "rsqrt"},
                 "learning-rate schedule"),
      int_field("schedule.warmup_steps", &E::schedule, &ScheduleConfig::warmup_steps, 0, kMaxSteps,
                "linear warmup steps"),
      int_field("schedule.decay_steps", &E::schedule, &ScheduleConfig::decay_steps, 1, kMaxSteps,
                "warmup_exponential: steps per factor of decay_rate"),
      float_field("schedule.decay_rate", &E::schedule, &ScheduleConfig::decay_rate, 1e-9, 1, "decay factor"),
      float_field("schedule.min_fraction", &E::schedule, &ScheduleConfig::min_fraction, 0, 1,
                  "floor of the decay, as a fraction of the peak"),
      int_field("schedule.total_steps", &E::schedule, &ScheduleConfig::total_steps, 0, kMaxSteps,
                "warmup_cosine: end of the decay (0: train.steps)"),
      mesh_field("sharding.mesh", &E::sharding, &ShardingConfig::mesh,
                 "device mesh, e.g. data:4,model:2 (\"\": one device)"),
      enum_field("sharding.strategy", &E::sharding, &ShardingConfig::strategy,
                 {"ddp", "fsdp", "tp", "fsdp_tp", "manual", "auto"}, "sharding recipe"),
      str_field("sharding.data_axis", &E::sharding, &ShardingConfig::data_axis, "batch axis of the mesh"),
      str_field("sharding.model_axis", &E::sharding, &ShardingConfig::model_axis, "tensor-parallel axis"),
      int_field("sharding.fsdp_min_bytes", &E::sharding, &ShardingConfig::fsdp_min_bytes, 0, kBig,
                "FSDP keeps smaller params replicated"),
      list_field("sharding.rules", &E::sharding, &ShardingConfig::rules, "overrides 'glob=P(...)', first match wins"),
      str_field("sharding.cluster", &E::sharding, &ShardingConfig::cluster,
                "auto: the cluster plans are costed for (cpu, h100x8, h200x8, tpuv4 or a .toml file)"),
      bool_field("sharding.auto_pipeline", &E::sharding, &ShardingConfig::auto_pipeline,
                 "auto: also plan the devices pipelined (stages x data or model inside, AUTO in the stages of the "
                 "best) and train that when predicted faster"),
      enum_field("sharding.schedule", &E::sharding, &ShardingConfig::schedule,
                 {"gpipe", "1f1b", "interleaved", "zero_bubble"}, "a mesh with a `stage` axis: the pipeline schedule"),
      int_field("sharding.virtual_stages", &E::sharding, &ShardingConfig::virtual_stages, 1, 64,
                "interleaved schedule: stages per device"),
      bool_field("sharding.balance_stages", &E::sharding, &ShardingConfig::balance_stages,
                 "split the layers into stages by cost (embedding with the first, head with the last)"),
      list_field("sharding.layers_per_stage", &E::sharding, &ShardingConfig::layers_per_stage,
                 "numbered layers per pipeline stage, e.g. 3,3,2 ([]: an even split)"),
      enum_field("memory.remat", &E::memory, &MemoryConfig::remat,
                 {"none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable", "nothing_saveable", "auto"},
                 "rematerialization policy (docs/memory.md)"),
      int_field("memory.budget_bytes", &E::memory, &MemoryConfig::budget_bytes, 0, kBig,
                "remat=auto: the planned per-device peak to fit, in bytes"),
      enum_field("memory.offload", &E::memory, &MemoryConfig::offload,
                 {"none", "params", "optimizer_state", "params_and_optimizer_state"},
                 "keep these in pinned_host memory between steps (docs/memory.md)"),
      int_field("memory.prefetch_depth", &E::memory, &MemoryConfig::prefetch_depth, 0, 64,
                "offload: layers of params fetched ahead of the one computing"),
      int_field("train.steps", &E::train, &TrainConfig::steps, 1, kMaxSteps, "training steps"),
      int_field("train.microbatches", &E::train, &TrainConfig::microbatches, 1, 1e6,
                "gradient accumulation: each step's batch in this many microbatches, one update"),
      int_field("train.eval_interval", &E::train, &TrainConfig::eval_interval, 0, kMaxSteps,
                "evaluate every N steps (0: at the end only)"),
      int_field("train.eval_batches", &E::train, &TrainConfig::eval_batches, 0, kBig,
                "eval batches per evaluation (0: the whole eval split)"),
      int_field("train.checkpoint_interval", &E::train, &TrainConfig::checkpoint_interval, 0, kMaxSteps,
                "checkpoint every N steps (0: at the end only)"),
      int_field("train.checkpoint_keep", &E::train, &TrainConfig::checkpoint_keep, 1, 1e6, "checkpoints kept"),
      int_field("train.summary_interval", &E::train, &TrainConfig::summary_interval, 1, kMaxSteps,
                "write train summaries every N steps"),
      int_field("train.seed", &E::train, &TrainConfig::seed, 0, 9.007199254740992e15, "params and data seed"),
      str_field("train.init_from_hf", &E::train, &TrainConfig::init_from_hf,
                "a Hugging Face model dir to fine-tune (\"\": random init from train.seed)"),
      enum_field("train.on_nonfinite", &E::train, &TrainConfig::on_nonfinite, {"stop", "skip", "continue"},
                 "a NaN or infinite loss or gradient norm: stop the run, skip that update, or continue"),
  };
  return t;
}

const Field& find(const std::string& path) {
  for (const Field& f : table())
    if (f.info.path == path) return f;
  std::vector<std::string> paths;
  for (const Field& f : table()) paths.push_back(f.info.path);
  const std::string best = closest(path, paths);
  const std::string mean = best.empty() ? "" : " (did you mean '" + best + "'?)";
  // Suggest fields of the same section, or the sections.
  std::string section = path.substr(0, path.find('.'));
  std::string near;
  for (const Field& f : table())
    if (f.info.path.rfind(section + ".", 0) == 0) near += (near.empty() ? "" : ", ") + f.info.path;
  if (near.empty()) {
    std::vector<std::string> secs;
    for (const Field& f : table()) {
      std::string s = f.info.path.substr(0, f.info.path.find('.'));
      if (std::find(secs.begin(), secs.end(), s) == secs.end()) secs.push_back(s);
    }
    for (auto& s : secs) near += (near.empty() ? "" : ", ") + s;
    throw Error("[pax] unknown config field '" + path + "'" + mean + "; the sections are " + near +
                " (see 'pax describe --fields' for every field)");
  }
  throw Error("[pax] unknown config field '" + path + "'" + mean + "; the fields of '" + section + "' are " + near);
}

std::string trim(std::string s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// "name:size,name:size" with size >= 1 or -1 (at most one); "" is one device.
void check_mesh_text(const std::string& path, const std::string& text) {
  if (text.empty()) return;
  std::stringstream ss(text);
  std::string part;
  int wild = 0;
  std::vector<std::string> names;
  while (std::getline(ss, part, ',')) {
    part = trim(part);
    size_t c = part.find(':');
    std::string name = c == std::string::npos ? "" : trim(part.substr(0, c));
    std::string size = c == std::string::npos ? "" : trim(part.substr(c + 1));
    bool ok_name = !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
      return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
    });
    char* end = nullptr;
    long long n = size.empty() ? 0 : std::strtoll(size.c_str(), &end, 10);
    bool ok_size = !size.empty() && end && *end == 0 && (n >= 1 || n == -1);
    if (!ok_name || !ok_size)
      throw Error("[pax] " + path + "='" + text + "': '" + part +
                  "' is not an axis; a mesh is name:size pairs joined by commas, e.g. data:4,model:2 (size >= 1, or "
                  "-1 once for the remaining devices)");
    if (std::find(names.begin(), names.end(), name) != names.end())
      throw Error("[pax] " + path + "='" + text + "': axis '" + name + "' appears twice");
    names.push_back(name);
    wild += n == -1;
  }
  if (wild > 1) throw Error("[pax] " + path + "='" + text + "': only one axis may have size -1");
}

void check_value(const FieldInfo& f, const FieldValue& v) {
  auto range_error = [&](const std::string& got) {
    return Error("[pax] " + f.path + "=" + got + " is out of range; allowed: " + f.allowed() +
                 (f.max == kMaxSteps ? " (the step counter is a 32-bit int)" : ""));
  };
  switch (f.type) {
    case FieldType::integer: {
      // Compared as integers: as doubles, 2^53 + 1 would equal a bound of 2^53.
      int64_t x = std::get<int64_t>(v);
      if (x < static_cast<int64_t>(f.min) || x > static_cast<int64_t>(f.max)) throw range_error(std::to_string(x));
      break;
    }
    case FieldType::floating: {
      double x = std::get<double>(v);
      if (!std::isfinite(x) || x < f.min || x > f.max) throw range_error(fmt_num(x));
      break;
    }
    case FieldType::enumeration: {
      const std::string& s = std::get<std::string>(v);
      if (std::find(f.choices.begin(), f.choices.end(), s) == f.choices.end())
        throw Error("[pax] " + f.path + "='" + s + "' is not allowed; allowed: " + f.allowed());
      break;
    }
    case FieldType::mesh:
      check_mesh_text(f.path, std::get<std::string>(v));
      break;
    default:
      break;
  }
}

}  // namespace

const char* field_type_name(FieldType t) {
  static constexpr const char* names[] = {"int", "float", "string", "bool", "enum", "list", "mesh"};
  static_assert(std::size(names) == static_cast<size_t>(FieldType::mesh) + 1);
  return enum_name(t, names);
}

std::string FieldInfo::allowed() const {
  switch (type) {
    case FieldType::integer:
      return "an int in [" + fmt_num(min) + ", " + fmt_num(max) + "]";
    case FieldType::floating:
      return "a float in [" + fmt_num(min) + ", " + fmt_num(max) + "]";
    case FieldType::boolean:
      return "true or false";
    case FieldType::enumeration: {
      std::string s = "one of ";
      for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + choices[i];
      return s;
    }
    case FieldType::list:
      return "a comma-separated list (a,b,c) or [] for none";
    case FieldType::mesh:
      return "a mesh like data:4,model:2, or \"\" for one device";
    case FieldType::string:
      return "any text";
  }
  return "";
}

const std::vector<FieldInfo>& fields() {
  static const std::vector<FieldInfo> infos = [] {
    std::vector<FieldInfo> v;
    for (const Field& f : table()) v.push_back(f.info);
    return v;
  }();
  return infos;
}

const FieldInfo& field_info(const std::string& path) { return find(path).info; }

std::string fields_table(const ExperimentConfig& c) {
  size_t w = 0;
  for (const FieldInfo& f : fields()) w = std::max(w, f.path.size());
  std::ostringstream os;
  for (const FieldInfo& f : fields()) {
    std::string value = field_text(c, f.path);
    os << f.path << std::string(w + 2 - f.path.size(), ' ') << field_type_name(f.type)
       << std::string(7 - std::string(field_type_name(f.type)).size(), ' ') << "= " << (value.empty() ? "\"\"" : value)
       << "    # " << f.doc << "; " << f.allowed() << "\n";
  }
  return os.str();
}

FieldValue get_field(const ExperimentConfig& c, const std::string& path) { return find(path).get(c); }

std::string field_text(const ExperimentConfig& c, const std::string& path) {
  FieldValue v = get_field(c, path);
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return fmt_num(*d);
  if (auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  if (auto* s = std::get_if<std::string>(&v)) return *s;
  std::string out;
  for (auto& s : std::get<std::vector<std::string>>(v)) out += (out.empty() ? "" : ",") + s;
  return out;
}

void set_field_value(ExperimentConfig& c, const std::string& path, const FieldValue& v) {
  const Field& f = find(path);
  check_value(f.info, v);
  f.set(c, v);
}

namespace {

// Decimal notation only: [+-]digits[.digits][e[+-]digits] (or .digits). strtod alone would also
// take hex (0x10, 0x1p3), inf, nan and leading spaces.
bool decimal_number(const std::string& t) {
  size_t i = 0, n = t.size();
  auto digits = [&] {
    const size_t s = i;
    while (i < n && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
    return i - s;
  };
  if (i < n && (t[i] == '+' || t[i] == '-')) ++i;
  size_t mant = digits();
  if (i < n && t[i] == '.') {
    ++i;
    mant += digits();
  }
  if (mant == 0) return false;
  if (i < n && (t[i] == 'e' || t[i] == 'E')) {
    ++i;
    if (i < n && (t[i] == '+' || t[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == n;
}

// What is wrong with the quotes of a value, or "": a quote opened and not closed (or closed and
// never opened), outside another kind of quote.
std::string unbalanced_quote(const std::string& t) {
  char quote = 0;
  for (char ch : t)
    if (quote ? ch == quote : (ch == '"' || ch == '\'')) quote = quote ? 0 : ch;
  if (!quote) return "";
  return std::string("the quote ") + quote + " is not closed";
}

}  // namespace

void set_field(ExperimentConfig& c, const std::string& path, const std::string& raw) {
  const Field& f = find(path);
  const FieldInfo& info = f.info;
  std::string text = trim(raw);
  auto bad = [&](const std::string& what) {
    return Error("[pax] " + path + "='" + raw + "' is not " + what + "; allowed: " + info.allowed());
  };
  if (std::string q = unbalanced_quote(text); !q.empty())
    throw Error("[pax] " + path + "='" + raw + "': " + q + "; quote the whole value (" + path +
                "='...') or none of it");
  // A string, enum or mesh value in one pair of quotes is the text inside them (a shell passes
  // them on when the whole --set is quoted: --set 'data.cache_dir="/x y"'); numbers and bools
  // are written bare.
  auto unquote = [](std::string t) {
    if (t.size() >= 2 && (t.front() == '"' || t.front() == '\'') && t.back() == t.front())
      t = t.substr(1, t.size() - 2);
    return t;
  };
  FieldValue v;
  switch (info.type) {
    case FieldType::integer: {
      if (!decimal_number(text)) throw bad("an int (decimal digits, e.g. 1000 or 1e3)");
      // Whole numbers, also written as floats (1e6); the range check below names the limits.
      errno = 0;
      char* end = nullptr;
      long long x = std::strtoll(text.c_str(), &end, 10);
      if (*end != 0 || errno == ERANGE) {
        const double d = std::strtod(text.c_str(), &end);
        if (d != std::floor(d)) throw bad("an int (it has a fraction)");
        if (!std::isfinite(d) || std::fabs(d) > 9.2e18 || errno == ERANGE)
          throw Error("[pax] " + path + "=" + text + " is out of range; allowed: " + info.allowed());
        x = static_cast<long long>(d);
      }
      v = static_cast<int64_t>(x);
      break;
    }
    case FieldType::floating: {
      if (!decimal_number(text)) throw bad("a float (decimal notation, e.g. 0.001 or 1e-3)");
      errno = 0;
      char* end = nullptr;
      const double d = std::strtod(text.c_str(), &end);
      if (*end != 0 || !std::isfinite(d) || (errno == ERANGE && std::fabs(d) >= 1))
        throw Error("[pax] " + path + "=" + text + " is out of range; allowed: " + info.allowed());
      if (errno == ERANGE)  // underflow: it would silently become 0 or lose precision
        throw Error("[pax] " + path + "=" + text + " is too small to represent; write 0 or a larger value (" +
                    info.allowed() + ")");
      v = d;
      break;
    }
    case FieldType::boolean: {
      if (text == "true" || text == "1")
        v = true;
      else if (text == "false" || text == "0")
        v = false;
      else
        throw bad("a bool");
      break;
    }
    case FieldType::list: {
      std::string body = text;
      if (!body.empty() && body.front() == '[') {
        if (body.back() != ']') throw bad("a list");
        body = body.substr(1, body.size() - 2);
      }
      std::vector<std::string> items;
      if (!trim(body).empty()) {
        // Split on commas outside quotes and parentheses, so rules like "a=P(None, 'model')" survive.
        std::string cur;
        int depth = 0;
        char quote = 0;
        for (char ch : body) {
          if (quote) {
            if (ch == quote) quote = 0;
          } else if (ch == '"' || ch == '\'') {
            quote = ch;
          } else if (ch == '(') {
            ++depth;
          } else if (ch == ')') {
            --depth;
          } else if (ch == ',' && depth == 0) {
            items.push_back(trim(cur));
            cur.clear();
            continue;
          }
          cur += ch;
        }
        items.push_back(trim(cur));
        for (auto& it : items) {
          if (it.size() >= 2 && (it.front() == '"' || it.front() == '\'') && it.back() == it.front())
            it = it.substr(1, it.size() - 2);
          if (it.empty()) throw bad("a list (empty item)");
        }
      }
      v = items;
      break;
    }
    default:
      v = unquote(text);
      break;
  }
  check_value(info, v);
  f.set(c, v);
}

void apply_override(ExperimentConfig& c, const std::string& assignment) {
  size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error("[pax] --set '" + assignment + "' is not path=value, e.g. --set train.steps=100");
  set_field(c, trim(assignment.substr(0, eq)), assignment.substr(eq + 1));
}

}  // namespace px::pax
