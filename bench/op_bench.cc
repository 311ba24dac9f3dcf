// Time per op at bench-gpt sizes (batch 8, seq 256, d_model 512, heads 8, vocab 8192), forward
// and, for the ops a training step leans on, forward + backward. GB/s counts each input and
// output once (the least traffic the op can do); each case is compared with copying as many
// bytes in the same run.
//   ./bench/op_bench [--quick] [--min_time=0.3]
#include <cstring>

#include "bench_util.h"
#include "parallax/autodiff.h"
#include "parallax/ops.h"
#include "parallax/optim.h"

namespace {

using px::Tensor;
using px::bench::copy_seconds;
using px::bench::Json;
using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

constexpr int64_t B = 8, S = 256, D = 512, H = 8, V = 8192, T = B * S;

// The loss of a value: sum(y * r) with a fixed r, so its gradient is a full-size cotangent.
Tensor weighted_sum(const Tensor& y) { return px::sum(y * px::full_like(y, 0.5)); }

Fn with_grad(Fn f, std::vector<int> wrt) {
  return [f, wrt](const std::vector<Tensor>& in) {
    Tensor loss = weighted_sum(f(in)[0]);
    std::vector<Tensor> xs;
    for (int w : wrt) xs.push_back(in[w]);
    std::vector<Tensor> out = px::gradients(loss, xs);
    out.insert(out.begin(), loss);
    return out;
  };
}

// Fused attention against the batched matmuls it contains (issue 53): bench-gpt's heads (8 of 64,
// batch 8, sequence 256; and GPT-2 small's 12 of 64, batch 2, sequence 1024), not causal, so
// that both do the same products: softmax(q k^T) v against (q k^T) v as two dot_generals, alone
// and with the gradients of q, k and v (attention's backward recomputes q k^T: five products
// against the matmuls' four). Interleaved rounds; the median ratio with its range.
void attention_vs_matmuls(const px::bench::Flags& flags) {
  using px::DType;
  struct Size {
    const char* name;
    px::Shape shape;
  };
  for (const Size& size : {Size{"bench", {8, 8, 256, 64}}, Size{"gpt2_small", {2, 12, 1024, 64}}})
    for (DType dt : {DType::f32, DType::bf16})
      for (bool grad : {false, true}) {
        Fn attention = [](auto& x) {
          return std::vector<Tensor>{px::dot_product_attention(x[0], x[1], x[2], {.causal = false})};
        };
        Fn matmuls = [](auto& x) {
          const px::DotDims scores{.lhs_contract = {3}, .rhs_contract = {3}, .lhs_batch = {0, 1}, .rhs_batch = {0, 1}};
          const px::DotDims mix{.lhs_contract = {3}, .rhs_contract = {2}, .lhs_batch = {0, 1}, .rhs_batch = {0, 1}};
          return std::vector<Tensor>{px::dot_general(px::dot_general(x[0], x[1], scores), x[2], mix)};
        };
        if (grad) attention = with_grad(attention, {0, 1, 2}), matmuls = with_grad(matmuls, {0, 1, 2});
        std::vector<px::Array> in;
        for (uint32_t k = 0; k < 3; ++k) in.push_back(px::bench::random_array(size.shape, dt, k + 1, -0.5f, 0.5f));
        auto a = px::bench::compile_fn(attention, in);
        auto m = px::bench::compile_fn(matmuls, in);
        std::vector<double> ratio, ta, tm;
        for (int round = 0; round < 5; ++round) {
          ta.push_back(px::bench::time_it([&] { a.run(); }, flags.min_time));
          tm.push_back(px::bench::time_it([&] { m.run(); }, flags.min_time));
          ratio.push_back(ta.back() / tm.back());
        }
        auto median = [](std::vector<double> v) {
          std::sort(v.begin(), v.end());
          return v[v.size() / 2];
        };
        Json()
            .s("bench", "attention_vs_matmuls")
            .s("size", size.name)
            .s("dtype", px::dtype_name(dt))
            .s("pass", grad ? "forward+backward" : "forward")
            .n("attention_ms", median(ta) * 1e3)
            .n("matmuls_ms", median(tm) * 1e3)
            .n("ratio", median(ratio))
            .n("ratio_min", *std::min_element(ratio.begin(), ratio.end()))
            .n("ratio_max", *std::max_element(ratio.begin(), ratio.end()))
            .print();
      }
}

}  // namespace

int main(int argc, char** argv) {
  px::bench::Flags flags = px::bench::parse_flags(argc, argv);
  using px::DType;
  auto rnd = [](const px::Shape& s, uint32_t seed) { return px::bench::random_array(s, DType::f32, seed); };
  auto bf = [](const px::Shape& s, uint32_t seed) { return px::bench::random_array(s, DType::bf16, seed); };
  auto ids = [](const px::Shape& s, int64_t hi) {
    return px::bench::random_array(s, DType::f32, 7, 0.0f, static_cast<float>(hi) - 0.5f).astype(DType::i32);
  };

  struct Case {
    std::string op;
    Fn fn;
    std::vector<px::Array> inputs;
  };
  std::vector<Case> cases = {
      {"add", [](auto& x) { return std::vector<Tensor>{x[0] + x[1]}; }, {rnd({T, D}, 1), rnd({T, D}, 2)}},
      {"add_bias", [](auto& x) { return std::vector<Tensor>{x[0] + x[1]}; }, {rnd({T, 4 * D}, 1), rnd({4 * D}, 2)}},
      {"exp", [](auto& x) { return std::vector<Tensor>{px::exp(x[0])}; }, {rnd({T, D}, 1)}},
      {"gelu", [](auto& x) { return std::vector<Tensor>{px::gelu(x[0])}; }, {rnd({T, 4 * D}, 1)}},
      {"bias_gelu", [](auto& x) { return std::vector<Tensor>{px::gelu(x[0] + x[1])}; },
       {rnd({B, S, 4 * D}, 1), rnd({4 * D}, 2)}},
      {"sum_last", [](auto& x) { return std::vector<Tensor>{px::sum(x[0], {-1})}; }, {rnd({T, D}, 1)}},
      {"sum_first", [](auto& x) { return std::vector<Tensor>{px::sum(x[0], {0})}; }, {rnd({T, D}, 1)}},
      {"max_last", [](auto& x) { return std::vector<Tensor>{px::max(x[0], {-1})}; }, {rnd({T, V}, 1)}},
      {"softmax", [](auto& x) { return std::vector<Tensor>{px::softmax(x[0], -1)}; }, {rnd({B, H, S, S}, 1)}},
      {"layer_norm", [](auto& x) { return std::vector<Tensor>{px::layer_norm(x[0], x[1], x[2])}; },
       {rnd({B, S, D}, 1), rnd({D}, 2), rnd({D}, 3)}},
      {"transpose_heads",
       [](auto& x) { return std::vector<Tensor>{px::transpose(x[0], {0, 2, 1, 3})}; },
       {rnd({B, S, H, D / H}, 1)}},
      {"transpose_2d", [](auto& x) { return std::vector<Tensor>{px::transpose(x[0], {1, 0})}; }, {rnd({T, D}, 1)}},
      {"take_embedding", [](auto& x) { return std::vector<Tensor>{px::take(x[0], x[1])}; },
       {rnd({V, D}, 1), ids({B, S}, V)}},
      {"softmax_cross_entropy",
       [](auto& x) { return std::vector<Tensor>{px::softmax_cross_entropy(x[0], x[1])}; },
       {rnd({B, S, V}, 1), ids({B, S}, V)}},
  };
  // Forward + backward of the ops that dominate a training step's non-matmul time.
  std::vector<Case> grads = {
      {"softmax+grad", with_grad([](auto& x) { return std::vector<Tensor>{px::softmax(x[0], -1)}; }, {0}),
       {rnd({B, H, S, S}, 1)}},
      {"layer_norm+grad",
       with_grad([](auto& x) { return std::vector<Tensor>{px::layer_norm(x[0], x[1], x[2])}; }, {0, 1, 2}),
       {rnd({B, S, D}, 1), rnd({D}, 2), rnd({D}, 3)}},
      {"gelu+grad", with_grad([](auto& x) { return std::vector<Tensor>{px::gelu(x[0])}; }, {0}), {rnd({T, 4 * D}, 1)}},
      {"take_embedding+grad", with_grad([](auto& x) { return std::vector<Tensor>{px::take(x[0], x[1])}; }, {0}),
       {rnd({V, D}, 1), ids({B, S}, V)}},
      // bench-gpt's attention (8 heads of 64 over 2 kv heads, causal) on bf16 q, k and v, as a bf16
      // step runs it: the forward alone, then with the gradients of q, k and v.
      {"attention_bf16",
       [](auto& x) { return std::vector<Tensor>{px::dot_product_attention(x[0], x[1], x[2])}; },
       {bf({B, H, S, D / H}, 1), bf({B, 2, S, D / H}, 2), bf({B, 2, S, D / H}, 3)}},
      {"attention_bf16+grad",
       with_grad([](auto& x) { return std::vector<Tensor>{px::dot_product_attention(x[0], x[1], x[2])}; }, {0, 1, 2}),
       {bf({B, H, S, D / H}, 1), bf({B, 2, S, D / H}, 2), bf({B, 2, S, D / H}, 3)}},
      // GPT-2 small's (12 heads of 64 over 4 kv heads, batch 2, sequence 1024).
      {"attention_bf16_gpt2_small+grad",
       with_grad([](auto& x) { return std::vector<Tensor>{px::dot_product_attention(x[0], x[1], x[2])}; }, {0, 1, 2}),
       {bf({2, 12, 1024, 64}, 1), bf({2, 4, 1024, 64}, 2), bf({2, 4, 1024, 64}, 3)}},
      {"cross_entropy_loss+grad",
       [](auto& x) {
         Tensor loss = px::cross_entropy_loss(x[0], x[1]);
         return std::vector<Tensor>{loss, px::gradients(loss, {x[0]})[0]};
       },
       {rnd({B, S, V}, 1), ids({B, S}, V)}},
      // As in a bf16 step: the gradient is stored in bf16 (the kernel writes it narrow).
      {"cross_entropy_loss+grad_bf16",
       [](auto& x) {
         Tensor loss = px::cross_entropy_loss(x[0], x[1]);
         return std::vector<Tensor>{loss, px::cast(px::gradients(loss, {x[0]})[0], DType::bf16)};
       },
       {rnd({B, S, V}, 1), ids({B, S}, V)}},
  };
  cases.insert(cases.end(), grads.begin(), grads.end());
  // The optimizer update of a 4M-element param (px::optim::adamw as a training step emits it):
  // reads p, g, m, v and writes p, m, v, the least traffic any AdamW can do.
  auto adam = px::optim::adamw({.lr = 1e-3, .weight_decay = 0.1});
  cases.push_back({"adamw_update",
                   [adam](auto& x) {
                     px::optim::Update u = adam->apply({x[0]}, {x[1]}, {x[2], x[3]}, x[4]);
                     return std::vector<Tensor>{u.params[0], u.state[0], u.state[1]};
                   },
                   {rnd({4 << 20}, 1), rnd({4 << 20}, 2), rnd({4 << 20}, 3),
                    px::bench::random_array({4 << 20}, DType::f32, 4, 0.0f, 1.0f), px::Array::from_i32({3}, {})}});
  // A bf16 step's cast of an f32 param to bf16 (4M elements: bench-gpt's embedding).
  cases.push_back({"cast_bf16", [](auto& x) { return std::vector<Tensor>{px::cast(x[0], DType::bf16)}; },
                   {rnd({T, 4 * D}, 1)}});
  if (flags.only == "attention_vs_matmuls") return attention_vs_matmuls(flags), 0;
  if (flags.quick) cases = {cases[0], cases[7], cases[8]};
  if (!flags.only.empty()) {
    std::erase_if(cases, [&](const Case& c) { return c.op != flags.only; });
    if (cases.empty()) {
      std::fprintf(stderr, "op_bench: no case named '%s'\n", flags.only.c_str());
      return 2;
    }
  }

  // Main-memory bandwidth (64 MiB, beyond the caches), for reference.
  const int64_t big = 64 << 20;
  Json().s("bench", "memcpy").i("bytes", 2 * big).n("gbps", 2.0 * big / copy_seconds(big, flags.min_time) / 1e9)
      .i("threads", px::bench::threads()).print();
  for (Case& c : cases) {
    std::string shape;
    for (auto& a : c.inputs) shape += (shape.empty() ? "" : ",") + px::type_str(a.type());
    Json j;
    j.s("bench", "op").s("op", c.op).s("inputs", shape);
    try {
      auto comp = px::bench::compile_fn(c.fn, c.inputs);
      double bytes = 0;
      for (auto& a : comp.inputs) bytes += static_cast<double>(a.nbytes());
      for (auto& a : comp.outputs) bytes += static_cast<double>(a.nbytes());
      double t = px::bench::time_it([&] { comp.run(); }, flags.min_time);
      double tc = copy_seconds(static_cast<int64_t>(bytes / 2), flags.min_time);
      j.n("ms", t * 1e3).n("gbps", bytes / t / 1e9).n("copy_ms", tc * 1e3).n("vs_copy", tc / t);
      j.i("steps", comp.exe->num_steps());
    } catch (const px::Error& e) {
      // An op that is not implemented yet is reported, not fatal: the rest still run.
      std::string msg = e.what();
      for (char& ch : msg)
        if (ch == '"' || ch == '\\' || ch == '\n') ch = '\'';
      j.s("error", msg);
    }
    j.print();
  }
  return 0;
}
