// pax from Python: experiments by name, overrides by dotted path, train / eval / decode / plan.
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bind.h"
#include "parallax/pax.h"
#include "parallax/text_data.h"

namespace pxpy {
namespace {

namespace pax = px::pax;

pax::RunOptions run_options(const std::string& job_dir, const std::string& devices, std::ostringstream* log) {
  pax::RunOptions o;
  o.job_dir = job_dir;
  o.devices = devices;
  o.progress = false;
  o.out = log;
  return o;
}

}  // namespace

void bind_pax(nb::module_& m) {
  nb::module_ d = m.def_submodule("_data", "text corpora (px::data)");
  d.def("gcide_path", &px::data::gcide_path);
  d.def("read_gcide", &px::data::read_gcide, nb::arg("max_documents") = 0,
        "The installed GCIDE dictionary as plain-text documents, one per entry.",
        nb::call_guard<nb::gil_scoped_release>());
  d.def("read_documents", &px::data::read_documents, nb::arg("paths"), nb::arg("max_documents") = 0,
        nb::arg("max_document_bytes") = int64_t{64} << 20, nb::call_guard<nb::gil_scoped_release>());

  nb::module_ p = m.def_submodule("_pax", "pax experiments (px::pax)");
  nb::class_<pax::ExperimentConfig>(p, "ExperimentConfig", "A resolved experiment: every field by dotted path.")
      .def(nb::init<const pax::ExperimentConfig&>())
      .def_ro("name", &pax::ExperimentConfig::name)
      .def_ro("summary", &pax::ExperimentConfig::summary)
      .def("set", &pax::set_field, nb::arg("path"), nb::arg("text"), "Sets a field as --set would (validated).")
      .def("get", &pax::field_text, nb::arg("path"))
      .def("validate", [](const pax::ExperimentConfig& c) { pax::validate(c); })
      .def("fields_table", [](const pax::ExperimentConfig& c) { return pax::fields_table(c); })
      .def("to_toml", [](const pax::ExperimentConfig& c) { return pax::to_toml(c); })
      .def("describe", [](const pax::ExperimentConfig& c) { return pax::describe(c); });

  p.def("experiment", &pax::experiment, nb::arg("name"));
  p.def("list_experiments", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto& e : pax::list_experiments()) out.emplace_back(e.name, e.summary);
    return out;
  });
  p.def("register_experiment", &pax::register_experiment, nb::arg("name"), nb::arg("summary"), nb::arg("fn"));
  p.def(
      "plan",
      [](const pax::ExperimentConfig& c, const std::string& devices, const std::string& cluster) {
        return pax::plan(c, devices, cluster).text();
      },
      nb::arg("config"), nb::arg("devices") = "", nb::arg("cluster") = "");

  nb::class_<pax::TrainResult>(p, "TrainResult")
      .def_ro("first_step", &pax::TrainResult::first_step)
      .def_ro("last_step", &pax::TrainResult::last_step)
      .def_ro("interrupted", &pax::TrainResult::interrupted)
      .def_ro("last_loss", &pax::TrainResult::last_loss)
      .def_ro("last_eval_loss", &pax::TrainResult::last_eval_loss);
  // Returns (result, log text): the log lines pax prints, collected while it ran.
  p.def(
      "train",
      [](const pax::ExperimentConfig& c, const std::string& job_dir, const std::string& devices) {
        std::ostringstream log;
        pax::TrainResult r;
        {
          nb::gil_scoped_release release;
          r = pax::train(c, run_options(job_dir, devices, &log));
        }
        return std::make_pair(r, log.str());
      },
      nb::arg("config"), nb::arg("job_dir"), nb::arg("devices") = "");

  nb::class_<pax::EvalResult>(p, "EvalResult")
      .def_ro("step", &pax::EvalResult::step)
      .def_ro("batches", &pax::EvalResult::batches)
      .def_ro("tokens", &pax::EvalResult::tokens)
      .def_ro("loss", &pax::EvalResult::loss)
      .def_ro("log_pplx", &pax::EvalResult::log_pplx)
      .def_ro("fraction_correct", &pax::EvalResult::fraction_correct);
  p.def(
      "evaluate",
      [](const pax::ExperimentConfig& c, const std::string& job_dir, std::optional<int64_t> step) {
        std::ostringstream log;
        nb::gil_scoped_release release;
        return pax::evaluate(c, run_options(job_dir, "", &log), step);
      },
      nb::arg("config"), nb::arg("job_dir"), nb::arg("step") = nb::none());

  nb::class_<pax::DecodeResult>(p, "DecodeResult")
      .def_ro("step", &pax::DecodeResult::step)
      .def_ro("prompt_ids", &pax::DecodeResult::prompt_ids)
      .def_ro("new_ids", &pax::DecodeResult::new_ids)
      .def_ro("text", &pax::DecodeResult::text);
  p.def(
      "decode",
      [](const pax::ExperimentConfig& c, const std::string& job_dir, const std::string& prompt, int64_t max_new_tokens,
         double temperature, int64_t top_k, uint64_t seed) {
        pax::DecodeOptions d;
        d.prompt = prompt;
        d.max_new_tokens = max_new_tokens;
        d.temperature = temperature;
        d.top_k = top_k;
        d.seed = seed;
        std::ostringstream log;
        nb::gil_scoped_release release;
        return pax::decode(c, run_options(job_dir, "", &log), d);
      },
      nb::arg("config"), nb::arg("job_dir"), nb::arg("prompt"), nb::arg("max_new_tokens") = 32,
      nb::arg("temperature") = 0.0, nb::arg("top_k") = 0, nb::arg("seed") = 0);
}

}  // namespace pxpy
