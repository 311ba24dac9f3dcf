// Durable file-system steps for checkpoints (internal): every write is fsync'd, directories too,
// so that a rename or a commit marker is never seen before the data it covers.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace px::ckpt_fs {

// Creates (or truncates) path, writes the bytes and closes it; with `sync`, fsyncs it first,
// else starts its write-back (for a later fsync_all). Throws px::Error naming the file.
void write_file(const std::string& path, const void* data, size_t n, bool sync = true);
inline void write_file(const std::string& path, const std::string& text, bool sync = true) {
  write_file(path, text.data(), text.size(), sync);
}
// fsyncs every file and directory, several at once: the file system then commits them together
// (one fsync at a time costs a journal commit each, ~10 ms on a virtual disk).
void fsync_all(const std::vector<std::string>& paths);
// The whole file; throws px::Error naming it when it cannot be read.
std::string read_file(const std::string& path);
// The same into `out` (resized; reusing its capacity saves an allocation per chunk).
void read_file(const std::string& path, std::vector<char>& out);
bool exists(const std::string& path);
bool is_dir(const std::string& path);
// mkdir; an existing directory is fine. Throws px::Error on other failures.
void make_dir(const std::string& path);
void fsync_dir(const std::string& path);
void rename(const std::string& from, const std::string& to);
// Swaps two paths in one step (renameat2 RENAME_EXCHANGE; by three renames where the file
// system lacks it).
void exchange(const std::string& a, const std::string& b);
// The names in a directory (not "." or ".."); empty when it does not exist.
std::vector<std::string> list_dir(const std::string& path);
// Deletes a file or a directory tree; a missing path is fine.
void remove_tree(const std::string& path);

// Runs fn(i, worker) for i in [0, n) on up to `threads` threads (the caller's one of them; worker
// in [0, threads) indexes per-thread scratch). After all have stopped, rethrows the first exception.
void parallel_for(size_t n, int threads, const std::function<void(size_t i, int worker)>& fn);

}  // namespace px::ckpt_fs
