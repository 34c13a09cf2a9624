// Environment configuration. Every variable read goes through here so that a value set by the
// user is logged once under NCCL_DEBUG_SUBSYS=ENV, as NCCL users expect.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tutti::env {

std::optional<std::string> getString(const char* name);
// Integer values; a malformed value is logged as a warning and the default is used.
int64_t getInt(const char* name, int64_t defaultValue);
double getDouble(const char* name, double defaultValue);
bool getBool(const char* name, bool defaultValue);  // 1/0, true/false, yes/no, on/off

// Deadline, in seconds, for every bootstrap wait (TUTTI_BOOTSTRAP_TIMEOUT, default 300).
double bootstrapTimeoutSeconds();

}  // namespace tutti::env
