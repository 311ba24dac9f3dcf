// Whole-program test: a small GPT learns the copy task within a fixed step budget.
#include <gtest/gtest.h>

#include <cmath>

#include "parallax/parallax.h"

namespace px {
namespace {

TEST(CopyTask, BatchesAreDeterministicAndWeighted) {
  data::CopyTaskOptions opt{.batch = 4, .seq_len = 10, .vocab = 8};
  data::LmBatch a = data::copy_task(opt, 3), b = data::copy_task(opt, 3), c = data::copy_task(opt, 4);
  EXPECT_EQ(a.tokens.to_i32(), b.tokens.to_i32());
  EXPECT_NE(a.tokens.to_i32(), c.tokens.to_i32());
  std::vector<int32_t> t = a.tokens.to_i32(), y = a.targets.to_i32();
  std::vector<float> w = a.weights.to_f32();
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(t[r * 10 + 5], data::kSeparatorToken);
    for (int p = 0; p < 9; ++p) EXPECT_EQ(y[r * 10 + p], t[r * 10 + p + 1]);
    for (int p = 5; p < 10; ++p) {
      EXPECT_EQ(w[r * 10 + p], 1.0f);
      EXPECT_EQ(y[r * 10 + p], t[r * 10 + p - 5]);  // the target repeats the payload
    }
    EXPECT_EQ(w[r * 10 + 4], 0.0f);
  }
  EXPECT_THROW(data::copy_task({.vocab = 2}, 0), Error);
}

TEST(CopyTask, SmallGptLearnsToCopy) {
  data::CopyTaskOptions task{.batch = 16, .seq_len = 16, .vocab = 12};
  nn::TransformerLm model(nn::gpt2_config("copy", task.vocab, 32, 2, 2, 128, task.seq_len));
  TensorType seq{DType::i32, {task.batch, task.seq_len}}, wts{DType::f32, {task.batch, task.seq_len}};
  const int steps = 200;
  TrainStep step(model.store(), optim::adamw({.lr = optim::warmup_cosine(5e-3, 20, steps)}),
                 [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1], b[2]); },
                 {seq, seq, wts}, {.clip_norm = 1.0});
  TrainState state = step.init(0);
  float first = 0, last = 0;
  for (int i = 0; i < steps; ++i) {
    data::LmBatch b = data::copy_task(task, i);
    StepMetrics m = step(state, {b.tokens, b.targets, b.weights});
    if (i == 0) first = m.loss;
    last = m.loss;
  }
  EXPECT_NEAR(first, std::log(task.vocab), 0.3);  // untrained: about uniform over the vocab
  EXPECT_LT(last, 0.1) << "the copy task was not learned in " << steps << " steps";
  EXPECT_EQ(state.step, steps);
}

TEST(TrainStep, RejectsBadBatchesAndStates) {
  nn::TransformerLm model(nn::gpt2_config("t", 8, 16, 2, 1, 32, 8));
  TensorType seq{DType::i32, {2, 8}};
  TrainStep step(model.store(), optim::sgd({.lr = 0.1}),
                 [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); }, {seq, seq});
  TrainState state = step.init(0);
  Array good = Array::zeros(DType::i32, {2, 8}), bad = Array::zeros(DType::i32, {2, 9});
  EXPECT_NO_THROW(step(state, {good, good}));
  try {
    step(state, {good, bad});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch array 1 has type i32[2,9]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(step(state, {good}), Error);
  TrainState empty;
  EXPECT_THROW(step(empty, {good, good}), Error);
}

}  // namespace
}  // namespace px

namespace px {
namespace {

TEST(TrainStep, SaveAndLoadResumesBitExactly) {
  data::CopyTaskOptions task{.batch = 4, .seq_len = 8, .vocab = 8};
  nn::TransformerLm model(nn::gpt2_config("ckpt", task.vocab, 16, 2, 1, 32, task.seq_len));
  TensorType seq{DType::i32, {task.batch, task.seq_len}}, wts{DType::f32, {task.batch, task.seq_len}};
  TrainStep step(model.store(), optim::adamw({.lr = 1e-2}),
                 [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1], b[2]); },
                 {seq, seq, wts});
  auto batch = [&](int i) {
    data::LmBatch b = data::copy_task(task, i);
    return std::vector<Array>{b.tokens, b.targets, b.weights};
  };
  TrainState a = step.init(0);
  for (int i = 0; i < 3; ++i) step(a, batch(i));
  std::string path = ::testing::TempDir() + "/px_train_state.safetensors";
  step.save(path, a);
  TrainState b = step.load(path);
  EXPECT_EQ(b.step, 3);
  EXPECT_EQ(step.state_names().front(), model.store().paths().front() + ".m");
  float la = step(a, batch(3)).loss, lb = step(b, batch(3)).loss;
  EXPECT_EQ(la, lb);
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_EQ(step.gather_params(a)[i].to_f32(), step.gather_params(b)[i].to_f32());

  // A different model cannot load it.
  nn::TransformerLm other(nn::gpt2_config("other", task.vocab, 32, 2, 1, 32, task.seq_len));
  TrainStep other_step(other.store(), optim::adamw({.lr = 1e-2}),
                       [&](const std::vector<Tensor>& t) { return nn::next_token_loss(other, t[0], t[1], t[2]); },
                       {seq, seq, wts});
  try {
    other_step.load(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("but this model expects"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace px

namespace px {
namespace {

TEST(TrainStep, ACopiedStateIsNotOverwrittenByLaterSteps) {
  nn::TransformerLm model(nn::gpt2_config("snap", 8, 16, 2, 1, 32, 8));
  TensorType seq{DType::i32, {2, 8}};
  TrainStep step(model.store(), optim::adamw({.lr = 1e-2}),
                 [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); }, {seq, seq});
  TrainState state = step.init(0);
  Array tokens = Array::from_i32({1, 2, 3, 4, 5, 6, 7, 0, 2, 3, 4, 5, 6, 7, 0, 1}, {2, 8});
  step(state, {tokens, tokens});
  TrainState snapshot = state;  // shares buffers with state
  std::vector<float> before = step.gather_params(snapshot)[0].to_f32();
  for (int i = 0; i < 3; ++i) step(state, {tokens, tokens});
  EXPECT_EQ(step.gather_params(snapshot)[0].to_f32(), before);
  EXPECT_NE(step.gather_params(state)[0].to_f32(), before);
}

}  // namespace
}  // namespace px
