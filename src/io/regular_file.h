// Opening user files for reading without hanging or misreading: a FIFO opened for reading waits
// for a writer (forever, for a stray named pipe), and a directory, device or socket is no file of
// data. Every reader of user files in src/data, src/text, src/io and src/checkpoint checks here.
//
//   px::io::require_regular_file(path, "[data] ");       // before std::ifstream, gzopen, a library's Load
//   int fd = px::io::open_for_reading(path, "[checkpoint] ");  // instead of open(path, O_RDONLY)
#pragma once

#include <string>

namespace px::io {

// "" when `path` is a regular file (symlinks followed) or does not exist (the caller reports a
// missing file in its own words); else what it is: "a FIFO (named pipe)", "a directory", ...
std::string non_regular_kind(const std::string& path);

// Throws px::UserError("<prefix>'<path>' is a FIFO (named pipe), not a regular file; ...") when
// `path` exists and is not a regular file.
void require_regular_file(const std::string& path, const std::string& prefix);

// Throws px::UserError("<prefix>'<path>' is a regular file, not a directory; ...") when `path`
// exists and is not a directory (symlinks followed); `must_exist` also refuses a missing path.
void require_directory(const std::string& path, const std::string& prefix, bool must_exist = false);

// open(path, O_RDONLY | O_CLOEXEC) that never blocks: a FIFO is opened non-blocking, found by
// fstat and refused (px::UserError as above, the descriptor closed). Returns -1 with errno set
// when open itself fails.
int open_for_reading(const std::string& path, const std::string& prefix);

}  // namespace px::io
