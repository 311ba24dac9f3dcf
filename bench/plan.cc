// bench/plan: the recipes (DDP, FSDP, TP, FSDP_TP) and AUTO's plan of a Transformer LM training
// step costed from shapes alone on a mesh and a cluster, without allocating the model. One JSON
// line per recipe and one for AUTO (--explain prints AUTO's explanation on stderr).
//
//   build/bench/plan --model=16b --mesh=data:32,model:8 --cluster=h100x8 --batch=256 --seq=1024
//   build/bench/plan --model=bench-gpt --mesh=data:4,model:2 --cluster=cpu
//   build/bench/plan --model=1b --mesh=data:16,model:2 --cluster=my_cluster.toml
//   build/bench/plan --matrix                                    # models x meshes x presets
//   build/bench/plan --matrix --model=175b                       # its rows with pipelining
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "bench_util.h"
#include "parallax/parallax.h"

namespace {

using px::bench::Json;

const char* kUsage =
    "usage: plan --model=NAME --mesh=AXIS:N[,AXIS:N...] [--cluster=cpu|h100x8|h200x8|tpuv4|FILE.toml]\n"
    "            [--batch=N] [--seq=N] [--dtype=f32|bf16] [--optimizer=adamw|sgd|adafactor]\n"
    "            [--recipes=DDP,FSDP,TP,FSDP_TP] [--data_axis=data] [--model_axis=model] [--layers=N]\n"
    "            [--recalibrate] [--no_auto | --auto_only] [--explain] [--time_limit=S] [--memory_limit_gib=G]\n"
    "            [--remat=none|full|dots_saveable|...] [--activation_rule=TAG=P(...)]\n"
    "       plan --matrix [--time_limit=S] [--model=NAME]   (the AutoSharding table: models x meshes x presets;\n"
    "            the 175b rows also search pipelined plans)\n"
    "  models: tiny, bench-gpt, 1b, 16b, llama8b, 175b, or a preset of px::nn::lm_config (gpt2_small, ...);\n"
    "  --layers overrides the model's number of layers\n"
    "  batch: global sequences per step (default: the number of devices); seq: default min(1024, the model's)\n"
    "  dtype: matmul operands (default bf16 on GPU clusters, f32 on cpu)\n";

[[noreturn]] void usage_error(const std::string& msg) {
  std::fprintf(stderr, "plan: %s\n%s", msg.c_str(), kUsage);
  std::exit(2);
}

px::nn::LmConfig model_config(const std::string& name) {
  if (name == "tiny") return px::nn::gpt2_tiny();
  if (name == "bench-gpt") return px::nn::bench_gpt();
  // The sizes of the AutoSharding benchmark: a 1B and a 16B GPT, and a Llama-3-style 8B.
  if (name == "1b") return px::nn::gpt2_config("1b", 32000, 2560, 20, 13, 10240, 1024);
  if (name == "16b") return px::nn::gpt2_config("16b", 32000, 6144, 48, 36, 24576, 1024);
  if (name == "llama8b") return px::nn::llama_config("llama8b", 128256, 4096, 32, 8, 32, 14336, 8192);
  // GPT-3 175B (vocabulary padded to a multiple of 128).
  if (name == "175b") return px::nn::gpt2_config("175b", 50304, 12288, 96, 96, 49152, 2048);
  try {
    return px::nn::lm_config(name);
  } catch (const px::Error&) {
    usage_error("unknown model '" + name + "'");
  }
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\')
      o += '\\', o += c;
    else if (c == '\n')
      o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20)
      o += ' ';
    else
      o += c;
  }
  return o + "\"";
}

int64_t mesh_devices(const std::string& text) {
  int64_t n = 1;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    size_t colon = item.find(':');
    if (colon == std::string::npos) usage_error("--mesh item '" + item + "' must be AXIS:SIZE, e.g. data:4");
    int64_t s = std::atoll(item.c_str() + colon + 1);
    if (s <= 0) usage_error("--mesh item '" + item + "' needs a positive size (no -1 here: give every size)");
    n *= s;
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return n;
}

// The predicted cost of one plan as JSON fields.
void cost_fields(Json& j, const px::StepCost& c) {
  j.n("step_s", c.step_s).n("compute_s", c.compute_s).n("comm_s", c.comm_s).n("exposed_comm_s", c.exposed_comm_s());
  for (int k = 0; k < px::kNumCollectiveKinds; ++k) {
    const auto& e = c.collectives[k];
    if (!e.calls) continue;
    std::string name = px::collective_name(static_cast<px::CollectiveKind>(k));
    j.i(name + "_bytes", e.payload_bytes).n(name + "_s", e.seconds);
  }
  j.i("peak_bytes_per_device", c.memory.peak_bytes);
  std::string cats = "{";
  for (int k = 0; k < px::kNumMemoryCategories; ++k)
    cats += std::string(k ? ", " : "") + "\"" + px::memory_category_name(static_cast<px::MemoryCategory>(k)) +
            "\": " + std::to_string(c.memory.by_category[k]);
  j.raw("peak_by_category", cats + "}");
  j.i("memory_bytes_per_device", c.memory_capacity).b("fits", c.fits());
}

// One pipelined candidate of px::search_pipelines as JSON fields.
Json pipelined_line(Json j, const px::PipelineCandidate& c, double search_s) {
  int64_t peak = 0;
  for (int d = 0; d < c.report.schedule.devices; ++d) peak = std::max(peak, c.report.planned_peak(d));
  j.raw("pipeline_mesh", json_str(c.mesh.to_string())).raw("inside", json_str(px::strategy_name(c.strategy)));
  j.raw("schedule", json_str(px::pipeline::kind_name(c.pipeline.schedule))).i("microbatches", c.microbatches);
  j.n("step_s", c.report.predicted_step_s).n("bubble", c.report.predicted_bubble);
  j.i("peak_bytes_per_device", peak).b("fits", c.fits).n("search_s", search_s);
  return j;
}

px::ShardingStrategy parse_strategy(const std::string& s) {
  for (auto k :
       {px::ShardingStrategy::DDP, px::ShardingStrategy::FSDP, px::ShardingStrategy::TP, px::ShardingStrategy::FSDP_TP})
    if (s == px::strategy_name(k)) return k;
  usage_error("unknown recipe '" + s + "' (recipes: DDP, FSDP, TP, FSDP_TP)");
}

// A cluster of the matrix: a preset, or "h100x8-100GbE": h100x8 nodes joined by 100 Gb/s
// Ethernet (12.5 GB/s per node, shared by its 8 GPUs, at the presets' 90% of the line rate).
px::Cluster load_matrix_cluster(const std::string& name) {
  if (name != "h100x8-100GbE") return px::load_cluster(name);
  px::Cluster c = px::load_cluster("h100x8");
  c.name = name;
  c.inter_node = {12.5e9 / 8 * 0.9, 10e-6};
  c.source += "; between nodes 100 Gb/s Ethernet";
  return c;
}

// The AutoSharding table: models x meshes x cluster presets, plus 16B on 32 devices of 16 GiB.
// One JSON line per row: AUTO's predicted step time beside the fastest recipe that fits.
int run_matrix(double time_limit, const std::string& only_model) {
  struct MeshRow {
    const char* name;
    const char* text;
  };
  const MeshRow meshes[] = {{"8", "data:8"},
                            {"4x2", "data:4,model:2"},
                            {"2x4", "data:2,model:4"},
                            {"16x2", "data:16,model:2"},
                            {"32x8", "data:32,model:8"},
                            {"64x4", "data:64,model:4"},
                            {"16x16x4", "data:16,fsdp:16,model:4"}};
  struct Row {
    std::string model, mesh, mesh_text, cluster;
    double memory_gib = 0;       // 0: the cluster's
    int64_t batch = 0, seq = 0;  // 0: one sequence per device, min(1024, the model's)
    bool pipelined = false;      // also search the devices pipelined (px::search_pipelines)
  };
  std::vector<Row> rows;
  for (const char* model : {"tiny", "bench-gpt", "1b", "16b", "llama8b"})
    for (const MeshRow& m : meshes)
      for (const char* cluster : {"h100x8", "h200x8", "tpuv4"}) rows.push_back({model, m.name, m.text, cluster});
  rows.push_back({"16b", "16x2", "data:16,model:2", "h100x8", 16.0});
  // GPT-3 175B over 128 nodes of 8 GPUs, remat full, GPT-3's 2048-token sequences in a batch of
  // 2048: on InfiniBand, and on 100 Gb/s Ethernet between the nodes (a slow inter-node link).
  for (const char* cluster : {"h100x8", "h100x8-100GbE"})
    rows.push_back({"175b", "128x8", "data:128,model:8", cluster, 0.0, 2048, 2048, true});
  int better = 0, comparable = 0;
  for (const Row& r : rows) {
    if (!only_model.empty() && r.model != only_model) continue;
    px::nn::LmConfig cfg = model_config(r.model);
    px::Cluster cluster = load_matrix_cluster(r.cluster);
    const int64_t devices = mesh_devices(r.mesh_text);
    px::Mesh mesh = cluster.apply(px::Mesh::parse(r.mesh_text, px::DeviceSet{"cpu", devices}));
    px::StepSetup setup;
    setup.batch = r.batch > 0 ? r.batch : devices;
    setup.seq = r.seq > 0 ? r.seq : std::min<int64_t>(1024, cfg.max_seq_len);
    if (r.pipelined) setup.remat.policy = px::RematPolicy::full;
    setup.compute_dtype = px::DType::bf16;
    setup.sharding.auto_time_limit_s = time_limit;
    if (r.memory_gib > 0)
      setup.sharding.auto_memory_limit_bytes = static_cast<int64_t>(r.memory_gib * double(int64_t{1} << 30));
    px::AutoPlan a = px::plan_auto(cfg, mesh, cluster, setup);
    const px::RecipeCost* best = nullptr;
    for (const auto& rc : a.recipes)
      if (rc.applies && rc.cost.memory.peak_bytes <= a.memory_limit && (!best || rc.cost.step_s < best->cost.step_s))
        best = &rc;
    Json j;
    j.raw("model", json_str(r.model)).raw("mesh", json_str(r.mesh)).i("devices", devices);
    j.raw("cluster",
          json_str(r.memory_gib > 0 ? r.cluster + "@" + std::to_string(static_cast<int>(r.memory_gib)) + "GiB"
                                    : r.cluster));
    j.i("batch", setup.batch).i("seq", setup.seq);
    j.n("auto_step_s", a.cost.step_s).b("auto_fits", a.fits).i("auto_peak_bytes", a.cost.memory.peak_bytes);
    j.raw("auto_from", json_str(a.from)).raw("auto_layout", json_str(a.layout));
    j.b("auto_sequence_parallel", !a.plan.activations.empty());  // the sequence split between blocks
    if (best)
      j.raw("best_recipe", json_str(px::strategy_name(best->strategy))).n("best_recipe_step_s", best->cost.step_s);
    else
      j.raw("best_recipe", "null").raw("best_recipe_step_s", "null");
    j.n("speedup", best ? best->cost.step_s / a.cost.step_s : 0.0);
    j.n("solve_s", a.solve_s).i("evaluations", a.evaluations).b("timed_out", a.timed_out);
    if (!a.fits) j.raw("why", json_str(a.why));
    if (r.pipelined) {
      // AUTO with pipelining: the fastest pipelined plan that fits when it beats the plan above.
      const auto t0 = std::chrono::steady_clock::now();
      const std::vector<px::PipelineCandidate> piped = px::search_pipelines(cfg, devices, cluster, setup, 60);
      const double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const px::PipelineCandidate* p = !piped.empty() && piped[0].fits ? &piped[0] : nullptr;
      if (p) {
        j.raw("pipelined", json_str(p->mesh.to_string() + ", " + px::strategy_name(p->strategy) + " inside, " +
                                    px::pipeline::kind_name(p->pipeline.schedule) + ", " +
                                    std::to_string(p->microbatches) + " microbatches"));
        j.n("pipelined_step_s", p->report.predicted_step_s).n("pipelined_bubble", p->report.predicted_bubble);
      } else {
        j.raw("pipelined", "null");
      }
      const bool piped_wins = p && (!a.fits || p->report.predicted_step_s < a.cost.step_s);
      j.n("auto_pipelining_step_s", piped_wins ? p->report.predicted_step_s : a.cost.step_s);
      j.b("pipelined_fastest", piped_wins).i("pipelined_candidates", static_cast<int64_t>(piped.size()));
      j.n("pipelined_search_s", search_s);
    }
    j.print();
    if (best) {
      ++comparable;
      if (a.cost.step_s < best->cost.step_s * 0.999) ++better;
    }
  }
  std::fprintf(stderr,
               "plan --matrix: %zu rows; AUTO strictly faster than the best fitting recipe on %d of %d rows "
               "where one fits\n",
               rows.size(), better, comparable);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  bool recalibrate = false, with_auto = true, skip_recipes = false, explain = false, pipelined = false, balance = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (a == "--matrix") {
      double limit = 10;
      std::string only_model;
      for (int k = 1; k < argc; ++k) {
        if (std::string(argv[k]).rfind("--time_limit=", 0) == 0) limit = std::atof(argv[k] + 13);
        if (std::string(argv[k]).rfind("--model=", 0) == 0) only_model = argv[k] + 8;
      }
      try {
        return run_matrix(limit, only_model);
      } catch (const px::Error& e) {
        std::fprintf(stderr, "plan: %s\n", e.what());
        return 1;
      }
    }
    if (a == "--pipelined" || a == "--balance") {
      (a == "--balance" ? balance : pipelined) = true;
      continue;
    }
    if (a == "--recalibrate" || a == "--no_auto" || a == "--auto_only" || a == "--explain") {
      recalibrate = recalibrate || a == "--recalibrate";
      with_auto = a != "--no_auto" && with_auto;
      skip_recipes = skip_recipes || a == "--auto_only";
      explain = explain || a == "--explain";
      continue;
    }
    if (a.rfind("--", 0) != 0) usage_error("unexpected argument '" + a + "'");
    size_t eq = a.find('=');
    std::string key = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2), value;
    if (eq != std::string::npos)
      value = a.substr(eq + 1);
    else if (i + 1 < argc)
      value = argv[++i];
    else
      usage_error("--" + key + " needs a value");
    static const char* known[] = {"model",    "mesh",        "cluster",          "batch",     "seq",
                                  "dtype",    "optimizer",   "recipes",          "data_axis", "model_axis",
                                  "layers",   "time_limit",  "memory_limit_gib", "remat",     "activation_rule",
                                  "schedule", "microbatches"};
    if (std::find(std::begin(known), std::end(known), key) == std::end(known)) usage_error("unknown flag --" + key);
    flags[key] = value;
  }
  if (!flags.count("model")) usage_error("--model is required");
  if (!flags.count("mesh")) usage_error("--mesh is required");
  const std::string cluster_name = flags.count("cluster") ? flags["cluster"] : "cpu";

  try {
    auto t0 = std::chrono::steady_clock::now();
    px::nn::LmConfig cfg = model_config(flags["model"]);
    if (flags.count("layers")) {
      cfg.n_layers = std::atoll(flags["layers"].c_str());
      if (cfg.n_layers <= 0) usage_error("--layers must be positive, got '" + flags["layers"] + "'");
    }
    const int64_t devices = mesh_devices(flags["mesh"]);
    px::Cluster cluster = cluster_name == "cpu" ? px::cpu_cluster(recalibrate) : px::load_cluster(cluster_name);
    px::Mesh mesh = cluster.apply(px::Mesh::parse(flags["mesh"], px::DeviceSet{"cpu", devices}));

    px::StepSetup setup;
    setup.batch = flags.count("batch") ? std::atoll(flags["batch"].c_str()) : devices;
    setup.seq = flags.count("seq") ? std::atoll(flags["seq"].c_str()) : std::min<int64_t>(1024, cfg.max_seq_len);
    std::string dtype = flags.count("dtype") ? flags["dtype"] : (cluster.devices_share_host ? "f32" : "bf16");
    if (dtype == "bf16")
      setup.compute_dtype = px::DType::bf16;
    else if (dtype != "f32")
      usage_error("--dtype must be f32 or bf16, got '" + dtype + "'");
    std::string optimizer = flags.count("optimizer") ? flags["optimizer"] : "adamw";
    if (optimizer == "adamw")
      setup.optimizer = px::optim::adamw({});
    else if (optimizer == "sgd")
      setup.optimizer = px::optim::sgd({});
    else if (optimizer == "adafactor")
      setup.optimizer = px::optim::adafactor({});
    else
      usage_error("--optimizer must be adamw, sgd or adafactor, got '" + optimizer + "'");
    if (flags.count("data_axis")) setup.sharding.data_axis = flags["data_axis"];
    if (flags.count("model_axis")) setup.sharding.model_axis = flags["model_axis"];
    if (flags.count("remat")) setup.remat.policy = px::parse_remat_policy(flags["remat"]);
    if (flags.count("activation_rule")) {
      const std::string& r = flags["activation_rule"];
      size_t eq = r.find('=');
      if (eq == std::string::npos)
        usage_error("--activation_rule must be TAG=P(...), e.g. layer_input=P('data','model')");
      setup.sharding.activation_rules.push_back({r.substr(0, eq), px::PartitionSpec::parse(r.substr(eq + 1))});
    }
    if (flags.count("time_limit")) setup.sharding.auto_time_limit_s = std::atof(flags["time_limit"].c_str());
    if (flags.count("memory_limit_gib"))
      setup.sharding.auto_memory_limit_bytes =
          static_cast<int64_t>(std::atof(flags["memory_limit_gib"].c_str()) * double(int64_t{1} << 30));
    std::vector<px::ShardingStrategy> recipes;
    if (flags.count("recipes")) {
      const std::string& r = flags["recipes"];
      size_t pos = 0;
      while (pos <= r.size()) {
        size_t comma = r.find(',', pos);
        recipes.push_back(parse_strategy(r.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos)));
        if (comma == std::string::npos) break;
        pos = comma + 1;
      }
    } else {
      recipes = {px::ShardingStrategy::DDP, px::ShardingStrategy::FSDP, px::ShardingStrategy::TP,
                 px::ShardingStrategy::FSDP_TP};
    }
    double setup_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    int64_t params = 0;
    {
      px::nn::TransformerLm m(cfg);
      params = m.store().param_count();
    }
    auto line = [&](const std::string& recipe) {
      Json j;
      j.raw("model", json_str(flags["model"])).i("params", params).raw("mesh", json_str(flags["mesh"]));
      j.i("devices", devices).raw("cluster", json_str(cluster.name)).raw("recipe", json_str(recipe));
      j.i("batch", setup.batch).i("seq", setup.seq).raw("dtype", json_str(dtype)).raw("optimizer", json_str(optimizer));
      return j;
    };
    if (flags.count("microbatches")) setup.microbatches = std::atoi(flags["microbatches"].c_str());
    if (px::pipeline::has_stage_axis(mesh)) {
      px::PipelineOptions po;
      po.schedule = px::pipeline::parse_kind(flags.count("schedule") ? flags["schedule"] : "1f1b");
      po.balance = balance;
      for (px::ShardingStrategy strategy : recipes) {
        Json j = line(px::strategy_name(strategy));
        try {
          const px::PipelineReport r = px::plan_pipeline(cfg, mesh, strategy, setup, po, &cluster);
          int64_t peak = 0;
          for (int d = 0; d < r.schedule.devices; ++d) peak = std::max(peak, r.planned_peak(d));
          j.b("applies", true).raw("schedule", json_str(px::pipeline::kind_name(po.schedule)));
          j.i("microbatches", setup.microbatches).n("step_s", r.predicted_step_s).n("bubble", r.predicted_bubble);
          j.i("peak_bytes_per_device", peak).i("memory_bytes_per_device", cluster.device_on(mesh).memory_bytes);
          if (explain) std::fprintf(stderr, "%s", r.to_string().c_str());
        } catch (const px::UserError& e) {
          j.b("applies", false).raw("step_s", "null").raw("reason", json_str(e.what()));
        }
        j.print();
      }
      return 0;
    }
    if (!skip_recipes)
      for (const px::RecipeCost& r : px::cost_recipes(cfg, mesh, cluster, setup, recipes)) {
        Json j = line(px::strategy_name(r.strategy));
        j.b("applies", r.applies);
        if (r.applies) {
          cost_fields(j, r.cost);
          j.i("param_bytes_per_device", r.param_bytes_per_device);
        } else {
          j.raw("step_s", "null").raw("reason", json_str(r.reason));
        }
        j.n("plan_s", r.plan_s + setup_s);
        setup_s = 0;  // the cluster and mesh set-up counts once, on the first line
        j.print();
      }
    if (with_auto) {
      px::AutoPlan a = px::plan_auto(cfg, mesh, cluster, setup);
      Json j = line("AUTO");
      j.b("applies", true);
      cost_fields(j, a.cost);
      j.i("param_bytes_per_device", a.plan.param_bytes_per_device());
      j.raw("from", json_str(a.from)).raw("layout", json_str(a.layout)).i("evaluations", a.evaluations);
      j.b("timed_out", a.timed_out).n("solve_s", a.solve_s + setup_s);
      j.print();
      if (explain) std::fprintf(stderr, "%s", a.explain().c_str());
    }
    if (pipelined) {
      const auto t1 = std::chrono::steady_clock::now();
      const std::vector<px::PipelineCandidate> cands =
          px::search_pipelines(cfg, devices, cluster, setup, setup.sharding.auto_time_limit_s);
      const double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
      for (const px::PipelineCandidate& c : cands) pipelined_line(line("pipelined"), c, search_s).print();
    }
  } catch (const px::Error& e) {
    std::fprintf(stderr, "plan: %s\n", e.what());
    return 1;
  }
  return 0;
}
