#include "parallax/data.h"

#include <string>

#include "data/text_internal.h"

namespace px::data {

int64_t copy_task_payload(const CopyTaskOptions& opt) { return opt.seq_len / 2; }

LmBatch copy_task(const CopyTaskOptions& opt, int64_t index) {
  if (opt.vocab < 3)
    throw Error("[copy_task] vocab " + std::to_string(opt.vocab) + " leaves no payload tokens; use vocab >= 3");
  if (opt.seq_len < 2 || opt.batch < 1)
    throw Error("[copy_task] need batch >= 1 and seq_len >= 2, got batch " + std::to_string(opt.batch) +
                " and seq_len " + std::to_string(opt.seq_len));
  const int64_t n = copy_task_payload(opt), s = opt.seq_len, b = opt.batch;
  LmBatch out{Array(DType::i32, {b, s}), Array(DType::i32, {b, s}), Array::zeros(DType::f32, {b, s})};
  std::vector<int32_t> row(static_cast<size_t>(s + 1));
  for (int64_t r = 0; r < b; ++r) {
    uint64_t state = mix(mix(opt.seed) ^ mix(static_cast<uint64_t>(index) * 0x100000001b3ull + static_cast<uint64_t>(r)));
    std::fill(row.begin(), row.end(), kPadToken);
    for (int64_t i = 0; i < n; ++i) {
      state = mix(state);
      row[i] = static_cast<int32_t>(2 + state % static_cast<uint64_t>(opt.vocab - 2));
      if (n + 1 + i <= s) row[n + 1 + i] = row[i];
    }
    row[n] = kSeparatorToken;
    for (int64_t p = 0; p < s; ++p) {
      out.tokens.data<int32_t>()[r * s + p] = row[p];
      out.targets.data<int32_t>()[r * s + p] = row[p + 1];
      // Targets at positions n..2n-1 are the copied payload.
      if (p >= n && p < 2 * n) out.weights.data<float>()[r * s + p] = 1.0f;
    }
  }
  return out;
}

}  // namespace px::data
