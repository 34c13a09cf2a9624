#include "runtime/peer_info.h"

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "kernels/cuda/dev_work.h"
#include "runtime/cuda_shim.h"
#include "runtime/env.h"
#include "runtime/version.h"

namespace tutti {

uint64_t fnv1a(const void* data, size_t size, uint64_t seed) {
  uint64_t h = seed;
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

bool canWatchProcess(const PeerInfo& me, const PeerInfo& p) {
  return p.pid != me.pid && p.pidNs == me.pidNs && me.pidNs != 0 && me.bootIdKnown &&
         p.bootIdKnown && p.machineHash == me.machineHash;
}

bool processAlive(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  char path[64], buf[256];
  snprintf(path, sizeof(path), "/proc/%lld/stat", static_cast<long long>(pid));
  FILE* f = fopen(path, "r");
  if (!f) return true;  // no /proc: trust kill()
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* close = strrchr(buf, ')');  // the command name may contain anything
  return !(close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X'));
}

std::string localHostname() {
  char name[256] = "";
  gethostname(name, sizeof(name) - 1);
  return name;
}

namespace {
// The running kernel's boot id, "" where it cannot be read.
std::string bootId() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  boot >> id;
  return id;
}
}  // namespace

uint64_t localMachineHash() {
  const std::string id = bootId();
  return fnv1a(id.data(), id.size());
}

uint64_t localHostHash() {
  std::string key;
  if (auto id = env::getString("NCCL_HOSTID")) {
    key = *id;
  } else {
    key = localHostname();
    if (const std::string id = bootId(); !id.empty()) key += "/" + id;
    struct stat st {};
    if (stat("/proc/self/ns/net", &st) == 0) key += "/netns" + std::to_string(st.st_ino);
  }
  return fnv1a(key.data(), key.size());
}

int machineCpus(const PeerInfo* peers, size_t n, uint64_t machineHash) {
  uint64_t all[16] = {};
  int beyond = 0;  // CPUs from 1024 up that some rank may use, which the masks do not hold
  for (size_t i = 0; i < n; ++i) {
    const PeerInfo& p = peers[i];
    if (p.machineHash != machineHash) continue;
    int inMask = 0;
    for (int w = 0; w < 16; ++w) {
      all[w] |= p.cpuMask[w];
      inMask += __builtin_popcountll(p.cpuMask[w]);
    }
    beyond = std::max(beyond, p.cpus - inMask);
  }
  int count = beyond;
  for (uint64_t w : all) count += __builtin_popcountll(w);
  return std::max(count, 1);
}

bool sameGpu(const PeerInfo& a, const PeerInfo& b) {
  if (a.cudaDev < 0 || b.cudaDev < 0 || a.hostHash != b.hostHash || strcmp(a.busId, b.busId) != 0)
    return false;
  // Unknown on either side: the bus id alone, as before UUIDs were compared. Counting two ranks
  // of one GPU as two GPUs would let them take more blocks than can be resident together.
  static const unsigned char kUnknown[sizeof(a.gpuUuid)] = {};
  if (memcmp(a.gpuUuid, kUnknown, sizeof kUnknown) == 0 ||
      memcmp(b.gpuUuid, kUnknown, sizeof kUnknown) == 0)
    return true;
  return memcmp(a.gpuUuid, b.gpuUuid, sizeof(a.gpuUuid)) == 0;
}

int deviceChannelCap(const PeerInfo* peers, size_t n, int* mostOnOneGpu) {
  int cap = kSharedGpuBlocks, most = 1;
  for (size_t i = 0; i < n; ++i) {
    const PeerInfo& p = peers[i];
    if (p.cudaDev < 0) continue;
    int sharing = 0;
    for (size_t j = 0; j < n; ++j) sharing += sameGpu(peers[j], p);
    most = std::max(most, sharing);
    const int blocks = p.gpuSms > 0 ? std::min(kSharedGpuBlocks, p.gpuSms / 2) : kSharedGpuBlocks;
    cap = std::min(cap, blocks / std::max(sharing, 1));
  }
  if (mostOnOneGpu) *mostOnOneGpu = most;
  return std::max(cap, 1);
}

DeviceSettings deviceSettingsFromEnv() {
  DeviceSettings d{};
  d.proto = -1;
  if (auto p = env::getString("NCCL_PROTO")) {
    std::string v = *p;
    std::transform(v.begin(), v.end(), v.begin(), ::tolower);
    if (v == "ll") d.proto = dev::kLL;
    if (v == "simple") d.proto = dev::kSimple;
  }
  // As the engine takes it (it caps it further by the ranks per GPU, alike on every rank).
  d.maxChannels = std::clamp<int64_t>(env::getInt("NCCL_MAX_NCHANNELS", dev::kMaxChannels), 1,
                                      dev::kMaxChannels);
  d.llMaxBytes = std::max<int64_t>(0, env::getInt("TUTTI_LL_MAX_BYTES", 64 << 10));
  d.gatherMaxBytes = std::max<int64_t>(0, env::getInt("TUTTI_LL_GATHER_MAX_BYTES", 4 << 10));
  d.channelBytes = std::max<int64_t>(1, env::getInt("TUTTI_DEV_CHANNEL_BYTES", 512 << 10));
  // The device links take these (runtime/links.cc, transports/p2p): compared here, since p2p
  // checks them per link, where only the sender would know.
  d.buffSize = env::getInt("NCCL_BUFFSIZE", 4 << 20);
  d.llSlotBytes = env::getInt("TUTTI_LL_SLOT_BYTES", 16 << 10);
  d.p2pDisabled = env::getBool("NCCL_P2P_DISABLE", false) ? 1 : 0;
  return d;
}

Status checkDeviceSettingsAgree(const PeerInfo* peers, size_t n) {
  struct Field {
    const char* name;
    int64_t DeviceSettings::*value;
  };
  static const Field kFields[] = {{"NCCL_PROTO", &DeviceSettings::proto},
                                  {"NCCL_MAX_NCHANNELS", &DeviceSettings::maxChannels},
                                  {"TUTTI_LL_MAX_BYTES", &DeviceSettings::llMaxBytes},
                                  {"TUTTI_LL_GATHER_MAX_BYTES", &DeviceSettings::gatherMaxBytes},
                                  {"TUTTI_DEV_CHANNEL_BYTES", &DeviceSettings::channelBytes},
                                  {"NCCL_BUFFSIZE", &DeviceSettings::buffSize},
                                  {"TUTTI_LL_SLOT_BYTES", &DeviceSettings::llSlotBytes}};
  auto shown = [](const Field& f, int64_t v) {
    if (f.value != &DeviceSettings::proto) return std::to_string(v);
    return std::string(v == dev::kLL ? "LL" : v == dev::kSimple ? "Simple" : "unset (automatic)");
  };
  const PeerInfo* first = nullptr;
  for (size_t i = 0; i < n; ++i) {
    const PeerInfo& p = peers[i];
    if (p.cudaDev < 0) continue;
    if (!first) {
      first = &p;
      continue;
    }
    for (const Field& f : kFields) {
      if (p.device.*f.value == first->device.*f.value) continue;
      return invalidUsage(std::string(f.name) + " differs between ranks: rank " +
                          std::to_string(first->rank) + " reads " +
                          shown(f, first->device.*f.value) + ", rank " + std::to_string(p.rank) +
                          " " + shown(f, p.device.*f.value) +
                          ". Each GPU rank plans its kernels from it, and plans that differ "
                          "would not meet: set it alike on every rank");
    }
  }
  return Status::Ok();
}

uint32_t wire::buildFingerprint() {
  std::string layout = std::string(kTuttiVersionString) + "/" + std::to_string(sizeof(PeerInfo));
  for (const char* name : kHostSettingNames) layout += std::string("/") + name;
  const uint64_t h = fnv1a(layout.data(), layout.size());
  return static_cast<uint32_t>(h ^ (h >> 32)) | 1;
}

PeerInfo localPeerInfo(int rank, int cudaDev, const net::SockAddr& bootstrapAddr) {
  PeerInfo p{};
  p.rank = rank;
  p.cudaDev = cudaDev;
  p.pid = getpid();
  cpu_set_t set;
  struct stat ns {};
  p.pidNs = stat("/proc/self/ns/pid", &ns) == 0 ? ns.st_ino : 0;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    p.cpus = CPU_COUNT(&set);
    for (int c = 0; c < 1024 && c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) p.cpuMask[c / 64] |= uint64_t(1) << (c % 64);
    }
  } else {
    p.cpus = 1;
    p.cpuMask[0] = 1;
  }
  p.hostHash = localHostHash();
  p.machineHash = localMachineHash();
  p.bootIdKnown = !bootId().empty();
  snprintf(p.busId, sizeof(p.busId), "%s", cuda::busId(cudaDev).c_str());
  cuda::deviceUuid(cudaDev, p.gpuUuid);
  p.gpuSms = cuda::multiProcessorCount(cudaDev);
  snprintf(p.hostname, sizeof(p.hostname), "%s", localHostname().c_str());
  p.bootstrapAddr = wire::fromSockAddr(bootstrapAddr);
  p.device = deviceSettingsFromEnv();
  p.host = hostSettingsFromEnv();
  return p;
}

}  // namespace tutti
