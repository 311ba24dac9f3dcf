#include "core/dump.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "core/env.h"
#include "core/log.h"

namespace px {
namespace {

// One pipeline at a time is the common case; the state is process-wide (AUTO may plan candidates
// on other threads) and guarded.
struct DumpState {
  std::mutex mu;
  std::string program = "program";
  int counter = 0;                  // passes of the current program so far
  int candidates = 0;               // depth of DumpCandidates scopes
  int candidate_counter = 0;        // candidate passes so far
  std::map<std::string, int> seen;  // programs of each name so far
};

DumpState& state() {
  static DumpState s;
  return s;
}

// Read each time, not from env()'s first reading: a program may turn it on between two steps.
bool dump_candidates() { return env_now("PX_DUMP_CANDIDATES").dump_candidates; }

}  // namespace

bool dumping() { return !env().dump_dir.empty(); }

void dump_pass(const std::string& pass, const std::function<std::string()>& text) {
  if (!dumping()) return;
  DumpState& s = state();
  std::string path;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    char number[16];
    if (s.candidates > 0) {
      if (!dump_candidates()) return;
      std::snprintf(number, sizeof number, "%04d", s.candidate_counter++);
      std::error_code ec;
      std::filesystem::create_directories(env().dump_dir + "/candidates", ec);
      path = env().dump_dir + "/candidates/" + s.program + "." + number + "." + pass + ".txt";
    } else {
      std::snprintf(number, sizeof number, "%02d", s.counter++);
      std::error_code ec;
      std::filesystem::create_directories(env().dump_dir, ec);  // made as the candidates' folder is
      path = env().dump_dir + "/" + s.program + "." + number + "." + pass + ".txt";
    }
  }
  std::ofstream f(path);
  if (!f) {
    PX_LOG(warn) << "PX_DUMP: cannot write " << path << " (is PX_DUMP a folder this process may write in?)";
    return;
  }
  f << "# pass: " << pass << "\n" << text();
}

DumpProgram::DumpProgram(const std::string& name) {
  DumpState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  prev_name_ = s.program;
  prev_counter_ = s.counter;
  const int n = ++s.seen[name];
  s.program = n == 1 ? name : name + "_" + std::to_string(n);
  s.counter = 0;
}

DumpProgram::~DumpProgram() {
  DumpState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.program = prev_name_;
  s.counter = prev_counter_;
}

DumpCandidates::DumpCandidates() {
  std::lock_guard<std::mutex> lock(state().mu);
  ++state().candidates;
}

DumpCandidates::~DumpCandidates() {
  std::lock_guard<std::mutex> lock(state().mu);
  --state().candidates;
}

}  // namespace px
