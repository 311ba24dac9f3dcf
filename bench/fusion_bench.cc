// The fused-loop engine against op-by-op execution: a chain of 8 elementwise ops on a large
// f32 tensor, compiled with fusion on and off, in the same run. The target is fused >= 2x.
//   ./bench/fusion_bench [--min_time=0.3] [--quick]
#include <cmath>

#include "bench_util.h"
#include "parallax/ops.h"

int main(int argc, char** argv) {
  px::bench::Flags flags = px::bench::parse_flags(argc, argv);
  const int64_t n = flags.quick ? (1 << 20) : (8 << 20);
  auto chain = [](const std::vector<px::Tensor>& in) {
    const px::Tensor &x = in[0], &a = in[1], &b = in[2];
    px::Tensor t = x * a + b;  // 2 ops
    t = px::tanh(t);
    t = t * 0.5;
    t = px::exp(t);
    t = t - x;
    t = px::sigmoid(t);
    t = t * t;
    return std::vector<px::Tensor>{t};
  };
  std::vector<px::Array> inputs = {px::bench::random_array({n}, px::DType::f32, 1),
                                   px::bench::random_array({n}, px::DType::f32, 2),
                                   px::bench::random_array({n}, px::DType::f32, 3)};

  px::CompileOptions fused_opt, unfused_opt;
  unfused_opt.fuse_elementwise = false;
  auto fused = px::bench::compile_fn(chain, inputs, fused_opt);
  auto unfused = px::bench::compile_fn(chain, inputs, unfused_opt);

  // Both must compute the same thing; elementwise kernels are the same, only the loop differs.
  std::vector<float> yf = fused.outputs[0].to_f32(), yu = unfused.outputs[0].to_f32();
  double max_diff = 0;
  for (size_t i = 0; i < yf.size(); ++i) max_diff = std::max(max_diff, static_cast<double>(std::fabs(yf[i] - yu[i])));

  double tf = px::bench::time_it([&] { fused.run(); }, flags.min_time);
  double tu = px::bench::time_it([&] { unfused.run(); }, flags.min_time);
  // The least traffic: the three inputs read once and the result written once.
  double bytes = 4.0 * n * 4;
  auto report = [&](const char* mode, double t, const px::bench::Compiled& c) {
    px::bench::Json()
        .s("bench", "fusion")
        .s("mode", mode)
        .i("elements", n)
        .i("ops", static_cast<int64_t>(c.graph->nodes().size()))
        .i("steps", c.exe->num_steps())
        .i("fused_groups", c.exe->num_fused_groups())
        .i("peak_bytes", c.exe->peak_bytes())
        .n("ms", t * 1e3)
        .n("gbps", bytes / t / 1e9)
        .print();
  };
  report("fused", tf, fused);
  report("unfused", tu, unfused);
  px::bench::Json()
      .s("bench", "fusion_speedup")
      .n("speedup", tu / tf)
      .b("meets_2x", tu / tf >= 2.0)
      .n("max_abs_diff", max_diff)
      .i("threads", px::bench::threads())
      .print();
  return 0;
}
