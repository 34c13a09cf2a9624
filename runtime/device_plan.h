// Planning a group's operations on GPU buffers into kernel launches: channels (blocks),
// protocol, chunk sizes, which links each block uses. Pure host code with no CUDA calls, so
// the same planner feeds the CUDA engine and the CPU emulation of the kernels in the tests.
// Every rank derives the same plan from the same calls and the shared peer table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kernels/cuda/dev_work.h"
#include "runtime/coll_args.h"
#include "runtime/links.h"
#include "runtime/status.h"

namespace tutti::devplan {

// The channel number of the links sends and receives use: links of their own, never a ring
// channel's. A group of sends and receives then makes every link it needs afresh on both of
// its ends, each end waiting for the other's (DeviceEngine::connect), so no rank launches a
// kernel of the group while a peer still allocates (allocating may wait for the whole GPU).
// Were a ring link reused, the rank that has all its links already would launch at once.
constexpr int kP2pChannel = dev::kMaxChannels;

struct Config {
  int rank = 0;
  int nranks = 1;
  int maxChannels = 4;
  size_t llMaxBytes = 64 << 10;  // LL when a channel's share is at most this
  // An LL AllReduce of at most this many bytes that fits one LL step, on 2 to kSteps + 1
  // ranks, runs as dev::kAlgoGather (0: never).
  size_t gatherMaxBytes = 4 << 10;
  // Blocks a group's sends and receives to other ranks may take (DeviceEngine::findP2pBlockCap):
  // past it, a block runs several (peer, direction) pairs in turn; 0: a block per pair.
  int maxP2pBlocks = 0;
  size_t channelBytes = 512 << 10;     // another channel per this many bytes
  int proto = -1;                      // NCCL_PROTO: dev::kSimple, dev::kLL, -1 automatic
  size_t oneRankChunkBytes = 4 << 20;  // a communicator of one rank: bytes per copy step
  // Ring links on every channel up to maxChannels at the first collective, not only on the
  // channels it uses: no FIFO is allocated later, while other ranks' kernels may be waiting.
  bool connectAllChannels = false;
  // An LL launch takes the threads its largest step needs, a line each (64 at least: the
  // thread that frees received slots is then in another warp than thread 0, see
  // dev::PrimsBase::releaser), rather than dev::kThreads: a small step's blocks then wait at
  // their barriers for 2 warps, not 16. false: every launch takes dev::kThreads.
  bool llFitThreads = true;
};

// A kernel launch: which kernel (datatype as ncclDataType_t, dev::Fn, dev::Proto), how many
// blocks, and its work (abortFlag, err and timeoutNs are the engine's to fill).
struct Launch {
  int dtype = 1;
  int fn = dev::kFnSum;
  int proto = dev::kSimple;
  int blocks = 0;
  dev::DevWork work;
  // Sends and receives past work's dev::kMaxOps (dev::DevP2pWork::more): non-empty only in a
  // launch of sends and receives, which then runs dev::p2pManyKernel.
  std::vector<dev::DevOp> more;
  int threads = dev::kThreads;  // per block (Config::llFitThreads)
};
// The threads an LL launch whose largest step carries `bytes` takes (Config::llFitThreads).
int llThreadsFor(size_t bytes);
// A device-to-device copy: a rank's send to itself met by its receive from itself, or a
// one-rank collective (its result is its input). Runs before launches[beforeLaunch] (after
// all of them when that is launches.size()), so a group's operations keep their order.
struct Copy {
  const void* src;
  void* dst;
  size_t bytes;
  size_t beforeLaunch = 0;
};
struct Plan {
  std::vector<Launch> launches;
  std::vector<Copy> copies;
};

// The links the operations need: the ring's on each channel, and one per send/recv peer.
std::vector<LinkNeed> linkNeeds(const Config& cfg, const CollArgs* ops, size_t n);
// Whether the operations include a collective that uses ring links (every rank has one).
bool usesRing(int nranks, const CollArgs* ops, size_t n);

// A group's sends and receives to other ranks run by round (the ranks d apart: a send to
// rank + d, a receive from rank - d), in launches of whole rounds of at most dev::kMaxP2pOps
// operations: a round of more is refused, naming its peers. ops are all on GPU buffers.
Status checkP2pRounds(int rank, int nranks, const CollArgs* ops, size_t n);

// link(peer, channel, send): the FIFO end, made beforehand from linkNeeds(). nextSeq numbers
// the operations (the communicator's opCount).
using LinkFn = std::function<const transport::FifoView*(int peer, int channel, bool send)>;
Status plan(const Config& cfg, const CollArgs* ops, size_t n, const LinkFn& link,
            const std::function<uint64_t()>& nextSeq, Plan* out);

// A launch with `more` as p2pManyKernel takes it: work, then the rest of the operations.
std::unique_ptr<dev::DevP2pWork> p2pWork(const Launch& l);

// A FIFO end as a kernel sees it (addresses only).
dev::DevConn devConn(const transport::FifoView* f);

}  // namespace tutti::devplan
