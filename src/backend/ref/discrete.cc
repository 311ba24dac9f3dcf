// The ref backend's discrete device memory (PX_REF_DISCRETE=1): each device buffer is its own
// mapping, inaccessible (PROT_NONE) except while a ref kernel or copy that names it runs. A host
// read or write of device memory anywhere else faults, as it would on an accelerator, and the
// fault handler names the buffer before the process aborts. This is how the paths that must not
// touch device memory from the host (checkpoints, the communicators, the run loop) are proven on
// a CPU: every test that runs on ref devices in this mode checks them.
//
// A buffer is opened by every kernel or copy that uses it and closed when the last one ends
// (counted, so devices running side by side may share one); pinned_host memory and host memory
// are never mapped here and are always open.
#include <execinfo.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/ref/ref.h"
#include "core/env.h"
#include "parallax/core.h"

namespace px::ref {

namespace {

struct Buffer {
  size_t bytes;    // mapped (whole pages)
  int opened = 0;  // kernels and copies using it now
};

std::mutex buffers_mutex;
std::map<uintptr_t, Buffer>& buffers() {
  static auto* b = new std::map<uintptr_t, Buffer>();  // never destroyed: freed during exit too
  return *b;
}

size_t page_rounded(int64_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (static_cast<size_t>(bytes) + page - 1) / page * page;
}

// The buffer that holds `p`; the lock is held. end() when none (host memory).
std::map<uintptr_t, Buffer>::iterator buffer_of(const void* p) {
  auto& b = buffers();
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = b.upper_bound(a);
  if (it == b.begin()) return b.end();
  --it;
  return a < it->first + it->second.bytes ? it : b.end();
}

void protect(uintptr_t start, const Buffer& b, int prot) {
  if (mprotect(reinterpret_cast<void*>(start), b.bytes, prot) != 0)
    throw Error(std::string("[ref] mprotect of a discrete device buffer failed: ") + std::strerror(errno));
}

struct sigaction previous_segv;

// A host access of a closed buffer: names it and what to use, then lets the fault end the process
// as it would have (the default action, or a handler that was there before).
void on_fault(int sig, siginfo_t* info, void* context) {
  char line[512];
  int n = 0;
  if (buffers_mutex.try_lock()) {
    auto it = buffer_of(info->si_addr);
    if (it != buffers().end())
      n = std::snprintf(line, sizeof line,
                        "[ref] the host touched device memory at %p, inside a %zu-byte device buffer of the ref "
                        "backend in discrete mode (PX_REF_DISCRETE=1): device memory is read and written "
                        "through the backend's copies (Array::to, Array::to_f32, px::copy_bytes), as on an "
                        "accelerator\n",
                        info->si_addr, it->second.bytes);
    buffers_mutex.unlock();
  }
  if (n > 0) {
    (void)!write(STDERR_FILENO, line, static_cast<size_t>(std::min<int>(n, sizeof line - 1)));
    void* frames[32];  // where: the code that reached into device memory
    backtrace_symbols_fd(frames, backtrace(frames, 32), STDERR_FILENO);
  }
  sigaction(SIGSEGV, &previous_segv, nullptr);
  if (previous_segv.sa_flags & SA_SIGINFO && previous_segv.sa_sigaction)
    previous_segv.sa_sigaction(sig, info, context);
  // Returning retries the access, which now faults under the previous (default) handler.
}

void install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &previous_segv);
  });
}

}  // namespace

bool discrete() { return env().ref_discrete; }

void* discrete_allocate(int64_t bytes) {
  install_fault_handler();
  const size_t n = page_rounded(bytes);
  void* p = mmap(nullptr, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  std::lock_guard<std::mutex> l(buffers_mutex);
  buffers()[reinterpret_cast<uintptr_t>(p)] = Buffer{n};
  return p;
}

void discrete_free(void* p) {
  size_t n = 0;
  {
    std::lock_guard<std::mutex> l(buffers_mutex);
    auto it = buffers().find(reinterpret_cast<uintptr_t>(p));
    if (it == buffers().end()) throw InternalError("[ref] freeing memory the discrete device did not allocate");
    n = it->second.bytes;
    buffers().erase(it);
  }
  munmap(p, n);
}

DeviceAccess::DeviceAccess(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) open(p);
}

DeviceAccess::DeviceAccess(const void* const* in, size_t n_in, const void* const* out, size_t n_out) {
  for (size_t i = 0; i < n_in; ++i) open(in[i]);
  for (size_t i = 0; i < n_out; ++i) open(out[i]);
}

void DeviceAccess::open(const void* p) {
  if (!p) return;
  std::lock_guard<std::mutex> l(buffers_mutex);
  auto it = buffer_of(p);
  if (it == buffers().end()) return;
  for (uintptr_t s : opened_)
    if (s == it->first) return;  // already opened by this access (an operand named twice)
  if (it->second.opened++ == 0) protect(it->first, it->second, PROT_READ | PROT_WRITE);
  opened_.push_back(it->first);
}

DeviceAccess::~DeviceAccess() {
  std::lock_guard<std::mutex> l(buffers_mutex);
  for (uintptr_t s : opened_) {
    auto it = buffers().find(s);
    // Not protect(): a destructor does not throw, and closing what was opened does not fail.
    if (it != buffers().end() && --it->second.opened == 0)
      mprotect(reinterpret_cast<void*>(it->first), it->second.bytes, PROT_NONE);
  }
}

bool is_device_buffer(const void* p) {
  std::lock_guard<std::mutex> l(buffers_mutex);
  return buffer_of(p) != buffers().end();
}

}  // namespace px::ref
