// How a step is split over a mesh: the recipes (DDP, FSDP, TP, FSDP_TP, MANUAL) and AUTO, their
// options, and the plan they produce (a spec for every param). px::TrainStep takes these in
// TrainStepOptions; px::plan_sharding and px::plan_auto produce plans without running anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallax/sharding.h"
#include "parallax/spmd.h"

namespace px {

enum class ShardingStrategy { AUTO, DDP, FSDP, TP, FSDP_TP, MANUAL };
const char* strategy_name(ShardingStrategy s);

// A MANUAL rule: params whose path matches the glob ('*' any run of characters, '?' one) get spec.
// The first matching rule wins; under any strategy, rules override what the recipe chose.
struct PathRule {
  std::string pattern;
  PartitionSpec spec;
};

struct ShardingOptions {
  std::string data_axis = "data";    // batch axis; every other mesh axis but model_axis also splits the batch
  std::string model_axis = "model";  // tensor-parallel axis
  int64_t fsdp_min_bytes = 4096;     // FSDP keeps params smaller than this replicated
  std::vector<PathRule> rules;       // overrides, first match wins
  // Layouts required of values tagged with px::tag (first matching name wins), e.g.
  // {"layer_input", P(("data"), "model", None)}: the activations between TransformerLm blocks split
  // over the sequence on the model axis (sequence parallelism). Training steps only.
  std::vector<PathRule> activation_rules;
  // Replicated gradients are all-reduced in buckets of up to this many bytes (one collective per
  // bucket, in param order); 0: one all-reduce per gradient. -1 (default): 25 MiB buckets when a
  // batch axis runs over a link with a latency of 10 us or more (across processes), none in one
  // process, where a call costs microseconds and packing a bucket copies every gradient twice.
  int64_t bucket_bytes = -1;
  DeviceParallelism device_parallelism = DeviceParallelism::automatic;  // how virtual devices share the cores
  // A mesh over several processes (Mesh::with_processes): this process's communicator (not owned).
  // The step then runs, and its state holds, only this process's positions; the process is the
  // one whose positions the communicator holds. Unset: the in-process one over the whole mesh.
  Communicator* communicator = nullptr;
  // AUTO (see docs/auto-sharding.md): the cluster the plans are costed for (a preset name or a
  // TOML file), the solver's time limit (the best plan found by then is used) and the memory
  // each device may use (0: the cluster's device memory).
  std::string auto_cluster = "cpu";
  double auto_time_limit_s = 10;
  int64_t auto_memory_limit_bytes = 0;
  // AUTO in one process also plans the mesh's devices pipelined (a `stage` axis outermost over
  // every count dividing the devices; DDP or FSDP inside, or TP / FSDP_TP over a node's devices;
  // 1F1B or zero-bubble, 2S or 4S microbatches; docs/pipeline.md) and trains the pipelined plan
  // when it fits and is predicted faster than the best plan on the mesh as given. Not with `rules`
  // (they name the mesh's axes). Off by default: on virtual CPU devices sharing a host the
  // pipeline's threads contend for its cores, which the cost model does not see.
  bool auto_pipeline = false;
};

struct ParamPlacement {
  std::string path;
  TensorType type;
  PartitionSpec spec;
  int64_t bytes_per_device = 0;
  std::string reason;  // e.g. "column (feeds blocks.0.mlp.proj.w)", "fsdp dim 0", "rule 'head.*'"
};

// The placement of every param and of the batch, decided at plan time.
struct ShardingPlan {
  Mesh mesh;
  ShardingStrategy strategy = ShardingStrategy::DDP;
  std::vector<ParamPlacement> params;   // in the store's order
  std::vector<std::string> batch_axes;  // the batch's leading dim is split over these
  std::vector<PathRule> activations;    // layouts required of tagged values (activation_rules, or AUTO's)
  std::string explanation;              // AUTO: px::AutoPlan::explain() of the plan
  double predicted_step_s = 0;          // AUTO: the cost model's step time for it
  std::string table() const;            // one row per param and a total line
  int64_t param_bytes_per_device() const;
};

}  // namespace px
