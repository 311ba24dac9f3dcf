// Small GPT-2 and Llama style LMs: loss and every param's gradient, partitioned data-parallel and
// Megatron-style (specs written by hand here; the recipes derive them), equal the unsharded run.
#include <gtest/gtest.h>

#include <random>

#include "parallax/nn.h"
#include "parallax/spmd.h"
#include "testing.h"

namespace px {
namespace {

std::vector<Mesh> meshes() {
  return {Mesh::cpu({{"data", 1}}),
          Mesh::cpu({{"data", 8}}),
          Mesh::cpu({{"data", 4}, {"model", 2}}),
          Mesh::cpu({{"data", 2}, {"model", 4}}),
          Mesh::cpu({{"model", 8}}),
          Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}})};
}

Array random_tokens(const Shape& s, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(numel(s));
  for (auto& t : v) t = static_cast<int32_t>(rng() % vocab);
  return Array::from_i32(v, s);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Megatron column / row splits over 'model' by param path; everything else replicated.
PartitionSpec tp_spec(const std::string& path, const Mesh& m) {
  if (m.axis_index("model") < 0) return {};
  for (const char* col : {"attn.wq", "attn.wk", "attn.wv", "mlp.fc.w", "mlp.gate.w", "mlp.up.w", "head.w"})
    if (ends_with(path, col)) return {none, "model"};
  for (const char* colb : {"attn.bq", "attn.bk", "attn.bv", "mlp.fc.b"})
    if (ends_with(path, colb)) return {"model"};
  for (const char* row : {"attn.wo", "mlp.proj.w", "mlp.down.w"})
    if (ends_with(path, row)) return {"model", none};
  return {};
}

void check_model(const nn::LmConfig& cfg, const std::vector<Mesh>& mesh_list, double atol, double rtol) {
  nn::TransformerLm model(cfg);
  const int64_t B = 8, S = cfg.max_seq_len;
  Array tokens = random_tokens({B, S}, cfg.vocab_size, 1), targets = random_tokens({B, S}, cfg.vocab_size, 2);
  const int np = model.store().size();
  auto g = nn::trace_with_params(model.store(),
                                 [&](const std::vector<Tensor>& b) {
                                   Tensor loss = nn::next_token_loss(model, b[0], b[1]);
                                   std::vector<Tensor> params;
                                   for (int i = 0; i < np; ++i) params.push_back(model.store().value(i));
                                   std::vector<Tensor> out = gradients(loss, params);
                                   out.insert(out.begin(), loss);
                                   return out;
                                 },
                                 {tokens.type(), targets.type()}, {"tokens", "targets"});
  std::vector<Array> inputs = model.init(0);
  inputs.push_back(tokens);
  inputs.push_back(targets);
  std::vector<Array> want = Executable::compile(*g)->run(inputs);
  for (const Mesh& m : mesh_list) {
    std::vector<std::string> batch;
    for (auto& ax : m.axes())
      if (ax.name != "model") batch.push_back(ax.name);
    for (bool tp : {false, true}) {
      std::vector<PartitionSpec> specs;
      for (int i = 0; i < np; ++i) specs.push_back(tp ? tp_spec(model.store().spec(i).path, m) : PartitionSpec());
      specs.push_back({batch});
      specs.push_back({batch});
      auto exe = ShardedExecutable::compile(*g, m, specs);
      std::vector<Array> got = exe->run_full(inputs);
      for (size_t o = 0; o < want.size(); ++o) {
        std::string what = o == 0 ? "loss" : "d " + model.store().spec(static_cast<int>(o) - 1).path;
        EXPECT_TRUE(testing::all_close(got[o].to_f32(), want[o].to_f32(), atol, rtol))
            << cfg.name << " " << what << " on " << m.to_string() << (tp ? " tp" : " ddp");
      }
    }
  }
}

// f32 sums in another order: errors of a few ulps of the largest terms.
TEST(SpmdModels, Gpt2StyleLossAndGradients) {
  check_model(nn::gpt2_config("gpt_micro", 256, 64, 4, 2, 128, 16), meshes(), 2e-6, 1e-4);
}

TEST(SpmdModels, LlamaStyleLossAndGradients) {
  check_model(nn::llama_config("llama_micro", 256, 64, 4, 2, 2, 96, 16), meshes(), 2e-6, 1e-4);
}

TEST(SpmdModels, Bf16ComputeStaysClose) {
  // bf16 matmul results are rounded per shard before the partial sums are added: bf16 tolerance.
  nn::LmConfig cfg = nn::gpt2_config("gpt_micro_bf16", 256, 64, 4, 2, 128, 16);
  cfg.compute_dtype = DType::bf16;
  check_model(cfg, {Mesh::cpu({{"data", 2}, {"model", 4}})}, 1e-3, 3e-2);
}

}  // namespace
}  // namespace px
