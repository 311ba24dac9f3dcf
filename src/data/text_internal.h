// Internals of the text data pipeline shared by its files and tests.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace px::data {

// The files that `paths` name, in reading order ("gcide" stays as itself).
std::vector<std::filesystem::path> expand_paths(const std::vector<std::string>& paths);
// Appends the documents of one file until `out` holds `max_documents` (0: no limit).
void read_file_documents(const std::filesystem::path& file, std::vector<std::string>& out, int64_t max_documents);
// One GCIDE dictd entry as plain text: markup stripped, one paragraph per line.
std::string gcide_entry_text(std::string_view block);

}  // namespace px::data
