#include "runtime/env.h"

#include <strings.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>

#include "runtime/log.h"

namespace tutti::env {
namespace {

void logOnce(const char* name, const char* value) {
  static std::mutex mu;
  static std::set<std::string>* seen = new std::set<std::string>();
  std::lock_guard<std::mutex> lock(mu);
  if (seen->insert(std::string(name) + "=" + value).second) {
    bool secret = strstr(name, "SECRET") != nullptr;  // never write a secret to a log
    TUTTI_INFO(log::kEnv, "%s set by environment to %s", name, secret ? "<hidden>" : value);
  }
}

}  // namespace

std::optional<std::string> getString(const char* name) {
  const char* v = getenv(name);
  if (!v) return std::nullopt;
  logOnce(name, v);
  return std::string(v);
}

int64_t getInt(const char* name, int64_t defaultValue) {
  auto v = getString(name);
  if (!v || v->empty()) return defaultValue;
  errno = 0;
  char* end = nullptr;
  long long x = strtoll(v->c_str(), &end, 0);
  if (errno != 0 || *end != '\0') {
    TUTTI_WARN("%s=%s is not an integer; using the default %lld", name, v->c_str(),
               static_cast<long long>(defaultValue));
    return defaultValue;
  }
  return x;
}

double getDouble(const char* name, double defaultValue) {
  auto v = getString(name);
  if (!v || v->empty()) return defaultValue;
  errno = 0;
  char* end = nullptr;
  double x = strtod(v->c_str(), &end);
  if (errno != 0 || *end != '\0') {
    TUTTI_WARN("%s=%s is not a number; using the default %g", name, v->c_str(), defaultValue);
    return defaultValue;
  }
  return x;
}

bool getBool(const char* name, bool defaultValue) {
  auto v = getString(name);
  if (!v || v->empty()) return defaultValue;
  const char* s = v->c_str();
  if (!strcasecmp(s, "1") || !strcasecmp(s, "true") || !strcasecmp(s, "yes") ||
      !strcasecmp(s, "on"))
    return true;
  if (!strcasecmp(s, "0") || !strcasecmp(s, "false") || !strcasecmp(s, "no") ||
      !strcasecmp(s, "off"))
    return false;
  TUTTI_WARN("%s=%s is not a boolean; using the default %d", name, s, defaultValue);
  return defaultValue;
}

double bootstrapTimeoutSeconds() {
  double t = getDouble("TUTTI_BOOTSTRAP_TIMEOUT", 300.0);
  if (!(t > 0)) return 300.0;  // also NaN
  return std::min(t, 1e7);     // 'inf' or huge values: keep deadlines representable
}

}  // namespace tutti::env
