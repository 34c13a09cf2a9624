#pragma once

#include "nccl.h"
#include "runtime/comm.h"

namespace tutti::api {

// Applies the ncclConfig_t ABI rule: copy at most config->size bytes, check the magic, treat
// fields newer than config->version (and past config->size) as undefined; undefined fields
// fall back to `base` (the parent's config for a split) or to the environment, then defaults.
Result<CommConfig> parseConfig(const ncclConfig_t* config, const CommConfig* base);

}  // namespace tutti::api
