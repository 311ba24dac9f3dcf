// PX_DUMP=DIR: every compiler pass writes its result as text, numbered in the order the passes
// ran, so a reader can follow one program through the pipeline (like XLA's dump flags).
//
//   dump_pass("partition", [&] { return program.summary(); });   // DIR/0007_partition.txt
#pragma once

#include <functional>
#include <string>

namespace px {

bool dumping();  // PX_DUMP is set
// Writes text() to DIR/<counter>_<pass>.txt when PX_DUMP is set (text() is not called otherwise).
void dump_pass(const std::string& pass, const std::function<std::string()>& text);

}  // namespace px
