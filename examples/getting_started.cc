// Getting started: define a small GPT, train it on the built-in copy task, watch the loss fall,
// then let it complete a sequence it has never seen.
//
//   build/examples/getting_started [steps]
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "parallax/parallax.h"

int run(int steps);

int main(int argc, char** argv) {
  int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  if (steps < 2) {
    std::fprintf(stderr, "usage: getting_started [steps >= 2]\n");
    return 2;
  }
  try {
    return run(steps);
  } catch (const px::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

int run(int steps) {
  px::data::CopyTaskOptions task{.batch = 16, .seq_len = 32, .vocab = 16};

  // A 2-layer GPT-2 style model: LayerNorm, GELU MLP, learned positions, tied embedding.
  px::nn::TransformerLm model(px::nn::gpt2_config("copy-gpt", task.vocab, /*d_model=*/64, /*heads=*/4,
                                                  /*layers=*/2, /*d_ff=*/256, task.seq_len));
  std::printf("model: %lld params\n", static_cast<long long>(model.store().param_count()));

  // Forward, loss, backward and AdamW, traced and compiled into one program.
  px::TensorType seq{px::DType::i32, {task.batch, task.seq_len}};
  px::TensorType wts{px::DType::f32, {task.batch, task.seq_len}};
  px::TrainStep step(
      model.store(),
      px::optim::adamw({.lr = px::optim::warmup_cosine(3e-3, std::max(1, steps / 10), steps), .weight_decay = 0.01}),
      [&](const std::vector<px::Tensor>& b) { return px::nn::next_token_loss(model, b[0], b[1], b[2]); },
      {seq, seq, wts}, {.clip_norm = 1.0});
  std::printf("compiled step: %d kernels, %d fused groups, %.2f MiB working memory\n", step.executable().num_steps(),
              step.executable().num_fused_groups(), static_cast<double>(step.peak_bytes()) / (1 << 20));

  px::TrainState state = step.init(/*seed=*/0);
  for (int i = 0; i < steps; ++i) {
    px::data::LmBatch b = px::data::copy_task(task, i);
    px::StepMetrics m = step(state, {b.tokens, b.targets, b.weights});
    if (i % 25 == 0 || i == steps - 1) std::printf("step %4d  loss %.4f  lr %.2e\n", i, m.loss, m.lr);
  }

  // Greedy completion of a fresh sequence: feed the prompt, append the argmax, repeat.
  px::TensorType one{px::DType::i32, {1, task.seq_len}};
  px::ForwardFn logits(model.store(),
                       [&](const std::vector<px::Tensor>& b) { return std::vector<px::Tensor>{model.logits(b[0])}; },
                       {one});
  px::data::LmBatch test =
      px::data::copy_task({.batch = 1, .seq_len = task.seq_len, .vocab = task.vocab, .seed = 99}, 0);
  const int64_t n = px::data::copy_task_payload(task);
  std::vector<int32_t> seqv(task.seq_len, px::data::kPadToken);
  for (int64_t p = 0; p <= n; ++p) seqv[p] = test.tokens.data<int32_t>()[p];
  const std::vector<px::Array> params = step.gather_params(state);  // full arrays
  for (int64_t p = n; p < 2 * n; ++p) {
    std::vector<float> out = logits(params, {px::Array::from_i32(seqv, {1, task.seq_len})})[0].to_f32();
    const float* row = out.data() + p * task.vocab;
    int32_t best = 0;
    for (int32_t v = 1; v < task.vocab; ++v)
      if (row[v] > row[best]) best = v;
    if (p + 1 < task.seq_len) seqv[p + 1] = best;
  }
  const int64_t last = std::min<int64_t>(2 * n, task.seq_len - 1);
  int correct = 0;
  std::printf("prompt:     ");
  for (int64_t p = 0; p < n; ++p) std::printf("%d ", seqv[p]);
  std::printf("\ncompletion: ");
  for (int64_t p = n + 1; p <= last; ++p) {
    std::printf("%d ", seqv[p]);
    correct += seqv[p] == seqv[p - n - 1];
  }
  std::printf("\ncopied %d of %lld tokens correctly\n", correct, static_cast<long long>(last - n));
  return 0;
}
