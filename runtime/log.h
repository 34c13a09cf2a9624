// NCCL-compatible logging: NCCL_DEBUG, NCCL_DEBUG_SUBSYS, NCCL_DEBUG_FILE and NCCL's line
// format (`host:pid:tid [dev] NCCL INFO msg`), so existing log tooling keeps working.
#pragma once

#include <cstdint>
#include <string>

namespace tutti::log {

enum class Level : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kAbort = 4, kTrace = 5 };

// Subsystem bits; the names are those NCCL_DEBUG_SUBSYS accepts.
enum Subsys : uint32_t {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2p = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kGraph = 1u << 5,
  kTuning = 1u << 6,
  kEnv = 1u << 7,
  kAlloc = 1u << 8,
  kCall = 1u << 9,
  kProxy = 1u << 10,
  kBootstrap = 1u << 11,
  kAll = ~0u,
};

// Parsers, exposed for tests. parseSubsys handles "INIT,NET", "^INIT", "ALL".
Level parseLevel(const char* value);
uint32_t parseSubsys(const char* value);
// Expands %h (host name) and %p (pid) in NCCL_DEBUG_FILE.
std::string expandFileName(const std::string& pattern, const std::string& host, int pid);

bool enabled(Level level, uint32_t subsys);
void write(Level level, uint32_t subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));

// The CUDA device shown in the `[dev]` field for lines written by this thread (-1: none).
void setThreadDevice(int device);

// Prints "NCCL version ..." once per process when NCCL_DEBUG is VERSION or higher.
void printVersionOnce();

// Re-reads the environment (tests change NCCL_DEBUG* between cases).
void reinitForTest();

}  // namespace tutti::log

#define TUTTI_LOG(level, subsys, ...)                                      \
  do {                                                                     \
    if (::tutti::log::enabled(level, subsys))                              \
      ::tutti::log::write(level, subsys, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define TUTTI_WARN(...) TUTTI_LOG(::tutti::log::Level::kWarn, ::tutti::log::kAll, __VA_ARGS__)
#define TUTTI_INFO(subsys, ...) TUTTI_LOG(::tutti::log::Level::kInfo, subsys, __VA_ARGS__)
#define TUTTI_TRACE(subsys, ...) TUTTI_LOG(::tutti::log::Level::kTrace, subsys, __VA_ARGS__)
