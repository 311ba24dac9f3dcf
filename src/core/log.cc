#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>

#include "core/enum_names.h"
#include "core/env.h"

namespace px {

namespace {
std::mutex& sink_mutex() {
  static std::mutex m;
  return m;
}
LogSink& sink_slot() {
  static LogSink s;
  return s;
}
// -1 until first read, then the level from PX_LOG_LEVEL or set_log_level.
std::atomic<int> g_level{-1};

void default_sink(const LogRecord& r) {
  using namespace std::chrono;
  auto now = system_clock::now();
  std::time_t t = system_clock::to_time_t(now);
  int ms = static_cast<int>(duration_cast<milliseconds>(now.time_since_epoch()).count() % 1000);
  std::tm tm{};
  localtime_r(&t, &tm);
  char ts[32];
  std::strftime(ts, sizeof ts, "%H:%M:%S", &tm);
  std::fprintf(stderr, "[px %c %s.%03d %s:%d] %s\n", "DIWEO"[static_cast<int>(r.level)], ts, ms, r.file, r.line,
               r.message.c_str());
}

const char* basename_of(const char* path) {
  const char* s = std::strrchr(path, '/');
  return s ? s + 1 : path;
}
}  // namespace

namespace {
constexpr const char* kLevelNames[] = {"debug", "info", "warn", "error", "off"};
static_assert(std::size(kLevelNames) == static_cast<size_t>(LogLevel::off) + 1);
}  // namespace

const char* log_level_name(LogLevel l) { return enum_name(l, kLevelNames); }

LogLevel log_level_from_name(const std::string& name) {
  if (auto l = enum_from_name<LogLevel>(name, kLevelNames)) return *l;
  if (name == "warning") return LogLevel::warn;
  throw Error("[log] unknown log level '" + name + "'; use one of debug, info, warn, error, off");
}

LogSink set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(sink_mutex());
  LogSink prev = std::move(sink_slot());
  sink_slot() = std::move(sink);
  return prev;
}

void set_log_level(LogLevel l) { g_level.store(static_cast<int>(l)); }

LogLevel log_level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l < 0) {
    l = static_cast<int>(env().log_level);
    int expected = -1;
    // A concurrent set_log_level wins over the environment default.
    if (!g_level.compare_exchange_strong(expected, l)) l = expected;
  }
  return static_cast<LogLevel>(l);
}

namespace detail {

LogMessage::~LogMessage() {
  LogRecord r{level_, basename_of(file_), line_, os_.str()};
  std::lock_guard<std::mutex> lock(sink_mutex());
  if (sink_slot()) sink_slot()(r);
  else default_sink(r);
}

CheckFailure::CheckFailure(const char* cond, const char* file, int line) {
  os_ << "[internal] check failed at " << basename_of(file) << ":" << line << ": " << cond << ". ";
}

void CheckThrow::operator&(std::ostream& os) { throw InternalError(static_cast<std::ostringstream&>(os).str()); }

}  // namespace detail

}  // namespace px
