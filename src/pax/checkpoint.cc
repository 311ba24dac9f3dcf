#include "pax/checkpoint.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "parallax/io.h"

namespace fs = std::filesystem;

namespace px::pax {

Checkpoints::Checkpoints(std::string job_dir, int64_t keep) : dir_(std::move(job_dir) + "/checkpoints"), keep_(keep) {}

std::string Checkpoints::path(int64_t step) const {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint_%08lld", static_cast<long long>(step));
  return dir_ + "/" + name;
}

std::vector<Array> Checkpoints::params(std::optional<int64_t>& step, const nn::TransformerLm& model) const {
  if (!step) step = latest();
  if (!step) throw Error("[pax] no checkpoint in '" + dir_ + "'; run 'pax train' first");
  const std::string file = path(*step) + "/state.safetensors";
  if (!std::filesystem::exists(file))
    throw Error("[pax] no checkpoint at step " + std::to_string(*step) + " ('" + file + "')");
  SafetensorsFile f = load_safetensors(file);
  std::vector<Array> out;
  for (const nn::ParamSpec& p : model.store().specs()) {
    if (!f.contains(p.path))
      throw Error("[pax] checkpoint '" + file + "' has no param '" + p.path + "' (a different model?)");
    const Array& a = f.get(p.path);
    if (a.type() != p.type)
      throw Error("[pax] checkpoint param '" + p.path + "' is " + type_str(a.type()) + " but the model wants " +
                  type_str(p.type));
    out.push_back(a);
  }
  return out;
}

void Checkpoints::save(int64_t step, const StepRunner& runner, const std::string& data_state) {
  const std::string final_dir = path(step), tmp = final_dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw Error("[pax] cannot create checkpoint folder '" + tmp + "': " + ec.message());
  runner.save(tmp + "/state.safetensors");
  {
    std::ofstream f(tmp + "/meta.json");
    f << nlohmann::json{{"step", step}, {"data_state", data_state}, {"format", "train_step_safetensors"}}.dump(2)
      << "\n";
    if (!f) throw Error("[pax] cannot write '" + tmp + "/meta.json'");
  }
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) throw Error("[pax] cannot commit checkpoint '" + final_dir + "': " + ec.message());
  std::vector<int64_t> all = steps();
  for (size_t i = 0; i + keep_ < all.size(); ++i) fs::remove_all(path(all[i]), ec);
}

std::vector<int64_t> Checkpoints::steps() const {
  std::vector<int64_t> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("checkpoint_", 0) != 0 || name.size() != 19) continue;  // skips *.tmp
    if (!fs::exists(e.path() / "meta.json")) continue;
    try {
      out.push_back(std::stoll(name.substr(11)));
    } catch (...) {
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<int64_t> Checkpoints::latest() const {
  std::vector<int64_t> s = steps();
  if (s.empty()) return std::nullopt;
  return s.back();
}

std::string Checkpoints::restore(int64_t step, StepRunner& runner) const {
  const std::string d = path(step);
  std::ifstream f(d + "/meta.json");
  if (!f) throw Error("[pax] no checkpoint at step " + std::to_string(step) + " ('" + d + "/meta.json' is missing)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    throw Error("[pax] '" + d + "/meta.json' is not valid JSON: " + e.what());
  }
  try {
    runner.load(d + "/state.safetensors");
  } catch (const Error& e) {
    throw Error("[pax] cannot restore '" + d + "' (a different model or optimizer?): " + e.what());
  }
  return meta.value("data_state", std::string());
}

}  // namespace px::pax
