// A reduction fed by a fused elementwise loop (internal to the CPU backend): the schedule puts a
// reduce_sum or reduce_max in the fused group that computes its operand (FusionLimits::reductions),
// and the reduction kernel (reduce.cc) pulls the operand's elements from the group's loop
// (fused.cc) range by range instead of reading them from memory. The ranges and the order in which
// they are summed are the unfused kernel's, so the result is bitwise the same.
#pragma once

#include <cstdint>

#include "backend/cpu/kernel.h"

namespace px::cpu {

// What a fed reduction reads as its operand (in[0] points at one): fill writes the operand's
// elements [off, off + n) as f32 (rounded to its dtype) into dst, working on thread tid's scratch.
// prefetch asks for the operands that elements [off, off + n) will read, a few rows ahead of fill.
struct ReduceFeed {
  const void* ctx;
  void (*fill)(const void* ctx, int tid, int64_t off, int64_t n, float* dst);
  void (*prefetch)(const void* ctx, int64_t off, int64_t n);
};

// The kernel of a reduce_sum or reduce_max node (spec: its types, a float operand) whose in[0] is a
// const ReduceFeed*; it runs on at most `threads` threads, so fill's tid is below that, and with
// `fence` each of them ends with a store fence (fill writes with streaming stores). Its scratch
// (out[1]) is fed_reduce_scratch_bytes(spec) bytes.
Kernel make_fed_reduce_kernel(const Primitive* prim, const KernelSpec& spec, int threads, bool fence);
int64_t fed_reduce_scratch_bytes(const Primitive* prim, const KernelSpec& spec);

}  // namespace px::cpu
