// Hugging Face checkpoints, decoding and tokenizers (px::nn pretrained.h, px::text), and
// tracing a function of a model's params (px::nn::trace_with_params).
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <nanobind/stl/function.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "parallax/nn/pretrained.h"
#include "parallax/text.h"

namespace pxpy {

void bind_pretrained(nb::module_& m) {
  m.def(
      "trace_with_params",
      [](px::nn::ParamStore& store, const px::nn::BatchFn& fn,
         const std::vector<std::pair<px::DType, px::Shape>>& types) {
        std::vector<px::TensorType> ts;
        for (auto& [d, s] : types) ts.push_back({d, s});
        return px::nn::trace_with_params(store, fn, ts);
      },
      nb::arg("store"), nb::arg("fn"), nb::arg("batch_types"),
      "A Graph whose inputs are the store's params then the batch; fn runs with the params bound.");

  m.def(
      "load_pretrained",
      [](const std::string& dir) {
        px::nn::Pretrained p;
        {
          nb::gil_scoped_release release;
          p = px::nn::load_pretrained(dir);
        }
        return std::make_tuple(std::move(p.model), std::move(p.params), p.architecture);
      },
      nb::arg("dir"));
  m.def("pretrained_architectures", &px::nn::pretrained_architectures);
  m.def(
      "save_pretrained",
      [](const px::nn::TransformerLm& model, const std::vector<px::Array>& params, const std::string& dir,
         const std::string& architecture) { px::nn::save_pretrained(model, params, dir, architecture); },
      nb::arg("model"), nb::arg("params"), nb::arg("dir"), nb::arg("architecture") = "",
      nb::call_guard<nb::gil_scoped_release>());
  m.def(
      "generate",
      [](const px::nn::TransformerLm& model, const std::vector<px::Array>& params,
         const std::vector<std::vector<int32_t>>& prompts, int64_t max_new_tokens, double temperature, int64_t top_k,
         double top_p, uint64_t seed, int32_t eos_id, bool use_cache, const std::string& platform) {
        px::nn::GenerateOptions o;
        o.max_new_tokens = max_new_tokens;
        o.temperature = temperature;
        o.top_k = top_k;
        o.top_p = top_p;
        o.seed = seed;
        o.eos_id = eos_id;
        o.use_cache = use_cache;
        o.platform = platform;
        return px::nn::generate(model, params, prompts, o);
      },
      nb::arg("model"), nb::arg("params"), nb::arg("prompts"), nb::arg("max_new_tokens") = 32,
      nb::arg("temperature") = 0.0, nb::arg("top_k") = 0, nb::arg("top_p") = 1.0, nb::arg("seed") = 0,
      nb::arg("eos_id") = -1, nb::arg("use_cache") = true, nb::arg("platform") = "cpu",
      nb::call_guard<nb::gil_scoped_release>());

  nb::class_<px::text::Tokenizer>(m, "Tokenizer", "Text to token ids and back (SentencePiece or byte-level BPE).")
      .def_prop_ro("kind", &px::text::Tokenizer::kind)
      .def(
          "encode", [](const px::text::Tokenizer& t, const std::string& s) { return t.encode(s); }, nb::arg("text"))
      .def("decode", &px::text::Tokenizer::decode, nb::arg("ids"))
      .def_prop_ro("vocab_size", &px::text::Tokenizer::vocab_size)
      .def_prop_ro("bos_id", &px::text::Tokenizer::bos_id)
      .def_prop_ro("eos_id", &px::text::Tokenizer::eos_id)
      .def_prop_ro("pad_id", &px::text::Tokenizer::pad_id);
  m.def("load_tokenizer", &px::text::load_tokenizer, nb::arg("path"));
  m.def(
      "train_sentencepiece",
      [](const std::vector<std::string>& docs, const std::string& path, int64_t vocab_size,
         const std::string& model_type, int64_t max_sentences, uint64_t seed) {
        px::text::SentencePieceTrainOptions o;
        o.vocab_size = vocab_size;
        o.model_type = model_type;
        o.max_sentences = max_sentences;
        o.seed = seed;
        px::text::train_sentencepiece(docs, path, o);
      },
      nb::arg("documents"), nb::arg("model_path"), nb::arg("vocab_size") = 8000, nb::arg("model_type") = "unigram",
      nb::arg("max_sentences") = 100000, nb::arg("seed") = 0, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace pxpy
