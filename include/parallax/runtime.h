// Compiling a Graph into an Executable and running it on the CPU.
//
//   auto exe = px::Executable::compile(*graph);           // schedule, fusion, buffer plan
//   std::cout << exe->peak_bytes();                        // known before the first run
//   std::vector<px::Array> out = exe->run({x, w});
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {

struct CompileOptions {
  bool fuse_elementwise = true;  // chain elementwise ops into single tiled passes
  bool optimize = true;          // run CSE and DCE first
  int64_t memory_limit_bytes = 0;  // 0 = none; above it compile() throws with a report
  // Mixed precision: bf16 or f16 runs every f32 matmul on 16-bit operands with f32 results
  // (see px::autocast in passes.h); f32 changes nothing.
  DType compute_dtype = DType::f32;
  bool profile = false;  // time every kernel (also PX_PROFILE=1); see Executable::profile_report
};

class Executable {
 public:
  static std::unique_ptr<Executable> compile(const Graph& g, const CompileOptions& opt = {});
  ~Executable();

  // Checks the inputs against the graph's input types and returns new output arrays.
  std::vector<Array> run(const std::vector<Array>& inputs);
  // Writes into caller-owned outputs of the right types; steps write their results straight into
  // them. An output may be one of the inputs' arrays (an in-place update such as w -= lr * g):
  // it is written in place when that input is no longer read, else through a private copy
  // allocated on the first such run. Apart from that copy, performs no allocation.
  // One Executable runs one call at a time (it patches pointers in place).
  void run_into(const std::vector<Array>& inputs, std::vector<Array>& outputs);

  int64_t peak_bytes() const;    // working memory: the arena size of the buffer plan
  int64_t output_bytes() const;  // bytes of the outputs (in the caller's arrays, not the arena)
  int num_steps() const;       // kernels launched per run
  int num_fused_groups() const;
  std::string summary() const;  // human-readable schedule and memory plan
  // Time per run spent in each kind of kernel, largest first (needs CompileOptions::profile).
  std::string profile_report(int top = 20) const;
  const Graph& graph() const;   // the optimized graph that was compiled

  struct Impl;

 private:
  explicit Executable(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace px
