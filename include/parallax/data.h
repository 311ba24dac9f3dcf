// Built-in synthetic language-modelling tasks: deterministic batches a small model can learn,
// for examples, tests and smoke runs.
//
//   px::data::LmBatch b = px::data::copy_task({.batch = 16, .seq_len = 32, .vocab = 16}, /*index=*/step);
//   // b.tokens, b.targets: i32[16, 32]; b.weights: f32[16, 32], 1 on the positions to learn
#pragma once

#include <cstdint>

#include "parallax/core.h"

namespace px::data {

struct LmBatch {
  Array tokens;   // i32[batch, seq_len]
  Array targets;  // i32[batch, seq_len]: tokens shifted left by one
  Array weights;  // f32[batch, seq_len]: which targets count in the loss
};

struct CopyTaskOptions {
  int64_t batch = 16;
  int64_t seq_len = 32;
  int64_t vocab = 16;  // token 0 is padding, 1 the separator; payload tokens are 2..vocab-1
  uint64_t seed = 0;
};

constexpr int32_t kPadToken = 0;
constexpr int32_t kSeparatorToken = 1;

// Each row is n random payload tokens, the separator, then the same n tokens again
// (n = seq_len / 2), padded. Only the repeated half is weighted: it is fully predictable, so
// a model that learns to copy drives that loss to zero. `index` selects the batch; the same
// (options, index) always gives the same batch.
LmBatch copy_task(const CopyTaskOptions& opt, int64_t index);
int64_t copy_task_payload(const CopyTaskOptions& opt);  // n

}  // namespace px::data
