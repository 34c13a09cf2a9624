#include "bindings/c/config.h"

#include <cstddef>
#include <cstring>

#include "runtime/env.h"

namespace tutti::api {
namespace {

ncclConfig_t undefinedConfig() {
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  return c;
}

// Resets fields the caller's header did not know about.
void forgetNewerFields(ncclConfig_t& c, unsigned int version) {
  const int U = NCCL_CONFIG_UNDEF_INT;
  if (version < 22500) c.trafficClass = U;
  if (version < 22700) c.collnetEnable = c.CTAPolicy = c.shrinkShare = c.nvlsCTAs = U;
  if (version < 22800) c.nChannelsPerNetPeer = c.nvlinkCentricSched = U;
  if (version < 22900) c.graphUsageMode = c.numRmaCtx = U;
  if (version < 23000) c.maxP2pPeers = c.graphStreamOrdering = U;
}

int pick(int value, const char* envName, int fallback) {
  if (value != NCCL_CONFIG_UNDEF_INT) return value;
  return static_cast<int>(env::getInt(envName, fallback));
}

}  // namespace

Result<CommConfig> parseConfig(const ncclConfig_t* in, const CommConfig* base) {
  CommConfig out;
  if (!in) {
    if (base) return *base;
    out.blocking = env::getInt("NCCL_COMM_BLOCKING", 1) != 0;
    return out;
  }
  constexpr size_t kHeader = offsetof(ncclConfig_t, blocking);
  if (in->size < kHeader || in->size > (1u << 20)) {
    return invalidArgument("config->size is " + std::to_string(in->size) +
                           "; initialize the config with NCCL_CONFIG_INITIALIZER");
  }
  ncclConfig_t c = undefinedConfig();
  memcpy(&c, in, std::min(in->size, sizeof(ncclConfig_t)));
  if (c.magic != NCCL_CONFIG_MAGIC) {
    char hex[16];
    snprintf(hex, sizeof(hex), "0x%x", c.magic);
    return invalidArgument(std::string("config->magic is ") + hex +
                           ", expected 0xcafebeef; initialize the config with "
                           "NCCL_CONFIG_INITIALIZER");
  }
  forgetNewerFields(c, c.version);

  if (base) out = *base;
  int blocking = c.blocking != NCCL_CONFIG_UNDEF_INT
                     ? c.blocking
                     : (base ? static_cast<int>(base->blocking)
                             : static_cast<int>(env::getInt("NCCL_COMM_BLOCKING", 1)));
  if (blocking != 0 && blocking != 1) {
    return invalidArgument("config->blocking is " + std::to_string(blocking) + ", expected 0 or 1");
  }
  out.blocking = blocking == 1;
  out.cgaClusterSize = pick(c.cgaClusterSize, "NCCL_CGA_CLUSTER_SIZE", out.cgaClusterSize);
  out.minCTAs = pick(c.minCTAs, "NCCL_MIN_CTAS", out.minCTAs);
  out.maxCTAs = pick(c.maxCTAs, "NCCL_MAX_CTAS", out.maxCTAs);
  if (out.minCTAs != -1 && out.minCTAs < 1) {
    return invalidArgument("config->minCTAs is " + std::to_string(out.minCTAs) + ", must be >= 1");
  }
  if (out.maxCTAs != -1 && out.maxCTAs < 1) {
    return invalidArgument("config->maxCTAs is " + std::to_string(out.maxCTAs) + ", must be >= 1");
  }
  if (out.minCTAs != -1 && out.maxCTAs != -1 && out.minCTAs > out.maxCTAs) {
    return invalidArgument("config->minCTAs (" + std::to_string(out.minCTAs) +
                           ") exceeds config->maxCTAs (" + std::to_string(out.maxCTAs) + ")");
  }
  if (c.cgaClusterSize != NCCL_CONFIG_UNDEF_INT && (c.cgaClusterSize < 0 || c.cgaClusterSize > 8)) {
    return invalidArgument("config->cgaClusterSize is " + std::to_string(c.cgaClusterSize) +
                           ", expected 0..8");
  }
  if (c.netName) {
    out.netName = c.netName;
  } else if (!base) {
    out.netName = env::getString("NCCL_NET").value_or("");
  }
  if (c.splitShare != NCCL_CONFIG_UNDEF_INT) out.splitShare = c.splitShare != 0;
  if (c.trafficClass != NCCL_CONFIG_UNDEF_INT) out.trafficClass = c.trafficClass;
  if (c.commName) out.commName = c.commName;
  return out;
}

}  // namespace tutti::api
