// The head counts an attention layer accepts, checked alike for a layer and a whole model's config.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace px::nn {

// Calls fail(message) unless n_kv_heads >= 0 (0: n_heads), n_heads divides d_model and the key/value
// heads divide n_heads. d_model and n_heads must already be positive.
inline void check_heads(int64_t d_model, int64_t n_heads, int64_t n_kv_heads,
                        const std::function<void(const std::string&)>& fail) {
  if (n_kv_heads < 0) fail("n_kv_heads must be >= 0 (0 = n_heads), got " + std::to_string(n_kv_heads));
  if (d_model % n_heads != 0)
    fail("d_model (" + std::to_string(d_model) + ") must be divisible by n_heads (" + std::to_string(n_heads) + ")");
  const int64_t kv = n_kv_heads > 0 ? n_kv_heads : n_heads;
  if (n_heads % kv != 0)
    fail("n_heads (" + std::to_string(n_heads) + ") must be divisible by n_kv_heads (" + std::to_string(kv) + ")");
}

}  // namespace px::nn
