// Built-in experiments: a tiny copy-task GPT that trains in seconds, the GCIDE text models, and
// the Pax seed configs at their published sizes (plannable from shapes; runnable where memory allows).
// Designated initializers leave the fields they do not name at their defaults, on purpose.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

#include "pax/experiments.h"

#include "parallax/pax.h"

namespace px::pax {
namespace {

// A tiny GPT-2 on the built-in copy task: trains to near-zero loss in about a minute on 2 cores.
ExperimentConfig copy_tiny() {
  ExperimentConfig c;
  c.model = {.flavour = "gpt2", .vocab_size = 16, .d_model = 64, .n_heads = 4, .n_layers = 2, .d_ff = 256,
             .seq_len = 32};
  c.data.kind = "copy_task";
  c.data.batch = 16;
  c.data.copy_eval_batches = 4;
  c.optimizer = {.name = "adamw", .lr = 3e-3, .weight_decay = 0.01, .clip_norm = 1.0};
  c.schedule = {.kind = "warmup_cosine", .warmup_steps = 20, .min_fraction = 0.1};
  c.train = {.steps = 200, .eval_interval = 50, .eval_batches = 0, .checkpoint_interval = 50, .checkpoint_keep = 2,
             .summary_interval = 10, .seed = 0};
  return c;
}

// GCIDE (Debian dict-gcide, ~40 MB of English) through a SentencePiece tokenizer trained on it.
ExperimentConfig gcide_tiny() {
  ExperimentConfig c;
  c.model = {.flavour = "gpt2", .vocab_size = 4096, .d_model = 128, .n_heads = 4, .n_layers = 2, .d_ff = 512,
             .seq_len = 128};
  c.data = {.kind = "text", .paths = {"gcide"}, .batch = 8, .eval_fraction = 0.01};
  c.optimizer = {.name = "adamw", .lr = 3e-3, .weight_decay = 0.01, .clip_norm = 1.0};
  c.schedule = {.kind = "warmup_cosine", .warmup_steps = 50, .min_fraction = 0.1};
  c.train = {.steps = 600, .eval_interval = 100, .eval_batches = 20, .checkpoint_interval = 100,
             .checkpoint_keep = 3, .summary_interval = 10};
  return c;
}

// About 25M parameters: 12 layers of d 384 with an 8000-token vocabulary. 1000 steps of 16 x 256
// tokens (4.1M tokens, about an hour on 2 cores): the reference curve in docs/pax.md; train longer
// with --set train.steps=N (the cosine schedule follows).
ExperimentConfig gcide_25m() {
  ExperimentConfig c = gcide_tiny();
  c.model = {.flavour = "gpt2", .vocab_size = 8000, .d_model = 384, .n_heads = 6, .n_layers = 12, .d_ff = 1536,
             .seq_len = 256};
  c.data.batch = 16;
  c.optimizer.lr = 1e-3;
  c.schedule.warmup_steps = 100;
  c.train.steps = 1000;
  c.train.eval_interval = 100;
  c.train.checkpoint_interval = 250;
  return c;
}

// The Pax lm_cloud seeds (paxml tasks/lm/params/lm_cloud.py): synthetic data (here the copy task
// over the same vocabulary), Adam (beta2 0.99) with a linear warmup over 4000 steps and an
// exponential decay to 0.1x at step 300000, gradients clipped to norm 5. Sizes as the issue gives
// them (paxml's unlimited LmCloudTransformerAdam has 32 layers; its LimitSteps variant 10).
ExperimentConfig lm_cloud_adam() {
  ExperimentConfig c;
  c.model = {.flavour = "gpt2", .vocab_size = 32000, .d_model = 1024, .n_heads = 16, .n_layers = 10, .d_ff = 4096,
             .seq_len = 1024, .tied_embedding = true};
  c.data = {.kind = "copy_task", .batch = 16};  // PERCORE_BATCH_SIZE 16: scale with the data axis
  c.optimizer = {.name = "adam", .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-6, .clip_norm = 5.0};
  c.schedule = {.kind = "warmup_exponential", .warmup_steps = 4000, .decay_steps = 296000, .decay_rate = 0.1,
                .min_fraction = 0.1};
  c.sharding = {.mesh = "data:-1", .strategy = "ddp"};
  c.train = {.steps = 300000, .eval_interval = 1000, .eval_batches = 0, .checkpoint_interval = 1000,
             .checkpoint_keep = 3, .summary_interval = 100};
  return c;
}

// A seed's LimitSteps variant: the same experiment stopped at `steps`.
ExperimentFn limit_steps(ExperimentConfig (*seed)(), int64_t steps) {
  return [seed, steps] {
    ExperimentConfig c = seed();
    c.train.steps = steps;
    return c;
  };
}

// 18 layers of d 3072 (24 heads of 128) in bf16, the params split over the data axis (SPMD,
// ZeRO-3 style) of 4 devices with 8 sequences each, remat saving nothing.
ExperimentConfig lm_cloud_2b() {
  ExperimentConfig c = lm_cloud_adam();
  c.model = {.flavour = "gpt2", .vocab_size = 32000, .d_model = 3072, .n_heads = 24, .n_layers = 18, .d_ff = 12288,
             .seq_len = 1024, .dtype = "bf16"};
  c.data.batch = 32;
  c.sharding = {.mesh = "data:4", .strategy = "fsdp"};
  c.memory.remat = "full";
  return c;
}

// C4 (English, JSON lines with a "text" field) from a folder the user gives with data.paths; paxml
// tasks/lm/params/c4.py: Adam (beta2 0.99, eps 1e-6, weight decay 1e-3), warmup 4000 then
// exponential decay to 0.1x at 300000, clip 1; 32 sequences of 1024 per device on data:4.
ExperimentConfig c4_1b() {
  ExperimentConfig c;
  c.model = {.flavour = "gpt2", .vocab_size = 32000, .d_model = 2560, .n_heads = 20, .n_layers = 13, .d_ff = 10240,
             .seq_len = 1024, .dtype = "bf16"};
  c.data = {.kind = "text", .paths = {}, .batch = 128, .eval_fraction = 0.001};
  c.optimizer = {.name = "adam", .lr = 1e-3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 1e-3,
                 .clip_norm = 1.0};
  c.schedule = {.kind = "warmup_exponential", .warmup_steps = 4000, .decay_steps = 296000, .decay_rate = 0.1,
                .min_fraction = 0.1};
  c.sharding = {.mesh = "data:4", .strategy = "fsdp"};
  c.memory.remat = "full";
  c.train = {.steps = 300000, .eval_interval = 1000, .eval_batches = 100, .checkpoint_interval = 1000,
             .checkpoint_keep = 5, .summary_interval = 10};
  return c;
}

// 36 layers of d 6144 (48 heads of 128) over data:16 x model:2, 8 sequences per device.
ExperimentConfig c4_16b() {
  ExperimentConfig c = c4_1b();
  c.model = {.flavour = "gpt2", .vocab_size = 32000, .d_model = 6144, .n_heads = 48, .n_layers = 36, .d_ff = 24576,
             .seq_len = 1024, .dtype = "bf16"};
  c.data.batch = 256;
  c.sharding = {.mesh = "data:16,model:2", .strategy = "fsdp_tp"};
  return c;
}

// paxml c4.py C4SpmdPipelineGpt3SmallAdam64Replicas (its docstring: "GPT-3 XL", 1.3B; its sizes
// make 2.9B): 24 layers of d 3072 (24
// heads of 128, MLP 12288), vocabulary 50257 padded to 50304 (a multiple of 64: it splits over the
// model axis, where GSPMD splits unevenly), sequences of 2048, bf16; the seed's ICI mesh
// [stage 4, replica 1, data 4, model 4] (64 devices), each stage's weights split over data and model;
// 512 sequences a step in 32 microbatches of 16; Adam (0.9, 0.95, 1e-8), weight decay 0.1, clip 1,
// lr 2e-4 warmed up over 265 steps then cosine to 10% at 108600; everything recomputed (SAVE_NOTHING).
// The seed pipelines GPipe-style; 1F1B here (the same step, fewer microbatches held at once).
ExperimentConfig c4_pipeline_gpt3_xl() {
  ExperimentConfig c = c4_1b();
  c.model = {.flavour = "gpt2", .vocab_size = 50304, .d_model = 3072, .n_heads = 24, .n_layers = 24, .d_ff = 12288,
             .seq_len = 2048, .dtype = "bf16"};
  c.data.batch = 512;
  c.optimizer = {.name = "adam", .lr = 2e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                 .clip_norm = 1.0};
  c.schedule = {.kind = "warmup_cosine", .warmup_steps = 265, .min_fraction = 0.1, .total_steps = 108600};
  c.sharding = {.mesh = "stage:4,data:4,model:4", .strategy = "fsdp_tp", .schedule = "1f1b"};
  c.memory.remat = "full";
  c.train = {.steps = 108600, .microbatches = 32, .eval_interval = 100, .eval_batches = 100,
             .checkpoint_interval = 200, .checkpoint_keep = 5, .summary_interval = 1};
  return c;
}

// The README's tiny GCIDE model pipelined over two devices: one layer per stage, 1F1B over 4
// microbatches of 2 sequences (pax train --devices cpu:2).
ExperimentConfig gcide_tiny_pipelined() {
  ExperimentConfig c = gcide_tiny();
  c.sharding.mesh = "stage:2";
  c.sharding.schedule = "1f1b";
  c.train.microbatches = 4;
  return c;
}

}  // namespace

void register_builtin_experiments() {
  register_experiment("copy.TransformerLmTiny", "2-layer GPT (d 64) on the built-in copy task; trains in a minute",
                      copy_tiny);
  register_experiment("gcide.TransformerLmTiny",
                      "2-layer GPT (d 128, vocab 4096) on the GCIDE dictionary text; the README's main job",
                      gcide_tiny);
  register_experiment("gcide.TransformerLmTinyPipelined",
                      "gcide.TransformerLmTiny pipelined: stage:2 (one layer each), 1F1B over 4 microbatches",
                      gcide_tiny_pipelined);
  register_experiment("gcide.Gpt25M", "12-layer GPT (d 384, vocab 8000, ~25M params) on GCIDE", gcide_25m);
  register_experiment("lm_cloud.LmCloudTransformerAdam",
                      "Pax seed: 10 layers, d 1024, vocab 32000, seq 1024, Adam, data parallel (DDP)", lm_cloud_adam);
  register_experiment("lm_cloud.LmCloudTransformerAdamLimitSteps", "LmCloudTransformerAdam stopped at 2000 steps",
                      limit_steps(lm_cloud_adam, 2000));
  register_experiment("lm_cloud.LmCloudSpmd2B", "Pax seed: 18 layers, d 3072, bf16, ~2B params, SPMD (FSDP over data:4)",
                      lm_cloud_2b);
  register_experiment("lm_cloud.LmCloudSpmd2BLimitSteps", "LmCloudSpmd2B stopped at 300 steps",
                      limit_steps(lm_cloud_2b, 300));
  register_experiment("c4.C4Spmd1BAdam4Replicas",
                      "Pax seed: 13 layers, d 2560, ~1B params on C4 (data.paths), mesh data:4", c4_1b);
  register_experiment("c4.C4SpmdPipelineGpt3SmallAdam64Replicas",
                      "Pax seed: 24 layers, d 3072, ~2.9B params on C4, pipelined: stage:4 x data:4 x model:4, "
                      "32 microbatches",
                      c4_pipeline_gpt3_xl);
  register_experiment("c4.C4Spmd16BAdam32Replicas",
                      "Pax seed: 36 layers, d 6144, ~16B params on C4 (data.paths), mesh data:16 x model:2", c4_16b);
}

}  // namespace px::pax
