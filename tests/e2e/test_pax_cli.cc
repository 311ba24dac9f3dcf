// The pax program end to end: training a tiny experiment, --set types, user errors (exit 2),
// Ctrl-C and resume, and TensorBoard reading the event files.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "parallax/io.h"
#include "testing.h"

namespace fs = std::filesystem;

namespace {

struct Result {
  int rc = -1;
  std::string out;
};

// Runs pax with the arguments (a shell word list) and captures stdout and stderr together; `env`:
// variables set for it ("PX_DEVICES=ref:2 PX_REF_DISCRETE=1").
Result pax(const std::string& args, const std::string& env = "") {
  const std::string cmd = (env.empty() ? "" : "env " + env + " ") + std::string(PX_PAX_BIN) + " " + args + " 2>&1";
  Result r;
  FILE* p = popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// For directory iteration that must not throw (a folder may vanish while it is read).
std::error_code& ec_ignore() {
  static thread_local std::error_code ec;
  return ec;
}

// Text data's shared cache ($XDG_CACHE_HOME/parallax/data) in a folder of this process, not the
// user's ~/.cache: set before any pax runs, so every pax started here inherits it.
const std::string kXdgCache = [] {
  const std::string d = ::testing::TempDir() + "/pax_e2e_" + std::to_string(::getpid()) + "_xdg";
  fs::remove_all(d);
  setenv("XDG_CACHE_HOME", d.c_str(), 1);
  return d;
}();

// Short sentences of a small vocabulary, `n` documents: a tokenizer of 315 pieces trains on them.
void write_sentences(const std::string& path, int n) {
  const char* subj[] = {"the cat", "a dog", "my friend", "the old man", "a small bird", "the teacher", "her brother"};
  const char* verb[] = {"sees", "likes", "finds", "eats", "reads", "keeps", "holds"};
  const char* obj[] = {"the ball",      "a book",     "some bread", "the red apple",
                       "a long letter", "the garden", "an old map"};
  std::ofstream f(path);
  uint32_t x = 12345;
  auto pick = [&](int k) { return (x = x * 1103515245u + 12345u) / 65536u % k; };
  for (int i = 0; i < n; ++i) f << subj[pick(7)] << " " << verb[pick(7)] << " " << obj[pick(7)] << ".\n\n";
}

std::string job(const std::string& name) {
  // Per process: two runs of the suite at once (two checkouts) must not share folders.
  std::string d = ::testing::TempDir() + "/pax_e2e_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(d);
  return d;
}

// A smaller copy model, so that a run is mostly compile time.
const std::string kSmall =
    " --exp=copy.TransformerLmTiny --set model.d_model=32 --set model.d_ff=64 --set model.n_layers=1"
    " --set model.seq_len=16 --set data.batch=4 --set data.copy_eval_batches=2 --set schedule.warmup_steps=2";

std::vector<nlohmann::json> metrics(const std::string& dir, const std::string& split) {
  std::vector<nlohmann::json> out;
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) {
      auto j = nlohmann::json::parse(line);
      if (j["split"] == split) out.push_back(j);
    }
  return out;
}

TEST(PaxCli, TrainsTheTinyExperimentAndLeavesTheJobDir) {
  const std::string d = job("train");
  Result r = pax("train" + kSmall + " --job_log_dir=" + d +
                 " --set train.steps=6 --set train.summary_interval=2 --set train.eval_interval=3"
                 " --set train.checkpoint_interval=3");
  ASSERT_EQ(r.rc, 0) << r.out;
  for (const char* f : {"config.toml", "plan.txt", "model_params.txt", "metrics.jsonl", "logs/train.log",
                        "plots/loss.png", "plots/log_pplx.png", "checkpoints/checkpoint_00000003/COMMITTED",
                        "checkpoints/checkpoint_00000006/metadata.json"})
    EXPECT_TRUE(fs::exists(d + "/" + f)) << f;
  EXPECT_FALSE(fs::is_empty(d + "/summaries/train"));
  EXPECT_FALSE(fs::is_empty(d + "/summaries/eval_test"));
  auto train = metrics(d, "train");
  ASSERT_EQ(train.size(), 3u);
  EXPECT_EQ(train.back()["step"], 6);
  for (const char* k : {"loss", "log_pplx", "learning_rate", "grad_norm", "grad_norm_clipped", "steps_per_sec",
                        "tokens_per_sec"})
    EXPECT_TRUE(train.back().contains(k)) << k;
  auto eval = metrics(d, "eval_test");
  ASSERT_EQ(eval.size(), 2u);
  EXPECT_TRUE(eval[0].contains("fraction_of_correct_next_step_preds"));
  EXPECT_NE(r.out.find("over 2 batches"), std::string::npos) << r.out;  // the whole eval split, stated
  std::ifstream mp(d + "/model_params.txt");
  std::string params((std::istreambuf_iterator<char>(mp)), {});
  EXPECT_NE(params.find("blocks.0.attn.wq  [32,32]  f32  P()"), std::string::npos) << params;

  // eval scores the latest checkpoint; the resolved config reproduces the run's config.
  Result e = pax("eval --config " + d + "/config.toml --job_log_dir=" + d);
  ASSERT_EQ(e.rc, 0) << e.out;
  EXPECT_NE(e.out.find("eval step 6: loss"), std::string::npos) << e.out;
  const std::string d2 = job("train_again");
  Result again = pax("train --config " + d + "/config.toml --job_log_dir=" + d2);
  ASSERT_EQ(again.rc, 0) << again.out;
  std::ifstream a(d + "/config.toml"), b(d2 + "/config.toml");
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(a)), {}), std::string((std::istreambuf_iterator<char>(b)), {}));
  auto train2 = metrics(d2, "train");
  ASSERT_EQ(train2.size(), train.size());
  for (size_t i = 0; i < train.size(); ++i) EXPECT_EQ(train2[i]["loss"], train[i]["loss"]);  // deterministic
}

// decode continues a prompt from the latest checkpoint: greedy output is the same with and
// without the KV cache, sampling is reproducible by seed, and bad prompts are user errors; export
// writes a Hugging Face model dir that decode --hf_model reads back to the same tokens and that
// train.init_from_hf starts from.
TEST(PaxCli, DecodeExportAndFineTuneFromHf) {
  const std::string d = job("decode");
  Result t = pax("train" + kSmall + " --job_log_dir=" + d + " --set train.steps=4 --set train.checkpoint_interval=4");
  ASSERT_EQ(t.rc, 0) << t.out;
  const std::string base = "decode --config " + d + "/config.toml --job_log_dir=" + d;
  auto ids_of = [](const std::string& out) {  // the last line: the prompt, '|', the new token ids
    std::string s = out.substr(0, out.find_last_not_of('\n') + 1);
    s = s.substr(s.find_last_of('\n') + 1);
    std::istringstream in(s.substr(s.find('|') + 1));
    std::vector<int> ids;
    for (int v; in >> v;) ids.push_back(v);
    return ids;
  };
  Result cached = pax(base + " --prompt '3 1 4 1 5' --max_new_tokens 8");
  ASSERT_EQ(cached.rc, 0) << cached.out;
  EXPECT_NE(cached.out.find("checkpoint step 4, 5 prompt tokens, 8 new tokens"), std::string::npos) << cached.out;
  std::vector<int> ids = ids_of(cached.out);
  ASSERT_EQ(ids.size(), 8u) << cached.out;
  EXPECT_NE(cached.out.find("\n3 1 4 1 5 | "), std::string::npos) << cached.out;  // the prompt, echoed
  for (int v : ids) EXPECT_TRUE(v >= 0 && v < 16) << v;  // the copy task's vocabulary
  Result plain = pax(base + " --prompt 3,1,4,1,5 --max_new_tokens 8 --no_cache");
  ASSERT_EQ(plain.rc, 0) << plain.out;
  EXPECT_EQ(ids_of(plain.out), ids);

  Result s1 = pax(base + " --prompt '3 1 4' --max_new_tokens 6 --temperature 1.5 --top_k 20 --seed 7");
  Result s2 = pax(base + " --prompt '3 1 4' --max_new_tokens 6 --temperature 1.5 --top_k 20 --seed 7");
  ASSERT_EQ(s1.rc, 0) << s1.out;
  EXPECT_EQ(ids_of(s1.out), ids_of(s2.out));
  Result capped = pax(base + " --prompt '1 2 3 4 5 6 7 8 9 10 11 12' --max_new_tokens 50");
  ASSERT_EQ(capped.rc, 0) << capped.out;
  EXPECT_EQ(ids_of(capped.out).size(), 4u) << capped.out;  // seq_len 16

  for (const char* bad : {"'1 two 3'", "'1 99999'", "'1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1'", "' '"}) {
    Result e = pax(base + " --prompt " + bad);
    EXPECT_EQ(e.rc, 2) << bad << ": " << e.out;
    EXPECT_NE(e.out.find("pax: error:"), std::string::npos) << e.out;
  }
  // export writes a Hugging Face model dir; decoding from it gives the same tokens.
  const std::string hf = job("decode_hf");
  Result x = pax("export --format=hf --config " + d + "/config.toml --job_log_dir=" + d + " --out " + hf);
  ASSERT_EQ(x.rc, 0) << x.out;
  EXPECT_TRUE(fs::exists(hf + "/config.json") && fs::exists(hf + "/model.safetensors")) << x.out;
  Result from_hf = pax("decode --hf_model=" + hf + " --prompt '3 1 4 1 5' --max_new_tokens 8");
  ASSERT_EQ(from_hf.rc, 0) << from_hf.out;
  EXPECT_EQ(ids_of(from_hf.out), ids);
  // Fine-tuning starts from it: with lr 0 the one step changes nothing, so eval gives the same loss.
  Result ev = pax("eval --config " + d + "/config.toml --job_log_dir=" + d);
  ASSERT_EQ(ev.rc, 0) << ev.out;
  const std::string tuned = job("decode_tuned");
  const std::string from_hf_cfg =
      kSmall + " --set train.init_from_hf=" + hf + " --set optimizer.lr=0 --set schedule.kind=constant";
  Result ft = pax("train" + from_hf_cfg + " --set train.steps=1 --job_log_dir=" + tuned);
  ASSERT_EQ(ft.rc, 0) << ft.out;
  EXPECT_NE(ft.out.find("from " + hf), std::string::npos) << ft.out;
  Result ev2 = pax("eval" + from_hf_cfg + " --job_log_dir=" + tuned);
  ASSERT_EQ(ev2.rc, 0) << ev2.out;
  auto loss_of = [](const std::string& out) { return out.substr(out.find("loss"), out.find("log_pplx") - out.find("loss")); };
  EXPECT_EQ(loss_of(ev2.out), loss_of(ev.out)) << ev.out << ev2.out;
  // Its export takes the special ids and tokenizer files of train.init_from_hf's directory.
  const std::string tuned_hf = job("decode_tuned_hf");
  Result tx = pax("export --job_log_dir=" + tuned + " --out " + tuned_hf);  // the source has neither
  ASSERT_EQ(tx.rc, 0) << tx.out;
  EXPECT_TRUE(nlohmann::json::parse(std::ifstream(tuned_hf + "/config.json"))["eos_token_id"].is_null());
  std::ofstream(hf + "/generation_config.json") << R"({"bos_token_id": 1, "eos_token_id": [3, 5]})";
  std::ofstream(hf + "/tokenizer_config.json") << R"({"model_max_length": 16})";
  tx = pax("export --job_log_dir=" + tuned + " --dtype f16 --out " + tuned_hf);
  ASSERT_EQ(tx.rc, 0) << tx.out;
  const nlohmann::json gen = nlohmann::json::parse(std::ifstream(tuned_hf + "/generation_config.json"));
  EXPECT_EQ(gen["eos_token_id"], nlohmann::json({3, 5})) << gen.dump();
  EXPECT_EQ(gen["bos_token_id"], 1) << gen.dump();
  EXPECT_TRUE(fs::exists(tuned_hf + "/tokenizer_config.json"));
  EXPECT_EQ(nlohmann::json::parse(std::ifstream(tuned_hf + "/config.json"))["torch_dtype"], "float16");
  Result wrong = pax("train" + from_hf_cfg + " --set model.d_model=64 --job_log_dir=" + job("decode_wrong"));
  EXPECT_EQ(wrong.rc, 2) << wrong.out;
  EXPECT_NE(wrong.out.find("--set model.d_model=32"), std::string::npos) << wrong.out;
  EXPECT_EQ(pax("decode --hf_model=" + hf + " --exp=copy.TransformerLmTiny --prompt '1'").rc, 2);
  EXPECT_EQ(pax("decode --hf_model=" + hf + "_missing --prompt '1'").rc, 2);
  EXPECT_EQ(pax("export --format=onnx --config " + d + "/config.toml --job_log_dir=" + d + " --out " + hf).rc, 2);
  // export --format=safetensors: the params as one file with the model's param names.
  const std::string file = hf + ".safetensors";
  Result xs = pax("export --format=safetensors --config " + d + "/config.toml --job_log_dir=" + d + " --out " + file);
  ASSERT_EQ(xs.rc, 0) << xs.out;
  px::SafetensorsFile sf = px::load_safetensors(file);
  EXPECT_TRUE(sf.contains("blocks.0.attn.wq") && sf.contains("embed.table")) << xs.out;

  Result none = pax("decode" + kSmall + " --job_log_dir=" + job("decode_empty") + " --prompt '1 2'");
  EXPECT_EQ(none.rc, 2) << none.out;
  EXPECT_NE(none.out.find("run 'pax train' first"), std::string::npos) << none.out;
}

// decode --hf_model stops at any of the model's EOS ids (generation_config.json lists several) and
// counts only the tokens before it; the prompt gets the special tokens of the tokenizer's own
// post-processor, as transformers' tokenizer(text) does: none for GPT-2's ByteLevel one, a BOS for
// a TemplateProcessing one (Llama 3).
TEST(PaxCli, DecodeHfModelUsesTheModelsEosIdsAndTheTokenizersPostProcessor) {
  const std::string d = job("hf_eos"), hf = job("hf_eos_model");
  Result t = pax("train" + kSmall + " --set model.vocab_size=32 --set train.steps=3 --job_log_dir=" + d);
  ASSERT_EQ(t.rc, 0) << t.out;
  ASSERT_EQ(pax("export --job_log_dir=" + d + " --out " + hf).rc, 0);
  auto new_ids = [](const std::string& out) {
    std::string s = out.substr(0, out.find_last_not_of('\n') + 1);
    std::istringstream in(s.substr(s.find_last_of('|') + 1));
    std::vector<int> ids;
    for (int v; in >> v;) ids.push_back(v);
    return ids;
  };
  Result all = pax("decode --hf_model=" + hf + " --prompt '3 1 4' --max_new_tokens 8");
  ASSERT_EQ(all.rc, 0) << all.out;
  const std::vector<int> ids = new_ids(all.out);
  ASSERT_EQ(ids.size(), 8u) << all.out;  // the export has no EOS: it runs to max_new_tokens
  // Two EOS ids: the third new token and one the model did not make before it.
  int other = 0;
  while (std::find(ids.begin(), ids.begin() + 3, other) != ids.begin() + 3) ++other;
  std::ofstream(hf + "/generation_config.json") << "{\"eos_token_id\": [" << other << ", " << ids[2] << "]}";
  const size_t first = std::find(ids.begin(), ids.end(), ids[2]) - ids.begin();
  Result stop = pax("decode --hf_model=" + hf + " --prompt '3 1 4' --max_new_tokens 8");
  ASSERT_EQ(stop.rc, 0) << stop.out;
  EXPECT_EQ(new_ids(stop.out), std::vector<int>(ids.begin(), ids.begin() + first)) << stop.out;
  EXPECT_NE(stop.out.find(std::to_string(first) + " new token" + (first == 1 ? "" : "s") +
                          " (stopped at the end-of-text token)"),
            std::string::npos)
      << stop.out;

  // A byte-level BPE of the letters a..z, a space (U+0120) and <|endoftext|> (27, BOS and EOS).
  nlohmann::json vocab;
  for (char ch = 'a'; ch <= 'z'; ++ch) vocab[std::string(1, ch)] = ch - 'a';
  vocab["\u0120"] = 26;
  const nlohmann::json eot = {{"id", 27}, {"content", "<|endoftext|>"}, {"special", true}};
  auto write_tokenizer = [&](const nlohmann::json& post) {
    nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
                        {"added_tokens", {eot}},
                        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
                        {"post_processor", post}};
    std::ofstream(hf + "/tokenizer.json") << j.dump();
    std::ofstream(hf + "/tokenizer_config.json") << R"({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})";
  };
  auto prompt_tokens = [](const Result& r) {
    const size_t at = r.out.find(" prompt tokens");
    if (at == std::string::npos) return -1;
    return std::stoi(r.out.substr(r.out.rfind(", ", at) + 2));
  };
  write_tokenizer({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}});  // GPT-2's
  Result gpt2 = pax("decode --hf_model=" + hf + " --prompt 'ab cd' --max_new_tokens 2");
  ASSERT_EQ(gpt2.rc, 0) << gpt2.out;
  EXPECT_EQ(prompt_tokens(gpt2), 5) << "no BOS: " << gpt2.out;
  EXPECT_NE(gpt2.out.find("\nab cd"), std::string::npos) << "the prompt, echoed: " << gpt2.out;
  write_tokenizer(
      {{"type", "TemplateProcessing"},
       {"single",
        {{{"SpecialToken", {{"id", "<|endoftext|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
       {"pair", nlohmann::json::array()},
       {"special_tokens",
        {{"<|endoftext|>", {{"id", "<|endoftext|>"}, {"ids", {27}}, {"tokens", {"<|endoftext|>"}}}}}}});
  Result llama = pax("decode --hf_model=" + hf + " --prompt 'ab cd' --max_new_tokens 2");
  ASSERT_EQ(llama.rc, 0) << llama.out;
  EXPECT_EQ(prompt_tokens(llama), 6) << "a BOS: " << llama.out;
  EXPECT_NE(llama.out.find("\nab cd"), std::string::npos) << "the prompt, echoed without the BOS: " << llama.out;
}

// sharding.strategy=auto (with memory.remat=full): the solver's plan (with its explanation) is in
// plan.txt, the run trains, and `pax plan` costs it on a GPU preset.
TEST(PaxCli, AutoShardingPlansExplainsAndTrains) {
  const std::string d = job("auto");
  const std::string sets = " --devices=cpu:4 --set sharding.mesh=data:2,model:2 --set sharding.strategy=auto";
  // With remat too: AUTO plans the step as rematerialized.
  Result r = pax("train" + kSmall + sets + " --set memory.remat=full --set train.steps=4 --job_log_dir=" + d);
  ASSERT_EQ(r.rc, 0) << r.out;
  std::ifstream in(d + "/plan.txt");
  std::string plan((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(plan.find("AUTO on Mesh{data: 2, model: 2}"), std::string::npos) << plan;
  EXPECT_NE(plan.find("why: "), std::string::npos) << plan;
  EXPECT_NE(plan.find("auto"), std::string::npos) << plan;
  Result p = pax("plan" + kSmall + sets + " --cluster=h100x8");
  ASSERT_EQ(p.rc, 0) << p.out;
  EXPECT_NE(p.out.find("FSDP_TP"), std::string::npos) << p.out;  // the recipes beside AUTO's plan
  EXPECT_NE(p.out.find("AUTO's prediction on h100x8"), std::string::npos) << p.out;
  Result bad = pax("plan" + kSmall + sets + " --cluster=nowhere");
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("nowhere"), std::string::npos) << bad.out;
}

TEST(PaxCli, EverySetTypeIsAcceptedAndRejectedAsDocumented) {
  const std::string base = "describe --exp=copy.TransformerLmTiny";
  // (The text data fields apply only to text data: set with data.kind=text.)
  for (const char* ok : {"train.steps=70", "optimizer.lr=1e-4", "data.kind=text --set tokenizer.model=/x.model",
                         "model.tied_embedding=false", "optimizer.name=sgd", "data.kind=text --set data.paths=a.txt,b.txt",
                         "sharding.mesh=data:1"}) {
    Result r = pax(base + " --set " + ok);
    EXPECT_EQ(r.rc, 0) << ok << ": " << r.out;
  }
  EXPECT_NE(pax(base + " --set train.steps=70").out.find("steps = 70"), std::string::npos);
  Result f = pax(base + " --fields");
  EXPECT_EQ(f.rc, 0);
  EXPECT_NE(f.out.find("optimizer.name"), std::string::npos);
  EXPECT_NE(f.out.find("one of adamw, adam, sgd, adafactor"), std::string::npos) << f.out;
  struct Bad {
    const char* set;
    const char* says;
  };
  for (Bad b : {Bad{"train.steps=seven", "train.steps='seven' is not an int"},
                Bad{"train.steps=-3", "an int in [1, "},
                Bad{"optimizer.lr=abc", "optimizer.lr='abc' is not a float"},
                Bad{"model.tied_embedding=yes", "true or false"},
                Bad{"optimizer.name=lion", "one of adamw, adam, sgd, adafactor"},
                Bad{"data.paths=[a", "data.paths"},
                Bad{"sharding.mesh=data4", "a mesh is name:size pairs"},
                Bad{"train.steps=5", "lower schedule.warmup_steps or raise train.steps"},
                Bad{"no.such=1", "unknown config field 'no.such'"},
                Bad{"train.steps=3e9", "train.steps=3000000000 is out of range; allowed: an int in [1, 2147483646]"},
                Bad{"train.steps=0x10", "train.steps='0x10' is not an int"},
                Bad{"optimizer.lr=0x1p-3", "optimizer.lr='0x1p-3' is not a float"},
                Bad{"'data.paths=\"abc'", "the quote \" is not closed"},
                Bad{"'data.path=abc'", "(did you mean 'data.paths'?)"},
                Bad{"train.steps", "is not path=value"}}) {
    Result r = pax(base + " --set " + b.set);
    EXPECT_EQ(r.rc, 2) << b.set;
    EXPECT_NE(r.out.find(b.says), std::string::npos) << b.set << ": " << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one line: " << r.out;
  }
}

TEST(PaxCli, UserErrorsExitWithCode2AndOneLine) {
  Result r = pax("train --exp=no.Such --job_log_dir=" + job("unknown"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(r.out, "pax: error: [pax] unknown experiment 'no.Such'; see 'pax list'\n");

  r = pax("train --exp=c4.C4Spmd1BAdam4Replicas --set sharding.mesh= --set memory.remat=none --job_log_dir=" +
          job("c4"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("reads text from data.paths, which is empty"), std::string::npos) << r.out;

  r = pax("train --exp=copy.TransformerLmTiny --set data.kind=text --set data.paths=/no/such/corpus --job_log_dir=" +
          job("missing"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("'/no/such/corpus' does not exist"), std::string::npos) << r.out;

  const std::string file = ::testing::TempDir() + "/pax_e2e_a_file";
  std::ofstream(file) << "x";
  r = pax("train" + kSmall + " --job_log_dir=" + file + "/job");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("cannot create the job dir"), std::string::npos) << r.out;

  r = pax("train --exp=copy.TransformerLmTiny");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("pass --job_log_dir=DIR"), std::string::npos) << r.out;

  r = pax("train --exp=copy.TransformerLmTiny --set memory.remat=auto --job_log_dir=" + job("remat"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("needs memory.budget_bytes"), std::string::npos) << r.out;
  r = pax("train" + kSmall + " --set train.steps=4 --set memory.remat=auto --set memory.budget_bytes=1000000000"
          " --devices=cpu:2 --set sharding.mesh=data:2 --set sharding.strategy=fsdp --job_log_dir=" + job("remat_auto"));
  EXPECT_EQ(r.rc, 0) << r.out;  // a budget the step fits: remat auto on a sharded run trains
  r = pax("train" + kSmall + " --set train.steps=4 --set memory.offload=params_and_optimizer_state"
          " --set memory.prefetch_depth=2 --job_log_dir=" + job("offload"));
  EXPECT_EQ(r.rc, 0) << r.out;  // offload has landed
  r = pax("train --exp=copy.TransformerLmTiny --set memory.offload=disk --job_log_dir=" + job("offload_bad"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("memory.offload"), std::string::npos) << r.out;

  // A missing train.init_from_hf is found before the data is prepared (GCIDE: a tokenizer to train).
  r = pax("train --exp=gcide.TransformerLmTiny --set train.init_from_hf=/no/such/model --job_log_dir=" +
          job("hf_missing"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("/no/such/model/config.json"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("data: preparing"), std::string::npos) << r.out;

  r = pax("decode --exp=copy.TransformerLmTiny --job_log_dir=" + job("decode_no_prompt"));
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--prompt is required"), std::string::npos) << r.out;

  r = pax("frobnicate");
  EXPECT_EQ(r.rc, 2);
  EXPECT_EQ(pax("train --help").rc, 0);
  EXPECT_NE(pax("list").out.find("c4.C4Spmd16BAdam32Replicas"), std::string::npos);
  Result plan = pax("plan --exp=c4.C4Spmd16BAdam32Replicas");
  EXPECT_EQ(plan.rc, 0) << plan.out;
  EXPECT_NE(plan.out.find("per device: params"), std::string::npos);
}

// Names and paths that were accepted and then ignored or misread (issue 52): each is refused,
// naming what is allowed.
TEST(PaxCli, UnknownNamesAndPathsOfTheWrongKindAreRefused) {
  auto with_env = [](const char* name, const char* value, const std::string& args) {
    ::setenv(name, value, 1);
    Result r = pax(args);
    ::unsetenv(name);
    return r;
  };
  Result r = with_env("PX_DEVICES", "garbage", "describe --exp=copy.TransformerLmTiny");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("PX_DEVICES='garbage': no backend is registered for platform 'garbage'; the registered "
                       "platforms are cpu, ref"),
            std::string::npos) << r.out;
  r = with_env("PX_LOG_LEVEL", "loud", "describe --exp=copy.TransformerLmTiny");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("PX_LOG_LEVEL='loud' is not a log level; use debug, info, warn, error or off"),
            std::string::npos) << r.out;
  r = pax("plan --exp=copy.TransformerLmTiny --devices=tpu:2 --set sharding.mesh=data:2");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("'tpu:2': no backend is registered for platform 'tpu'"), std::string::npos) << r.out;
  // cuda: provided where the build has the CUDA backend; on a machine without a GPU it says so.
  r = pax("plan --exp=copy.TransformerLmTiny --devices=cuda --set sharding.mesh=data:1");
  EXPECT_EQ(r.rc, 2);
  EXPECT_TRUE(r.out.find("(no CUDA device is visible to this process") != std::string::npos ||
              r.out.find("(this program has no CUDA backend") != std::string::npos ||
              std::getenv("CUDA_VISIBLE_DEVICES") != nullptr)
      << r.out;
  const std::string dir = job("a_dir"), file = ::testing::TempDir() + "/pax_e2e_kind_file";
  std::filesystem::create_directories(dir);
  std::ofstream(file) << "x";
  r = pax("describe --config " + dir);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("config file '" + dir + "' is a directory, not a regular file"), std::string::npos) << r.out;
  r = pax("decode --hf_model=" + file + " --prompt=hi");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--hf_model '" + file + "' is a regular file, not a directory"), std::string::npos) << r.out;
  r = pax("train --exp=copy.TransformerLmTiny --job_log_dir=" + file);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("--job_log_dir '" + file + "' is a regular file, not a directory"), std::string::npos) << r.out;
  r = pax("export --exp=copy.TransformerLmTiny --job_log_dir=" + dir + " --out=" + file);
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("export: --out '" + file + "' is a regular file, not a directory"), std::string::npos) << r.out;
  r = pax("describe --exp=copy.TransformerLmTiny --set data.paths=corpus.txt");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("data.paths=corpus.txt has no effect here: it applies only with data.kind=text"),
            std::string::npos) << r.out;
  r = pax("describe --exp=copy.TransformerLmTiny --set sharding.schedule=zero_bubble");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("sharding.schedule=zero_bubble has no effect here"), std::string::npos) << r.out;
}

// Saved on {data:4, model:2} with FSDP_TP, resumed on {data:8} with DDP, on {model:2} with TP and on
// one device: each restores the step-4 checkpoint onto its own shardings, trains one more step and
// evaluates; the losses agree with the run that never moved (to the rounding of another mesh's
// reduction order).
TEST(PaxCli, ResumesOnAnotherMeshAndStrategy) {
  const std::string steps = " --set train.summary_interval=1 --set train.eval_interval=0"
                            " --set train.checkpoint_interval=4 --set model.n_heads=2 --set data.batch=8";
  const std::string src = job("mesh_src");
  Result r = pax("train" + kSmall + steps + " --set train.steps=4 --devices=cpu:8 --set sharding.mesh=data:4,model:2"
                 " --set sharding.strategy=fsdp_tp --job_log_dir=" + src);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto resume = [&](const std::string& name, const std::string& where) {
    const std::string d = job("mesh_" + name);
    fs::copy(src, d, fs::copy_options::recursive);
    Result x = pax("train" + kSmall + steps + " --set train.steps=5" + where + " --job_log_dir=" + d);
    EXPECT_EQ(x.rc, 0) << name << ": " << x.out;
    EXPECT_NE(x.out.find("resumed at step 4"), std::string::npos) << name << ": " << x.out;
    return std::make_pair(metrics(d, "train").back()["loss"].get<double>(),
                          metrics(d, "eval_test").back()["loss"].get<double>());
  };
  auto same = resume("same", " --devices=cpu:8 --set sharding.mesh=data:4,model:2 --set sharding.strategy=fsdp_tp");
  for (auto [name, where] : std::vector<std::pair<std::string, std::string>>{
           {"ddp", " --devices=cpu:8 --set sharding.mesh=data:8 --set sharding.strategy=ddp"},
           {"tp", " --devices=cpu:2 --set sharding.mesh=model:2 --set sharding.strategy=tp"},
           {"one", " --devices=cpu:1 --set sharding.mesh="}}) {
    auto got = resume(name, where);
    EXPECT_NEAR(got.first, same.first, 1e-5 * std::abs(same.first)) << name;
    EXPECT_NEAR(got.second, same.second, 1e-5 * std::abs(same.second)) << name;
  }
}

// train, eval and decode on devices whose memory the host cannot read (the ref backend's discrete
// mode, as an accelerator's): the same losses as on the CPU within the ref backend's rounding, a
// checkpoint that eval and decode read back, and the same greedy tokens with and without the cache.
TEST(PaxCli, TrainsEvalsAndDecodesOnDeviceMemoryTheHostCannotRead) {
  const std::string steps = " --set train.steps=4 --set train.summary_interval=1 --set train.eval_interval=4"
                            " --set train.checkpoint_interval=4 --set sharding.mesh=data:2 --set sharding.strategy=fsdp";
  const std::string dev = job("discrete"), cpu = job("discrete_cpu");
  const std::string discrete = "PX_REF_DISCRETE=1";
  Result r = pax("train" + kSmall + steps + " --devices=ref:2 --job_log_dir=" + dev, discrete);
  ASSERT_EQ(r.rc, 0) << r.out;
  Result c = pax("train" + kSmall + steps + " --devices=cpu:2 --job_log_dir=" + cpu);
  ASSERT_EQ(c.rc, 0) << c.out;
  auto on_dev = metrics(dev, "train"), on_cpu = metrics(cpu, "train");
  ASSERT_EQ(on_dev.size(), 4u);
  ASSERT_EQ(on_cpu.size(), 4u);
  for (size_t i = 0; i < on_dev.size(); ++i) {
    const double want = on_cpu[i]["loss"], got = on_dev[i]["loss"];
    EXPECT_NEAR(got, want, 1e-4 * std::abs(want)) << "step " << i + 1;
  }
  Result e = pax("eval --devices=ref:2 --config " + dev + "/config.toml --job_log_dir=" + dev, discrete);
  ASSERT_EQ(e.rc, 0) << e.out;
  EXPECT_NE(e.out.find("eval step 4: loss"), std::string::npos) << e.out;
  const std::string base =
      "decode --devices=ref:1 --config " + dev + "/config.toml --job_log_dir=" + dev + " --prompt '3 1 4 1 5'";
  Result cached = pax(base + " --max_new_tokens 6", discrete);
  Result plain = pax(base + " --max_new_tokens 6 --no_cache", discrete);
  ASSERT_EQ(cached.rc, 0) << cached.out;
  ASSERT_EQ(plain.rc, 0) << plain.out;
  auto last_line = [](const std::string& out) {
    const std::string s = out.substr(0, out.find_last_not_of('\n') + 1);
    return s.substr(s.find_last_of('\n') + 1);
  };
  EXPECT_EQ(last_line(cached.out), last_line(plain.out));
  EXPECT_EQ(last_line(cached.out).rfind("3 1 4 1 5 | ", 0), 0u) << cached.out;
}

// A damaged latest checkpoint: train stops with an error that offers --restore_step; resuming
// from the checkpoint before sets the damaged one aside and ends with the losses of a run that
// never broke.
TEST(PaxCli, RestoreStepResumesFromTheCheckpointBeforeADamagedOne) {
  const std::string steps = " --set train.steps=8 --set train.checkpoint_interval=4 --set train.summary_interval=1"
                            " --set train.eval_interval=0";
  const std::string ref = job("restore_ref"), d = job("restore");
  ASSERT_EQ(pax("train" + kSmall + steps + " --job_log_dir=" + ref).rc, 0);
  ASSERT_EQ(pax("train" + kSmall + steps + " --job_log_dir=" + d).rc, 0);
  const std::string damaged = d + "/checkpoints/checkpoint_00000008";
  const std::string chunk = damaged + "/blocks.0.mlp.fc.w/c/0/0";
  ASSERT_TRUE(fs::exists(chunk));
  {
    std::fstream f(chunk, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    f.write("\x5a\x5a\x5a\x5a", 4);
  }
  Result r = pax("train" + kSmall + steps + " --set train.steps=12 --job_log_dir=" + d);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--restore_step=4"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("blocks.0.mlp.fc.w"), std::string::npos) << r.out;  // the array at fault

  Result bad = pax("train" + kSmall + steps + " --restore_step=3 --job_log_dir=" + d);
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("the committed steps are 4, 8"), std::string::npos) << bad.out;

  Result ok = pax("train" + kSmall + steps + " --restore_step=4 --job_log_dir=" + d);
  ASSERT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("resumed at step 4 (set aside: " + damaged + ".discarded)"), std::string::npos) << ok.out;
  EXPECT_TRUE(fs::exists(damaged + ".discarded/blocks.0.mlp.fc.w"));  // set aside, not deleted
  EXPECT_TRUE(fs::exists(damaged + "/COMMITTED"));                    // and written again, whole
  auto a = metrics(ref, "train"), b = metrics(d, "train");
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i]["loss"], a[i]["loss"]) << "step " << a[i]["step"];
}

TEST(PaxCli, InterruptedRunContinuesWithTheSameLosses) {
  // A model big enough that the 37 steps after the third summary take a while: Ctrl-C lands in
  // the middle of the run, not after it (retried if a loaded machine still let the run finish).
  const std::string model = " --exp=copy.TransformerLmTiny --set model.d_model=64 --set model.d_ff=256"
                            " --set model.n_layers=2 --set model.seq_len=32 --set data.batch=8"
                            " --set data.copy_eval_batches=2 --set schedule.warmup_steps=2";
  const int kSteps = 40;
  const std::string steps = " --set train.steps=" + std::to_string(kSteps) +
                            " --set train.summary_interval=1 --set train.eval_interval=0 --set train.checkpoint_interval=0";
  const std::string ref = job("ref");
  ASSERT_EQ(pax("train" + model + steps + " --job_log_dir=" + ref).rc, 0);

  std::string cut;
  int status = -1;
  for (int attempt = 0; attempt < 3 && status != 130; ++attempt) {
    cut = job("cut");
    const std::string cmd = std::string(PX_PAX_BIN) + " train" + model + steps + " --job_log_dir=" + cut + " > " +
                            ::testing::TempDir() + "/pax_e2e_cut.log 2>&1";
    pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    // Interrupt after a few steps have been summarized.
    auto t0 = std::chrono::steady_clock::now();
    while (metrics(cut, "train").size() < 3 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(120))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    kill(pid, SIGINT);
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFEXITED(st));
    status = WEXITSTATUS(st);
    ASSERT_TRUE(status == 130 || status == 0) << "exit " << status;  // 0: the run ended before Ctrl-C came
  }
  ASSERT_EQ(status, 130);
  const size_t done = metrics(cut, "train").size();
  EXPECT_LT(done, static_cast<size_t>(kSteps));
  ASSERT_TRUE(fs::exists(cut + "/checkpoints/checkpoint_" + std::string(8 - std::to_string(done).size(), '0') +
                         std::to_string(done)));

  Result r = pax("train" + model + steps + " --job_log_dir=" + cut);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("resumed at step " + std::to_string(done)), std::string::npos) << r.out;
  auto a = metrics(ref, "train"), b = metrics(cut, "train");
  ASSERT_EQ(a.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(b.size(), static_cast<size_t>(kSteps));
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["step"], a[i]["step"]);
    EXPECT_EQ(b[i]["loss"], a[i]["loss"]) << "step " << a[i]["step"];
  }
}

TEST(PaxCli, TensorBoardReadsTheValuesOfMetricsJsonl) {
  const std::string d = job("tb");
  ASSERT_EQ(pax("train" + kSmall + " --job_log_dir=" + d +
                " --set train.steps=4 --set train.summary_interval=1 --set train.eval_interval=2")
                .rc,
            0);
  const std::string script = ::testing::TempDir() + "/pax_read_events.py";
  std::ofstream(script) << R"(import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out = {}
for split in ("train", "eval_test"):
    ea = EventAccumulator(sys.argv[1] + "/summaries/" + split)
    ea.Reload()
    out[split] = {t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}
print(json.dumps(out))
)";
  const char* env = std::getenv("PX_TEST_PYTHON");
  const std::string python = env && *env ? px::testing::test_python() : PX_VENV_PYTHON;
  FILE* p = popen((python + " " + script + " " + d).c_str(), "r");
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << "the tensorboard package is missing: run scripts/setup_test_venv.sh";
  auto tb = nlohmann::json::parse(text);
  int compared = 0;
  for (const char* split : {"train", "eval_test"})
    for (const auto& m : metrics(d, split))
      for (auto& [k, v] : m.items()) {
        if (k == "split" || k == "step" || k == "wall_time") continue;
        ASSERT_TRUE(tb[split].contains(k)) << split << "/" << k;
        bool found = false;
        for (auto& sv : tb[split][k])
          if (sv[0] == m["step"]) {
            EXPECT_NEAR(sv[1].get<double>(), v.get<double>(), 1e-6 * std::max(1.0, std::abs(v.get<double>())));
            found = true;
            ++compared;
          }
        EXPECT_TRUE(found) << split << "/" << k << " at step " << m["step"];
      }
  EXPECT_GE(compared, 4 * 7 + 2 * 3);
}

}  // namespace

#include <random>

#include "parallax/checkpoint.h"
#include "parallax/io.h"

namespace {

// pax train killed with SIGKILL at random moments (during compilation, steps and checkpoint
// writes), rerun each time with the same command: the run ends with bitwise the params and
// optimizer state of an uninterrupted run, and metrics.jsonl holds the same losses.
TEST(PaxCli, SigkillAtRandomMomentsThenRerunEndsBitwiseLikeAnUninterruptedRun) {
  const std::string args = kSmall + " --set train.steps=40 --set train.summary_interval=1 --set train.eval_interval=0"
                                    " --set train.checkpoint_interval=2 --set train.checkpoint_keep=2";
  const std::string ref = job("kill_ref"), cut = job("kill_cut");
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(pax("train" + args + " --job_log_dir=" + ref).rc, 0);
  const double run_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  std::mt19937 rng(2026);
  std::uniform_real_distribution<double> when(0.05 * run_ms, 0.6 * run_ms);
  int kills = 0, torn = 0, exit_code = -1;
  double scale = 1.0;
  for (int attempt = 0; attempt < 100 && exit_code != 0; ++attempt) {
    pid_t pid = fork();
    if (pid == 0) {
      const std::string cmd = std::string(PX_PAX_BIN) + " train" + args + " --job_log_dir=" + cut + " >/dev/null 2>&1";
      execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    int st = 0;
    if (kills < 24) {  // after 24 kills the run is left to finish
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(1000 * scale * when(rng)));
      pid_t done = 0;
      while ((done = waitpid(pid, &st, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (done == 0) {
        ASSERT_EQ(kill(pid, SIGKILL), 0);
        ASSERT_EQ(waitpid(pid, &st, 0), pid);
      }
      if (WIFSIGNALED(st)) {
        ++kills;
        for (auto& e : fs::directory_iterator(cut + "/checkpoints", ec_ignore()))
          torn += e.path().filename().string().ends_with(".tmp");
        continue;
      }
      // It finished before the kill came (the machine got faster than when the reference run was
      // timed): start over with shorter waits, so that the final run has been killed too.
      ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "attempt " << attempt;
      fs::remove_all(cut);
      scale *= 0.5;
      continue;
    }
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFEXITED(st)) << "attempt " << attempt;
    exit_code = WEXITSTATUS(st);
  }
  ASSERT_EQ(exit_code, 0);
  std::printf("one run: %.0f ms; %d kills, %d left a checkpoint write unfinished\n", run_ms, kills, torn);
  EXPECT_GE(kills, 20);

  px::Checkpoint a = px::read_checkpoint(ref + "/checkpoints/checkpoint_00000040");
  px::Checkpoint b = px::read_checkpoint(cut + "/checkpoints/checkpoint_00000040");
  ASSERT_EQ(a.names(), b.names());
  for (const std::string& n : a.names()) {
    px::Array x = a.full(n), y = b.full(n);
    ASSERT_EQ(x.type(), y.type()) << n;
    EXPECT_EQ(std::memcmp(x.raw(), y.raw(), static_cast<size_t>(x.nbytes())), 0) << n;
  }
  auto la = metrics(ref, "train"), lb = metrics(cut, "train");
  ASSERT_EQ(la.size(), 40u);
  ASSERT_EQ(lb.size(), 40u);
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(lb[i]["loss"], la[i]["loss"]) << "step " << la[i]["step"];
}

}  // namespace

namespace {

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), {});
}

// `pax <args>` in the background, stdout and stderr to `log`; returns its pid (pax itself: exec).
pid_t start_pax(const std::string& args, const std::string& log) {
  fs::remove(log);  // what a test waits for in it is this run's
  const std::string cmd = "exec " + std::string(PX_PAX_BIN) + " " + args + " > " + log + " 2>&1";
  pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  return pid;
}

// Waits (polling, up to `seconds`) until `done` holds; false on time-out.
template <class F>
bool wait_until(F done, int seconds = 300) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(seconds)) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

// The exit status of `pid`, waiting up to `seconds` (then killing it: -1).
int wait_status(pid_t pid, int seconds = 300) {
  int st = 0;
  if (!wait_until([&] { return waitpid(pid, &st, WNOHANG) == pid; }, seconds)) {
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
  }
  return st;
}

// A run long enough that it is still training when the test acts (it is stopped before its end).
const std::string kLong = kSmall +
                          " --set train.steps=1000000 --set train.summary_interval=5"
                          " --set train.eval_interval=0 --set train.checkpoint_interval=0";

// SIGTERM (what Slurm, docker stop, Kubernetes and mpirun send) lets the step finish, saves it,
// says so and exits 143; the rerun continues from that step. While it runs, the job dir is owned:
// a second trainer there is refused with the first one's pid.
TEST(PaxCli, SigtermSavesTheStepExits143AndTheJobDirIsLockedMeanwhile) {
  const std::string d = job("term"), log = ::testing::TempDir() + "/pax_e2e_term_" + std::to_string(getpid()) + ".log";
  pid_t pid = start_pax("train" + kLong + " --job_log_dir=" + d, log);
  ASSERT_TRUE(wait_until([&] { return metrics(d, "train").size() >= 2; })) << read_text(log);

  Result second = pax("train" + kLong + " --job_log_dir=" + d);
  EXPECT_EQ(second.rc, 2) << second.out;
  EXPECT_NE(second.out.find("is in use by another pax train"), std::string::npos) << second.out;
  EXPECT_NE(second.out.find("pid " + std::to_string(pid)), std::string::npos) << second.out;
  EXPECT_NE(read_text(d + "/.lock").find("pid " + std::to_string(pid)), std::string::npos);

  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int st = wait_status(pid);
  ASSERT_TRUE(WIFEXITED(st)) << "status " << st << ": " << read_text(log);
  EXPECT_EQ(WEXITSTATUS(st), 143) << read_text(log);
  const std::string out = read_text(log);
  const size_t stopped = out.find("stopped by SIGTERM after step ");
  ASSERT_NE(stopped, std::string::npos) << out;
  const int64_t step = std::stoll(out.substr(stopped + std::strlen("stopped by SIGTERM after step ")));
  const std::string ck =
      d + "/checkpoints/checkpoint_" + std::string(8 - std::to_string(step).size(), '0') + std::to_string(step);
  const size_t saving = out.find("saving step " + std::to_string(step) + " -> " + ck);
  const size_t committed = out.find("committed step " + std::to_string(step) + " -> " + ck);
  ASSERT_NE(saving, std::string::npos) << out;
  ASSERT_NE(committed, std::string::npos) << out;
  EXPECT_LT(saving, committed);
  EXPECT_LT(committed, stopped);
  EXPECT_TRUE(fs::exists(ck + "/COMMITTED"));
  EXPECT_NE(out.find("checkpoint step " + std::to_string(step) + " committed; rerun the same command to continue"),
            std::string::npos)
      << out;

  // The lock went with the process: the rerun takes the dir and continues from that step.
  Result more = pax("train" + kLong + " --set train.steps=" + std::to_string(step + 2) + " --job_log_dir=" + d);
  ASSERT_EQ(more.rc, 0) << more.out;
  EXPECT_NE(more.out.find("resumed at step " + std::to_string(step)), std::string::npos) << more.out;
  EXPECT_NE(more.out.find("committed step " + std::to_string(step + 2)), std::string::npos) << more.out;
}

// A second signal (of either kind) while the first is handled ends the process at once.
TEST(PaxCli, ASecondSignalEndsTheRunAtOnce) {
  const std::string d = job("twice"),
                    log = ::testing::TempDir() + "/pax_e2e_twice_" + std::to_string(getpid()) + ".log";
  pid_t pid = start_pax("train" + kLong + " --job_log_dir=" + d, log);
  ASSERT_TRUE(wait_until([&] { return metrics(d, "train").size() >= 1; })) << read_text(log);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  ASSERT_EQ(kill(pid, SIGINT), 0);  // another kind: never merged with the first while pending
  const int st = wait_status(pid);
  ASSERT_TRUE(WIFSIGNALED(st)) << "status " << st << ": " << read_text(log);
  EXPECT_TRUE(WTERMSIG(st) == SIGINT || WTERMSIG(st) == SIGTERM) << WTERMSIG(st);
}

// A rerun that would train another config in a job dir with a checkpoint is refused before
// anything there is written, naming each field; what may change on a rerun (steps, intervals,
// mesh) is accepted. eval, decode and export read DIR/config.toml when no --exp or --config is given.
TEST(PaxCli, AJobDirHoldsOneConfigAndEvalDecodeExportReadIt) {
  const std::string d = job("owned");
  const std::string steps = " --set train.steps=3 --set train.checkpoint_interval=3 --set train.eval_interval=0";
  ASSERT_EQ(pax("train" + kSmall + steps + " --job_log_dir=" + d).rc, 0);
  std::map<std::string, std::string> before;
  for (const char* f : {"config.toml", "plan.txt", "model_params.txt", "metrics.jsonl"})
    before[f] = read_text(d + "/" + f);

  Result r = pax("train" + kSmall + steps +
                 " --set model.d_model=64 --set optimizer.lr=0.01 --set train.steps=4"
                 " --job_log_dir=" +
                 d);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("2 fields differ"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model.d_model (job: 32, this run: 64)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("optimizer.lr (job: 0.003, this run: 0.01)"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("train.steps"), r.out.find("train.steps, the intervals")) << r.out;  // may change
  EXPECT_EQ(r.out.find("--restore_step"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--config " + d + "/config.toml"), std::string::npos) << r.out;
  for (auto& [f, text] : before) EXPECT_EQ(read_text(d + "/" + f), text) << f << " was rewritten";
  Result other = pax("train --exp=copy.TransformerLmTiny --job_log_dir=" + d);
  EXPECT_EQ(other.rc, 2) << other.out;
  EXPECT_NE(other.out.find("model.d_model (job: 32, this run: 64)"), std::string::npos) << other.out;

  // More steps on another mesh continue the job, from the job's own config.
  Result more = pax("train --job_log_dir=" + d + " --set train.steps=6 --devices=cpu:2 --set sharding.mesh=data:2");
  ASSERT_EQ(more.rc, 0) << more.out;
  EXPECT_NE(more.out.find("resumed at step 3"), std::string::npos) << more.out;

  Result e = pax("eval --job_log_dir=" + d);
  ASSERT_EQ(e.rc, 0) << e.out;
  EXPECT_NE(e.out.find("eval step 6: loss"), std::string::npos) << e.out;
  Result missing = pax("eval --job_log_dir=" + d + " --step 4");
  EXPECT_EQ(missing.rc, 2) << missing.out;
  EXPECT_NE(missing.out.find("no checkpoint at step 4"), std::string::npos) << missing.out;
  EXPECT_NE(missing.out.find("the committed steps are 3, 6"), std::string::npos) << missing.out;
  Result dec = pax("decode --job_log_dir=" + d + " --prompt '3 1 4' --max_new_tokens 2");
  ASSERT_EQ(dec.rc, 0) << dec.out;
  EXPECT_NE(dec.out.find("checkpoint step 6, 3 prompt tokens, 2 new tokens"), std::string::npos) << dec.out;
  EXPECT_NE(dec.out.find("\n3 1 4 | "), std::string::npos) << dec.out;
  Result x = pax("export --format=safetensors --job_log_dir=" + d + " --step 7 --out " + d + "/x.safetensors");
  EXPECT_EQ(x.rc, 2) << x.out;
  EXPECT_NE(x.out.find("the committed steps are 3, 6"), std::string::npos) << x.out;
  ASSERT_EQ(pax("export --format=safetensors --job_log_dir=" + d + " --out " + d + "/x.safetensors").rc, 0);

  // A job dir without a checkpoint has nothing to lose: another config replaces its config.toml.
  const std::string fresh = job("owned_fresh");
  fs::create_directories(fresh);
  fs::copy_file(d + "/config.toml", fresh + "/config.toml");
  Result replaced = pax("train" + kSmall + steps + " --set model.d_model=64 --job_log_dir=" + fresh);
  ASSERT_EQ(replaced.rc, 0) << replaced.out;
  EXPECT_NE(replaced.out.find("config.toml is replaced (the job dir has no checkpoint yet); changed: model.d_model "
                              "(job: 32, this run: 64)"),
            std::string::npos)
      << replaced.out;

  Result none = pax("eval --job_log_dir=" + job("owned_empty"));
  EXPECT_EQ(none.rc, 2) << none.out;
  EXPECT_NE(none.out.find("pass --exp=NAME"), std::string::npos) << none.out;
}

TEST(PaxCli, MisspeltNamesGetASuggestionAndVersionIsPrinted) {
  Result r = pax("trian --exp=copy.TransformerLmTiny");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("unknown command 'trian'; did you mean 'train'?"), std::string::npos) << r.out;
  r = pax("describe --exp=copy.TransformerLmTiyn");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("did you mean 'copy.TransformerLmTiny'?"), std::string::npos) << r.out;
  r = pax("train --exp=copy.TransformerLmTiny --job_dir=/tmp/x");
  EXPECT_EQ(r.rc, 2);
  EXPECT_NE(r.out.find("did you mean '--job_log_dir' for '--job_dir'?"), std::string::npos) << r.out;
  r = pax("--version");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.rfind("pax (parallax ", 0), 0u) << r.out;
}

// The train loss logged at a summary is the mean over the steps since the last one (the console's
// "mean"), with the last step's as loss_last.
TEST(PaxCli, TheLoggedLossIsTheWindowMean) {
  const std::string every = job("mean_every"), pairs = job("mean_pairs");
  const std::string args = kSmall + " --set train.steps=4 --set train.eval_interval=0";
  ASSERT_EQ(pax("train" + args + " --set train.summary_interval=1 --job_log_dir=" + every).rc, 0);
  ASSERT_EQ(pax("train" + args + " --set train.summary_interval=2 --job_log_dir=" + pairs).rc, 0);
  auto a = metrics(every, "train"), b = metrics(pairs, "train");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const double l1 = a[2 * i]["loss"], l2 = a[2 * i + 1]["loss"];
    EXPECT_NEAR(b[i]["loss"].get<double>(), (l1 + l2) / 2, 1e-6) << "step " << b[i]["step"];
    EXPECT_EQ(b[i]["loss_last"].get<double>(), l2);
  }
}

// tokens/s, steps/s and MFU leave out the time of evals (and checkpoint saves): with an eval that
// takes far longer than the steps, the rate logged is far above the steps over the wall time.
TEST(PaxCli, ThroughputLeavesOutTheEvalTime) {
  const std::string d = job("rate");
  Result r = pax("train" + kSmall +
                 " --set data.copy_eval_batches=2000 --set train.steps=6 --set train.eval_interval=2"
                 " --set train.summary_interval=2 --set train.checkpoint_interval=0 --job_log_dir=" +
                 d);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto m = metrics(d, "train");
  ASSERT_EQ(m.size(), 3u);
  for (size_t i = 1; i < m.size(); ++i) {  // the windows after an eval (of 2000 batches, against 2 steps)
    const double wall = m[i]["wall_time"].get<double>() - m[i - 1]["wall_time"].get<double>();
    EXPECT_GT(m[i]["steps_per_sec"].get<double>(), 3 * 2 / wall) << "step " << m[i]["step"] << ": " << r.out;
    EXPECT_NEAR(m[i]["tokens_per_sec"].get<double>(), m[i]["steps_per_sec"].get<double>() * 4 * 16, 1e-6 * 64e6);
  }
}

// A diverging run stops at the first NaN or infinite loss, with an error and without saving that
// step; train.on_nonfinite=skip leaves such updates out; =continue trains on, saying so once.
TEST(PaxCli, ANonFiniteLossStopsTheRun) {
  const std::string diverge = kSmall +
                              " --set optimizer.name=sgd --set optimizer.lr=10 --set optimizer.clip_norm=0"
                              " --set model.init_std=10 --set schedule.warmup_steps=0 --set train.steps=30"
                              " --set train.checkpoint_interval=1 --set train.eval_interval=0";
  const std::string d = job("nan");
  Result r = pax("train" + diverge + " --job_log_dir=" + d);
  EXPECT_EQ(r.rc, 2) << r.out;
  const size_t at = r.out.find("pax: error: [pax] step ");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_NE(r.out.find("train.on_nonfinite=stop"), std::string::npos) << r.out;
  const int64_t step = std::stoll(r.out.substr(at + std::strlen("pax: error: [pax] step ")));
  EXPECT_FALSE(fs::exists(d + "/checkpoints/checkpoint_" + std::string(8 - std::to_string(step).size(), '0') +
                          std::to_string(step)));
  // skip: the bad updates are not applied; a run that only diverges further stops after 100 in a row.
  const std::string skip = job("nan_skip");
  Result s = pax("train" + diverge + " --set train.on_nonfinite=skip --job_log_dir=" + skip);
  EXPECT_EQ(s.rc, 2) << s.out;
  EXPECT_NE(s.out.find("update skipped (train.on_nonfinite=skip)"), std::string::npos) << s.out;
  EXPECT_NE(s.out.find("100 updates in a row skipped"), std::string::npos) << s.out;
  for (const auto& m : metrics(skip, "train"))  // NaN would be written as null
    EXPECT_TRUE(m["loss"].is_number() && std::isfinite(m["loss"].get<double>())) << m.dump();
  Result c =
      pax("train" + diverge +
          " --set train.on_nonfinite=continue --set train.checkpoint_interval=0 --job_log_dir=" + job("nan_continue"));
  EXPECT_EQ(c.rc, 0) << c.out;
  EXPECT_NE(c.out.find("training on (train.on_nonfinite=continue)"), std::string::npos) << c.out;
}

// After a resume, the event files hold each step once: the steps a killed run wrote past its last
// checkpoint are dropped, and TensorBoard shows the values of metrics.jsonl.
TEST(PaxCli, TensorBoardHoldsEachStepOnceAfterAResume) {
  const std::string d = job("tb_resume");
  const std::string args = kSmall +
                           " --set train.steps=6 --set train.summary_interval=1 --set train.eval_interval=1"
                           " --set train.checkpoint_interval=3 --job_log_dir=" +
                           d;
  ASSERT_EQ(pax("train" + args).rc, 0);
  // As if the run had been killed after step 6's summaries and before its checkpoint was committed.
  fs::remove_all(d + "/checkpoints/checkpoint_00000006");
  Result r = pax("train" + args);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("resumed at step 3"), std::string::npos) << r.out;
  const std::string script = ::testing::TempDir() + "/pax_read_raw_events.py";
  std::ofstream(script) << R"(import collections, glob, json, sys
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out = {}
for split in ("train", "eval_test"):
    seen = collections.Counter()
    for f in sorted(glob.glob(sys.argv[1] + "/summaries/" + split + "/events.out.tfevents.*")):
        for e in EventFileLoader(f).Load():
            for v in e.summary.value:
                seen[(v.tag, e.step)] += 1
    ea = EventAccumulator(sys.argv[1] + "/summaries/" + split)
    ea.Reload()
    out[split] = {"most": max(seen.values()), "loss": [[e.step, e.value] for e in ea.Scalars("loss")]}
print(json.dumps(out))
)";
  const char* env = std::getenv("PX_TEST_PYTHON");
  const std::string python = env && *env ? px::testing::test_python() : PX_VENV_PYTHON;
  FILE* p = popen((python + " " + script + " " + d + " 2>/dev/null").c_str(), "r");
  std::string text;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
  ASSERT_EQ(pclose(p), 0) << "the tensorboard package is missing: run scripts/setup_test_venv.sh";
  auto tb = nlohmann::json::parse(text);
  for (const char* split : {"train", "eval_test"}) {
    EXPECT_EQ(tb[split]["most"], 1) << split << ": a (tag, step) written twice";
    auto m = metrics(d, split);
    ASSERT_EQ(m.size(), 6u) << split;
    ASSERT_EQ(tb[split]["loss"].size(), 6u) << split;
    for (size_t i = 0; i < 6; ++i) {
      EXPECT_EQ(tb[split]["loss"][i][0], m[i]["step"]);
      EXPECT_NEAR(tb[split]["loss"][i][1].get<double>(), m[i]["loss"].get<double>(), 1e-6);
    }
  }
}

// Text data says what it prepares (tokenizer training and tokenization take a while on a real
// corpus) and that it reads the caches on a rerun; greedy decode echoes the prompt and, where the
// model ends the sentence, says it stopped at the end-of-text token and counts only what it made.
TEST(PaxCli, TextDataSaysWhatItPreparesAndDecodeStopsAtTheEndOfText) {
  const std::string corpus = ::testing::TempDir() + "/pax_e2e_corpus_" + std::to_string(getpid()) + ".txt";
  write_sentences(corpus, 2000);
  const std::string d = job("text");
  const std::string args = " --exp=copy.TransformerLmTiny --set data.kind=text --set data.paths=" + corpus +
                           " --set model.vocab_size=315 --set model.d_model=32 --set model.d_ff=64"
                           " --set model.n_layers=1 --set model.seq_len=32 --set data.batch=8 --set train.steps=200"
                           " --set train.summary_interval=50 --set train.eval_interval=0"
                           " --set train.checkpoint_interval=0 --set optimizer.lr=0.02 --set schedule.warmup_steps=10"
                           " --job_log_dir=" +
                           d;
  Result t = pax("train" + args);
  ASSERT_EQ(t.rc, 0) << t.out;
  EXPECT_NE(t.out.find("data: preparing 1 path"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("data: 2000 documents"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("tokenizer trained in"), std::string::npos) << t.out;
  Result again = pax("train" + args);
  ASSERT_EQ(again.rc, 0) << again.out;
  EXPECT_NE(again.out.find("tokenizer read, text read from the token cache"), std::string::npos) << again.out;

  int stopped = 0;
  for (const char* prompt : {"the cat", "my friend", "a dog"}) {
    Result r = pax("decode --job_log_dir=" + d + " --prompt '" + prompt + "'");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find(std::string("\n") + prompt), std::string::npos) << "the prompt, echoed: " << r.out;
    const size_t at = r.out.find("prompt tokens, ");
    ASSERT_NE(at, std::string::npos) << r.out;
    const int made = std::stoi(r.out.substr(at + std::strlen("prompt tokens, ")));
    if (r.out.find("new tokens (stopped at the end-of-text token)") != std::string::npos) {
      ++stopped;
      EXPECT_LT(made, 32) << r.out;
    }
  }
  EXPECT_GE(stopped, 1) << "a model trained on short sentences ends some of them";

  // export --format=hf writes the tokenizer's special ids (transformers' generate() stops at the
  // EOS), in the dtype asked for and in shards of at most --max_shard_size.
  const std::string hf = job("text_hf");
  Result x = pax("export --job_log_dir=" + d + " --dtype bf16 --max_shard_size 20KB --out " + hf);
  ASSERT_EQ(x.rc, 0) << x.out;
  auto json_of = [](const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); };
  const nlohmann::json cfg = json_of(hf + "/config.json"), gen = json_of(hf + "/generation_config.json");
  ASSERT_TRUE(cfg["eos_token_id"].is_number_integer()) << cfg.dump();
  EXPECT_GE(cfg["eos_token_id"].get<int>(), 0) << cfg.dump();
  EXPECT_EQ(gen["eos_token_id"], cfg["eos_token_id"]) << gen.dump();
  EXPECT_EQ(gen["bos_token_id"], cfg["bos_token_id"]) << gen.dump();
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16") << cfg.dump();
  EXPECT_FALSE(fs::exists(hf + "/model.safetensors"));
  const nlohmann::json index = json_of(hf + "/model.safetensors.index.json");
  std::set<std::string> shards;
  for (auto& [name, file] : index["weight_map"].items()) shards.insert(file.get<std::string>());
  EXPECT_GE(shards.size(), 2u) << index.dump();
  for (const std::string& f : shards) {
    EXPECT_LE(fs::file_size(hf + "/" + f), 20000u + 21000u) << f;  // a tensor over the limit gets a shard alone
    for (const px::Array& a : px::load_safetensors(hf + "/" + f).arrays) EXPECT_EQ(a.dtype(), px::DType::bf16) << f;
  }
  // The export decodes (the prompt as ids: a run's tokenizer files are not copied).
  Result from_hf = pax("decode --hf_model=" + hf + " --prompt '5 6 7' --max_new_tokens 4");
  EXPECT_EQ(from_hf.rc, 0) << from_hf.out;
  for (const char* bad : {"--dtype f64", "--max_shard_size lots", "--max_shard_size -5"}) {
    Result e = pax("export --job_log_dir=" + d + " " + bad + " --out " + hf);
    EXPECT_EQ(e.rc, 2) << bad << ": " << e.out;
    EXPECT_NE(e.out.find("pax: error:"), std::string::npos) << e.out;
  }
  fs::remove(corpus);
}

// The trained tokenizer and the token cache live in a shared cache ($XDG_CACHE_HOME/parallax/data)
// named by what determines them: a second job dir on the same corpus reads them, a changed corpus
// gets its own, a damaged file is rebuilt, data.cache_dir puts them elsewhere, and no temporary
// file is left behind.
TEST(PaxCli, TextCachesAreSharedBetweenJobDirsAndKeyedByTheCorpus) {
  const std::string corpus = ::testing::TempDir() + "/pax_e2e_shared_" + std::to_string(getpid()) + ".txt";
  write_sentences(corpus, 2000);
  const std::string shared = kXdgCache + "/parallax/data";
  auto run = [&](const std::string& name, const std::string& extra = "") {
    return pax("train --exp=copy.TransformerLmTiny --set data.kind=text --set data.paths=" + corpus +
               " --set model.vocab_size=315 --set model.d_model=32 --set model.d_ff=64 --set model.n_layers=1"
               " --set model.seq_len=32 --set data.batch=4 --set train.steps=2 --set schedule.warmup_steps=1"
               " --set train.eval_interval=0 --set train.eval_batches=1" +
               extra + " --job_log_dir=" + job(name));
  };
  auto files = [](const std::string& dir, const std::string& prefix) {
    std::vector<std::string> out;
    for (auto& e : fs::directory_iterator(dir, ec_ignore()))
      if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
    return out;
  };
  Result a = run("shared_a");
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_NE(a.out.find("read from the cache " + shared), std::string::npos) << a.out;
  EXPECT_NE(a.out.find("tokenizer trained in"), std::string::npos) << a.out;
  const std::string dir_a = ::testing::TempDir() + "/pax_e2e_" + std::to_string(::getpid()) + "_shared_a";
  EXPECT_TRUE(fs::exists(dir_a + "/config.toml"));
  EXPECT_FALSE(fs::exists(dir_a + "/data")) << "the caches are not in the job dir";
  const size_t models = files(shared, "spm-").size(), token_files = files(shared, "tokens-").size();
  EXPECT_GE(models, 1u);
  EXPECT_GE(token_files, 1u);

  Result b = run("shared_b");  // another job dir, the same data: nothing prepared again
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("tokenizer read, text read from the token cache"), std::string::npos) << b.out;
  EXPECT_EQ(files(shared, "spm-").size(), models);

  {  // a changed corpus (size and mtime) is not the cached one
    std::ofstream(corpus, std::ios::app) << "the cat sees a dog.\n\n";
  }
  Result c = run("shared_c");
  ASSERT_EQ(c.rc, 0) << c.out;
  EXPECT_NE(c.out.find("tokenizer trained in"), std::string::npos) << c.out;
  EXPECT_EQ(files(shared, "spm-").size(), models + 1);

  // Damaged files are validated on read and rebuilt.
  for (const std::string& f : files(shared, "tokens-")) std::ofstream(f, std::ios::trunc) << "not a token cache";
  Result d = run("shared_d");
  ASSERT_EQ(d.rc, 0) << d.out;
  EXPECT_NE(d.out.find("tokenizer read, text tokenized in"), std::string::npos) << d.out;
  for (const std::string& f : files(shared, "spm-")) std::ofstream(f, std::ios::trunc) << "not a model";
  Result e = run("shared_e");
  ASSERT_EQ(e.rc, 0) << e.out;
  EXPECT_NE(e.out.find("tokenizer trained in"), std::string::npos) << e.out;
  EXPECT_TRUE(files(shared, "").size() == files(shared, "spm-").size() + files(shared, "tokens-").size())
      << "only models and token files, no temporary file left";

  const std::string own = job("shared_own_cache");
  Result o = run("shared_f", " --set data.cache_dir=" + own);
  ASSERT_EQ(o.rc, 0) << o.out;
  EXPECT_NE(o.out.find("read from the cache " + own), std::string::npos) << o.out;
  EXPECT_EQ(files(own, "spm-").size(), 1u);
  EXPECT_EQ(files(own, "tokens-").size(), 1u);
  fs::remove(corpus);
}

// A signal while the data is prepared (a tokenizer trained on a corpus: seconds here, minutes on a
// real one) ends the run when the preparation is done, before anything is trained or saved.
TEST(PaxCli, ASignalDuringDataPreparationStopsBeforeTheFirstStep) {
  const std::string corpus = ::testing::TempDir() + "/pax_e2e_big_" + std::to_string(getpid()) + ".txt";
  {
    const char* words[] = {"the", "cat", "a", "dog", "my", "friend", "old", "man", "small", "bird", "teacher",
                           "sees", "likes", "finds", "eats", "reads", "ball", "book", "bread", "red", "apple"};
    std::ofstream f(corpus);
    uint32_t x = 7;
    for (int i = 0; i < 100000; ++i) {
      for (int w = 0; w < 12; ++w) f << (w ? " " : "") << words[(x = x * 1103515245u + 12345u) / 65536u % 21];
      f << ".\n\n";
    }
  }
  const std::string d = job("prep"), log = ::testing::TempDir() + "/pax_e2e_prep_" + std::to_string(getpid()) + ".log";
  pid_t pid = start_pax("train --exp=copy.TransformerLmTiny --set data.kind=text --set data.paths=" + corpus +
                            " --set model.vocab_size=300 --set model.d_model=32 --set model.d_ff=64"
                            " --set model.n_layers=1 --set model.seq_len=32 --job_log_dir=" + d,
                        log);
  ASSERT_TRUE(wait_until([&] { return read_text(log).find("data: preparing") != std::string::npos; }))
      << read_text(log);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  const int st = wait_status(pid);
  const std::string out = read_text(log);
  ASSERT_TRUE(WIFEXITED(st)) << "status " << st << ": " << out;
  EXPECT_EQ(WEXITSTATUS(st), 143) << out;
  EXPECT_NE(out.find("stopped by SIGTERM before the first step (nothing trained)"), std::string::npos) << out;
  EXPECT_TRUE(fs::is_empty(d + "/checkpoints")) << out;
  fs::remove(corpus);
}

}  // namespace
