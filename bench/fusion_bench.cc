// The fused-loop engine against op-by-op execution and against the memory: a chain of 8
// elementwise ops on a large f32 tensor, compiled with fusion on and off, and a plain copy of as
// many bytes as the fused chain moves at least, in the same run (interleaved rounds). The targets:
// fused >= 3x unfused and >= 0.8 of the copy bandwidth.
//   ./bench/fusion_bench [--min_time=0.3] [--quick]
#include <algorithm>
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

  // The least traffic: the three inputs read once and the result written once. Copying half as
  // many bytes (read once, written once) moves as many.
  const double bytes = 4.0 * n * 4;
  // Rounds of copy, fused, unfused, one after the other, so that the machine's load reaches all
  // three alike; each figure is the median over the rounds of the median time of a round.
  const int rounds = 3;
  std::vector<double> tc, tf, tu, speedup, vs_copy;
  for (int r = 0; r < rounds; ++r) {
    tc.push_back(px::bench::copy_seconds(static_cast<int64_t>(bytes / 2), flags.min_time / rounds));
    tf.push_back(px::bench::time_it([&] { fused.run(); }, flags.min_time / rounds));
    tu.push_back(px::bench::time_it([&] { unfused.run(); }, flags.min_time / rounds));
    speedup.push_back(tu.back() / tf.back());
    vs_copy.push_back(tc.back() / tf.back());
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
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
  report("fused", median(tf), fused);
  report("unfused", median(tu), unfused);
  const double copy_s = median(tc);
  px::bench::Json()
      .s("bench", "fusion_copy")
      .n("ms", copy_s * 1e3)
      .n("gbps", bytes / copy_s / 1e9)
      .i("threads", px::bench::threads())
      .print();
  const double sp = median(speedup), vc = median(vs_copy);
  px::bench::Json()
      .s("bench", "fusion_speedup")
      .n("speedup", sp)
      .b("meets_3x", sp >= 3.0)
      .n("vs_copy", vc)
      .b("meets_0.8_copy", vc >= 0.8)
      .n("max_abs_diff", max_diff)
      .i("threads", px::bench::threads())
      .i("rounds", rounds)
      .print();
  return 0;
}
