// What each rank tells every other at init: who it is and where it runs.
#pragma once

#include <cstdint>
#include <string>
#include <type_traits>

#include "runtime/host_settings.h"
#include "runtime/status.h"
#include "runtime/wire.h"

namespace tutti {

// The settings every GPU rank's planner (runtime/device_plan.h) must share: each rank plans its
// kernels alone, so ranks that read different values would plan different steps (a wrong
// result, or a hang). Read from the environment at init, exchanged in PeerInfo, compared
// (checkDeviceSettingsAgree), and used from there by the CUDA engine.
struct DeviceSettings {
  int64_t proto;           // NCCL_PROTO: -1 automatic, dev::kSimple or dev::kLL
  int64_t maxChannels;     // NCCL_MAX_NCHANNELS as given (the engine caps it)
  int64_t llMaxBytes;      // TUTTI_LL_MAX_BYTES
  int64_t gatherMaxBytes;  // TUTTI_LL_GATHER_MAX_BYTES
  int64_t channelBytes;    // TUTTI_DEV_CHANNEL_BYTES
  int64_t buffSize;        // NCCL_BUFFSIZE (the device FIFOs' slots; 4 MiB unset)
  int64_t llSlotBytes;     // TUTTI_LL_SLOT_BYTES (the device FIFOs' LL lines; 16 KiB unset)
  // NCCL_P2P_DISABLE: not compared (each pair of ranks takes mapped host memory where either
  // end set it), but carried, so that the receiver, which decides, knows the sender's too.
  int64_t p2pDisabled;
};
DeviceSettings deviceSettingsFromEnv();

struct PeerInfo {
  int32_t rank;
  int32_t cudaDev;  // -1: a CPU rank
  int64_t pid;
  int32_t cpus;         // hardware threads this process may run on
  int32_t bootIdKnown;  // 1 when machineHash comes from a boot id (0: it tells nothing)
  uint64_t pidNs;       // pid namespace inode: pids mean the same thing only within one
  // The running kernel (boot id): ranks that share CPUs even across namespaces.
  uint64_t machineHash;
  uint64_t hostHash;          // equal for ranks that can share memory directly
  char busId[24];             // PCI bus id of cudaDev, "" for CPU ranks
  unsigned char gpuUuid[16];  // cudaDev's UUID (a MIG instance's own), zeros for CPU ranks
  int32_t gpuSms;             // cudaDev's multiprocessors (a MIG instance's own), 0 unknown
  char hostname[64];
  wire::Addr bootstrapAddr;
  // The CPUs this process may run on (affinity), CPU c at bit c % 64 of word c / 64; CPUs from
  // 1024 up are only counted in `cpus`.
  uint64_t cpuMask[16];
  DeviceSettings device;
  HostSettings host;
};
static_assert(std::is_trivially_copyable_v<PeerInfo>);

// Ok, or which setting differs between which two GPU ranks (CPU ranks plan no kernels).
Status checkDeviceSettingsAgree(const PeerInfo* peers, size_t n);

// Blocks the collectives of the ranks sharing a GPU may take in all: half of what the GPU runs
// at once (a block of the kernels' 512 threads per multiprocessor: their registers fill one),
// at most kSharedGpuBlocks (an H100's 132 multiprocessors give 64); 64 where the size is
// unknown. The other half is left to other kernels (another communicator's may wait for these
// ranks too).
inline constexpr int kSharedGpuBlocks = 64;
// The channels (a block each) every GPU rank's collectives may take: on each GPU, its blocks
// divided among the ranks there; the least over every GPU of the communicator, so that every
// rank plans alike (the plans must meet). At least 1; kSharedGpuBlocks where no GPU rank. The
// same pass counts the most ranks on one GPU (at least 1) into *mostOnOneGpu, where given.
int deviceChannelCap(const PeerInfo* peers, size_t n, int* mostOnOneGpu = nullptr);

// Whether two ranks use one GPU (the same MIG instance, under MIG): both GPU ranks on one host
// with the same bus id and UUID (a UUID that could not be read, all zeros, is not compared).
bool sameGpu(const PeerInfo& a, const PeerInfo& b);

// Hash of host name, boot id and network namespace, or of NCCL_HOSTID when set. Ranks in
// different network namespaces count as different hosts: that is how tests stand in for a
// cluster on one machine, and a namespace boundary usually is a container boundary too.
uint64_t localHostHash();
uint64_t localMachineHash();
std::string localHostname();
PeerInfo localPeerInfo(int rank, int cudaDev, const net::SockAddr& bootstrapAddr);

// How many CPUs the ranks on one machine (machineHash) may run on together: the union of their
// affinity masks. Ranks bound to separate cores do not share them, however few each has.
int machineCpus(const PeerInfo* peers, size_t n, uint64_t machineHash);

// Whether this process can tell by pid if p's process is alive: another process of the same
// kernel and pid namespace (pids mean nothing across either).
// Hosts whose boot id cannot be read all hash alike, so without one nobody is watched.
bool canWatchProcess(const PeerInfo& me, const PeerInfo& p);
// Whether process pid exists and is not a zombie its parent has yet to reap.
bool processAlive(int64_t pid);

uint64_t fnv1a(const void* data, size_t size, uint64_t seed = 0xcbf29ce484222325ull);

}  // namespace tutti
