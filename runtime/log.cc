#include "runtime/log.h"

#include <strings.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/version.h"

namespace tutti::log {
namespace {

struct Subsystem {
  const char* name;
  uint32_t bit;
};
constexpr Subsystem kSubsystems[] = {
    {"INIT", kInit},   {"COLL", kColl},           {"P2P", kP2p}, {"SHM", kShm},     {"NET", kNet},
    {"GRAPH", kGraph}, {"TUNING", kTuning},       {"ENV", kEnv}, {"ALLOC", kAlloc}, {"CALL", kCall},
    {"PROXY", kProxy}, {"BOOTSTRAP", kBootstrap}, {"ALL", kAll},
};

struct State {
  std::mutex mu;
  bool initialized = false;
  Level level = Level::kNone;
  uint32_t subsys = 0;
  FILE* out = stdout;
  char host[64] = "";
};

State& state() {
  static State* s = new State();  // never destroyed: threads may log during exit
  return *s;
}

std::atomic<int> gLevel{-1};  // -1: environment not read yet
std::atomic<uint32_t> gSubsys{0};
thread_local int tDevice = -1;

void initLocked(State& s) {
  if (s.initialized) return;
  s.initialized = true;
  s.level = parseLevel(getenv("NCCL_DEBUG"));
  const char* sub = getenv("NCCL_DEBUG_SUBSYS");
  s.subsys = parseSubsys(sub ? sub : "INIT,BOOTSTRAP,ENV");
  gethostname(s.host, sizeof(s.host) - 1);
  if (char* dot = strchr(s.host, '.')) *dot = '\0';
  if (s.out != stdout && s.out != stderr) fclose(s.out);
  s.out = stdout;
  const char* file = getenv("NCCL_DEBUG_FILE");
  if (file && *file && s.level != Level::kNone) {
    std::string name = expandFileName(file, s.host, getpid());
    if (FILE* f = fopen(name.c_str(), "w")) {
      setvbuf(f, nullptr, _IOLBF, 0);
      s.out = f;
    }
  }
  gSubsys.store(s.subsys);
  gLevel.store(static_cast<int>(s.level));
}

void ensureInit() {
  if (gLevel.load(std::memory_order_acquire) >= 0) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  initLocked(s);
}

const char* levelName(Level level) {
  switch (level) {
    case Level::kWarn:
      return "WARN";
    case Level::kTrace:
      return "TRACE";
    case Level::kAbort:
      return "ABORT";
    default:
      return "INFO";
  }
}

}  // namespace

Level parseLevel(const char* v) {
  if (!v) return Level::kNone;
  if (!strcasecmp(v, "VERSION")) return Level::kVersion;
  if (!strcasecmp(v, "WARN")) return Level::kWarn;
  if (!strcasecmp(v, "INFO")) return Level::kInfo;
  if (!strcasecmp(v, "ABORT")) return Level::kAbort;
  if (!strcasecmp(v, "TRACE")) return Level::kTrace;
  return Level::kNone;
}

uint32_t parseSubsys(const char* v) {
  if (!v) return 0;
  bool invert = v[0] == '^';
  if (invert) ++v;
  uint32_t mask = 0;
  std::string list(v);
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    std::string tok = list.substr(pos, comma - pos);
    for (const Subsystem& s : kSubsystems) {
      if (!strcasecmp(tok.c_str(), s.name)) mask |= s.bit;
    }
    pos = comma + 1;
  }
  return invert ? ~mask : mask;
}

std::string expandFileName(const std::string& pattern, const std::string& host, int pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[i + 1];
      if (c == 'h') {
        out += host;
        ++i;
        continue;
      }
      if (c == 'p') {
        out += std::to_string(pid);
        ++i;
        continue;
      }
      if (c == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

bool enabled(Level level, uint32_t subsys) {
  ensureInit();
  int current = gLevel.load(std::memory_order_relaxed);
  if (static_cast<int>(level) > current) return false;
  // WARN and VERSION lines are printed whatever the subsystem filter says, as NCCL does.
  if (level == Level::kWarn || level == Level::kVersion) return true;
  return (gSubsys.load(std::memory_order_relaxed) & subsys) != 0;
}

void write(Level level, uint32_t /*subsys*/, const char* file, int line, const char* fmt, ...) {
  State& s = state();
  char prefix[256];
  int pid = getpid();
  long tid = syscall(SYS_gettid);
  if (level == Level::kWarn) {
    const char* base = strrchr(file, '/');
    snprintf(prefix, sizeof(prefix), "%s:%d:%ld [%d] %s:%d NCCL WARN ", s.host, pid, tid, tDevice,
             base ? base + 1 : file, line);
  } else {
    snprintf(prefix, sizeof(prefix), "%s:%d:%ld [%d] NCCL %s ", s.host, pid, tid, tDevice,
             levelName(level));
  }
  char body[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof(body), fmt, ap);
  va_end(ap);
  std::lock_guard<std::mutex> lock(s.mu);
  fprintf(s.out, "%s%s\n", prefix, body);
  fflush(s.out);
}

void setThreadDevice(int device) { tDevice = device; }

void printVersionOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (enabled(Level::kVersion, kAll)) {
      State& s = state();
      std::lock_guard<std::mutex> lock(s.mu);
      fprintf(s.out, "%s:%d:%ld [%d] NCCL INFO NCCL version %s (tutti %s, %s)\n", s.host, getpid(),
              syscall(SYS_gettid), tDevice, kNcclVersionString, kTuttiVersionString,
              kCudaDescription);
      fflush(s.out);
    }
  });
}

void reinitForTest() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.initialized = false;
  initLocked(s);
}

}  // namespace tutti::log
