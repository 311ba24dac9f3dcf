// What the generator's files share (codegen.cc, codegen_rows.cc): the dtypes' storage and register
// types, loads and stores as CUDA C expressions, literals, and the kernel's final assembly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/codegen.h"

namespace px::cuda::detail {

bool int_like(DType d);
// The C type a buffer of the dtype holds (float, unsigned short, int, unsigned char).
std::string storage(DType d);
// The register class values of the dtype are computed in: f32 for the float dtypes.
enum class Reg { f, i, b };
Reg reg_of(DType d);
std::string reg_type(Reg r);
// A stored element (an lvalue expression such as "in0[i]") as its register value, and back.
std::string load(DType d, const std::string& element);
std::string store(DType d, const std::string& v);
std::string convert(Reg from, Reg to, const std::string& e);
// An f32 value rounded to what the dtype holds (bf16, f16; f32 unchanged).
std::string round_to(DType d, const std::string& v);
// Exact literals: an f32 (hex float; infinities and NaN through the element math) and an integer.
std::string flit(double v);
std::string ilit(int64_t v);
// A double as the dtype stores it (full's value), and as i32 stores it (saturating, NaN 0).
double round_value(DType d, double v);
int64_t saturate_i32(double v);
// The kernel's parameter list: `const T* in<k>` for the operands, `T* out<k>` for the results.
std::string params(const std::vector<DType>& in, const std::vector<DType>& out);
std::vector<DType> dtypes_of(const Graph& g, const std::vector<int>& values);
// "for (i over [0, count)) {" as a grid-stride loop (closed by the caller with "  }\n}\n"), and its launch.
std::string grid_stride_loop(int64_t count);
Launch elementwise_launch(int64_t count);
std::string type_label(const TensorType& t);
// The source: the prelude (the element math's include, the block reductions px_block_reduce) and
// `body`, whose "@NAME@" becomes px_<family>_<hash>.
KernelSource finish(const std::string& family, const std::string& body, const std::string& label, Launch launch,
                    int num_inputs, int num_outputs);

// The row, index, optimizer and random kernels (codegen_rows.cc).
bool can_generate_row(const Primitive* p);
KernelSource generate_row(const Graph& g, const Unit& unit, const Node& n);

}  // namespace px::cuda::detail
