// The pax command line, as a library function: tools/pax/main.cc calls it, and a program that
// registers its own experiments can too.
//
//   pax list
//   pax describe --exp=copy.TransformerLmTiny
//   pax plan --exp=c4.C4Spmd16BAdam32Replicas --cluster=h100x8
//   pax train --exp=copy.TransformerLmTiny --job_log_dir=/tmp/job --set train.steps=50
//   pax eval --job_log_dir=/tmp/job --config /tmp/job/config.toml
//   pax decode --job_log_dir=/tmp/job --config /tmp/job/config.toml --prompt "The meaning of"
//   pax decode --hf_model=models/gpt2-small --prompt "The meaning of"
//   pax export --format=hf --job_log_dir=/tmp/job --config /tmp/job/config.toml --out /tmp/job-hf
//
// Every user error (unknown experiment, bad --set, missing data, unwritable job dir) exits with
// code 2 and a one-line reason.
// Designated initializers leave the fields they do not name at their defaults, on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>

#include "core/env.h"
#include "io/regular_file.h"
#include "parallax/pax.h"
#include "pax/export.h"
#include "pax/model.h"
#include "pax/suggest.h"

#ifndef PX_VERSION
#define PX_VERSION "unknown"
#endif

namespace px::pax {
namespace {

// Lock-free, so the signal handler may set them.
std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

// SIGINT (Ctrl-C) and SIGTERM (kill, scancel and Slurm's preemption, docker stop, Kubernetes):
// the first asks train to finish its step, save and return; it puts both signals back to their
// default action, so that a second one (of either kind) ends the process at once.
std::atomic<int> g_signals{0};
void on_stop_signal(int sig) {
  // Over several threads two signals may be handled at once, before either resets the actions:
  // the count tells the second.
  const bool second = g_signals.fetch_add(1) > 0;
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(SIGINT, &dfl, nullptr);
  sigaction(SIGTERM, &dfl, nullptr);
  if (second) {
    raise(sig);  // delivered with the default action (the end of the process) when this handler returns
    return;
  }
  g_signal = sig;
  g_stop = true;
}

void catch_stop_signals() {
  struct sigaction sa = {};
  sa.sa_handler = on_stop_signal;
  sa.sa_flags = SA_RESTART;  // the thread that takes the signal may be in a read or write: it goes on
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGINT);  // one handler at a time
  sigaddset(&sa.sa_mask, SIGTERM);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

struct Common {
  std::string exp, job_dir, config, devices;
  std::vector<std::string> sets;
};

void add_common(CLI::App* app, Common& o, bool job_dir) {
  app->add_option("--exp", o.exp, "registered experiment name (see 'pax list')");
  if (job_dir) app->add_option("--job_log_dir", o.job_dir, "job dir: config, checkpoints, summaries, plots, logs");
  app->add_option("--set", o.sets, "override a field: --set path.to.field=value (repeatable)")->take_all();
  app->add_option("--config", o.config, "a TOML file of fields (e.g. DIR/config.toml of an earlier run)");
  app->add_option("--devices", o.devices, "devices, e.g. cpu:8 (default: PX_DEVICES, else cpu:1)");
}

// The config: the experiment (--exp), then the file (--config), then each --set. Without --exp and
// --config, the job dir's config.toml when there is one (the run that made it).
px::pax::ExperimentConfig resolve(const Common& o) {
  px::pax::ExperimentConfig c;
  const std::string job_config = o.job_dir.empty() ? std::string() : o.job_dir + "/config.toml";
  if (!o.exp.empty()) {
    c = px::pax::experiment(o.exp);
    if (!o.config.empty()) c = px::pax::from_toml_file(o.config, &c);
  } else if (!o.config.empty()) {
    c = px::pax::from_toml_file(o.config);
  } else if (!job_config.empty() && std::filesystem::exists(job_config)) {
    c = px::pax::from_toml_file(job_config);
  } else {
    throw px::UserError(
        "[pax] no experiment: pass --exp=NAME (see 'pax list') or --config FILE" +
        std::string(o.job_dir.empty() ? "" : " (" + job_config + ", read when neither is given, does not exist)"));
  }
  for (const std::string& s : o.sets) px::pax::apply_override(c, s);
  px::pax::validate(c);
  return c;
}

// A subcommand that is not one: "unknown command 'trian'; did you mean 'train'?".
std::string unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  if (std::find(names.begin(), names.end(), argv[1]) != names.end()) return "";
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ", ") + n;
  return "unknown command '" + std::string(argv[1]) + "'" + px::pax::did_you_mean(argv[1], names) +
         " (the commands: " + all + ")";
}

// For a flag the subcommand does not have: "; did you mean '--job_log_dir'?".
std::string flag_hint(CLI::App& app, int argc, char** argv) {
  if (argc < 2) return "";
  CLI::App* sub = nullptr;
  for (CLI::App* s : app.get_subcommands([](const CLI::App*) { return true; }))
    if (s->get_name() == argv[1]) sub = s;
  if (!sub) return "";
  std::vector<std::string> flags;
  for (const CLI::Option* opt : sub->get_options())
    for (const std::string& n : opt->get_lnames()) flags.push_back(n);
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--", 0) != 0 || a.size() < 3) continue;
    a = a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
    if (std::find(flags.begin(), flags.end(), a) != flags.end()) continue;
    const std::string near = px::pax::closest(a, flags);
    if (!near.empty()) return "; did you mean '--" + near + "' for '--" + a + "'?";
  }
  return "";
}

void need_job_dir(const Common& o) {
  if (o.job_dir.empty()) throw px::Error("[pax] no job dir: pass --job_log_dir=DIR");
  px::io::require_directory(o.job_dir, "[pax] --job_log_dir ");
}

}  // namespace

int cli_main(int argc, char** argv) {
  CLI::App app{"pax: declarative experiments on Parallax (train, evaluate, plan)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "pax (parallax " PX_VERSION ")");
  Common o;
  int64_t eval_step = -1, eval_batches = -1;
  bool list_fields = false;

  CLI::App* list = app.add_subcommand("list", "list the registered experiments with their summaries");
  CLI::App* describe = app.add_subcommand("describe", "print the resolved config, parameter count and sharding plan");
  CLI::App* plan = app.add_subcommand("plan", "per-param placement and per-device memory, from shapes alone");
  CLI::App* train = app.add_subcommand("train", "train, resuming from the latest checkpoint in the job dir");
  CLI::App* eval = app.add_subcommand("eval", "evaluate the latest (or a given) checkpoint");
  CLI::App* decode = app.add_subcommand("decode", "continue a prompt with the latest (or a given) checkpoint");
  CLI::App* exp = app.add_subcommand("export", "write the latest (or a given) checkpoint as a Hugging Face model dir");
  add_common(describe, o, false);
  add_common(plan, o, false);
  std::string plan_cluster = "cpu";
  plan->add_option("--cluster", plan_cluster,
                   "predict the step time and peak memory on: cpu (this machine, calibrated once), h100x8, h200x8, tpuv4, or a "
                   ".toml file (docs/auto-sharding.md); \"\" to skip")
      ->capture_default_str();
  add_common(train, o, true);
  int64_t restore_step = -1;
  train->add_option("--restore_step", restore_step,
                    "resume from this committed checkpoint instead of the latest (newer ones are set aside as "
                    "checkpoint_N.discarded, not deleted)");
  add_common(eval, o, true);
  add_common(decode, o, true);
  add_common(exp, o, true);
  std::string export_format = "hf", export_out, export_dtype = "f32";
  int64_t export_step = -1;
  uint64_t export_shard = 0;
  exp->add_option("--format", export_format, "output format: hf (a model dir: config.json + model.safetensors) or safetensors (--out FILE)");
  exp->add_option("--out", export_out, "the directory to write (created if needed)")->required();
  exp->add_option("--step", export_step, "checkpoint step (default: the latest)");
  exp->add_option("--dtype", export_dtype, "hf: the weights' dtype")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  exp->add_option("--max_shard_size", export_shard,
                  "hf: split the weights into shards of at most this size (e.g. 5GB, 500MiB; 0: one file)")
      ->transform(CLI::AsSizeValue(true));
  describe->add_flag("--fields", list_fields, "list every field: path, type, value, allowed values, meaning");
  eval->add_option("--step", eval_step, "checkpoint step (default: the latest)");
  eval->add_option("--batches", eval_batches, "eval batches (default: train.eval_batches; 0 = the whole split)");
  px::pax::DecodeOptions dopt;
  int64_t decode_step = -1;
  decode->add_option("--prompt", dopt.prompt, "the text to continue (the copy task: token ids, e.g. \"5 9 2\")")
      ->required();
  decode->add_option("--step", decode_step, "checkpoint step (default: the latest)");
  std::string hf_model;
  decode->add_option("--hf_model", hf_model, "a Hugging Face model dir to decode from instead of an experiment");
  decode->add_option("--max_new_tokens", dopt.max_new_tokens, "tokens to generate (capped by model.seq_len)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  decode->add_option("--temperature", dopt.temperature, "0: greedy; > 0: sample")->check(CLI::Range(0.0, 100.0));
  decode->add_option("--top_k", dopt.top_k, "sample among the k most likely tokens (0: all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  decode->add_option("--top_p", dopt.top_p, "nucleus sampling: the smallest set reaching this probability")
      ->check(CLI::Range(0.0, 1.0));
  decode->add_option("--seed", dopt.seed, "sampling seed");
  decode->add_flag("!--no_cache", dopt.use_cache, "recompute the whole prefix for every token (slow; for checking)");

  if (std::string bad = unknown_command(app, argc, argv); !bad.empty()) {
    std::fprintf(stderr, "pax: error: %s\n", bad.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion&) {
    std::printf("pax (parallax %s)\n", PX_VERSION);
    return 0;
  } catch (const CLI::ParseError& e) {
    const std::string sub = argc > 1 && argv[1][0] != '-' ? std::string(argv[1]) + " " : "";
    std::fprintf(stderr, "pax: error: %s%s (see 'pax %s--help')\n", e.what(), flag_hint(app, argc, argv).c_str(),
                 sub.c_str());
    return 2;
  }

  try {
    if (list->parsed()) {
      size_t w = 0;
      for (auto& e : px::pax::list_experiments()) w = std::max(w, e.name.size());
      for (auto& e : px::pax::list_experiments())
        std::printf("%-*s  %s\n", static_cast<int>(w), e.name.c_str(), e.summary.c_str());
      return 0;
    }
    if (decode->parsed()) {
      if (decode_step >= 0) dopt.step = decode_step;
      px::pax::DecodeResult r;
      if (!hf_model.empty()) {
        if (!o.exp.empty() || !o.config.empty() || !o.job_dir.empty())
          throw px::UserError("[pax] decode: --hf_model takes the model from its directory; drop --exp, --config "
                              "and --job_log_dir");
        r = px::pax::decode_pretrained(hf_model, dopt);
      } else {
        need_job_dir(o);
        r = px::pax::decode(resolve(o), {.job_dir = o.job_dir, .devices = o.devices}, dopt);
      }
      double avg = 0;
      for (double t : r.token_seconds) avg += t / static_cast<double>(std::max<size_t>(r.token_seconds.size(), 1));
      std::fprintf(stderr, "decode: %s, %zu prompt tokens, %zu new token%s%s, %.2f ms per token\n",
                   hf_model.empty() ? ("checkpoint step " + std::to_string(r.step)).c_str() : hf_model.c_str(),
                   r.prompt_ids.size(), r.new_ids.size(), r.new_ids.size() == 1 ? "" : "s",
                   r.stopped_at_eos ? " (stopped at the end-of-text token)"
                   : static_cast<int64_t>(r.new_ids.size()) < dopt.max_new_tokens ? " (the model's context is full)"
                                                                                  : "",
                   avg * 1e3);
      std::printf("%s\n", r.full_text.c_str());  // the prompt, then its continuation
      return 0;
    }
    px::pax::ExperimentConfig c = resolve(o);
    if (describe->parsed()) {
      std::cout << (list_fields ? px::pax::fields_table(c) : px::pax::describe(c));
      return 0;
    }
    if (plan->parsed()) {
      std::cout << px::pax::plan(c, o.devices, plan_cluster).text();
      return 0;
    }
    need_job_dir(o);
    // Under mpirun or srun, eval, decode and export run on rank 0 alone: they read whole
    // checkpoints on one device, and the other ranks would only repeat its output and summaries.
    // Every rank still joins the world (MPI's start-up and shut-down are collective).
    if (!train->parsed() && px::env().launch_size > 1 && px::pax::launched_world()->rank != 0) return 0;
    px::pax::RunOptions ro{.job_dir = o.job_dir, .devices = o.devices};
    if (train->parsed()) {
      ro.stop = &g_stop;
      ro.stop_signal = &g_signal;
      catch_stop_signals();
      if (restore_step >= 0) ro.restore_step = restore_step;
      px::pax::TrainResult r = px::pax::train(c, ro);
      // 128 + the signal, as a shell reports a process it ended: 130 for SIGINT, 143 for SIGTERM
      // (under mpirun a process the others stopped, without a signal of its own, says 130).
      if (r.interrupted) return 128 + (g_signal.load() ? g_signal.load() : SIGINT);
      return 0;
    }
    if (exp->parsed()) {
      std::optional<int64_t> step;
      if (export_step >= 0) step = export_step;
      if (export_shard > static_cast<uint64_t>(INT64_MAX))
        throw px::UserError("[pax] export: --max_shard_size is too large; give at most 8EB");
      int64_t done = px::pax::export_run(c, ro, export_out,
                                         {.format = export_format,
                                          .step = step,
                                          .dtype = px::dtype_from_name(export_dtype),
                                          .max_shard_bytes = static_cast<int64_t>(export_shard)});
      std::printf("exported checkpoint step %lld to %s (format %s)\n", static_cast<long long>(done),
                  export_out.c_str(), export_format.c_str());
      return 0;
    }
    if (eval->parsed()) {
      if (eval_batches >= 0) px::pax::set_field(c, "train.eval_batches", std::to_string(eval_batches));
      std::optional<int64_t> step;
      if (eval_step >= 0) step = eval_step;
      px::pax::EvalResult r = px::pax::evaluate(c, ro, step);
      std::printf("eval step %lld: loss %.4f  log_pplx %.4f  fraction_of_correct_next_step_preds %.4f  over %lld batches "
                  "(%lld tokens)\n",
                  static_cast<long long>(r.step), r.loss, r.log_pplx, r.fraction_correct,
                  static_cast<long long>(r.batches), static_cast<long long>(r.tokens));
      return 0;
    }
  } catch (const px::Error& e) {
    std::string msg = e.what();
    for (char& ch : msg)
      if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "pax: error: %s\n", msg.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pax: internal error: %s\n", e.what());
    return 1;
  }
  return 0;
}

}  // namespace px::pax
