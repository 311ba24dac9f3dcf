// Sustained matmul GFLOP/s of this machine through oneDNN (the peak the cost model divides by)
// and through Parallax's own px::matmul, measured in the same run. The bench-gpt shapes run in the
// three layouts of a linear layer's step: nn (y = x w), nt (dx = dy w^T), tn (dw = x^T dy), through
// oneDNN's matmul primitive, its sgemm (f32) and px::matmul.
//   ./bench/gemm_bench [--quick] [--min_time=0.3]
#include <oneapi/dnnl/dnnl.h>
#include <dnnl.hpp>

#include "bench_util.h"
#include "parallax/ops.h"
#include "peak.h"

namespace {

using dnnl::memory;
using px::bench::Json;

struct GemmShape {
  int64_t m, k, n;
  const char* label;
};

// Which operand is stored transposed: nn, nt (B as [n,k]) or tn (A as [k,m]).
enum class Layout { nn, nt, tn };
const char* layout_name(Layout l) { return l == Layout::nn ? "nn" : l == Layout::nt ? "nt" : "tn"; }

// C[m,n] = A[m,k] @ B[k,n] in oneDNN, all row-major; returns seconds per call, or -1 with
// `why` set when oneDNN has no implementation for the dtype on this CPU.
double time_onednn(const GemmShape& s, Layout l, memory::data_type dt, double min_time, std::string& impl,
                   std::string& why) {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  static dnnl::stream strm(eng);
  memory::desc a_md({s.m, s.k}, dt, l == Layout::tn ? memory::dims{1, s.m} : memory::dims{s.k, 1});
  memory::desc b_md({s.k, s.n}, dt, l == Layout::nt ? memory::dims{1, s.k} : memory::dims{s.n, 1});
  memory::desc c_md({s.m, s.n}, dt, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd;
  try {
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), eng);
  } catch (const dnnl::error& e) {
    why = "oneDNN has no matmul for this dtype on this CPU";
    return -1;
  }
  impl = pd.impl_info_str();
  memory a(a_md, eng), b(b_md, eng), c(c_md, eng);
  // Fill A and B with small values so every dtype stays finite.
  px::DType pdt = dt == memory::data_type::f32 ? px::DType::f32 : px::DType::bf16;
  px::Array ha = px::bench::random_array({s.m, s.k}, pdt, 1), hb = px::bench::random_array({s.k, s.n}, pdt, 2);
  std::memcpy(a.get_data_handle(), ha.raw(), static_cast<size_t>(ha.nbytes()));
  std::memcpy(b.get_data_handle(), hb.raw(), static_cast<size_t>(hb.nbytes()));
  dnnl::matmul mm(pd);
  return px::bench::time_it(
      [&] {
        mm.execute(strm, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
        strm.wait();
      },
      min_time);
}

double time_sgemm(const GemmShape& s, Layout l, double min_time) {
  px::Array a = px::bench::random_array({s.m, s.k}, px::DType::f32, 1),
            b = px::bench::random_array({s.k, s.n}, px::DType::f32, 2);
  std::vector<float> c(static_cast<size_t>(s.m * s.n));
  const char ta = l == Layout::tn ? 'T' : 'N', tb = l == Layout::nt ? 'T' : 'N';
  return px::bench::time_it(
      [&] {
        dnnl_sgemm(ta, tb, s.m, s.n, s.k, 1.f, a.data<float>(), ta == 'N' ? s.k : s.m, b.data<float>(),
                   tb == 'N' ? s.n : s.k, 0.f, c.data(), s.n);
      },
      min_time);
}

double time_parallax(const GemmShape& s, Layout l, px::DType dt, double min_time) {
  // The transposed operand is stored transposed and read through a transpose, which the matmul
  // absorbs into its layout.
  auto c = px::bench::compile_fn(
      [l](const std::vector<px::Tensor>& in) {
        px::Tensor a = l == Layout::tn ? px::transpose(in[0], {1, 0}) : in[0];
        px::Tensor b = l == Layout::nt ? px::transpose(in[1], {1, 0}) : in[1];
        return std::vector<px::Tensor>{px::matmul(a, b)};
      },
      {px::bench::random_array(l == Layout::tn ? px::Shape{s.k, s.m} : px::Shape{s.m, s.k}, dt, 1),
       px::bench::random_array(l == Layout::nt ? px::Shape{s.n, s.k} : px::Shape{s.k, s.n}, dt, 2)});
  return px::bench::time_it([&] { c.run(); }, min_time);
}

}  // namespace

int main(int argc, char** argv) {
  px::bench::Flags flags = px::bench::parse_flags(argc, argv);
  // Square sizes, then the matmuls of one bench-gpt layer (8 x 256 = 2048 tokens, d 512, d_ff 2048,
  // vocab 8192): qkv, attention output, ffn up, ffn down, logits.
  std::vector<GemmShape> shapes = {
      {512, 512, 512, "square"},         {1024, 1024, 1024, "square"},     {2048, 2048, 2048, "square"},
      {2048, 512, 1536, "gpt_qkv"},      {2048, 512, 512, "gpt_attn_out"}, {2048, 512, 2048, "gpt_ffn_up"},
      {2048, 2048, 512, "gpt_ffn_down"}, {2048, 512, 8192, "gpt_logits"},
  };
  if (flags.quick) shapes = {{512, 512, 512, "square"}, {2048, 512, 2048, "gpt_ffn_up"}};

  struct Peak {
    double gflops = 0;
    std::string shape;
  };
  Peak peak[2];
  const memory::data_type dts[2] = {memory::data_type::f32, memory::data_type::bf16};
  const px::DType pdts[2] = {px::DType::f32, px::DType::bf16};
  for (const GemmShape& s : shapes)
    for (Layout l : {Layout::nn, Layout::nt, Layout::tn}) {
      if (l != Layout::nn && std::string(s.label) == "square") continue;
      double flops = 2.0 * s.m * s.k * s.n;
      std::string shape = std::to_string(s.m) + "x" + std::to_string(s.k) + "x" + std::to_string(s.n);
      // The fields every measurement of this shape and layout starts with.
      auto record = [&](const char* impl, const std::string& dtype) {
        Json r;
        r.s("bench", "gemm").s("impl", impl).s("dtype", dtype).s("shape", shape).s("label", s.label);
        r.s("layout", layout_name(l));
        return r;
      };
      double onednn_f32 = 0;  // this shape's f32 figure, the reference when oneDNN lacks bf16
      for (int d = 0; d < 2; ++d) {
        std::string impl, why;
        double t = time_onednn(s, l, dts[d], flags.min_time, impl, why);
        double onednn_gflops = t > 0 ? flops / t / 1e9 : 0;
        if (d == 0) onednn_f32 = onednn_gflops;
        if (d == 0) {
          const double ts = time_sgemm(s, l, flags.min_time);
          record("onednn_sgemm", "f32")
              .n("ms", ts * 1e3)
              .n("gflops", flops / ts / 1e9)
              .i("threads", px::bench::threads())
              .print();
        }
        Json j = record("onednn", px::dtype_name(pdts[d]));
        if (t > 0) {
          j.n("ms", t * 1e3).n("gflops", onednn_gflops).s("kernel", impl);
          if (onednn_gflops > peak[d].gflops) peak[d] = {onednn_gflops, shape};
        } else {
          j.b("supported", false).s("why", why);
        }
        j.i("threads", px::bench::threads()).print();

        double tp = time_parallax(s, l, pdts[d], flags.min_time);
        Json p = record("parallax", px::dtype_name(pdts[d]));
        p.n("ms", tp * 1e3).n("gflops", flops / tp / 1e9);
        // Parallax over oneDNN at the same dtype, or over oneDNN f32 when oneDNN lacks the dtype.
        double ref = t > 0 ? onednn_gflops : onednn_f32;
        if (ref > 0) p.n("vs_onednn", flops / tp / 1e9 / ref);
        p.print();
      }
    }
  // The FMA-loop peak of each dtype, measured after the matmuls (bf16: AMX or AVX-512 BF16, else f32's).
  const px::bench::FmaPeak fma = px::bench::fma_peak(px::bench::threads());
  for (int d = 0; d < 2; ++d) {
    Json j;
    j.s("bench", "gemm_peak").s("dtype", px::dtype_name(pdts[d]));
    const double fma_gflops = d == 1 && fma.bf16_gflops > 0 ? fma.bf16_gflops : fma.f32_gflops;
    if (peak[d].gflops > 0)
      j.n("gflops", peak[d].gflops)
          .s("shape", peak[d].shape)
          .n("fma_peak_gflops", fma_gflops)
          .s("isa", fma.isa)
          .n("fraction_of_fma_peak", peak[d].gflops / fma_gflops);
    else
      j.raw("gflops", "null").s("why", "oneDNN has no matmul for this dtype on this CPU; it runs through f32");
    j.i("threads", px::bench::threads()).print();
  }
  return 0;
}
