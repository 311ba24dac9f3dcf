// The recipe equivalence matrix on the full gpt2_tiny and llama_tiny presets (seq 128, batch 8):
// 3 sharded AdamW steps on each mesh, with each recipe the mesh allows, equal the unsharded run.
#include <gtest/gtest.h>

#include <algorithm>
#include <exception>

#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "recipe_check.h"

namespace px {
namespace {

using namespace recipe_check;

// One unsharded reference per model, shared by every case that runs in this process.
const Reference& gpt_ref() {
  static const Reference r = run_reference(nn::gpt2_tiny(), 3);
  return r;
}
const Reference& llama_ref() {
  static const Reference r = run_reference(nn::llama_tiny(), 3);
  return r;
}

bool has_axis(const Mesh& mesh, const std::string& axis) { return mesh.axis_index(axis) >= 0; }

int count_split(const ShardingPlan& plan) {
  return static_cast<int>(
      std::count_if(plan.params.begin(), plan.params.end(), [](const auto& p) { return !p.spec.is_replicated(); }));
}

// Every batch axis of the mesh (all but 'model') holds a piece of some FSDP-split param.
void expect_fsdp_uses_every_batch_axis(const ShardingPlan& plan, const std::string& what) {
  for (const std::string& axis : plan.batch_axes) {
    bool used = false;
    for (const auto& p : plan.params) {
      auto axes = p.spec.used_axes();
      used |= std::find(axes.begin(), axes.end(), axis) != axes.end();
    }
    EXPECT_TRUE(used) << what << ": no param is split over '" << axis << "'\n" << plan.table();
  }
}

// DDP and FSDP where the mesh has a 'data' axis, TP and FSDP_TP where it has a 'model' axis
// (FSDP_TP needs both). A case that throws is reported by name and the others still run.
void check_mesh(const Reference& ref, const Mesh& mesh) {
  std::vector<ShardingStrategy> strategies;
  if (has_axis(mesh, "data")) strategies = {ShardingStrategy::DDP, ShardingStrategy::FSDP};
  if (has_axis(mesh, "model")) strategies.push_back(ShardingStrategy::TP);
  if (has_axis(mesh, "data") && has_axis(mesh, "model")) strategies.push_back(ShardingStrategy::FSDP_TP);
  for (ShardingStrategy s : strategies) {
    const std::string what = ref.cfg.name + " " + strategy_name(s) + " on " + mesh.to_string();
    const bool fsdp = s == ShardingStrategy::FSDP || s == ShardingStrategy::FSDP_TP;
    ShardingOptions sopt;
    if (fsdp) sopt.fsdp_min_bytes = 1024;  // split all but the norm scales and the d_model-sized biases
    try {
      ShardingPlan plan = check_sharded(ref, mesh, s, sopt);
      int64_t batch_devices = 1;
      for (const auto& a : plan.batch_axes) batch_devices *= mesh.axis_size(a);
      // The recipe really shards something whenever its axes have more than one device.
      if (s == ShardingStrategy::DDP)
        EXPECT_EQ(count_split(plan), 0) << what << "\n" << plan.table();
      else if (s == ShardingStrategy::FSDP && batch_devices == 1)
        EXPECT_EQ(count_split(plan), 0) << what << "\n" << plan.table();
      else
        EXPECT_GE(count_split(plan), 8) << what << "\n" << plan.table();
      if (fsdp && batch_devices > 1) expect_fsdp_uses_every_batch_axis(plan, what);
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << " threw: " << e.what();
    }
  }
}

Mesh data1() { return Mesh::cpu({{"data", 1}}); }
Mesh data8() { return Mesh::cpu({{"data", 8}}); }
Mesh data4_model2() { return Mesh::cpu({{"data", 4}, {"model", 2}}); }
Mesh data2_model4() { return Mesh::cpu({{"data", 2}, {"model", 4}}); }
Mesh model8() { return Mesh::cpu({{"model", 8}}); }
Mesh data2_fsdp2_model2() { return Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}}); }

// One TEST per model and mesh so that ctest -j2 spreads the matrix over both cores.
TEST(RecipesTiny, GptData1) { check_mesh(gpt_ref(), data1()); }
TEST(RecipesTiny, GptData8) { check_mesh(gpt_ref(), data8()); }
TEST(RecipesTiny, GptData4Model2) { check_mesh(gpt_ref(), data4_model2()); }
TEST(RecipesTiny, GptData2Model4) { check_mesh(gpt_ref(), data2_model4()); }
TEST(RecipesTiny, GptModel8) { check_mesh(gpt_ref(), model8()); }
TEST(RecipesTiny, GptData2Fsdp2Model2) { check_mesh(gpt_ref(), data2_fsdp2_model2()); }

TEST(RecipesTiny, LlamaData1) { check_mesh(llama_ref(), data1()); }
TEST(RecipesTiny, LlamaData8) { check_mesh(llama_ref(), data8()); }
TEST(RecipesTiny, LlamaData4Model2) { check_mesh(llama_ref(), data4_model2()); }
TEST(RecipesTiny, LlamaData2Model4) { check_mesh(llama_ref(), data2_model4()); }
TEST(RecipesTiny, LlamaModel8) { check_mesh(llama_ref(), model8()); }
TEST(RecipesTiny, LlamaData2Fsdp2Model2) { check_mesh(llama_ref(), data2_fsdp2_model2()); }

}  // namespace
}  // namespace px
