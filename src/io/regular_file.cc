#include "io/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "parallax/core.h"

namespace px::io {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

[[noreturn]] void refuse(const std::string& path, const std::string& prefix, const std::string& kind) {
  throw UserError(prefix + "'" + path + "' is " + kind +
                  ", not a regular file; give a regular file (a pipe, device or directory cannot be read as one)");
}

}  // namespace

std::string non_regular_kind(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "";
  return kind_of(st.st_mode);
}

void require_regular_file(const std::string& path, const std::string& prefix) {
  const std::string kind = non_regular_kind(path);
  if (!kind.empty()) refuse(path, prefix, kind);
}

void require_directory(const std::string& path, const std::string& prefix, bool must_exist) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (must_exist)
      throw UserError(prefix + "'" + path + "' does not exist; give an existing directory");
    return;
  }
  if (S_ISDIR(st.st_mode)) return;
  const std::string kind = S_ISREG(st.st_mode) ? "a regular file" : kind_of(st.st_mode);
  throw UserError(prefix + "'" + path + "' is " + kind + ", not a directory; give a directory" +
                  (must_exist ? "" : " (made when missing)"));
}

int open_for_reading(const std::string& path, const std::string& prefix) {
  // O_NONBLOCK makes open return at once on a FIFO without a writer; for regular files it changes nothing.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    refuse(path, prefix, kind_of(st.st_mode));
  }
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

}  // namespace px::io
