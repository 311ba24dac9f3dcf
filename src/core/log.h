// One logging macro with a pluggable sink, and a check macro for internal invariants.
//
//   PX_LOG(info) << "compiled " << n << " steps";     // filtered by PX_LOG_LEVEL (default: warn)
//   px::set_log_sink([](const px::LogRecord& r) { my_logger(r.message); });
//   PX_CHECK(offset >= 0) << "value %" << v << " has no buffer";   // throws px::InternalError
#pragma once

#include <functional>
#include <sstream>
#include <string>

#include "parallax/core.h"

namespace px {

enum class LogLevel : int { debug = 0, info = 1, warn = 2, error = 3, off = 4 };
const char* log_level_name(LogLevel l);
LogLevel log_level_from_name(const std::string& name);  // throws px::Error naming the valid levels

struct LogRecord {
  LogLevel level;
  const char* file;  // basename of the source file
  int line;
  std::string message;
};
using LogSink = std::function<void(const LogRecord&)>;

// Replaces the sink (nullptr restores the default, which writes one line per record to stderr).
// Returns the previous sink. The sink may be called from several threads at once.
LogSink set_log_sink(LogSink sink);
// Records below this level are dropped before their message is built.
void set_log_level(LogLevel l);
LogLevel log_level();
inline bool log_enabled(LogLevel l) { return static_cast<int>(l) >= static_cast<int>(log_level()); }

namespace detail {
// Collects one message and hands it to the sink when destroyed (the end of the statement).
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~LogMessage();
  std::ostream& stream() { return os_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream os_;
};

// Builds the message of a failed PX_CHECK and throws it as px::Error at the end of the statement.
// Collects a failed check's message; the throw happens in CheckThrow, never in a destructor
// (a throwing destructor terminates the program when it runs during unwinding).
class CheckFailure {
 public:
  CheckFailure(const char* cond, const char* file, int line);
  std::ostream& stream() { return os_; }

 private:
  std::ostringstream os_;
};
struct CheckThrow {
  // Takes the stream once every `<<` has run; throws px::InternalError with its text.
  [[noreturn]] void operator&(std::ostream& os);
};

// Lets the macros below be used as `PX_LOG(x) << ...;` inside an if/else without dangling-else issues.
struct Voidify {
  void operator&(std::ostream&) {}
};
}  // namespace detail

}  // namespace px

#define PX_LOG(level)                                      \
  !::px::log_enabled(::px::LogLevel::level) ? (void)0      \
                                            : ::px::detail::Voidify() & \
                                                  ::px::detail::LogMessage(::px::LogLevel::level, __FILE__, __LINE__).stream()

#define PX_CHECK(cond) \
  (cond) ? (void)0 : ::px::detail::CheckThrow() & ::px::detail::CheckFailure(#cond, __FILE__, __LINE__).stream()
