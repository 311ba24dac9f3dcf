// Loading a Hugging Face checkpoint: writes a random Llama-shaped checkpoint (bf16, ~1B params by
// default, streamed to disk tensor by tensor), then times `cat file > /dev/null` and
// px::nn::load_pretrained on the same bytes in the same run (both from the page cache after the
// write), and load_pretrained_slices reading every param as 4 boxes (FSDP on 4 devices). MB/s
// counts the file's bytes.
//   ./build/bench/load_pretrained [--quick] [--dir=PATH]   (default dir: /tmp/px_load_bench)
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "bench_util.h"
#include "parallax/nn/pretrained.h"

using namespace px;
namespace fs = std::filesystem;

namespace {

// Writes model.safetensors with the given (name, shape) tensors as random bf16, one at a time.
uint64_t write_checkpoint(const std::string& path, const std::vector<std::pair<std::string, Shape>>& tensors) {
  nlohmann::ordered_json header;
  uint64_t off = 0;
  for (auto& [name, shape] : tensors) {
    uint64_t n = 2;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  std::ofstream out(path, std::ios::binary);
  uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  std::mt19937 rng(0);
  std::vector<uint16_t> buf;
  for (auto& [name, shape] : tensors) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    buf.resize(static_cast<size_t>(n));
    // bf16 values in about [-0.06, 0.06]: random mantissa, fixed small exponent, random sign.
    for (auto& v : buf) {
      uint32_t r = rng();
      v = static_cast<uint16_t>((r & 0x8000u) | (0x3D00u + (r & 0x7Fu)));
    }
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(n * 2));
  }
  out.close();
  return 8 + len + off;
}

double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::string dir = "/tmp/px_load_bench";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick")
      quick = true;
    else if (a.rfind("--dir=", 0) == 0)
      dir = a.substr(6);
    else {
      std::fprintf(stderr, "unknown flag %s (flags: --quick --dir=PATH)\n", a.c_str());
      return 2;
    }
  }
  // ~1.0B params: vocab 32000, d 2048, 16 heads (8 kv), 18 layers, ff 5632 (untied head).
  nn::LmConfig c = nn::llama_config("llama_1b", 32000, 2048, 16, 8, quick ? 2 : 18, 5632, 2048);
  fs::create_directories(dir);
  {
    nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                          {"model_type", "llama"},
                          {"vocab_size", c.vocab_size},
                          {"hidden_size", c.d_model},
                          {"intermediate_size", c.d_ff},
                          {"num_hidden_layers", c.n_layers},
                          {"num_attention_heads", c.n_heads},
                          {"num_key_value_heads", c.kv_heads()},
                          {"max_position_embeddings", c.max_seq_len},
                          {"rms_norm_eps", 1e-5},
                          {"rope_theta", 500000.0},
                          {"tie_word_embeddings", false},
                          {"torch_dtype", "bfloat16"}};
    std::ofstream(dir + "/config.json") << cfg.dump(2);
  }
  std::vector<std::pair<std::string, Shape>> tensors{{"model.embed_tokens.weight", {c.vocab_size, c.d_model}}};
  const int64_t kv = c.kv_heads() * c.head_dim();
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    tensors.push_back({p + "input_layernorm.weight", {c.d_model}});
    tensors.push_back({p + "self_attn.q_proj.weight", {c.d_model, c.d_model}});
    tensors.push_back({p + "self_attn.k_proj.weight", {kv, c.d_model}});
    tensors.push_back({p + "self_attn.v_proj.weight", {kv, c.d_model}});
    tensors.push_back({p + "self_attn.o_proj.weight", {c.d_model, c.d_model}});
    tensors.push_back({p + "post_attention_layernorm.weight", {c.d_model}});
    tensors.push_back({p + "mlp.gate_proj.weight", {c.d_ff, c.d_model}});
    tensors.push_back({p + "mlp.up_proj.weight", {c.d_ff, c.d_model}});
    tensors.push_back({p + "mlp.down_proj.weight", {c.d_model, c.d_ff}});
  }
  tensors.push_back({"model.norm.weight", {c.d_model}});
  tensors.push_back({"lm_head.weight", {c.vocab_size, c.d_model}});
  const std::string file = dir + "/model.safetensors";
  double write_s = 0;
  uint64_t bytes = 0;
  write_s = seconds_of([&] { bytes = write_checkpoint(file, tensors); });
  const double mb = static_cast<double>(bytes) / 1e6;

  const double cat_s = seconds_of([&] {
    if (std::system(("cat '" + file + "' > /dev/null").c_str()) != 0) std::fprintf(stderr, "cat failed\n");
  });
  int64_t params = 0;
  const double load_s = seconds_of([&] {
    nn::Pretrained p = nn::load_pretrained(dir);
    params = p.model->store().param_count();
  });
  // Sliced, as into FSDP on 4 devices: each param read as 4 boxes along its first dim, each box
  // converted straight into its own array (dropped at once: the read is what is timed).
  const std::vector<TensorType> types = nn::TransformerLm(nn::read_pretrained_config(dir)).store().types();
  const double sliced_s = seconds_of([&] {
    nn::load_pretrained_slices(dir, [&](int i, const BoxReader& read) {
      const Shape& shape = types[static_cast<size_t>(i)].shape;
      const int64_t n = shape[0] % 4 == 0 ? 4 : 1;
      Shape box = shape;
      box[0] /= n;
      for (int64_t k = 0; k < n; ++k) {
        std::vector<int64_t> off(shape.size(), 0);
        off[0] = k * box[0];
        Array a(DType::f32, box);
        read(off, a);
      }
    });
  });
  bench::Json()
      .s("bench", "load_pretrained")
      .i("params", params)
      .s("dtype", "bf16 -> f32")
      .n("file_mb", mb)
      .n("write_s", write_s)
      .n("cat_s", cat_s)
      .n("cat_mb_s", mb / cat_s)
      .n("load_s", load_s)
      .n("load_mb_s", mb / load_s)
      .n("load_vs_cat", cat_s / load_s)
      .n("sliced_load_s", sliced_s)
      .n("sliced_mb_s", mb / sliced_s)
      .i("threads", bench::threads())
      .print();
  fs::remove_all(dir);
  return 0;
}
