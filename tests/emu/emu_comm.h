// The emulated GPU data path's harness (tests/emu): a communicator's device FIFOs in host
// memory, laid out as the p2p transport lays them, and a group of operations planned by the
// device planner and run through the kernels' own source on CPU threads (emu_launch.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "collectives/matrix.h"
#include "kernels/cuda/dev_work.h"
#include "runtime/device_plan.h"
#include "transports/transport.h"

namespace tutti::test {

inline constexpr size_t kSlotBytes = 1024;    // NCCL_BUFFSIZE 8192, as the other matrices
inline constexpr size_t kLlSlotBytes = 1024;  // 512 payload bytes per LL step
// TUTTI_EMU_* variables change the set-up by hand (to mimic a GPU run's configuration).
size_t envOr(const char* name, size_t v);
// Threads per emulated block (TUTTI_EMU_THREADS, 2 by default).
unsigned threadsPerBlock();

// One FIFO (sender -> receiver, one channel) in host memory: control block, Simple slots, LL
// slots, and the sender's own step word.
struct EmuFifo {
  char* mem = nullptr;
  uint64_t ownStep = 0;
  transport::FifoView send, recv;
  EmuFifo(int from, int to, int channel) {
    const size_t bytes = transport::deviceFifoBytes(kSlotBytes, kLlSlotBytes);
    mem = static_cast<char*>(aligned_alloc(64, bytes));
    memset(mem, 0, bytes);
    auto* ctrl = new (mem) transport::FifoCtrl();
    ctrl->tail.store(0);
    ctrl->head.store(0);
    ctrl->broken.store(0);
    for (transport::FifoView* v : {&send, &recv}) {
      transport::layDeviceFifo(mem, kSlotBytes, kLlSlotBytes, v);  // as p2p lays it out
      v->channel = channel;
    }
    send.peer = to;
    send.ownStep = &ownStep;
    recv.peer = from;
  }
  ~EmuFifo() { free(mem); }
  bool broken() const { return send.ctrl->broken.load() != 0; }
};

// Every FIFO of an n-rank communicator, and each rank's view of them.
struct EmuComm {
  int n;
  devplan::Config cfg;
  std::vector<std::unique_ptr<EmuFifo>> fifos;  // [(from * n + to) * kLinkChannels + channel]
  struct RankState {
    uint32_t abort = 0;
    uint32_t claim = 0;
    dev::DevError err{};
    uint64_t seq = 0;
  };
  std::vector<std::unique_ptr<RankState>> ranks;
  uint64_t timeoutNs = 60ull * 1000000000ull;
  std::atomic<int> mostP2pBlocks{0};    // the most blocks a launch of sends and receives took
  std::atomic<int> mostP2pLaunches{0};  // the most launches of sends and receives in one run

  explicit EmuComm(int n, int proto = -1) : n(n) {
    cfg.nranks = n;
    cfg.maxChannels = int(envOr("TUTTI_EMU_CHANNELS", 2));
    cfg.channelBytes = envOr("TUTTI_EMU_CHANNEL_BYTES", 2048);  // two channels from 2 KiB on
    cfg.llMaxBytes = envOr("TUTTI_EMU_LL_MAX_BYTES", 1024);     // LL up to 1 KiB per channel
    cfg.proto = proto;
    cfg.oneRankChunkBytes = 4096;
    // The ring's channels and the links of sends and receives (devplan::kP2pChannel).
    for (int i = 0; i < n * n * kLinkChannels; ++i) {
      const int c = i % kLinkChannels, to = (i / kLinkChannels) % n, from = i / kLinkChannels / n;
      fifos.push_back(std::make_unique<EmuFifo>(from, to, c));
    }
    for (int r = 0; r < n; ++r) ranks.push_back(std::make_unique<RankState>());
  }
  static constexpr int kLinkChannels = devplan::kP2pChannel + 1;
  EmuFifo& fifo(int from, int to, int c) {
    return *fifos[size_t((from * n + to) * kLinkChannels + c)];
  }

  // Runs one group of operations on rank r to completion; "" or the error.
  std::string run(int r, const std::vector<CollArgs>& ops);
};

// One operation as an NCCL call would queue it.
CollArgs args(CollKind kind, const void* send, void* recv, size_t count, int dtype, int root,
              const RedOpSpec& red = {});

// The matrix case as the operations an NCCL call would queue, on rank r.
std::vector<CollArgs> opsFor(const Case& c, int r, int n, const void* send, void* recv,
                             const uint8_t* scalar);

inline std::vector<float> filled(size_t n, float v) { return std::vector<float>(n, v); }

}  // namespace tutti::test
