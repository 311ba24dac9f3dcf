// pax configs: typed dotted fields, --set parsing and validation, TOML round trips, the registry.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/log.h"
#include "parallax/pax.h"
#include "parallax/plan.h"
#include "pax/model.h"
#include "testing.h"

namespace px::pax {
namespace {

using px::testing::error_of;

ExperimentConfig tiny() { return experiment("copy.TransformerLmTiny"); }

TEST(PaxConfig, EveryTypeIsAcceptedBySetField) {
  ExperimentConfig c = tiny();
  set_field(c, "train.steps", "42");                  // int
  set_field(c, "model.d_model", "1e2");               // an integral float is an int
  set_field(c, "optimizer.lr", "2.5e-4");             // float
  set_field(c, "tokenizer.model", "/x/spm.model");    // string
  set_field(c, "model.tied_embedding", "false");      // bool
  set_field(c, "optimizer.name", "sgd");              // enum
  set_field(c, "data.paths", "a.txt, b/,'c,d.txt'");  // list (quotes keep commas)
  set_field(c, "sharding.mesh", "data:4,model:2");    // mesh
  EXPECT_EQ(c.train.steps, 42);
  EXPECT_EQ(c.model.d_model, 100);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2.5e-4);
  EXPECT_EQ(c.tokenizer.model, "/x/spm.model");
  EXPECT_FALSE(c.model.tied_embedding);
  EXPECT_EQ(c.optimizer.name, "sgd");
  EXPECT_EQ(c.data.paths, (std::vector<std::string>{"a.txt", "b/", "c,d.txt"}));
  EXPECT_EQ(c.sharding.mesh, "data:4,model:2");
  set_field(c, "data.paths", "[]");
  EXPECT_TRUE(c.data.paths.empty());
  apply_override(c, "sharding.rules=blocks.*.mlp.fc.w=P(None, 'model')");
  EXPECT_EQ(c.sharding.rules, std::vector<std::string>{"blocks.*.mlp.fc.w=P(None, 'model')"});
}

TEST(PaxConfig, BadValuesNameTheFieldAndWhatIsAllowed) {
  ExperimentConfig c = tiny();
  EXPECT_NE(error_of([&] { set_field(c, "train.steps", "ten"); }).find("train.steps='ten' is not an int"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "train.steps", "0"); }).find("an int in [1,"), std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "optimizer.lr", "fast"); }).find("optimizer.lr='fast' is not a float"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "optimizer.lr", "-1"); }).find("a float in [0, 10]"), std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "model.tied_embedding", "maybe"); }).find("true or false"), std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "optimizer.name", "lion"); }).find("one of adamw, adam, sgd, adafactor"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "data.paths", "[a,"); }).find("data.paths"), std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "sharding.mesh", "data=4"); }).find("a mesh is name:size pairs"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "sharding.mesh", "data:-1,model:-1"); }).find("only one axis"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "train.stepz", "1"); }).find("the fields of 'train' are"), std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "trainer.steps", "1"); }).find("the sections are"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_override(c, "train.steps"); }).find("is not path=value"), std::string::npos);
  EXPECT_EQ(c.train.steps, tiny().train.steps);  // rejected values change nothing
}

TEST(PaxConfig, RelationsAndUnavailableFeaturesAreChecked) {
  ExperimentConfig c = tiny();
  c.model.n_heads = 3;
  EXPECT_NE(error_of([&] { validate(c); }).find("not divisible by model.n_heads=3"), std::string::npos);
  c = tiny();
  set_field(c, "memory.remat", "full");
  EXPECT_EQ(error_of([&] { check_runnable(c); }), "<no error>");  // remat has landed
  set_field(c, "memory.remat", "auto");
  EXPECT_EQ(error_of([&] { validate(c); }), "<no error>");  // plannable
  EXPECT_NE(error_of([&] { check_runnable(c); }).find("memory.remat=auto needs memory.budget_bytes"),
            std::string::npos);
  set_field(c, "memory.budget_bytes", "100000000");
  EXPECT_EQ(error_of([&] { check_runnable(c); }), "<no error>");
  c = tiny();
  set_field(c, "memory.offload", "params");
  EXPECT_EQ(error_of([&] { check_runnable(c); }), "<no error>");  // offload has landed
  EXPECT_NE(error_of([&] { set_field(c, "memory.prefetch_depth", "-1"); }).find("memory.prefetch_depth"),
            std::string::npos);
  c = tiny();
  set_field(c, "sharding.strategy", "auto");
  EXPECT_EQ(error_of([&] { check_runnable(c); }), "<no error>");  // AUTO has landed
  c = tiny();
  set_field(c, "sharding.rules", "blocks.*=P(('data'");
  EXPECT_NE(error_of([&] { validate(c); }).find("sharding.rules"), std::string::npos);
}

// train.microbatches divides the batch and each data shard's rows; pax plan shows it.
TEST(PaxConfig, MicrobatchesDivideTheBatchAndEachDataShard) {
  ExperimentConfig c = tiny();
  set_field(c, "data.batch", "8");
  EXPECT_NE(error_of([&] { set_field(c, "train.microbatches", "0"); }).find("train.microbatches"), std::string::npos);
  set_field(c, "train.microbatches", "3");
  EXPECT_NE(error_of([&] { validate(c); }).find("train.microbatches=3 does not divide data.batch=8"),
            std::string::npos);
  set_field(c, "train.microbatches", "4");
  EXPECT_EQ(error_of([&] { validate(c); }), "<no error>");
  set_field(c, "sharding.mesh", "data:4");
  const std::string e = error_of([&] { validate(c); });
  EXPECT_NE(e.find("does not divide the 2 sequences of each of the 4 data shards"), std::string::npos) << e;
  EXPECT_NE(e.find("data.batch to a multiple of 16"), std::string::npos) << e;
  set_field(c, "train.microbatches", "2");
  EXPECT_EQ(error_of([&] { validate(c); }), "<no error>");
  EXPECT_NE(plan(c).text().find("microbatches: 2"), std::string::npos) << plan(c).text();
}

// pax plan planned a batch the data axis does not divide (data:3 with data.batch=8, or data:-1
// resolved on the devices); now the mesh as made is checked, naming the fix.
TEST(PaxPlan, TheDataAxisDividesTheBatch) {
  ExperimentConfig c = tiny();
  set_field(c, "data.batch", "8");
  set_field(c, "sharding.mesh", "data:3");
  std::string e = error_of([&] { plan(c); });
  EXPECT_NE(e.find("[pax] data.batch=8 is not divisible by the data axis 'data' of size 3"), std::string::npos) << e;
  EXPECT_NE(e.find("set data.batch to a multiple of 3 (e.g. 9)"), std::string::npos) << e;
  set_field(c, "sharding.mesh", "data:-1");
  e = error_of([&] { plan(c, "cpu:3"); });
  EXPECT_NE(e.find("not divisible by the data axis 'data' of size 3"), std::string::npos) << e;
  set_field(c, "data.batch", "9");
  EXPECT_EQ(error_of([&] { plan(c, "cpu:3"); }), "<no error>");
}

// A cluster file's [axis.NAME] link for an axis the mesh lacks was accepted (the axis it meant
// kept the default links); now it is an error naming the mesh's axes.
TEST(PaxPlan, AClusterFileNamesOnlyTheMeshsAxes) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "px_test_cluster_axes";
  std::filesystem::create_directories(dir);
  const std::string file = (dir / "c.toml").string();
  std::ofstream(file) << "name = \"two\"\n[device]\nmatmul_flops_f32 = 1e12\nmatmul_flops_bf16 = 2e12\n"
                         "vector_flops = 1e11\nmemory_bandwidth = 1e11\nmemory_bytes = 1e10\n"
                         "[intra_node]\nbandwidth_bytes_per_s = 1e10\nlatency_s = 1e-6\n"
                         "[axis.modle]\nbandwidth_bytes_per_s = 1e10\nlatency_s = 1e-6\n";
  ExperimentConfig c = tiny();
  set_field(c, "sharding.mesh", "data:2");
  const std::string e = error_of([&] { plan(c, "", file); });
  EXPECT_NE(e.find("gives a link for axis 'modle' ([axis.modle]) but the mesh"), std::string::npos) << e;
  EXPECT_NE(e.find("(its axes: data)"), std::string::npos) << e;
  std::filesystem::remove_all(dir);
}

// A field the rest of the config leaves unused: the training data fields are an error (the run
// would train on the copy task), the tuning knobs a warning logged once, naming what would apply it.
TEST(PaxConfig, FieldsWithoutEffectAreNamed) {
  ExperimentConfig c = tiny();
  set_field(c, "data.paths", "my_corpus.txt");
  std::string e = error_of([&] { validate(c); });
  EXPECT_NE(e.find("[pax] data.paths=my_corpus.txt has no effect here: it applies only with data.kind=text"),
            std::string::npos) << e;
  c = tiny();
  set_field(c, "sharding.schedule", "zero_bubble");
  set_field(c, "optimizer.momentum", "0.9");
  std::vector<std::string> warnings;
  LogSink old = set_log_sink([&](const LogRecord& r) { warnings.push_back(r.message); });
  validate(c);
  validate(c);  // once per process
  set_log_sink(old);
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_NE(warnings[0].find("optimizer.momentum=0.9 has no effect here: it applies only with optimizer.name=sgd"),
            std::string::npos) << warnings[0];
  EXPECT_NE(warnings[1].find("sharding.schedule=zero_bubble has no effect here: it applies only on a mesh with a "
                             "stage axis"),
            std::string::npos) << warnings[1];
  // With a stage axis it applies: no warning.
  set_field(c, "optimizer.momentum", "0");
  set_field(c, "sharding.mesh", "stage:2,data:1");
  warnings.clear();
  old = set_log_sink([&](const LogRecord& r) { warnings.push_back(r.message); });
  validate(c);
  set_log_sink(old);
  EXPECT_TRUE(warnings.empty()) << warnings[0];
  // No shipped experiment sets a field it does not use.
  for (const ExperimentInfo& x : list_experiments()) {
    warnings.clear();
    old = set_log_sink([&](const LogRecord& r) { warnings.push_back(r.message); });
    EXPECT_EQ(error_of([&] { validate(experiment(x.name)); }), "<no error>") << x.name;
    set_log_sink(old);
    EXPECT_TRUE(warnings.empty()) << x.name << ": " << warnings[0];
  }
}

TEST(PaxConfig, PathsAreOfTheirKind) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "px_test_path_kinds";
  std::filesystem::create_directories(dir);
  std::string e = error_of([&] { from_toml_file(dir.string()); });
  EXPECT_NE(e.find("[pax] config file '" + dir.string() + "' is a directory, not a regular file"), std::string::npos)
      << e;
  std::filesystem::remove_all(dir);
}

// Every numeric field: a value past its range names the field, the value and the range (step
// counts end below INT32_MAX, the step counter's limit); hex, inf and nan are not numbers here.
// Unclosed quotes are errors; one pair of quotes around a string is taken off. A misspelt field
// gets a suggestion.
TEST(PaxConfig, SetRefusesValuesOutsideTheFieldsRangeHexAndUnclosedQuotes) {
  ExperimentConfig c = tiny();
  const std::string steps = error_of([&] { set_field(c, "train.steps", "3e9"); });
  EXPECT_NE(steps.find("train.steps=3000000000 is out of range"), std::string::npos) << steps;
  EXPECT_NE(steps.find("an int in [1, 2147483646]"), std::string::npos) << steps;
  set_field(c, "train.steps", "2147483646");
  EXPECT_EQ(c.train.steps, 2147483646);
  auto text = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  int numeric = 0;
  for (const FieldInfo& f : fields()) {
    if (f.type != FieldType::integer && f.type != FieldType::floating) continue;
    ++numeric;
    c = tiny();
    // The bounds are accepted by the parser (other checks may refuse them later), past them not.
    EXPECT_EQ(error_of([&] { set_field(c, f.path, text(f.max)); }), "<no error>") << f.path;
    EXPECT_EQ(error_of([&] { set_field(c, f.path, text(f.min)); }), "<no error>") << f.path;
    const bool is_int = f.type == FieldType::integer;
    const double step = std::max(1e-9, std::fabs(f.max) * 1e-6);
    for (std::string past : {is_int ? std::to_string(static_cast<int64_t>(f.max) + 1) : text(f.max + step),
                             is_int ? std::to_string(static_cast<int64_t>(f.min) - 1) : text(f.min - step),
                             std::string("1e30"), std::string("-1e30")}) {
      const std::string e = error_of([&] { set_field(c, f.path, past); });
      EXPECT_NE(e.find(f.path), std::string::npos) << past << ": " << e;
      EXPECT_NE(e.find("out of range"), std::string::npos) << f.path << "=" << past << ": " << e;
      EXPECT_NE(e.find(f.allowed()), std::string::npos) << f.path << "=" << past << ": " << e;
    }
    for (const char* bad : {"0x10", "0X1p3", "inf", "-inf", "nan", "1e", "--1", "1..2", "1 2", "'3'", "1_000", ""}) {
      const std::string e = error_of([&] { set_field(c, f.path, bad); });
      EXPECT_NE(e.find(f.path + "='" + bad + "' is not"), std::string::npos) << bad << ": " << e;
    }
  }
  EXPECT_GE(numeric, 30);
  c = tiny();
  EXPECT_NE(error_of([&] { set_field(c, "model.d_model", "64.5"); }).find("it has a fraction"), std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "optimizer.lr", "1e-400"); }).find("too small"), std::string::npos);
  set_field(c, "model.d_model", "6.4e1");  // a whole number written as a float
  EXPECT_EQ(c.model.d_model, 64);

  for (const char* field : {"data.cache_dir", "data.paths", "sharding.mesh", "optimizer.name", "train.steps"})
    for (const char* bad : {"\"abc", "abc'", "'abc\""}) {
      const std::string e = error_of([&] { set_field(c, field, bad); });
      EXPECT_NE(e.find(std::string(field) + "='" + bad + "': the quote"), std::string::npos) << e;
      EXPECT_NE(e.find("is not closed"), std::string::npos) << e;
    }
  set_field(c, "data.cache_dir", "\"/tmp/a b\"");
  EXPECT_EQ(c.data.cache_dir, "/tmp/a b");
  set_field(c, "optimizer.name", "'sgd'");
  EXPECT_EQ(c.optimizer.name, "sgd");
  set_field(c, "data.cache_dir", "\"/tmp/bob's\"");
  EXPECT_EQ(c.data.cache_dir, "/tmp/bob's");

  EXPECT_NE(error_of([&] { apply_override(c, "data.path=\"abc"); }).find("(did you mean 'data.paths'?)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "trian.steps", "3"); }).find("(did you mean 'train.steps'?)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { set_field(c, "optimizer.learning_rate", "3"); }).find("the fields of 'optimizer' are"),
            std::string::npos);

  // A config file is held to the same ranges.
  const std::string path = ::testing::TempDir() + "/pax_range.toml";
  std::ofstream(path) << "experiment = 'copy.TransformerLmTiny'\n[train]\nsteps = 3000000000\n";
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("train.steps=3000000000 is out of range"), std::string::npos);
  std::filesystem::remove(path);
}

TEST(PaxConfig, TomlRoundTripReproducesTheConfig) {
  ExperimentConfig c = tiny();
  set_field(c, "optimizer.lr", "0.0012345678901234");
  set_field(c, "data.paths", "x.txt,y.jsonl");
  set_field(c, "sharding.mesh", "data:2");
  set_field(c, "train.seed", "7");
  const std::string path = ::testing::TempDir() + "/pax_roundtrip.toml";
  std::ofstream(path) << to_toml(c);
  ExperimentConfig back = from_toml_file(path);
  EXPECT_EQ(back.name, "copy.TransformerLmTiny");
  for (const FieldInfo& f : fields()) EXPECT_EQ(field_text(back, f.path), field_text(c, f.path)) << f.path;
  EXPECT_EQ(back.optimizer.lr, c.optimizer.lr);  // bit-exact
  EXPECT_EQ(to_toml(back), to_toml(c));
}

TEST(PaxConfig, TomlRejectsUnknownKeysAndWrongTypes) {
  const std::string path = ::testing::TempDir() + "/pax_bad.toml";
  std::ofstream(path) << "experiment = 'copy.TransformerLmTiny'\n[train]\nstepz = 3\n";
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("unknown config field 'train.stepz'"), std::string::npos);
  std::ofstream(path) << "experiment = 'copy.TransformerLmTiny'\n[train]\nsteps = 'many'\n";
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("train.steps must be int"), std::string::npos);
  std::ofstream(path) << "experiment = 'copy.TransformerLmTiny'\n[optimizer]\nlr = 1\n";  // int for a float: fine
  EXPECT_EQ(from_toml_file(path).optimizer.lr, 1.0);
  std::ofstream(path) << "[train]\nsteps = 3\n";
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("names no experiment"), std::string::npos);
  std::ofstream(path) << "experiment = 'nope.Nope'\n";
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("unknown experiment 'nope.Nope'"), std::string::npos);
  EXPECT_NE(error_of([&] { from_toml_file(path + ".missing"); }).find("cannot read config file"), std::string::npos);
}

// Non-ASCII characters are fine in strings and comments, and an error naming the line elsewhere
// (toml++ 3.3 has undefined behaviour on them there; the fuzzer found it).
TEST(PaxConfig, TomlNonAsciiOutsideStringsIsAnErrorNamingTheLine) {
  const std::string path = ::testing::TempDir() + "/pax_utf8.toml";
  std::ofstream(path)
      << "experiment = 'copy.TransformerLmTiny' # d\xc3\xa9j\xc3\xa0 vu\n[data]\ncache_dir = \"caf\xc3\xa9\"\n"
      << "[tokenizer]\nmodel = '''\xc3\xa7"
         "a'''\n";
  const ExperimentConfig c = from_toml_file(path);
  EXPECT_EQ(c.data.cache_dir, "caf\xc3\xa9");
  EXPECT_EQ(c.tokenizer.model,
            "\xc3\xa7"
            "a");
  std::ofstream(path) << "experiment = 'copy.TransformerLmTiny'\n[train]\nsteps \xc3\xa7= 3\n";
  const std::string m = error_of([&] { from_toml_file(path); });
  EXPECT_NE(m.find("line 3: a non-ASCII character outside a quoted string or comment"), std::string::npos) << m;
  std::ofstream(path) << std::string("rstta.ineps \xc3\xa7la\0\0&1\n", 19);  // the fuzzer's input
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("line 1: a non-ASCII character"), std::string::npos);
  // A quote where no string may start is no string: what follows is outside one.
  std::ofstream(path) << "lgs = +\"clock\xc9\x89\"\n";
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("line 1: a non-ASCII character"), std::string::npos);
  // An unquoted value runs up to a terminator, brackets and quotes included (the fuzzer's l=+["λ).
  std::ofstream(path) << "l=+[\"\xce\xbb\n";
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("line 1: a non-ASCII character"), std::string::npos);
  // toml++ tests what follows a backslash in a multi-line string for whitespace.
  std::ofstream(path) << "experiment = 'copy.TransformerLmTiny'\n[data]\ncache_dir = \"\"\"x\\\n\xce\xbby\"\"\"\n";
  EXPECT_NE(error_of([&] { from_toml_file(path); }).find("line 3: a non-ASCII character after a backslash"),
            std::string::npos)
      << error_of([&] { from_toml_file(path); });
  // Strings in arrays and inline tables, quoted keys in headers: read as data.
  std::ofstream(path) << "experiment = 'copy.TransformerLmTiny'\n[sharding]\nrules = [\"x\xce\xbb=P()\", 'y']\n";
  EXPECT_EQ(error_of([&] { from_toml_file(path); }).find("non-ASCII"), std::string::npos)
      << error_of([&] { from_toml_file(path); });
}

// The written config escapes non-ASCII characters, so it reads back whatever they are.
TEST(PaxConfig, WrittenConfigEscapesNonAsciiAndReadsBack) {
  const std::string path = ::testing::TempDir() + "/pax_utf8_back.toml";
  ExperimentConfig c = experiment("copy.TransformerLmTiny");
  c.data.cache_dir = "/data/\xce\xbb\xd0\x96\xc3\xa9";
  const std::string text = to_toml(c);
  for (char ch : text) EXPECT_LT(static_cast<unsigned char>(ch), 0x80u) << text;
  std::ofstream(path) << text;
  EXPECT_EQ(from_toml_file(path).data.cache_dir, c.data.cache_dir);
}

TEST(PaxRegistry, ExperimentsDeriveByOverridingFields) {
  register_experiment("test.Derived", "copy tiny with one layer", [] {
    ExperimentConfig c = experiment("copy.TransformerLmTiny");
    c.model.n_layers = 1;
    return c;
  });
  ExperimentConfig d = experiment("test.Derived");
  EXPECT_EQ(d.name, "test.Derived");
  EXPECT_EQ(d.summary, "copy tiny with one layer");
  EXPECT_EQ(d.model.n_layers, 1);
  EXPECT_EQ(d.model.d_model, tiny().model.d_model);
  EXPECT_NE(error_of([] {
              register_experiment("test.Derived", "", [] { return ExperimentConfig(); });
            }).find("already registered"),
            std::string::npos);
  EXPECT_EQ(error_of([] { experiment("no.Such"); }), "[pax] unknown experiment 'no.Such'; see 'pax list'");
  bool listed = false;
  for (auto& e : list_experiments()) listed |= e.name == "test.Derived";
  EXPECT_TRUE(listed);
}

TEST(PaxPlan, EveryShippedExperimentPlansFromShapesInSeconds) {
  for (const ExperimentInfo& e : list_experiments()) {
    if (e.name.rfind("test.", 0) == 0) continue;
    auto t0 = std::chrono::steady_clock::now();
    PlanReport r = plan(experiment(e.name), e.name.find("lm_cloud.LmCloudTransformerAdam") == 0 ? "cpu:8" : "");
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 20.0) << e.name;
    EXPECT_GT(r.param_count, 0) << e.name;
    EXPECT_GT(r.param_bytes_per_device, 0) << e.name;
    EXPECT_NE(r.text().find("predicted step time: pass --cluster"), std::string::npos);
  }
  // With a cluster: the step time and the whole step's peak (more than params, gradients and
  // optimizer state: activations too), from shapes alone.
  PlanReport costed = plan(experiment("c4.C4Spmd16BAdam32Replicas"), "", "h100x8");
  EXPECT_EQ(costed.cluster, "h100x8");
  EXPECT_GT(costed.step_s, 0);
  EXPECT_GE(costed.step_s, costed.compute_s);
  EXPECT_GT(costed.peak_bytes_per_device,
            costed.param_bytes_per_device + costed.gradient_bytes_per_device + costed.optimizer_bytes_per_device);
  EXPECT_NE(costed.text().find("predicted on h100x8: step"), std::string::npos) << costed.text();
  // The published sizes: 16B on data:16 x model:2, FSDP x TP.
  PlanReport big = plan(experiment("c4.C4Spmd16BAdam32Replicas"));
  EXPECT_EQ(big.devices, 32);
  EXPECT_NEAR(big.param_count / 1e9, 16.5, 0.5);
  EXPECT_NEAR(static_cast<double>(big.param_bytes_per_device), big.param_count * 4.0 / 32, big.param_count * 0.01);
  EXPECT_NEAR(plan(experiment("c4.C4Spmd1BAdam4Replicas")).param_count / 1e9, 1.1, 0.2);
  EXPECT_NEAR(plan(experiment("lm_cloud.LmCloudSpmd2B")).param_count / 1e9, 2.1, 0.2);
  EXPECT_NEAR(plan(experiment("gcide.Gpt25M")).param_count / 1e6, 25, 3);
}

// AUTO's pipelined candidates: on 8-GPU nodes (NVLink inside, InfiniBand across) 64 devices train
// the 2.9B seed model fastest pipelined, stages across the nodes and data parallelism inside them,
// faster than every recipe without stages that fits.
TEST(PaxPlan, OnEightGpuNodesTheSeedModelIsPredictedFastestPipelined) {
  const ExperimentConfig c = experiment("c4.C4SpmdPipelineGpt3SmallAdam64Replicas");
  const Cluster cluster = cluster_preset("h100x8");
  StepSetup setup;
  setup.batch = c.data.batch;
  setup.seq = c.model.seq_len;
  setup.compute_dtype = DType::bf16;
  setup.remat = {RematPolicy::full, {}};
  setup.microbatches = 8;
  const std::vector<PipelineCandidate> piped = search_pipelines(lm_config(c), 64, cluster, setup);
  ASSERT_FALSE(piped.empty());
  ASSERT_TRUE(piped[0].fits) << piped[0].report.to_string();
  for (size_t i = 1; i < piped.size(); ++i)
    if (piped[i].fits) EXPECT_LE(piped[0].report.predicted_step_s, piped[i].report.predicted_step_s);
  const Mesh flat = cluster.apply(Mesh({{"data", 64}}));
  double best_flat = 0;
  for (const RecipeCost& rc : cost_recipes(lm_config(c), flat, cluster, setup, {ShardingStrategy::DDP, ShardingStrategy::FSDP}))
    if (rc.applies && rc.cost.fits() && (best_flat == 0 || rc.cost.step_s < best_flat)) best_flat = rc.cost.step_s;
  ASSERT_GT(best_flat, 0);
  EXPECT_LT(piped[0].report.predicted_step_s, best_flat) << piped[0].settings();
  EXPECT_NE(piped[0].settings().find("--set sharding.mesh=stage:"), std::string::npos) << piped[0].settings();
}

// The seed's pipelined experiment planned on its own mesh (64 devices, 4 stages of 6 layers, data
// and model axes inside each stage) from shapes alone: per stage layers, per device group memory,
// the bubble, and on a cluster the predicted step time.
TEST(PaxPlan, ThePipelinedSeedPlansPerStageInSeconds) {
  const ExperimentConfig c = experiment("c4.C4SpmdPipelineGpt3SmallAdam64Replicas");
  auto t0 = std::chrono::steady_clock::now();
  PlanReport r = plan(c, "", "tpuv4");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  EXPECT_EQ(r.devices, 64);
  EXPECT_NEAR(r.param_count / 1e9, 2.9, 0.1);
  const std::string t = r.text();
  for (const char* want : {"pipeline: 1f1b, 4 devices, 4 stages, 32 microbatches",
                           "stage 0 (device 0): embed, pos_embed, blocks.0, blocks.1, blocks.2, blocks.3, blocks.4, blocks.5",
                           "stage 3 (device 3): blocks.18", "device 3: planned peak", "bubble:", "predicted on tpuv4: step"})
    EXPECT_NE(t.find(want), std::string::npos) << want << "\n" << t;
  EXPECT_GT(r.step_s, 0);
  EXPECT_GT(r.peak_bytes_per_device, r.param_bytes_per_device + r.optimizer_bytes_per_device);
  // FSDP x TP inside each stage: a device holds a 16th of its stage's params.
  EXPECT_NEAR(static_cast<double>(r.param_bytes_per_device), r.param_count * 4.0 / 4 / 16, r.param_count * 0.02);
  // Bad pipeline settings name the fix.
  ExperimentConfig uneven = c;
  uneven.sharding.mesh = "stage:5,data:4,model:4";
  EXPECT_NE(error_of([&] { plan(uneven); }).find("do not split evenly into 5 stages"), std::string::npos);
  ExperimentConfig bad = c;
  bad.sharding.layers_per_stage = {"6", "six", "6", "6"};
  EXPECT_NE(error_of([&] { plan(bad); }).find("sharding.layers_per_stage has 'six'"), std::string::npos);
}

}  // namespace
}  // namespace px::pax
