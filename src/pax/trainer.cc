// The pax train loop: resume, step, summarize, evaluate, checkpoint, plot.
// Designated initializers leave the fields they do not name at their defaults, on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/env.h"
#include "parallax/auto.h"
#include "parallax/communicator.h"
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
#include "runtime/fma_peak.h"

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

// The job dir's owner: an exclusive flock on DIR/.lock, held while train runs, with the owner's
// host and pid in the file. The kernel drops the lock when the process ends, however it ends, so
// a crashed run leaves nothing to clean up.
class JobLock {
 public:
  explicit JobLock(const std::string& dir) : path_(dir + "/.lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      throw Error("[pax] cannot create the lock file '" + path_ + "': " + std::strerror(errno) +
                  "; pass a writable --job_log_dir");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      char buf[512] = {};
      const ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      ::close(fd_);
      fd_ = -1;
      std::string owner = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string("owner unknown");
      while (!owner.empty() && (owner.back() == '\n' || owner.back() == ' ')) owner.pop_back();
      if (err == EWOULDBLOCK)
        throw UserError("[pax] the job dir '" + dir + "' is in use by another pax train (" + owner + ", per " + path_ +
                        "); wait for it to end or stop it, or pass another --job_log_dir");
      throw Error("[pax] cannot lock '" + path_ + "': " + std::strerror(err));
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    const std::time_t t = std::time(nullptr);
    std::tm utc{};
    gmtime_r(&t, &utc);
    char when[64];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
    const std::string me =
        std::string("host ") + host + ", pid " + std::to_string(::getpid()) + ", since " + when + "\n";
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size())) {
      const int err = errno;
      ::close(fd_);  // and with it the lock
      fd_ = -1;
      throw Error("[pax] cannot write the lock file '" + path_ + "': " + std::strerror(err));
    }
  }
  ~JobLock() {
    if (fd_ < 0) return;
    const int rc = ::ftruncate(fd_, 0);  // an empty file: nobody holds it (the flock is what counts)
    (void)rc;
    ::close(fd_);
  }
  JobLock(const JobLock&) = delete;
  JobLock& operator=(const JobLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

// What a rerun in a job dir may change: how long and how often, where and how it runs. Everything
// else (model, data, tokenizer, optimizer, schedule, seed, the model it started from) is the job.
bool may_change_on_rerun(const std::string& path) {
  if (path.rfind("sharding.", 0) == 0 || path.rfind("memory.", 0) == 0) return true;
  for (const char* p : {"train.steps", "train.eval_interval", "train.eval_batches", "train.checkpoint_interval",
                        "train.checkpoint_keep", "train.summary_interval", "train.on_nonfinite", "data.cache_dir"})
    if (path == p) return true;
  return false;
}

bool same_value(const FieldValue& a, const FieldValue& b) {
  if (a.index() != b.index()) return false;
  if (auto* x = std::get_if<double>(&a)) {  // a float written to TOML and read back may differ in the last bit
    const double y = std::get<double>(b);
    return *x == y || std::abs(*x - y) <= 1e-12 * std::max(std::abs(*x), std::abs(y));
  }
  return a == b;
}

// Before anything in the job dir is written: a job dir with a checkpoint holds one job, and a
// rerun that would train another (another model, data, optimizer, ...) is an error naming each
// field that differs. Without a checkpoint nothing is lost: the new config replaces the old one.
void check_same_job(const ExperimentConfig& c, const std::string& dir, bool has_checkpoint, std::ostream& note) {
  const std::string file = dir + "/config.toml";
  if (!fs::exists(file)) return;
  ExperimentConfig job;
  try {
    job = from_toml_file(file, &c);
  } catch (const Error& e) {
    if (!has_checkpoint) return;
    throw Error("[pax] cannot read the job's config '" + file + "' (" + e.what() +
                "); fix or remove it, or pass another --job_log_dir");
  }
  std::string differ;
  int n = 0;
  for (const FieldInfo& f : fields()) {
    if (may_change_on_rerun(f.path) || same_value(get_field(job, f.path), get_field(c, f.path))) continue;
    differ += std::string(n++ ? ", " : "") + f.path + " (job: " + field_text(job, f.path) +
              ", this run: " + field_text(c, f.path) + ")";
  }
  if (n == 0) return;
  if (!has_checkpoint) {
    note << "note: " << file << " is replaced (the job dir has no checkpoint yet); changed: " << differ << "\n";
    return;
  }
  throw UserError("[pax] the job dir '" + dir + "' holds another run: " + std::to_string(n) + " field" +
                  (n > 1 ? "s differ" : " differs") + " from its config.toml: " + differ +
                  ". Nothing was written. To continue that run, pass --config " + file +
                  " (train.steps, the intervals, sharding.* and memory.* may change); to train this config, pass "
                  "another --job_log_dir");
}

// True on every process when `flag` is true on any (a collective: every process calls it).
bool on_any_process(Communicator* comm, bool flag) {
  if (!comm) return flag;
  std::vector<int32_t> mine(comm->local_positions().size(), flag ? 1 : 0), any(mine.size());
  Buffers ins;
  MutBuffers outs;
  for (size_t i = 0; i < mine.size(); ++i) ins.push_back(&mine[i]), outs.push_back(&any[i]);
  DeviceGroups all(1);
  for (int64_t p = 0; p < comm->world_size(); ++p) all[0].push_back(static_cast<int>(p));
  comm->all_reduce(ins, outs, 1, DType::i32, ReduceOp::max, all);
  return any[0] != 0;
}

std::string signal_name(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  return sig ? "signal " + std::to_string(sig) : std::string("a stop request");
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
    // The same for the event files, and a SessionLog START at the first step this run writes, so
    // that TensorBoard also forgets those steps in copies of older files (it purges on START).
    for (const char* sub : {"/summaries/train", "/summaries/eval_test"}) drop_events_after(dir_ + sub, restored_step);
    train_ = std::make_unique<EventWriter>(dir_ + "/summaries/train");
    eval_ = std::make_unique<EventWriter>(dir_ + "/summaries/eval_test");
    for (EventWriter* w : {train_.get(), eval_.get()}) {
      w->session_start(restored_step + 1);
      w->flush();
    }
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

// MFU: the model's matmul FLOPs per step against the hardware's peak (runtime/fma_peak.h): this
// machine's FMA-loop peak at the model's dtype (measured once per machine and cached), times the
// run's processes (each measures the CPUs it may run on; the mesh's virtual devices share them).
// Said once, at the start. A rate above the peak means the peak is wrong: it is measured again once,
// and if the rate is still above, MFU shows 100% with a warning, never more.
class MfuMeter {
 public:
  MfuMeter(double model_flops_per_step, DType dtype, int processes, Reporter& report)
      : model_flops_(model_flops_per_step), dtype_(dtype), processes_(processes), report_(report) {
    set_peak(hardware_peak());
    report_.line("MFU against the peak " + peak_.describe(dtype_) +
                 (processes_ > 1 ? " per process, x" + std::to_string(processes_) + " processes" : std::string()));
  }
  double peak_flops() const { return peak_flops_; }

  // The MFU of `steps_per_s`, in [0, 1].
  double operator()(double steps_per_s) {
    Mfu m = model_flops_utilization(model_flops_ * steps_per_s, peak_flops_);
    if (m.over_peak && !remeasured_) {
      remeasured_ = true;
      report_.line("warning: the model's " + fmt("%.3g", model_flops_ * steps_per_s / 1e12) +
                   " TFLOP/s is above the peak of " + fmt("%.3g", peak_flops_ / 1e12) +
                   " TFLOP/s, which no kernel can beat: measuring the peak again");
      set_peak(hardware_peak(/*remeasure=*/true));
      report_.line("MFU against the peak " + peak_.describe(dtype_));
      m = model_flops_utilization(model_flops_ * steps_per_s, peak_flops_);
    }
    if (m.over_peak && !warned_) {
      warned_ = true;
      report_.line("warning: the model's " + fmt("%.3g", model_flops_ * steps_per_s / 1e12) +
                   " TFLOP/s is still above the re-measured peak: the peak or the step's FLOP count is wrong; MFU "
                   "is shown as 100% when above it (this is said once)");
    }
    return m.fraction;
  }

 private:
  void set_peak(HardwarePeak p) {
    peak_ = std::move(p);
    peak_flops_ = peak_.flops(dtype_) * processes_;
  }

  double model_flops_;
  DType dtype_;
  int processes_;
  Reporter& report_;
  HardwarePeak peak_;
  double peak_flops_ = 0;
  bool remeasured_ = false, warned_ = false;
};

}  // namespace

TrainResult train(const ExperimentConfig& cfg, const RunOptions& opts) {
  ExperimentConfig c = cfg;
  check_runnable(c);
  prepare_job_dir(opts.job_dir);
  const std::string dir = opts.job_dir;
  std::ostream& out = opts.out ? *opts.out : std::cout;
  Mesh mesh = make_mesh(c, resolve_devices(c, opts.devices, /*for_planning=*/false));
  // Under mpirun / srun: every process trains on the same config and mesh (checked), rank 0 alone
  // owns the job dir, prepares the data first (tokenizer and caches in the job dir) and writes the
  // outputs.
  const ProcessWorld* world = launched_world();
  Communicator* comm = world && world->size > 1 ? world->communicator : nullptr;
  const bool primary = !world || world->rank == 0;
  if (comm)
    check_same_on_every_process(*comm, world->rank, "configs", to_toml(c) + "\nmesh = " + mesh.to_string() + "\n");
  // Own the job dir, and check that this run continues the job there, before writing anything.
  std::unique_ptr<JobLock> lock;
  std::exception_ptr refused;
  std::ostringstream note;
  if (primary) try {
      lock = std::make_unique<JobLock>(dir);
      check_same_job(c, dir, Checkpoints(dir, c.train.checkpoint_keep).latest().has_value(), note);
    } catch (const Error&) {
      refused = std::current_exception();
    }
  if (on_any_process(comm, refused != nullptr)) {
    if (refused) std::rethrow_exception(refused);
    throw UserError("[pax] process 0 could not take the job dir '" + dir + "' (its error says why)");
  }
  if (primary) out << note.str();
  // The model's config (with train.init_from_hf: checked against its config.json) before the data,
  // whose preparation may take minutes.
  const nn::LmConfig lmc = lm_config(c);

  std::unique_ptr<DataSource> data;
  if (primary) data = make_data_source(c, dir, &out);
  if (comm) comm->barrier();
  if (!primary) data = make_data_source(c, dir);
  if (primary) write_file(dir + "/config.toml", to_toml(c));

  nn::TransformerLm model(lmc);
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
    if (std::find(all.begin(), all.end(), *opts.restore_step) == all.end())
      throw Error("[pax] --restore_step=" + std::to_string(*opts.restore_step) +
                  ": no committed checkpoint at that step in " + dir + "/checkpoints; the committed steps are " +
                  ckpt.steps_text());
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
  const int64_t n_eval = eval_batch_count(c, *data, primary ? out : quiet);

  TrainResult result;
  result.first_step = result.last_step = start;
  report.line("pax train " + c.name + ": " + std::to_string(rep.param_count) + " params on " + mesh.to_string() + ", " +
              c.sharding.strategy + ", " + origin + "; job dir " + dir);
  if (start >= c.train.steps) {
    report.line("already trained to step " + std::to_string(start) + " (train.steps=" + std::to_string(c.train.steps) +
                "); raise train.steps to continue");
    return result;
  }

  // A signal during the data preparation or the compilation: nothing is trained, nothing to save.
  if (on_any_process(comm, opts.stop && opts.stop->load())) {
    const int sig = opts.stop_signal ? opts.stop_signal->load() : 0;
    report.line("stopped by " + (sig || !comm ? signal_name(sig) : std::string("a signal to another process")) +
                " before the first step (" + (start > 0 ? "still at step " + std::to_string(start) : "nothing trained") +
                "); rerun the same command to continue");
    result.interrupted = true;
    return result;
  }

  // Seconds spent in evals, checkpoint saves and summaries, which the throughput leaves out: in the current
  // summary window, and since the first step.
  double excluded_window = 0, excluded_total = 0;
  auto timed = [&](auto&& fn) {
    const double t0 = now_s();
    fn();
    const double dt = now_s() - t0;
    excluded_window += dt, excluded_total += dt;
  };
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
  auto report_committed = [&](std::optional<int64_t> s) {
    if (s) report.line("committed step " + std::to_string(*s) + " -> " + ckpt.path(*s));
  };
  int64_t saved_step = -1;
  auto do_checkpoint = [&](int64_t step) {
    report_committed(ckpt.finish());  // the previous save, which the next one waits for anyway
    ckpt.save(step, *runner, config_json, data->state());
    saved_step = step;
    report.line("saving step " + std::to_string(step) + " -> " + ckpt.path(step));
  };

  const int64_t tokens_per_step = c.data.batch * c.model.seq_len;
  MfuMeter mfu(model_flops_per_step(c, model), c.model.dtype == "bf16" ? DType::bf16 : DType::f32,
               world ? world->size : 1, report);
  auto peak_memory = [&] {
    int64_t most = 0;
    for (int d : runner->device_ids())
      most = std::max(most, memory_stats({d, MemoryKind::device, mesh.platform()}).peak_bytes_in_use);
    return most;
  };
  const double t_start = now_s();
  double t_window = t_start, t_first = t_start;
  int64_t window_steps = 0, skipped_in_a_row = 0;
  double loss_sum = 0;
  bool warned_nonfinite = false;
  for (int64_t step = start + 1; step <= c.train.steps;) {
    data::LmBatch b = data->next_train();
    StepMetrics m = runner->step({b.tokens, b.targets, b.weights});
    const bool finite = m.finite && std::isfinite(m.loss) && std::isfinite(m.grad_norm);
    if (!finite) {
      const std::string what = "step " + std::to_string(step) + ": the loss is " + fmt("%g", m.loss) +
                               " and the gradient norm " + fmt("%g", m.grad_norm);
      if (c.train.on_nonfinite == "stop") {
        report.end_progress();
        report_committed(ckpt.finish());
        throw UserError("[pax] " + what +
                        " (training diverged); the run stops without saving this step "
                        "(train.on_nonfinite=stop); the last checkpoint is " +
                        (ckpt.latest() ? "step " + std::to_string(*ckpt.latest()) : std::string("none")) +
                        ". Lower optimizer.lr, raise schedule.warmup_steps or set optimizer.clip_norm, or pass " +
                        "--set train.on_nonfinite=skip (skip such updates) or =continue (train on)");
      }
      if (m.skipped) {
        report.line("warning: " + what +
                    "; update skipped (train.on_nonfinite=skip), the step is trained again on "
                    "the next batch");
        if (++skipped_in_a_row >= 100)
          throw UserError("[pax] " + what +
                          "; 100 updates in a row skipped (train.on_nonfinite=skip): training "
                          "diverged; lower optimizer.lr or resume from an earlier checkpoint with --restore_step");
      } else if (!warned_nonfinite) {
        report.line("warning: " + what + "; training on (train.on_nonfinite=continue); this is said once");
        warned_nonfinite = true;
      }
    }
    if (!m.skipped) {
      skipped_in_a_row = 0;
      result.last_step = step;
      result.last_loss = m.loss;
      ++window_steps;
      loss_sum += m.loss;
    }
    const double t = now_s();
    // The rates leave out the first step, which pays for first-run allocations. The throughput
    // shown leaves out the time of evals, checkpoint saves and summaries too; the ETA (wall time
    // to go) does not, as those will come again.
    if (step == start + 1) t_first = t, excluded_total = 0;
    const double rate = step > start + 1 ? (step - start - 1) / std::max(t - t_first - excluded_total, 1e-9)
                                         : 1 / std::max(t - t_start, 1e-9);
    const double wall_rate = step > start + 1 ? (step - start - 1) / std::max(t - t_first, 1e-9) : rate;
    report.progress("step " + std::to_string(step) + "/" + std::to_string(c.train.steps) + "  loss " +
                    fmt("%.4f", m.loss) + "  " + fmt("%.0f", rate * tokens_per_step) + " tokens/s  ETA " +
                    hms((c.train.steps - step) / wall_rate));
    const bool last = step == c.train.steps && !m.skipped;
    if (!m.skipped && (step % c.train.summary_interval == 0 || last) && window_steps > 0) {
      const double sps = window_steps / std::max(t - t_window - excluded_window, 1e-9);
      const double mean = loss_sum / static_cast<double>(window_steps);
      t_window = t, window_steps = 0, loss_sum = 0, excluded_window = 0;
      // Writing the summary (event files, metrics.jsonl, plots) is left out of the next window too.
      timed([&] {
        const double utilization = mfu(sps);
        report.scalars(
            "train", step,
            {{"loss", mean},
             {"loss_last", m.loss},
             {"log_pplx", mean},
             {"learning_rate", m.lr},
             {"grad_norm", m.grad_norm},
             {"grad_norm_clipped",
              c.optimizer.clip_norm > 0 ? std::min<double>(m.grad_norm, c.optimizer.clip_norm) : m.grad_norm},
             {"steps_per_sec", sps},
             {"tokens_per_sec", sps * tokens_per_step},
             {"mfu", utilization},
             {"peak_flops", mfu.peak_flops()},
             {"peak_memory_bytes_per_device", static_cast<double>(peak_memory())}});
        report.line("train step " + std::to_string(step) + "  loss " + fmt("%.4f", m.loss) + "  mean " +
                    fmt("%.4f", mean) + "  lr " + fmt("%.3g", m.lr) + "  grad_norm " + fmt("%.3g", m.grad_norm) + "  " +
                    fmt("%.0f", sps * tokens_per_step) + " tokens/s  MFU " +
                    fmt("%.1f", 100 * utilization) + "%  ETA " +
                    hms((c.train.steps - step) / wall_rate));
      });
    }
    // Every process stops at the same step (a signal may reach them at different ones).
    const bool stop = on_any_process(comm, opts.stop && opts.stop->load());
    if (!m.skipped) {
      if (last || (c.train.eval_interval > 0 && step % c.train.eval_interval == 0)) timed([&] { do_eval(step); });
      if (last || stop || (c.train.checkpoint_interval > 0 && step % c.train.checkpoint_interval == 0))
        timed([&] { do_checkpoint(step); });
    }
    if (stop && !last) {
      report.end_progress();
      // A skipped step has nothing new to save; the step before it may have.
      if (m.skipped && result.last_step > start && result.last_step != saved_step) do_checkpoint(result.last_step);
      report_committed(ckpt.finish());
      const int sig = opts.stop_signal ? opts.stop_signal->load() : 0;
      report.line("stopped by " + (sig || !comm ? signal_name(sig) : std::string("a signal to another process")) +
                  " after step " + std::to_string(result.last_step) +
                  (ckpt.latest() ? ", checkpoint step " + std::to_string(*ckpt.latest()) + " committed" : "") +
                  "; rerun the same command to continue");
      result.interrupted = true;
      break;
    }
    if (!m.skipped) ++step;
    // A save finished in the background meanwhile: say so.
    if (auto s = ckpt.newly_committed()) report_committed(s);
  }
  report_committed(ckpt.finish());  // the last checkpoint is committed (or its error thrown) before train returns
  if (env().profile && result.last_step > start) {
    // PX_PROFILE=1: where the step's time went, and the last step unit by unit (every process its own).
    const std::string timeline = dir + (world && world->size > 1
                                            ? "/timeline_rank" + std::to_string(world->rank) + ".json"
                                            : std::string("/timeline.json"));
    if (runner->train_step().pipelined()) {  // every device's schedule, action by action
      const PipelineReport& r = runner->train_step().pipeline_report();
      if (primary) write_file(dir + "/profile.txt", r.to_string());
      write_file(timeline, r.chrome_trace());
    } else {
      const Executable& exe = runner->executable();
      if (primary) write_file(dir + "/profile.txt", exe.profile_report(40));
      write_file(timeline, exe.timeline().chrome_trace());
    }
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
