// pax decode: the checkpoint's model (or a Hugging Face model directory) continues a prompt, through
// nn::generate (prefill once, then one position per new token from a KV cache); pax export writes a
// checkpoint as a Hugging Face model directory.
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "parallax/nn/pretrained.h"
#include "parallax/pax.h"
#include "parallax/text.h"
#include "io/regular_file.h"
#include "pax/checkpoint.h"
#include "pax/data_source.h"
#include "pax/export.h"
#include "pax/model.h"

namespace px::pax {
namespace {

// "3 1 4" or "3,1,4" -> ids; anything else names the bad part.
std::vector<int32_t> parse_ids(const std::string& text, int64_t vocab) {
  std::string s = text;
  std::replace(s.begin(), s.end(), ',', ' ');
  std::istringstream in(s);
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v >= vocab)
      throw UserError("[pax] decode: there is no tokenizer (the copy task, or a model dir without tokenizer.json or "
                      "tokenizer.model), so the prompt is token ids in [0, " + std::to_string(vocab) +
                      ") separated by spaces; got '" + word + "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

}  // namespace

namespace {

// Tokenizes the prompt with the special tokens the tokenizer adds itself (as transformers'
// tokenizer(text): GPT-2 and Qwen2 none, Llama a BOS), or parses ids; generates until any of
// `eos_ids`; and turns the new ids back into text.
DecodeResult run_decode(const nn::TransformerLm& model, const std::vector<Array>& params, const text::Tokenizer* tok,
                        const std::vector<int32_t>& eos_ids, const DecodeOptions& d, const std::string& platform) {
  if (d.max_new_tokens < 1)
    throw UserError("[pax] decode: max_new_tokens must be >= 1, got " + std::to_string(d.max_new_tokens));
  const int64_t context = model.config().max_seq_len, vocab = model.config().vocab_size;
  DecodeResult r;
  if (d.prompt.find_first_not_of(" \t\n") == std::string::npos)
    throw UserError("[pax] decode: the prompt is empty; pass --prompt \"some text\"");
  std::vector<int32_t> plain;  // the prompt without special tokens: what is echoed
  if (tok) {
    plain = tok->encode(d.prompt);
    r.prompt_ids = tok->add_special_tokens(plain);
  } else {
    plain = r.prompt_ids = parse_ids(d.prompt, vocab);
  }
  for (int32_t id : r.prompt_ids)
    if (id < 0 || id >= vocab)
      throw UserError("[pax] decode: the tokenizer gives id " + std::to_string(id) +
                      " for the prompt, outside the model's vocabulary of " + std::to_string(vocab) +
                      "; use the tokenizer the model was made with");
  const int64_t p = static_cast<int64_t>(r.prompt_ids.size());
  if (p >= context)
    throw UserError("[pax] decode: the prompt is " + std::to_string(p) + " tokens, the model's context is " +
                    std::to_string(context) + "; give a shorter prompt");
  nn::GenerateOptions g;
  g.max_new_tokens = std::min<int64_t>(d.max_new_tokens, context - p);
  g.temperature = d.temperature;
  g.top_k = d.top_k;
  g.top_p = d.top_p;
  g.seed = d.seed;
  g.use_cache = d.use_cache;
  g.token_seconds = &r.token_seconds;
  g.eos_ids = eos_ids;
  g.platform = platform;
  r.new_ids = nn::generate(model, params, {r.prompt_ids}, g)[0];
  // generate() repeats the EOS to the end of the row: the tokens produced are those before the first.
  auto eos = std::find_if(r.new_ids.begin(), r.new_ids.end(),
                          [&](int32_t id) { return std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end(); });
  if (eos != r.new_ids.end()) {
    r.stopped_at_eos = true;
    r.new_ids.erase(eos, r.new_ids.end());
    r.token_seconds.resize(std::min(r.token_seconds.size(), r.new_ids.size() + 1));  // the EOS took time too
  }
  if (tok) {
    r.text = tok->decode(r.new_ids);
    r.prompt_text = tok->decode(plain);
    // Decoded together, so that the space between the prompt and the first new word stays.
    std::vector<int32_t> all = plain;
    all.insert(all.end(), r.new_ids.begin(), r.new_ids.end());
    r.full_text = tok->decode(all);
  } else {
    auto join = [](const std::vector<int32_t>& ids) {
      std::string t;
      for (size_t i = 0; i < ids.size(); ++i) t += (i ? " " : "") + std::to_string(ids[i]);
      return t;
    };
    r.text = join(r.new_ids);
    r.prompt_text = join(r.prompt_ids);
    r.full_text = r.prompt_text + " | " + r.text;
  }
  return r;
}

// The ids that end generation: the model's (generation_config.json's or config.json's) and the tokenizer's.
std::vector<int32_t> eos_ids_of(const nn::SpecialTokenIds& special, const text::Tokenizer* tok) {
  std::vector<int32_t> ids;
  auto add = [&](int32_t id) {
    if (id >= 0 && std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  };
  for (int32_t id : special.eos) add(id);
  if (tok) add(tok->eos_id());
  return ids;
}

}  // namespace

DecodeResult decode(const ExperimentConfig& c, const RunOptions& opts, const DecodeOptions& d) {
  check_runnable(c);
  std::unique_ptr<DataSource> data = make_data_source(c, opts.job_dir);
  nn::TransformerLm model(lm_config(c));
  std::optional<int64_t> step = d.step;
  std::vector<Array> params = Checkpoints(opts.job_dir, c.train.checkpoint_keep).params(step, model);
  DecodeResult r = run_decode(model, params, data->tokenizer(), eos_ids_of({}, data->tokenizer()), d,
                              resolve_devices(c, opts.devices, false).platform);
  r.step = *step;
  return r;
}

DecodeResult decode_pretrained(const std::string& dir, const DecodeOptions& d) {
  io::require_directory(dir, "[pax] decode: --hf_model ", /*must_exist=*/true);
  nn::Pretrained p = nn::load_pretrained(dir);
  std::unique_ptr<text::Tokenizer> tok;
  // load_hf_tokenizer: tokenizer.json, or tokenizer.model where that is SentencePiece-style or absent.
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (std::filesystem::exists(std::filesystem::path(dir) / name)) {
      tok = text::load_hf_tokenizer(dir);
      break;
    }
  return run_decode(*p.model, p.params, tok.get(), eos_ids_of(p.special, tok.get()), d, default_devices().platform);
}

int64_t export_checkpoint(const ExperimentConfig& c, const RunOptions& opts, const std::string& out_dir,
                          const std::string& format, std::optional<int64_t> step) {
  return export_run(c, opts, out_dir, {.format = format, .step = step});
}

int64_t export_run(const ExperimentConfig& c, const RunOptions& opts, const std::string& out_dir,
                   const ExportOptions& x) {
  const std::string& format = x.format;
  std::optional<int64_t> step = x.step;
  if (format != "hf" && format != "safetensors")
    throw UserError("[pax] export: unknown --format '" + format + "'; use hf (a model directory) or safetensors (one file)");
  if (out_dir.empty()) throw UserError("[pax] export: no output path; pass --out DIR (hf) or --out FILE.safetensors");
  if (x.dtype != DType::f32 && x.dtype != DType::bf16 && x.dtype != DType::f16)
    throw UserError(std::string("[pax] export: --dtype ") + dtype_name(x.dtype) + " is not a weights dtype; use f32, "
                    "bf16 or f16");
  if (x.max_shard_bytes < 0)
    throw UserError("[pax] export: --max_shard_size must be >= 0 (0: one file), got " +
                    std::to_string(x.max_shard_bytes));
  if (format == "safetensors" && (x.dtype != DType::f32 || x.max_shard_bytes > 0))
    throw UserError("[pax] export: --dtype and --max_shard_size apply to --format=hf; --format=safetensors writes "
                    "the checkpoint's f32 params as one file");
  if (format == "hf") io::require_directory(out_dir, "[pax] export: --out ");
  if (format == "safetensors" && std::filesystem::is_directory(out_dir))
    throw UserError("[pax] export: --out '" + out_dir + "' is a directory; --format=safetensors writes one file: give "
                    "a file path, e.g. " + out_dir + "/params.safetensors");
  check_runnable(c);
  if (format == "safetensors") {
    Checkpoints ckpt(opts.job_dir, c.train.checkpoint_keep);
    if (!step) step = ckpt.latest();
    if (!step) throw UserError("[pax] no checkpoint in '" + opts.job_dir + "/checkpoints'; run 'pax train' first");
    std::vector<int64_t> all = ckpt.steps();
    if (std::find(all.begin(), all.end(), *step) == all.end())
      throw UserError("[pax] no checkpoint at step " + std::to_string(*step) + " in '" + opts.job_dir +
                      "/checkpoints'; the committed steps are " + ckpt.steps_text() +
                      " (leave out --step for the latest)");
    export_safetensors(ckpt.path(*step), out_dir, "params");
    return *step;
  }
  nn::TransformerLm model(lm_config(c));
  std::vector<Array> params = Checkpoints(opts.job_dir, c.train.checkpoint_keep).params(step, model);
  nn::SavePretrainedOptions so;
  so.dtype = x.dtype;
  so.max_shard_bytes = x.max_shard_bytes;
  if (!c.train.init_from_hf.empty()) {
    // Fine-tuned from a Hugging Face model: its special ids, generation config and tokenizer files.
    so.special = nn::read_special_token_ids(c.train.init_from_hf);
    if (std::filesystem::exists(std::filesystem::path(c.train.init_from_hf) / "generation_config.json"))
      so.generation_config_from = c.train.init_from_hf;
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                             "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja"})
      if (std::filesystem::exists(std::filesystem::path(c.train.init_from_hf) / name))
        so.tokenizer_from = c.train.init_from_hf;  // save_pretrained refuses a directory without any
  } else if (c.data.kind != "copy_task") {
    // The run's own tokenizer (read from the data cache, or prepared again as training did).
    std::unique_ptr<DataSource> data = make_data_source(c, opts.job_dir);
    if (const text::Tokenizer* tok = data->tokenizer()) {
      so.special.bos = tok->bos_id();
      if (tok->eos_id() >= 0) so.special.eos = {tok->eos_id()};
      so.special.pad = tok->pad_id();
    }
  }
  nn::save_pretrained(model, params, out_dir, so);
  return *step;
}

}  // namespace px::pax
