// The pax train loop: resume, step, summarize, evaluate, checkpoint, plot.
// Designated initializers leave the fields they do not name at their defaults, on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/env.h"
#include "distributed/communicator.h"
#include "parallax/auto.h"
#include "parallax/io.h"
#include "parallax/memory.h"
#include "parallax/nn/pretrained.h"
#include "parallax/ops.h"
#include "parallax/pax.h"
#include "parallax/train.h"
#include "pax/checkpoint.h"
#include "pax/data_source.h"
#include "pax/model.h"
#include "pax/plot.h"
#include "pax/step_runner.h"
#include "pax/summary.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace px::pax {
namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

// Creates the job dir and its folders; a dir that cannot be written is a user error.
void prepare_job_dir(const std::string& dir) {
  if (dir.empty()) throw Error("[pax] no job dir: pass --job_log_dir=DIR");
  std::error_code ec;
  for (const char* sub : {"", "/logs", "/checkpoints", "/summaries/train", "/summaries/eval_test", "/plots"}) {
    fs::create_directories(dir + sub, ec);
    if (ec)
      throw Error("[pax] cannot create the job dir '" + dir + sub + "': " + ec.message() +
                  "; pass a writable --job_log_dir");
  }
  const std::string probe = dir + "/logs/.write_test." + std::to_string(::getpid());  // one per process
  std::ofstream f(probe);
  if (!f) throw Error("[pax] the job dir '" + dir + "' is not writable; pass a writable --job_log_dir");
  f.close();
  fs::remove(probe, ec);
}

void write_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text;
    if (!f) throw Error("[pax] cannot write '" + path + "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error("[pax] cannot write '" + path + "': " + ec.message());
}

std::string hms(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  long t = std::lround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%ld:%02ld", t / 60, t % 60);
  return buf;
}

// Sums over an eval set: weighted cross entropy, weighted correct predictions, weights.
class Evaluator {
 public:
  Evaluator(const ExperimentConfig& c, nn::TransformerLm& model)
      : fn_(
            model.store(), [&model](const std::vector<Tensor>& b) { return sums(model, b); }, batch_types(c),
            ForwardOptions{.compile = {.compute_dtype = model.config().compute_dtype}}) {}

  EvalResult run(const std::vector<Array>& params, const DataSource& data, int64_t n) {
    EvalResult r;
    double ce = 0, correct = 0, w = 0;
    for (int64_t i = 0; i < n; ++i) {
      data::LmBatch b = data.eval_batch(i);
      std::vector<Array> out = fn_(params, {b.tokens, b.targets, b.weights});
      ce += out[0].to_f32()[0], correct += out[1].to_f32()[0], w += out[2].to_f32()[0];
    }
    r.batches = n;
    r.tokens = static_cast<int64_t>(std::llround(w));
    r.loss = r.log_pplx = w > 0 ? ce / w : 0;
    r.fraction_correct = w > 0 ? correct / w : 0;
    return r;
  }

 private:
  // A prediction is correct when the target's logit is the largest (argmax; ties count as correct).
  static std::vector<Tensor> sums(const nn::TransformerLm& model, const std::vector<Tensor>& b) {
    Tensor logits = model.logits(b[0]);
    const int64_t vocab = logits.shape().back();
    Tensor target_logit = sum(logits * one_hot(b[1], vocab), {-1});
    Tensor ce = logsumexp(logits, -1) - target_logit;
    Tensor best = max(logits, {-1});
    Tensor correct = cast(greater_equal(target_logit, best), DType::f32);
    return {sum(ce * b[2]), sum(correct * b[2]), sum(b[2])};
  }
  ForwardFn fn_;
};

int64_t eval_batch_count(const ExperimentConfig& c, const DataSource& data, std::ostream& log) {
  const int64_t avail = data.num_eval_batches();
  if (avail <= 0) throw Error("[pax] the eval split is empty; raise data.eval_fraction or give more data");
  if (c.train.eval_batches == 0) return avail;
  if (c.train.eval_batches > avail) {
    log << "note: train.eval_batches=" << c.train.eval_batches << " but the eval split has " << avail
        << " batches; evaluating all " << avail << "\n";
    return avail;
  }
  return c.train.eval_batches;
}

// The run's outputs: logs, metrics.jsonl, event files and plots. Over several processes only
// rank 0's reporter is `enabled`; the others' write and print nothing.
class Reporter {
 public:
  Reporter(const ExperimentConfig& c, const RunOptions& o, int64_t restored_step, bool enabled)
      : dir_(o.job_dir), out_(o.out ? *o.out : std::cout), enabled_(enabled) {
    if (!enabled_) return;
    // Lines past the checkpoint we resume from belong to a run that is being redone: drop them,
    // so that metrics.jsonl reads like one uninterrupted run.
    std::vector<std::string> keep;
    {
      std::ifstream f(dir_ + "/metrics.jsonl");
      std::string line;
      while (std::getline(f, line)) {
        if (line.empty()) continue;
        json j;
        try {
          j = json::parse(line);
        } catch (...) {
          continue;  // a line cut by a crash
        }
        if (j.value("step", int64_t{0}) > restored_step) continue;
        keep.push_back(line);
        remember(j);
      }
    }
    std::string text;
    for (auto& l : keep) text += l + "\n";
    write_file(dir_ + "/metrics.jsonl", text);
    metrics_.open(dir_ + "/metrics.jsonl", std::ios::app);
    log_.open(dir_ + "/logs/train.log", std::ios::app);
    if (!metrics_ || !log_) throw Error("[pax] cannot write to the job dir '" + dir_ + "'");
    train_ = std::make_unique<EventWriter>(dir_ + "/summaries/train");
    eval_ = std::make_unique<EventWriter>(dir_ + "/summaries/eval_test");
    tty_ = o.progress && isatty(2);
  }

  void line(const std::string& s) {
    if (!enabled_) return;
    if (tty_) std::cerr << "\r\033[K";
    out_ << s << "\n" << std::flush;
    log_ << s << "\n" << std::flush;
  }
  void progress(const std::string& s) {
    if (tty_) std::cerr << "\r\033[K" << s << std::flush;
  }
  void end_progress() {
    if (tty_) std::cerr << "\r\033[K" << std::flush;
  }

  void scalars(const std::string& split, int64_t step, const std::map<std::string, double>& v) {
    if (!enabled_) return;
    const double t = now_s();
    (split == "train" ? *train_ : *eval_).scalars(step, v, t);
    (split == "train" ? *train_ : *eval_).flush();
    json j{{"split", split}, {"step", step}, {"wall_time", t}};
    for (auto& [k, x] : v) j[k] = x;
    metrics_ << j.dump() << "\n" << std::flush;
    remember(j);
    redraw();
  }

 private:
  void remember(const json& j) {
    const std::string split = j.value("split", "");
    auto add = [&](std::vector<double>& xs, std::vector<double>& ys, const char* key) {
      if (j.contains(key) && j[key].is_number()) {
        xs.push_back(j.value("step", 0.0));
        ys.push_back(j[key].get<double>());
      }
    };
    if (split == "train") add(tx_, tloss_, "loss"), add(tpx_, tpplx_, "log_pplx");
    if (split == "eval_test") add(ex_, eloss_, "loss"), add(epx_, epplx_, "log_pplx");
  }
  void redraw() {
    try {
      plot_png(dir_ + "/plots/loss.png", "loss", "step", "loss",
               {{"train", tx_, tloss_, 0x1f77b4, false}, {"eval", ex_, eloss_, 0xd62728, true}});
      plot_png(dir_ + "/plots/log_pplx.png", "log perplexity", "step", "log_pplx",
               {{"train", tpx_, tpplx_, 0x1f77b4, false}, {"eval", epx_, epplx_, 0xd62728, true}});
    } catch (const Error& e) {
      if (!plot_warned_) line(std::string("warning: ") + e.what());
      plot_warned_ = true;
    }
  }

  std::string dir_;
  std::ostream& out_;
  std::ofstream metrics_, log_;
  std::unique_ptr<EventWriter> train_, eval_;
  bool enabled_ = true, tty_ = false, plot_warned_ = false;
  std::vector<double> tx_, tloss_, tpx_, tpplx_, ex_, eloss_, epx_, epplx_;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

TrainResult train(const ExperimentConfig& cfg, const RunOptions& opts) {
  ExperimentConfig c = cfg;
  check_runnable(c);
  prepare_job_dir(opts.job_dir);
  const std::string dir = opts.job_dir;
  Mesh mesh = make_mesh(c, resolve_devices(c, opts.devices, /*for_planning=*/false));
  // Under mpirun / srun: every process trains on the same config and mesh (checked), rank 0 alone
  // prepares the data first (tokenizer and caches in the job dir) and writes the outputs.
  const ProcessWorld* world = launched_world();
  Communicator* comm = world && world->size > 1 ? world->communicator : nullptr;
  const bool primary = !world || world->rank == 0;
  if (comm)
    check_same_on_every_process(*comm, world->rank, "configs", to_toml(c) + "\nmesh = " + mesh.to_string() + "\n");
  std::unique_ptr<DataSource> data;
  if (primary) data = make_data_source(c, dir);
  if (comm) comm->barrier();
  if (!primary) data = make_data_source(c, dir);
  if (primary) write_file(dir + "/config.toml", to_toml(c));

  nn::TransformerLm model(lm_config(c));
  std::unique_ptr<StepRunner> runner = make_step_runner(c, model, mesh);
  // The plan the step runs (AUTO solved it once, there).
  const ShardingPlan& splan = runner->plan();
  PlanReport rep = plan_report(c, model, splan);
  if (primary) {
    write_file(dir + "/plan.txt", rep.text());
    write_file(dir + "/model_params.txt", model_params_text(splan));
  }

  Checkpoints ckpt(dir, c.train.checkpoint_keep);
  const std::string config_json = nlohmann::json{{"experiment", c.name}, {"config_toml", to_toml(c)}}.dump();
  int64_t start = 0;
  std::string origin = "from scratch";
  std::string set_aside;  // newer checkpoints moved away by --restore_step
  if (opts.restore_step) {
    std::vector<int64_t> all = ckpt.steps();
    if (std::find(all.begin(), all.end(), *opts.restore_step) == all.end()) {
      std::string list;
      for (int64_t s : all) list += (list.empty() ? "" : ", ") + std::to_string(s);
      throw Error("[pax] --restore_step=" + std::to_string(*opts.restore_step) +
                  ": no committed checkpoint at that "
                  "step in " +
                  dir + "/checkpoints; the committed steps are " + (list.empty() ? "(none)" : list));
    }
    if (primary)  // one process renames; the others wait for it
      for (const std::string& p : ckpt.set_aside_after(*opts.restore_step))
        set_aside += (set_aside.empty() ? "" : ", ") + p;
    if (comm) comm->barrier();
  }
  if (auto last = opts.restore_step ? opts.restore_step : ckpt.latest()) {
    std::string ds = ckpt.restore(*last, *runner);
    if (!ds.empty()) data->restore(ds);
    start = runner->step_count();
    origin = "resumed at step " + std::to_string(start) + (set_aside.empty() ? "" : " (set aside: " + set_aside + ")");
  } else if (!c.train.init_from_hf.empty()) {
    // lm_config already checked the sizes; the loader checks every tensor against them (the same
    // config gives the same params in the same order).
    runner->init_from_pretrained(c.train.init_from_hf);
    origin = "from " + c.train.init_from_hf;
  }
  Reporter report(c, opts, start, primary);
  Evaluator evaluator(c, model);
  std::ostringstream quiet;
  const int64_t n_eval = eval_batch_count(c, *data, primary ? std::cout : quiet);

  TrainResult result;
  result.first_step = result.last_step = start;
  report.line("pax train " + c.name + ": " + std::to_string(rep.param_count) + " params on " + mesh.to_string() + ", " +
              c.sharding.strategy + ", " + origin + "; job dir " + dir);
  if (start >= c.train.steps) {
    report.line("already trained to step " + std::to_string(start) + " (train.steps=" + std::to_string(c.train.steps) +
                "); raise train.steps to continue");
    return result;
  }

  auto do_eval = [&](int64_t step) {
    EvalResult e = evaluator.run(runner->params(), *data, n_eval);
    report.scalars(
        "eval_test", step,
        {{"loss", e.loss}, {"log_pplx", e.log_pplx}, {"fraction_of_correct_next_step_preds", e.fraction_correct}});
    report.line("eval  step " + std::to_string(step) + "  loss " + fmt("%.4f", e.loss) + "  accuracy " +
                fmt("%.4f", e.fraction_correct) + "  over " + std::to_string(e.batches) + " batches (" +
                std::to_string(e.tokens) + " tokens)");
    result.last_eval_loss = e.loss;
  };
  auto do_checkpoint = [&](int64_t step) {
    ckpt.save(step, *runner, config_json, data->state());
    report.line("checkpoint step " + std::to_string(step) + " -> " + ckpt.path(step));
  };

  const int64_t tokens_per_step = c.data.batch * c.model.seq_len;
  // MFU: the model's matmul FLOPs per step against the matmul peak of every device of the run on
  // sharding.cluster (its devices' rate at the model's dtype; virtual CPU devices share the host's).
  const double model_flops = model_flops_per_step(c, model);
  const Cluster cluster = load_cluster(c.sharding.cluster);
  const double peak_flops = cluster.device_on(mesh).matmul_flops(c.model.dtype == "bf16" ? DType::bf16 : DType::f32) *
                            static_cast<double>(mesh.size());
  auto peak_memory = [&] {
    int64_t most = 0;
    for (int d : runner->device_ids()) most = std::max(most, memory_stats(Placement{d}).peak_bytes_in_use);
    return most;
  };
  const double t_start = now_s();
  double t_window = t_start, t_first = t_start;
  int64_t window_steps = 0;
  double loss_sum = 0;
  for (int64_t step = start + 1; step <= c.train.steps; ++step) {
    data::LmBatch b = data->next_train();
    StepMetrics m = runner->step({b.tokens, b.targets, b.weights});
    result.last_step = step;
    result.last_loss = m.loss;
    ++window_steps;
    loss_sum += m.loss;
    const double t = now_s();
    // The rate leaves out the first step, which pays for first-run allocations.
    if (step == start + 1) t_first = t;
    const double rate =
        step > start + 1 ? (step - start - 1) / std::max(t - t_first, 1e-9) : 1 / std::max(t - t_start, 1e-9);
    report.progress("step " + std::to_string(step) + "/" + std::to_string(c.train.steps) + "  loss " +
                    fmt("%.4f", m.loss) + "  " + fmt("%.0f", rate * tokens_per_step) + " tokens/s  ETA " +
                    hms((c.train.steps - step) / rate));
    if (step % c.train.summary_interval == 0 || step == c.train.steps) {
      const double sps = window_steps / std::max(t - t_window, 1e-9);
      report.scalars("train", step,
                     {{"loss", m.loss},
                      {"log_pplx", m.loss},
                      {"learning_rate", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"grad_norm_clipped",
                       c.optimizer.clip_norm > 0 ? std::min<double>(m.grad_norm, c.optimizer.clip_norm) : m.grad_norm},
                      {"steps_per_sec", sps},
                      {"tokens_per_sec", sps * tokens_per_step},
                      {"mfu", model_flops * sps / peak_flops},
                      {"peak_memory_bytes_per_device", static_cast<double>(peak_memory())}});
      report.line("train step " + std::to_string(step) + "  loss " + fmt("%.4f", m.loss) + "  mean " +
                  fmt("%.4f", loss_sum / window_steps) + "  lr " + fmt("%.3g", m.lr) + "  grad_norm " +
                  fmt("%.3g", m.grad_norm) + "  " + fmt("%.0f", sps * tokens_per_step) + " tokens/s  MFU " +
                  fmt("%.1f", 100 * model_flops * sps / peak_flops) + "%  ETA " + hms((c.train.steps - step) / rate));
      t_window = t, window_steps = 0, loss_sum = 0;
    }
    const bool last = step == c.train.steps;
    bool stop = opts.stop && opts.stop->load();
    if (comm) {  // every process stops at the same step (a Ctrl-C may reach them at different ones)
      std::vector<int32_t> mine(comm->local_positions().size(), stop ? 1 : 0), any(mine.size());
      Buffers ins;
      MutBuffers outs;
      for (size_t i = 0; i < mine.size(); ++i) ins.push_back(&mine[i]), outs.push_back(&any[i]);
      DeviceGroups all(1);
      for (int64_t p = 0; p < comm->world_size(); ++p) all[0].push_back(static_cast<int>(p));
      comm->all_reduce(ins, outs, 1, DType::i32, ReduceOp::max, all);
      stop = any[0] != 0;
    }
    if (last || (c.train.eval_interval > 0 && step % c.train.eval_interval == 0)) do_eval(step);
    if (last || stop || (c.train.checkpoint_interval > 0 && step % c.train.checkpoint_interval == 0))
      do_checkpoint(step);
    if (stop && !last) {
      report.line("interrupted at step " + std::to_string(step) + "; rerun the same command to continue");
      result.interrupted = true;
      break;
    }
  }
  ckpt.wait();  // the last checkpoint is committed (or its error thrown) before train returns
  if (env().profile && result.last_step > start) {
    // PX_PROFILE=1: where the step's time went, and the last step unit by unit (every process its own).
    const Executable& exe = runner->executable();
    if (primary) write_file(dir + "/profile.txt", exe.profile_report(40));
    write_file(dir + (world && world->size > 1 ? "/timeline_rank" + std::to_string(world->rank) + ".json"
                                               : std::string("/timeline.json")),
               exe.timeline().chrome_trace());
  }
  report.end_progress();
  if (!result.interrupted)
    report.line("done: step " + std::to_string(result.last_step) + ", summaries in " + dir + "/summaries, plots in " +
                dir + "/plots, checkpoints in " + dir + "/checkpoints");
  return result;
}

EvalResult evaluate(const ExperimentConfig& c, const RunOptions& opts, std::optional<int64_t> step) {
  check_runnable(c);
  prepare_job_dir(opts.job_dir);
  std::unique_ptr<DataSource> data = make_data_source(c, opts.job_dir);
  nn::TransformerLm model(lm_config(c));
  std::vector<Array> params = Checkpoints(opts.job_dir, c.train.checkpoint_keep).params(step, model);
  std::ostringstream note;
  const int64_t n = eval_batch_count(c, *data, note);
  Evaluator ev(c, model);
  EvalResult r = ev.run(params, *data, n);
  r.step = *step;
  std::ostream& out = opts.out ? *opts.out : std::cout;
  out << note.str();
  EventWriter w(opts.job_dir + "/summaries/eval_test");
  w.scalars(*step,
            {{"loss", r.loss}, {"log_pplx", r.log_pplx}, {"fraction_of_correct_next_step_preds", r.fraction_correct}});
  return r;
}

}  // namespace px::pax
