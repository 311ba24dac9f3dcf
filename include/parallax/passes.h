// Graph-to-graph passes beyond DCE and CSE (graph.h). Each is pure: it returns a new graph with
// the same inputs and outputs.
//
//   auto mixed = px::autocast(*graph, px::DType::bf16);   // matmuls in bf16, f32 results
//   std::cout << mixed->to_string();                       // shows the inserted casts
//   // or, at compile time: px::Executable::compile(*graph, {.compute_dtype = px::DType::bf16});
#pragma once

#include <memory>
#include <vector>

#include "parallax/graph.h"

namespace px {

// Mixed precision: every dot_general whose operands and result are f32 takes its operands cast to
// `compute` (bf16 or f16) and still produces f32 (accumulation stays f32). Everything else
// (reductions, norms, softmax, elementwise math) is left in f32. compute = f32 returns a copy.
// With value_map set it also returns, per value of g, its id in the result.
std::unique_ptr<Graph> autocast(const Graph& g, DType compute, std::vector<int>* value_map = nullptr);

}  // namespace px
