#include "checkpoint/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "io/regular_file.h"
#include "parallax/core.h"

namespace px::ckpt_fs {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("[checkpoint] " + path + ": " + what + ": " + std::strerror(errno));
}

}  // namespace

void write_file(const std::string& path, const void* data, size_t n, bool sync) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot create");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::close(fd);
      errno = e;
      fail(path, "write failed");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  if (!sync) {
    (void)::sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);  // only a head start for the fsync
  } else if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    fail(path, "fsync failed");
  }
  if (::close(fd) != 0) fail(path, "close failed");
}

void fsync_all(const std::vector<std::string>& paths) {
  parallel_for(paths.size(), 16, [&](size_t i, int) {
    int fd = ::open(paths[i].c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(paths[i], "cannot open for fsync");
    if (::fsync(fd) != 0) {
      int e = errno;
      ::close(fd);
      errno = e;
      fail(paths[i], "fsync failed");
    }
    ::close(fd);
  });
}

namespace {
// The whole file into `out` (a std::string or std::vector<char>), resized to what was read.
template <class Bytes>
void read_whole(const std::string& path, Bytes& out) {
  int fd = io::open_for_reading(path, "[checkpoint] ");
  if (fd < 0) fail(path, "cannot open");
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    fail(path, "cannot stat");
  }
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      ::close(fd);
      fail(path, "read failed");
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  out.resize(got);
}
}  // namespace

std::string read_file(const std::string& path) {
  std::string out;
  read_whole(path, out);
  return out;
}

void read_file(const std::string& path, std::vector<char>& out) { read_whole(path, out); }

void parallel_for(size_t n, int threads, const std::function<void(size_t, int)>& fn) {
  std::atomic<size_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&](int worker) {
    for (size_t i; !stop && (i = next++) < n;) {
      try {
        fn(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        stop = true;
      }
    }
  };
  int t = static_cast<int>(std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), n));
  std::vector<std::thread> pool;
  for (int w = 1; w < t; ++w) pool.emplace_back(work, w);
  work(0);
  for (std::thread& th : pool) th.join();
  if (error) std::rethrow_exception(error);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0) return;
  if (errno == EEXIST && is_dir(path)) return;
  if (errno == EEXIST) throw Error("[checkpoint] " + path + ": exists and is not a directory; move it away");
  fail(path, "cannot create directory");
}

void fsync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open directory");
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    fail(path, "fsync of directory failed");
  }
  ::close(fd);
}

void rename(const std::string& from, const std::string& to) {
  if (::rename(from.c_str(), to.c_str()) != 0) fail(from, "cannot rename to '" + to + "'");
}

void exchange(const std::string& a, const std::string& b) {
  if (::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0) return;
  // A file system without the exchange: b is moved aside first (a crash between the renames
  // leaves b's old content under b + ".replaced").
  if (errno != EINVAL && errno != ENOSYS) fail(a, "cannot exchange with '" + b + "'");
  const std::string aside = b + ".replaced";
  remove_tree(aside);
  rename(b, aside);
  rename(a, b);
  rename(aside, a);
}

std::vector<std::string> list_dir(const std::string& path) {
  std::vector<std::string> names;
  DIR* d = ::opendir(path.c_str());
  if (!d) return names;
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  return names;
}

void remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const std::string& n : list_dir(path)) remove_tree(path + "/" + n);
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) fail(path, "cannot remove directory");
  } else if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    fail(path, "cannot remove");
  }
}

}  // namespace px::ckpt_fs
