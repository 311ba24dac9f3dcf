// A Hugging Face checkpoint streamed into an FSDP step on 4 devices: each param is sharded as
// soon as it is read and dropped, so no device ever holds the whole model (the allocator's
// per-device high-water marks say so), and the state equals the one made from the full params.
// Sliced, each device reads only its own shard, and each of two processes only its part.
#include <gtest/gtest.h>

#include <cstdio>

#include "distributed/threaded.h"
#include "nn/pretrained_util.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/nn/pretrained.h"
#include "parallax/parallel.h"
#include "testing.h"

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
  TrainStep step(
      model.store(), optim::sgd({.lr = 0.1}),
      [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); }, batch,
      px::testing::on_mesh(mesh, ShardingStrategy::FSDP, so));

  auto growth = [&](const std::function<void()>& fn) {
    std::vector<int64_t> base;
    for (int d : mesh.device_ids()) {
      reset_peak_memory({d});
      base.push_back(memory_stats({d}).bytes_in_use);
    }
    fn();
    std::vector<int64_t> out;
    for (size_t k = 0; k < base.size(); ++k)
      out.push_back(memory_stats({mesh.device_ids()[k]}).peak_bytes_in_use - base[k]);
    return out;
  };

  TrainState streamed;
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
  TrainState whole;
  std::vector<int64_t> g_whole = growth([&] { whole = step.init(nn::load_pretrained(dir.str()).params); });
  EXPECT_GE(g_whole[0], model_bytes);

  std::vector<Array> a = step.gather_params(streamed), b = step.gather_params(whole);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].to_f32(), b[i].to_f32()) << i;
  std::vector<int32_t> tok(4 * 32);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 37) % 512);
  Array x = Array::from_i32(tok, {4, 32});
  const float first_loss = step(streamed, {x, x}).loss;
  EXPECT_EQ(first_loss, step(whole, {x, x}).loss);

  // Sliced: every device reads its own box straight into its shard; no param is ever whole.
  TrainState sliced;
  int64_t elements_read = 0;
  std::vector<int64_t> g_sliced = growth([&] {
    sliced = step.begin_state();
    nn::load_pretrained_slices(dir.str(), [&](int i, const BoxReader& read) {
      step.set_param(sliced, i, [&](const std::vector<int64_t>& off, Array& out) {
        elements_read += numel(out.shape());
        read(off, out);
      });
    });
  });
  EXPECT_EQ(elements_read * 4, model_bytes);  // every element once (f32)
  for (size_t k = 0; k < g_sliced.size(); ++k) EXPECT_EQ(g_sliced[k], model_bytes / 4) << "device " << k;
  std::vector<Array> c = step.gather_params(sliced);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(c[i].to_f32(), a[i].to_f32()) << i;
  EXPECT_EQ(step(sliced, {x, x}).loss, first_loss);

  // A state with a param never set is an error at the step, naming it.
  TrainState partial = step.begin_state();
  EXPECT_THROW(step(partial, {x, x}), Error);
  EXPECT_THROW(step.set_param(partial, 999, a[0]), Error);
  EXPECT_THROW(step.set_param(partial, 1, a[0]), Error);  // wrong shape for param 1
}

// GPT-2 (Conv1D weights stored transposed, q, k and v in one tensor) into FSDP_TP over 2
// processes of 2 devices: each process reads only the boxes of its own devices, about half of
// the model, and the params and the first step equal those loaded whole.
TEST(PretrainedLoad, SlicedOverTwoProcessesEachReadsItsPart) {
  testing::TempDir dir("pretrained_sliced_procs");
  nn::LmConfig cfg = nn::gpt2_config("gpt2", 256, 64, 4, 2, 128, 16);
  {
    nn::TransformerLm m(cfg);
    nn::save_pretrained(m, m.init(3), dir.str());
  }
  const std::vector<TensorType> batch = {{DType::i32, {4, 16}}, {DType::i32, {4, 16}}};
  ShardingOptions so;
  so.fsdp_min_bytes = 0;
  Mesh single = Mesh::cpu({{"data", 2}, {"model", 2}});
  Mesh split = single.with_processes(2);
  std::vector<int32_t> tok(4 * 16);
  for (size_t i = 0; i < tok.size(); ++i) tok[i] = static_cast<int32_t>((i * 29) % 256);
  Array x = Array::from_i32(tok, {4, 16});

  nn::TransformerLm ref_model(nn::read_pretrained_config(dir.str()));
  int64_t model_elements = 0;
  for (const TensorType& t : ref_model.store().types()) model_elements += numel(t.shape);
  auto loss_of = [&](nn::TransformerLm& m) {
    return [&m](const std::vector<Tensor>& b) { return nn::next_token_loss(m, b[0], b[1]); };
  };
  TrainStep ref(ref_model.store(), optim::adamw({}), loss_of(ref_model), batch,
                px::testing::on_mesh(single, ShardingStrategy::FSDP_TP, so));
  TrainState rs = ref.init(nn::load_pretrained(dir.str()).params);
  std::vector<Array> want = ref.gather_params(rs);
  const float want_loss = ref(rs, {x, x}).loss;

  std::vector<int64_t> read(2, 0);
  std::vector<std::vector<Array>> got(2);
  std::vector<float> loss(2);
  auto world = make_threaded_world(split.process_layout());
  world->run([&](int p, Communicator& comm) {
    nn::TransformerLm m(nn::read_pretrained_config(dir.str()));
    ShardingOptions o = so;
    o.communicator = &comm;
    TrainStep step(m.store(), optim::adamw({}), loss_of(m), batch,
                   px::testing::on_mesh(split, ShardingStrategy::FSDP_TP, o));
    TrainState s = step.begin_state();
    nn::load_pretrained_slices(dir.str(), [&](int i, const BoxReader& r) {
      step.set_param(s, i, [&](const std::vector<int64_t>& off, Array& out) {
        read[p] += numel(out.shape());
        r(off, out);
      });
    });
    got[p] = step.gather_params(s);
    loss[p] = step(s, {x, x}).loss;
  });
  for (int p = 0; p < 2; ++p) {
    SCOPED_TRACE("process " + std::to_string(p));
    std::printf("process %d read %lld of %lld elements\n", p, static_cast<long long>(read[p]),
                static_cast<long long>(model_elements));
    EXPECT_GE(read[p] * 2, model_elements);
    EXPECT_LT(read[p] * 4, model_elements * 3);  // never the whole model: about half
    ASSERT_EQ(got[p].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[p][i].to_f32(), want[i].to_f32()) << i;
    EXPECT_EQ(loss[p], want_loss);
  }
}

}  // namespace
}  // namespace px
