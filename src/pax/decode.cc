// pax decode: the checkpoint's model (or a Hugging Face model directory) continues a prompt, through
// nn::generate (prefill once, then one position per new token from a KV cache); pax export writes a
// checkpoint as a Hugging Face model directory.
#include <algorithm>
#include <filesystem>
#include <sstream>

#include "parallax/nn/pretrained.h"
#include "parallax/pax.h"
#include "parallax/text.h"
#include "pax/checkpoint.h"
#include "pax/data_source.h"
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

// Tokenizes the prompt (or parses ids), generates, and turns the new ids back into text.
DecodeResult run_decode(const nn::TransformerLm& model, const std::vector<Array>& params, const text::Tokenizer* tok,
                        const DecodeOptions& d) {
  if (d.max_new_tokens < 1)
    throw UserError("[pax] decode: max_new_tokens must be >= 1, got " + std::to_string(d.max_new_tokens));
  const int64_t context = model.config().max_seq_len, vocab = model.config().vocab_size;
  DecodeResult r;
  if (d.prompt.find_first_not_of(" \t\n") == std::string::npos)
    throw UserError("[pax] decode: the prompt is empty; pass --prompt \"some text\"");
  r.prompt_ids = tok ? tok->encode(d.prompt) : parse_ids(d.prompt, vocab);
  if (tok && tok->bos_id() >= 0) r.prompt_ids.insert(r.prompt_ids.begin(), tok->bos_id());
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
  if (tok) g.eos_id = tok->eos_id();
  r.new_ids = nn::generate(model, params, {r.prompt_ids}, g)[0];
  // generate() repeats the EOS to the end of the row: the tokens produced are those before it.
  if (tok && tok->eos_id() >= 0) {
    auto eos = std::find(r.new_ids.begin(), r.new_ids.end(), tok->eos_id());
    if (eos != r.new_ids.end()) {
      r.stopped_at_eos = true;
      r.new_ids.erase(eos, r.new_ids.end());
      r.token_seconds.resize(std::min(r.token_seconds.size(), r.new_ids.size() + 1));  // the EOS took time too
    }
  }
  if (tok) {
    std::vector<int32_t> prompt = r.prompt_ids;
    if (tok->bos_id() >= 0 && !prompt.empty() && prompt.front() == tok->bos_id()) prompt.erase(prompt.begin());
    r.text = tok->decode(r.new_ids);
    r.prompt_text = tok->decode(prompt);
    // Decoded together, so that the space between the prompt and the first new word stays.
    std::vector<int32_t> all = prompt;
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

}  // namespace

DecodeResult decode(const ExperimentConfig& c, const RunOptions& opts, const DecodeOptions& d) {
  check_runnable(c);
  std::unique_ptr<DataSource> data = make_data_source(c, opts.job_dir);
  nn::TransformerLm model(lm_config(c));
  std::optional<int64_t> step = d.step;
  std::vector<Array> params = Checkpoints(opts.job_dir, c.train.checkpoint_keep).params(step, model);
  DecodeResult r = run_decode(model, params, data->tokenizer(), d);
  r.step = *step;
  return r;
}

DecodeResult decode_pretrained(const std::string& dir, const DecodeOptions& d) {
  nn::Pretrained p = nn::load_pretrained(dir);
  std::unique_ptr<text::Tokenizer> tok;
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (std::filesystem::exists(std::filesystem::path(dir) / name)) {
      tok = text::load_tokenizer((std::filesystem::path(dir) / name).string());
      break;
    }
  return run_decode(*p.model, p.params, tok.get(), d);
}

int64_t export_checkpoint(const ExperimentConfig& c, const RunOptions& opts, const std::string& out_dir,
                          const std::string& format, std::optional<int64_t> step) {
  if (format != "hf" && format != "safetensors")
    throw UserError("[pax] export: unknown --format '" + format + "'; use hf (a model directory) or safetensors (one file)");
  if (out_dir.empty()) throw UserError("[pax] export: no output path; pass --out DIR (hf) or --out FILE.safetensors");
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
  nn::save_pretrained(model, params, out_dir);
  return *step;
}

}  // namespace px::pax
