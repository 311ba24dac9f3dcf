// pax decode: the checkpoint's model continues a prompt, through nn::generate (prefill once, then
// one position per new token from a KV cache).
#include <algorithm>
#include <sstream>

#include "parallax/nn/pretrained.h"
#include "parallax/pax.h"
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
      throw UserError("[pax] decode: this experiment has no tokenizer (data.kind=copy_task), so the prompt is token "
                      "ids in [0, " + std::to_string(vocab) + ") separated by spaces; got '" + word + "'");
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

}  // namespace

DecodeResult decode(const ExperimentConfig& c, const RunOptions& opts, const DecodeOptions& d) {
  check_runnable(c);
  if (d.max_new_tokens < 1) throw UserError("[pax] decode: max_new_tokens must be >= 1, got " + std::to_string(d.max_new_tokens));
  std::unique_ptr<DataSource> data = make_data_source(c, opts.job_dir);
  nn::TransformerLm model(lm_config(c));
  DecodeResult r;
  std::optional<int64_t> step = d.step;
  std::vector<Array> params = Checkpoints(opts.job_dir, c.train.checkpoint_keep).params(step, model);
  r.step = *step;

  const text::Tokenizer* tok = data->tokenizer();
  r.prompt_ids = tok ? tok->encode(d.prompt) : parse_ids(d.prompt, c.model.vocab_size);
  if (tok && tok->bos_id() >= 0) r.prompt_ids.insert(r.prompt_ids.begin(), tok->bos_id());
  const int64_t p = static_cast<int64_t>(r.prompt_ids.size());
  if (d.prompt.find_first_not_of(" \t\n") == std::string::npos || p == 0)
    throw UserError("[pax] decode: the prompt is empty; pass --prompt \"some text\"");
  if (p >= c.model.seq_len)
    throw UserError("[pax] decode: the prompt is " + std::to_string(p) + " tokens, the model's context is " +
                    std::to_string(c.model.seq_len) + "; give a shorter prompt");

  nn::GenerateOptions g;
  g.max_new_tokens = std::min<int64_t>(d.max_new_tokens, c.model.seq_len - p);
  g.temperature = d.temperature;
  g.top_k = d.top_k;
  g.top_p = d.top_p;
  g.seed = d.seed;
  g.use_cache = d.use_cache;
  g.token_seconds = &r.token_seconds;
  if (tok) g.eos_id = tok->eos_id();
  r.new_ids = nn::generate(model, params, {r.prompt_ids}, g)[0];
  if (tok) {
    std::vector<int32_t> shown = r.new_ids;
    auto eos = std::find(shown.begin(), shown.end(), tok->eos_id());
    if (tok->eos_id() >= 0 && eos != shown.end()) shown.erase(eos, shown.end());
    r.text = tok->decode(shown);
  } else {
    for (size_t i = 0; i < r.new_ids.size(); ++i) r.text += (i ? " " : "") + std::to_string(r.new_ids[i]);
  }
  return r;
}

}  // namespace px::pax
