// pax: declarative experiments. An experiment is C++ code returning an ExperimentConfig,
// registered under a dotted name; every field has a dotted path, a type and a validator, so the
// command line (`--set train.steps=100`) and TOML files can set any of them.
//
//   px::pax::register_experiment("my.TinyCopy", "a smaller copy model", [] {
//     px::pax::ExperimentConfig c = px::pax::experiment("copy.TransformerLmTiny");  // derive
//     c.model.n_layers = 1;
//     return c;
//   });
//   px::pax::ExperimentConfig cfg = px::pax::experiment("my.TinyCopy");
//   px::pax::set_field(cfg, "optimizer.lr", "1e-3");              // validated; throws px::Error
//   px::pax::TrainResult r = px::pax::train(cfg, {.job_dir = "/tmp/job"});
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "parallax/core.h"

namespace px::pax {

// ---- the config tree -----------------------------------------------------------------------

struct ModelConfig {
  std::string flavour = "gpt2";  // gpt2 | llama
  int64_t vocab_size = 2048;     // text data: must equal the tokenizer's vocabulary
  int64_t d_model = 128;
  int64_t n_heads = 4;
  int64_t n_kv_heads = 0;  // 0: n_heads
  int64_t n_layers = 2;
  int64_t d_ff = 512;
  int64_t seq_len = 128;
  double init_std = 0.02;
  bool tied_embedding = true;  // the head reuses the embedding (GPT-2); Llama unties it
  std::string dtype = "f32";  // compute dtype of the matmuls: f32 | bf16 (params and norms stay f32)
  bool fused_head = false;    // the head and loss as one chunked primitive: no [batch, seq, vocab] logits
};

struct DataConfig {
  std::string kind = "copy_task";  // copy_task | text
  std::vector<std::string> paths;  // text: files or folders (.txt, .jsonl, .gz), or "gcide"
  std::string cache_dir;           // text: where the tokenizer and token caches go ("" = DIR/data)
  int64_t batch = 8;               // global batch, split over the data-parallel groups
  double eval_fraction = 0.01;     // text: share of documents held out for eval
  int64_t max_documents = 0;       // text: 0 = all
  int64_t max_document_bytes = int64_t{64} << 20;  // text: a longer document is an error naming its file and line
  int64_t copy_eval_batches = 8;   // copy_task: size of the fixed eval set, in batches
};

struct TokenizerConfig {
  std::string model;  // a SentencePiece .model; "" = train one on the corpus (cached)
};

struct OptimizerConfig {
  std::string name = "adamw";  // adamw | adam | sgd | adafactor
  double lr = 1e-3;            // peak learning rate
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  double momentum = 0.0;   // sgd
  double clip_norm = 1.0;  // 0 = no clipping
};

struct ScheduleConfig {
  std::string kind = "constant";  // constant | linear_warmup | warmup_cosine | warmup_exponential | rsqrt
  int64_t warmup_steps = 0;
  int64_t decay_steps = 1000;  // warmup_exponential: steps per factor of decay_rate
  double decay_rate = 0.5;
  double min_fraction = 0.0;  // floor (exponential) or final value (cosine), as a fraction of lr
  int64_t total_steps = 0;    // warmup_cosine: 0 = train.steps
};

struct ShardingConfig {
  std::string mesh;              // "data:4,model:2"; "" = one device
  std::string strategy = "ddp";  // ddp | fsdp | tp | fsdp_tp | manual | auto
  std::string data_axis = "data";
  std::string model_axis = "model";
  int64_t fsdp_min_bytes = 4096;
  std::vector<std::string> rules;  // "glob=P(...)", e.g. "blocks.*.mlp.fc.w=P(None, 'model')"
  std::string cluster = "cpu";     // auto: the cluster plans are costed for (a preset or a .toml file)
  bool auto_pipeline = false;      // auto: also plan the devices pipelined, train that when faster
  // A mesh with a `stage` axis pipelines the model (docs/pipeline.md): the schedule, stages per
  // device (interleaved) and numbered layers per stage ([]: an even split).
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved | zero_bubble
  int64_t virtual_stages = 1;
  std::vector<std::string> layers_per_stage;
  bool balance_stages = false;  // split the layers by cost instead (PipelineOptions::balance)
};

struct MemoryConfig {
  std::string remat = "none";    // none | full | dots_saveable | dots_with_no_batch_dims_saveable |
                                 // nothing_saveable | auto (needs budget_bytes)
  int64_t budget_bytes = 0;      // remat=auto: the planned per-device peak to fit, in bytes
  std::string offload = "none";  // none | params | optimizer_state | params_and_optimizer_state
  int64_t prefetch_depth = 1;    // offload: layers of params fetched ahead of the one computing
};

struct TrainConfig {
  int64_t steps = 100;
  int64_t microbatches = 1;  // gradient accumulation: microbatches per step (divides the batch per device)
  int64_t eval_interval = 50;   // 0 = only at the end
  int64_t eval_batches = 0;     // 0 = the whole eval split
  int64_t checkpoint_interval = 50;  // 0 = only at the end
  int64_t checkpoint_keep = 3;  // newest N checkpoints are kept
  int64_t summary_interval = 10;
  uint64_t seed = 0;
  // A Hugging Face model dir (GPT-2, Llama, Mistral, Qwen2) to start from instead of random
  // params: fine-tuning. The model section's sizes must match its config.json (an error names
  // the --set that fixes each); the rest (norm eps, rotary theta and scaling, biases, sliding
  // window, max positions) comes from config.json. Ignored when DIR has a checkpoint to resume.
  std::string init_from_hf;
  // A step whose loss or gradient norm is NaN or infinite: stop (the run ends with an error and
  // that step is not saved), skip (its update is not applied; the step is trained again on the
  // next batch) or continue (train on, as before).
  std::string on_nonfinite = "stop";
};

struct ExperimentConfig {
  std::string name;     // the registered name this config came from
  std::string summary;  // one line
  ModelConfig model;
  DataConfig data;
  TokenizerConfig tokenizer;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  ShardingConfig sharding;
  MemoryConfig memory;
  TrainConfig train;
};

// ---- fields: every leaf of the tree by dotted path -------------------------------------------

enum class FieldType { integer, floating, string, boolean, enumeration, list, mesh };
const char* field_type_name(FieldType t);  // "int", "float", "string", "bool", "enum", "list", "mesh"

using FieldValue = std::variant<int64_t, double, bool, std::string, std::vector<std::string>>;

struct FieldInfo {
  std::string path;  // "optimizer.lr"
  FieldType type;
  std::string doc;
  std::vector<std::string> choices;  // enum: the allowed values
  double min = 0, max = 0;           // int and float: the allowed range (inclusive)
  std::string allowed() const;       // "one of adamw, adam, sgd", "an int in [1, 1e+12]", ...
};

const std::vector<FieldInfo>& fields();
// One line per field: path, type, value in `c`, what is allowed, and what it does.
std::string fields_table(const ExperimentConfig& c);
const FieldInfo& field_info(const std::string& path);  // throws px::Error listing near names
FieldValue get_field(const ExperimentConfig& c, const std::string& path);
std::string field_text(const ExperimentConfig& c, const std::string& path);  // as --set would take it
// Parses `text` as the field's type, validates it and stores it. Throws px::Error naming the
// field, the text and what is allowed.
void set_field(ExperimentConfig& c, const std::string& path, const std::string& text);
void set_field_value(ExperimentConfig& c, const std::string& path, const FieldValue& v);
// "path=value" from --set.
void apply_override(ExperimentConfig& c, const std::string& assignment);
// Checks every field and the relations between them (heads divide d_model, rules parse, ...).
void validate(const ExperimentConfig& c);
// What running (not planning) needs beyond validate(): throws for settings that exist in the
// config but not yet in the library (remat, offload, AUTO).
void check_runnable(const ExperimentConfig& c);

// TOML: every field, in sections, plus `experiment = "<name>"`. Reading starts from the named
// experiment (or `base` when given) and applies the file's fields; unknown keys are errors.
std::string to_toml(const ExperimentConfig& c);
ExperimentConfig from_toml_file(const std::string& path, const ExperimentConfig* base = nullptr);
void apply_toml_file(ExperimentConfig& c, const std::string& path);

// ---- the registry -----------------------------------------------------------------------------

using ExperimentFn = std::function<ExperimentConfig()>;
struct ExperimentInfo {
  std::string name, summary;
};
// Throws px::Error when the name is taken. The function runs on every lookup.
void register_experiment(const std::string& name, const std::string& summary, ExperimentFn fn);
std::vector<ExperimentInfo> list_experiments();  // sorted by name; the built-ins are included
// The named experiment's config (name and summary filled in); throws "[pax] unknown experiment".
ExperimentConfig experiment(const std::string& name);

// ---- planning (shapes only: nothing is allocated) ---------------------------------------------

struct PlanReport {
  int64_t param_count = 0;
  int64_t devices = 1;
  std::string mesh;                // "Mesh{data: 4} on cpu:4" or "one device"
  std::string strategy;
  int64_t microbatches = 1;        // train.microbatches: the step's batch in this many, one update
  std::string table;               // per param: shape, spec, bytes per device
  int64_t param_bytes_per_device = 0;
  int64_t optimizer_bytes_per_device = 0;
  int64_t gradient_bytes_per_device = 0;
  // The step on a cluster (auto.h's cost model, from the same buffer planner the runtime uses);
  // empty `cluster` when it was not costed.
  std::string cluster;
  double step_s = 0, compute_s = 0, comm_s = 0;  // predicted seconds per training step
  int64_t peak_bytes_per_device = 0;              // the whole step's peak, activations included
  int64_t device_memory_bytes = 0;                // the cluster's device memory
  std::string cost_note;                          // why there is no prediction, when there is none
  std::string pipeline;  // a mesh with a `stage` axis: stages, memory per device group, bubble (PipelineReport)
  // sharding.strategy=auto on a cluster: the fastest pipelined plan of the same devices that fits
  // (px::search_pipelines), its prediction beside AUTO's and the --set that trains it.
  std::string pipelined;
  std::string text() const;        // the whole report as `pax plan` prints it
};
// `devices`: "cpu:N" or "" (= as many virtual devices as the mesh needs, for planning).
// `cluster`: a preset ("cpu", "h100x8", "h200x8") or a TOML file to predict the step time and
// peak memory on (docs/auto-sharding.md); "" for placement and state bytes only.
PlanReport plan(const ExperimentConfig& c, const std::string& devices = "", const std::string& cluster = "");
// The resolved config, the parameter count and the sharding plan.
std::string describe(const ExperimentConfig& c);

// ---- running ----------------------------------------------------------------------------------

struct RunOptions {
  std::string job_dir;
  std::string devices;             // "cpu:N"; "" = PX_DEVICES or the mesh's size
  bool progress = true;            // a progress line on stderr when it is a terminal
  std::ostream* out = nullptr;     // plain log lines also go here (nullptr: stdout)
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by SIGINT): checkpoint and return early
  const std::atomic<int>* stop_signal = nullptr;  // the signal that set `stop`, named in the log
  // train: resume from this committed checkpoint instead of the latest (e.g. the latest is
  // damaged); newer checkpoints are set aside (renamed to checkpoint_N.discarded), not deleted.
  std::optional<int64_t> restore_step;
};

struct TrainResult {
  int64_t first_step = 0;  // the step training started from (after resuming)
  int64_t last_step = 0;   // steps completed in total
  bool interrupted = false;
  float last_loss = 0;
  std::optional<double> last_eval_loss;
};
// Trains `c` in opts.job_dir, resuming from its latest checkpoint.
TrainResult train(const ExperimentConfig& c, const RunOptions& opts);

struct EvalResult {
  int64_t step = 0;  // the checkpoint's step
  int64_t batches = 0;
  int64_t tokens = 0;  // weighted target positions
  double loss = 0, log_pplx = 0, fraction_correct = 0;
};
// Evaluates the checkpoint at `step` (latest when empty) over train.eval_batches (0 = all).
EvalResult evaluate(const ExperimentConfig& c, const RunOptions& opts, std::optional<int64_t> step = {});

struct DecodeOptions {
  // Text data: text, tokenized by the experiment's tokenizer. The copy task (no tokenizer): token
  // ids separated by spaces or commas.
  std::string prompt;
  std::optional<int64_t> step;  // checkpoint step (latest when empty)
  int64_t max_new_tokens = 32;  // capped so that prompt + new tokens fit model.seq_len
  double temperature = 0.0;     // 0: greedy
  int64_t top_k = 0;            // > 0: sample among the k most likely tokens
  double top_p = 1.0;           // < 1: nucleus sampling
  uint64_t seed = 0;
  bool use_cache = true;        // false: recompute the whole prefix for every token (for checking)
};
struct DecodeResult {
  int64_t step = 0;                      // the checkpoint's step
  std::vector<int32_t> prompt_ids, new_ids;
  std::string text;                      // the new tokens as text (ids when there is no tokenizer)
  std::string prompt_text;               // the prompt as the tokenizer reads it back (ids: as given)
  std::string full_text;                 // the prompt and its continuation (ids: "3 1 4 | 1 5 9")
  bool stopped_at_eos = false;           // generation ended at the end-of-text token (not in new_ids)
  std::vector<double> token_seconds;     // per new token
};
// Continues the prompt with the model of the checkpoint at `step` (a KV cache: each new token
// costs one position). Throws px::Error for a missing checkpoint, an empty or too long prompt.
DecodeResult decode(const ExperimentConfig& c, const RunOptions& opts, const DecodeOptions& d);
// The same from a Hugging Face model directory (nn::load_pretrained), with its tokenizer.json or
// tokenizer.model when it has one (else the prompt is token ids). `step` is unused.
DecodeResult decode_pretrained(const std::string& dir, const DecodeOptions& d);

// Writes the params of the checkpoint at `step` (latest when empty) as a Hugging Face model
// directory (nn::save_pretrained: config.json and model.safetensors; GPT2LMHeadModel for the
// gpt2 flavour, LlamaForCausalLM for llama) that `transformers` and `pax decode --hf_model` load.
// format "safetensors": the params as one safetensors file at `out_dir` (a file path; the
// checkpoint's names, readable by safetensors, torch and numpy). Returns the step exported.
int64_t export_checkpoint(const ExperimentConfig& c, const RunOptions& opts, const std::string& out_dir,
                          const std::string& format = "hf", std::optional<int64_t> step = {});

// ---- the command line -------------------------------------------------------------------------

// `pax train|eval|decode|plan|list|describe ...`: returns the exit code (2 for user errors).
// A program that registers its own experiments can end main() with `return px::pax::cli_main(argc, argv);`.
int cli_main(int argc, char** argv);

}  // namespace px::pax
