// A Hugging Face checkpoint streamed into an FSDP step on 4 devices: each param is sharded as
// soon as it is read and dropped, so no device ever holds the whole model (the allocator's
// per-device high-water marks say so), and the state equals the one made from the full params.
#include <gtest/gtest.h>

#include <cstdio>

#include "nn/pretrained_util.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/nn/pretrained.h"
#include "parallax/parallel.h"

namespace px {
namespace {

TEST(PretrainedLoad, StreamedIntoFsdpNoDeviceHoldsTheWholeModel) {
  testing::TempDir dir("pretrained_fsdp");
  nn::LmConfig cfg = nn::llama_config("llama", 512, 64, 4, 2, 4, 128, 32);
  {
    nn::TransformerLm m(cfg);
    nn::save_pretrained(m, m.init(7), dir.str());
  }
  nn::TransformerLm model(nn::read_pretrained_config(dir.str()));
  int64_t model_bytes = 0;
  for (const TensorType& t : model.store().types()) model_bytes += t.nbytes();
  const std::vector<TensorType> batch = {{DType::i32, {4, 32}}, {DType::i32, {4, 32}}};
  ShardingOptions so;
  so.fsdp_min_bytes = 0;
  Mesh mesh = Mesh::cpu({{"data", 4}});
  ShardedTrainStep step(
      model.store(), optim::sgd({.lr = 0.1}),
      [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); }, batch, mesh,
      ShardingStrategy::FSDP, so);

  auto growth = [&](const std::function<void()>& fn) {
    std::vector<int64_t> base;
    for (int d : mesh.device_ids()) {
      reset_peak_memory({d});
      base.push_back(memory_stats({d}).bytes_in_use);
    }
    fn();
    std::vector<int64_t> out;
    for (size_t k = 0; k < base.size(); ++k) out.push_back(memory_stats({mesh.device_ids()[k]}).peak_bytes_in_use - base[k]);
    return out;
  };

  ShardedTrainState streamed;
  std::vector<int64_t> g = growth([&] {
    streamed = step.begin_state();
    nn::load_pretrained(dir.str(), [&](int i, Array p) { step.set_param(streamed, i, p); });
  });
  std::printf("model %lld bytes; streamed, per device high-water growth:", static_cast<long long>(model_bytes));
  for (int64_t v : g) std::printf(" %lld", static_cast<long long>(v));
  std::printf("\n");
  for (size_t k = 0; k < g.size(); ++k) {
    SCOPED_TRACE("device " + std::to_string(k));
    EXPECT_GE(g[k], model_bytes / 4);  // its quarter of every param
    EXPECT_LT(g[k], model_bytes / 2);  // and never the whole model
  }
  // Loading whole and then sharding holds the full model on device 0: the check can tell.
  ShardedTrainState whole;
  std::vector<int64_t> g_whole = growth([&] { whole = step.init(nn::load_pretrained(dir.str()).params); });
  EXPECT_GE(g_whole[0], model_bytes);

  std::vector<Array> a = step.gather_params(streamed), b = step.gather_params(whole);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_f32(), b[i].to_f32()) << i;
  std::vector<int32_t> tok(4 * 32);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 37) % 512);
  Array x = Array::from_i32(tok, {4, 32});
  EXPECT_EQ(step(streamed, {x, x}).loss, step(whole, {x, x}).loss);

  // A state with a param never set is an error at the step, naming it.
  ShardedTrainState partial = step.begin_state();
  EXPECT_THROW(step(partial, {x, x}), Error);
  EXPECT_THROW(step.set_param(partial, 999, a[0]), Error);
  EXPECT_THROW(step.set_param(partial, 1, a[0]), Error);  // wrong shape for param 1
}

}  // namespace
}  // namespace px
