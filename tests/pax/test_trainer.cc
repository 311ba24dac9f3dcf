// The trainer through the library API: checkpoint keep policy, resume, eval coverage.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "parallax/pax.h"
#include "testing.h"

namespace px::pax {
namespace {

ExperimentConfig small() {
  ExperimentConfig c = experiment("copy.TransformerLmTiny");
  for (const char* s : {"model.d_model=32", "model.d_ff=64", "model.n_layers=1", "model.seq_len=16", "data.batch=4",
                        "data.copy_eval_batches=3", "schedule.warmup_steps=1", "train.steps=6",
                        "train.summary_interval=2", "train.eval_interval=0", "train.checkpoint_interval=2",
                        "train.checkpoint_keep=2"})
    apply_override(c, s);
  return c;
}

std::string fresh(const std::string& name) {
  // Per process: two runs of the suite at once (two checkouts) must not share folders.
  std::string d = ::testing::TempDir() + "/pax_trainer_" + std::to_string(::getpid()) + "_" + name;
  std::filesystem::remove_all(d);
  return d;
}

TEST(PaxTrainer, KeepsTheNewestCheckpointsAndResumesFromTheLatest) {
  const std::string d = fresh("keep");
  std::ostringstream log;
  TrainResult r = train(small(), {.job_dir = d, .progress = false, .out = &log});
  EXPECT_EQ(r.first_step, 0);
  EXPECT_EQ(r.last_step, 6);
  EXPECT_FALSE(r.interrupted);
  ASSERT_TRUE(r.last_eval_loss.has_value());
  EXPECT_FALSE(std::filesystem::exists(d + "/checkpoints/checkpoint_00000002"));
  EXPECT_TRUE(std::filesystem::exists(d + "/checkpoints/checkpoint_00000004"));
  EXPECT_TRUE(std::filesystem::exists(d + "/checkpoints/checkpoint_00000006"));

  // More steps continue from step 6; the same steps again do nothing.
  ExperimentConfig more = small();
  apply_override(more, "train.steps=8");
  TrainResult r2 = train(more, {.job_dir = d, .progress = false, .out = &log});
  EXPECT_EQ(r2.first_step, 6);
  EXPECT_EQ(r2.last_step, 8);
  TrainResult r3 = train(more, {.job_dir = d, .progress = false, .out = &log});
  EXPECT_EQ(r3.first_step, 8);
  EXPECT_EQ(r3.last_step, 8);
  EXPECT_NE(log.str().find("already trained to step 8"), std::string::npos);
}

// A `stage` axis in sharding.mesh pipelines the run: the same losses as one device running the
// same microbatches, checkpoints it resumes from, and PX_PROFILE's files name the stages.
TEST(PaxTrainer, APipelinedRunTrainsAndResumesLikeOneDevice) {
  ExperimentConfig one = small();
  apply_override(one, "model.n_layers=2");
  apply_override(one, "train.microbatches=2");
  ExperimentConfig piped = one;
  apply_override(piped, "sharding.mesh=stage:2");
  apply_override(piped, "sharding.schedule=zero_bubble");
  std::ostringstream log;
  TrainResult a = train(one, {.job_dir = fresh("one"), .progress = false, .out = &log});
  const std::string d = fresh("piped");
  TrainResult b = train(piped, {.job_dir = d, .devices = "cpu:2", .progress = false, .out = &log});
  EXPECT_EQ(b.last_step, 6);
  EXPECT_NEAR(a.last_loss, b.last_loss, 1e-5 * std::abs(a.last_loss));
  ASSERT_TRUE(a.last_eval_loss && b.last_eval_loss);
  EXPECT_NEAR(*a.last_eval_loss, *b.last_eval_loss, 1e-5 * std::abs(*a.last_eval_loss));
  ExperimentConfig more = piped;
  apply_override(more, "train.steps=8");
  TrainResult c = train(more, {.job_dir = d, .devices = "cpu:2", .progress = false, .out = &log});
  EXPECT_EQ(c.first_step, 6);
  EXPECT_EQ(c.last_step, 8);
}

TEST(PaxTrainer, EvaluatesTheWholeSplitOrTheStatedNumberOfBatches) {
  const std::string d = fresh("eval");
  std::ostringstream log;
  train(small(), {.job_dir = d, .progress = false, .out = &log});
  ExperimentConfig c = small();
  EvalResult all = evaluate(c, {.job_dir = d, .out = &log});
  EXPECT_EQ(all.step, 6);
  EXPECT_EQ(all.batches, 3);  // eval_batches = 0: every batch of the split
  EXPECT_GT(all.tokens, 0);
  EXPECT_GE(all.fraction_correct, 0.0);
  EXPECT_LE(all.fraction_correct, 1.0);
  apply_override(c, "train.eval_batches=1");
  EvalResult one = evaluate(c, {.job_dir = d, .out = &log}, 4);
  EXPECT_EQ(one.step, 4);
  EXPECT_EQ(one.batches, 1);
  EXPECT_EQ(one.tokens * 3, all.tokens);  // copy-task batches weigh the same
  apply_override(c, "train.eval_batches=10");
  std::ostringstream note;
  EXPECT_EQ(evaluate(c, {.job_dir = d, .out = &note}).batches, 3);
  EXPECT_NE(note.str().find("the eval split has 3 batches"), std::string::npos) << note.str();
  EXPECT_NE(px::testing::error_of([&] { evaluate(c, {.job_dir = d, .out = &note}, 3); }).find("no checkpoint at step 3"),
            std::string::npos);
  EXPECT_NE(px::testing::error_of([&] { evaluate(c, {.job_dir = fresh("none"), .out = &note}); })
                .find("run 'pax train' first"),
            std::string::npos);
}

// Through the library too: train() on a job dir holding another run throws px::UserError naming the
// field, and writes nothing there.
TEST(PaxTrainer, RefusesAnotherConfigInAJobDirWithACheckpoint) {
  const std::string d = fresh("other");
  std::ostringstream log;
  train(small(), {.job_dir = d, .progress = false, .out = &log});
  const auto before = std::filesystem::last_write_time(d + "/config.toml");
  ExperimentConfig other = small();
  apply_override(other, "optimizer.name=sgd");
  try {
    train(other, {.job_dir = d, .progress = false, .out = &log});
    FAIL() << "expected a UserError";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.name (job: adamw, this run: sgd)"), std::string::npos) << e.what();
  }
  EXPECT_EQ(std::filesystem::last_write_time(d + "/config.toml"), before);
  ExperimentConfig longer = small();
  apply_override(longer, "train.steps=8");
  EXPECT_EQ(train(longer, {.job_dir = d, .progress = false, .out = &log}).first_step, 6);
}

}  // namespace
}  // namespace px::pax
