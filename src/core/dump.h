// PX_DUMP=DIR: every compiler pass writes its result as text, numbered in pipeline order and named
// after the program it belongs to, so a reader can follow one program through the pipeline (like
// XLA's dump flags):
//
//   DumpProgram scope("train_step");                              // the program being compiled
//   dump_pass("partition", [&] { return program.summary(); });    // DIR/train_step.04.partition.txt
//
// Passes run on candidates (the plans AUTO or remat `auto` cost, the settings an over-limit error
// lists) run inside a DumpCandidates scope: they are written to DIR/candidates/ and only with
// PX_DUMP_CANDIDATES=1, so that the real pipeline is not buried among them.
#pragma once

#include <functional>
#include <string>

namespace px {

bool dumping();  // PX_DUMP is set
// Writes text() to DIR/<program>.<NN>.<pass>.txt when PX_DUMP is set (text() is not called otherwise).
void dump_pass(const std::string& pass, const std::function<std::string()>& text);

// The program the passes run in this scope belong to (outside any: "program"). A second program
// of the same name in one process is "<name>_2", and so on. Scopes nest; the innermost names.
class DumpProgram {
 public:
  explicit DumpProgram(const std::string& name);
  ~DumpProgram();
  DumpProgram(const DumpProgram&) = delete;
  DumpProgram& operator=(const DumpProgram&) = delete;

 private:
  std::string prev_name_;
  int prev_counter_ = 0;
};

// Passes in this scope plan a candidate, not the program: DIR/candidates/, with PX_DUMP_CANDIDATES=1.
class DumpCandidates {
 public:
  DumpCandidates();
  ~DumpCandidates();
  DumpCandidates(const DumpCandidates&) = delete;
  DumpCandidates& operator=(const DumpCandidates&) = delete;
};

}  // namespace px
