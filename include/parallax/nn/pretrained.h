// Hugging Face checkpoints: load GPT-2, Llama, Mistral and Qwen2 model directories (config.json and
// model.safetensors or a sharded set with model.safetensors.index.json) into a TransformerLm, save
// one back in the same layout, and decode from it with a key/value cache.
//
//   px::nn::Pretrained p = px::nn::load_pretrained("models/qwen2-0.5b");
//   std::cout << p.architecture << "\n" << p.model->param_table();
//   auto out = px::nn::generate(*p.model, p.params, {{151643, 9707}}, {.max_new_tokens = 32});
//   // transformers loads it, with p's special ids, generation config, dtype and tokenizer files:
//   px::nn::save_pretrained(*p.model, p.params, "out/qwen2-tuned", px::nn::save_options_of(p));
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallax/core.h"
#include "parallax/nn/transformer.h"

namespace px::nn {

// The special token ids of a model: generation_config.json's when the directory has one (what
// transformers' generate() uses), else config.json's. -1 / empty: none.
struct SpecialTokenIds {
  int32_t bos = -1;
  std::vector<int32_t> eos;  // configs may list several (Llama 3 instruct: end_of_text, eot_id, ...)
  int32_t pad = -1;
};

struct Pretrained {
  std::string architecture;              // "LlamaForCausalLM", ...
  std::unique_ptr<TransformerLm> model;  // config from config.json (name: the model_type)
  std::vector<Array> params;             // f32, in model->store() order
  SpecialTokenIds special;               // bos/eos/pad ids (generate's eos_ids, save_pretrained's)
  std::string dir;                       // the directory it was read from
  // The weights' dtype in the files: bf16 or f16 when every tensor is stored so, else f32 (what
  // transformers' from_pretrained(dtype="auto") picks, and what save_options_of keeps).
  DType dtype = DType::f32;
};

// The architectures (config.json "architectures") load_pretrained accepts.
std::vector<std::string> pretrained_architectures();

// The LmConfig and architecture that config.json in `dir` describes; throws px::Error naming the
// file and the field for anything unsupported (architectures, activations, rope types, ...).
LmConfig read_pretrained_config(const std::string& dir, std::string* architecture = nullptr);

// Reads the model in `dir`. Safetensors files are memory-mapped and each tensor converted (bf16,
// f16 -> f32, transposed where the layouts differ) straight into its param. Errors name the file
// at fault and the fix: unsupported architecture, missing or truncated shard, tensors missing,
// unexpected or shaped unlike config.json.
Pretrained load_pretrained(const std::string& dir);
// The same, streamed: `sink(i, param)` receives each param (index in model->store() order, a full
// f32 host array) as soon as it is read, and Pretrained::params stays empty. Every check runs
// before the first param is read. With TrainStep::set_param the caller shards each param
// and drops it, so the whole model is never in memory at once:
//   px::TrainState s = step.begin_state();
//   px::nn::load_pretrained(dir, [&](int i, px::Array p) { step.set_param(s, i, p); });
Pretrained load_pretrained(const std::string& dir, const std::function<void(int, Array)>& sink);
// The same, sliced: `sink(i, read)` gets a reader of boxes of param i (BoxReader, in
// parallax/core.h) that converts only the elements of the box asked for, straight from the
// mapped file; it is valid during the call. With TrainStep's set_param(s, i, read) every
// device reads only its own shard, so over several processes each process reads only its part:
//   px::nn::load_pretrained_slices(dir, [&](int i, const px::BoxReader& r) { step.set_param(s, i, r); });
Pretrained load_pretrained_slices(const std::string& dir, const std::function<void(int, const BoxReader&)>& sink);

// The special ids config.json (and generation_config.json when present) in `dir` declare.
SpecialTokenIds read_special_token_ids(const std::string& dir);

struct SavePretrainedOptions {
  // The layout; empty: the one the config implies (learned positions -> GPT2LMHeadModel, qkv_bias
  // -> Qwen2ForCausalLM, sliding_window -> MistralForCausalLM, else LlamaForCausalLM).
  std::string architecture;
  // Written to config.json and generation_config.json; ids not given are written as null (so
  // transformers does not fall back to its defaults, e.g. Llama's eos 2). Ids are >= 0 (-1: none)
  // and may lie beyond the vocabulary, as transformers allows (GPT-2's default 50256 in a small
  // test vocabulary): such an id is never generated.
  SpecialTokenIds special;
  // The tensors' dtype: f32, bf16 or f16 (round to nearest even); config.json's torch_dtype and
  // dtype say which.
  DType dtype = DType::f32;
  // > 0: shards of at most this many bytes (a tensor larger than that gets a shard of its own),
  // model-0000i-of-0000n.safetensors and model.safetensors.index.json; 0: one model.safetensors.
  int64_t max_shard_bytes = 0;
  // A directory whose tokenizer files (tokenizer.json, tokenizer_config.json, tokenizer.model,
  // special_tokens_map.json, vocab.json, merges.txt, added_tokens.json, chat_template.jinja)
  // are copied beside the weights; empty: none copied.
  std::string tokenizer_from;
  // A directory whose generation_config.json (do_sample, temperature, top_p, max_length, ...) is
  // kept in the one written, with its special ids replaced by `special`; empty: a
  // generation_config.json of the special ids alone.
  std::string generation_config_from;
};

// What reproduces `p` as it was read: its architecture, special ids, dtype, generation config
// (when its directory has a generation_config.json) and tokenizer files (when it has any), so that
// save_pretrained(*p.model, p.params, out, save_options_of(p)) writes a directory transformers
// reads as it reads p.dir.
SavePretrainedOptions save_options_of(const Pretrained& p);

// Writes config.json, generation_config.json and the weights (model.safetensors, or shards and
// their index) into `dir` (created if needed); weights files of an earlier save in another form
// (one file or shards) are removed. Throws px::Error naming the param, option or file at fault.
void save_pretrained(const TransformerLm& model, const std::vector<Array>& params, const std::string& dir,
                     const SavePretrainedOptions& opt);
// The same with only the architecture given: f32, one file, no special ids, no tokenizer.
void save_pretrained(const TransformerLm& model, const std::vector<Array>& params, const std::string& dir,
                     const std::string& architecture = "");

// ---- decoding ---------------------------------------------------------------------------------

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  double temperature = 0.0;  // 0: greedy (argmax)
  int64_t top_k = 0;         // > 0: sample among the k most likely tokens
  double top_p = 1.0;        // < 1: sample among the smallest set whose probability reaches top_p
  uint64_t seed = 0;
  // A row stops after emitting eos_id or any of eos_ids (its later positions repeat that id); when
  // every row has stopped, generation ends early.
  int32_t eos_id = -1;
  std::vector<int32_t> eos_ids;
  // Cache length: the prompt plus max_new_tokens when 0; at most the model's max_seq_len.
  int64_t max_len = 0;
  // false: recompute the whole sequence for every token (the reference the cache is tested against).
  bool use_cache = true;
  // When set, receives the seconds each new token took (index i: the (i+1)-th new token).
  std::vector<double>* token_seconds = nullptr;
  // The platform whose device 0 runs the programs (pax decode: its devices'); the params are copied
  // there once, the KV cache stays there, and only the logits come back to the host.
  std::string platform = "cpu";
};

// Continues each prompt by max_new_tokens tokens; returns only the new ids. Prompts may differ in
// length: each row keeps its own positions (its cache slots, rotary angles and learned position
// rows are its own, its mask covers its own tokens), so a row decodes exactly as it would alone.
// With the cache, a prefill program runs the prompts once and a one-token decode program (over a
// fixed cache length) produces each following token, so every new token costs the same.
std::vector<std::vector<int32_t>> generate(const TransformerLm& model, const std::vector<Array>& params,
                                           const std::vector<std::vector<int32_t>>& prompts,
                                           const GenerateOptions& opt = {});

}  // namespace px::nn
