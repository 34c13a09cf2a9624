// The CPU engine: runs a communicator's operations on host buffers to completion. Ring
// collectives are split across channels; channel 0 runs on the calling thread (so a small
// collective costs no thread hand-off) and the others on the communicator's channel workers.
// Point-to-point operations of one group progress together, non-blocking, so that any mix of
// sends and receives completes whatever order the ranks issued them in.
#pragma once

#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "kernels/cpu/ring_dispatch.h"
#include "runtime/coll_args.h"
#include "runtime/status.h"
#include "runtime/two_way_tuner.h"
#include "runtime/workers.h"
#include "transports/shm/area.h"
#include "transports/transport.h"

namespace tutti {

class Comm;
class OpState;

class Engine {
 public:
  explicit Engine(Comm& comm);
  ~Engine();

  // One group's operations for this communicator, in the order they were issued. Those on
  // GPU buffers go to the CUDA engine: prepared, and launched unless deferDeviceLaunch (the
  // group then launches every communicator's kernels together, see group.cc).
  Status run(const CollArgs* ops, size_t n, bool deferDeviceLaunch = false);
  Status run(const std::vector<CollArgs>& ops) { return run(ops.data(), ops.size()); }
  // run() on this communicator's runner thread; wait with waitAsync().
  void runAsync(const std::vector<CollArgs>* ops, Status* out, bool deferDeviceLaunch = false);
  void waitAsync();

  int maxChannels() const { return maxChannels_; }
  // Whether the ranks agree on the settings that shape host-buffer operations
  // (checkHostSettingsAgree): group.cc refuses those before anything runs where they do not.
  const Status& settingsAgree() const { return settingsAgree_; }
  // Channels an operation of this many bytes uses (the same on every rank).
  int channelsFor(size_t bytes) const;

 private:
  Status runCollective(const CollArgs& op);
  // shape: doubling, the binomial tree or halving and doubling over recursive doubling's links
  // (collectives/recursive_doubling.h, cpu::RdShape).
  Status runRecursiveDoubling(const CollArgs& op, OpState& state, cpu::RdShape shape);
  Status ensureRdLinks(OpState& state);
  Status runFlat(const CollArgs& op, OpState& state);
  Status ensureFlatLinks(OpState& state);
  // A broadcast or an all-gather through the host's shared area (transports/shm/area.h), made
  // on first use: rank 0 creates it and names it to the others over the bootstrap.
  Status runAreaBroadcast(const CollArgs& op, OpState& state);
  // Whether a call of `total` bytes is in an area range [min, max] (min 0: the range is off).
  static bool inArea(size_t total, size_t min, size_t max) {
    return min != 0 && total >= min && total <= max;
  }
  Status ensureArea(OpState& state);
  // The root of a broadcast from stateBcastMinBytes_: flat while copies into the ring's slots
  // run slow (the shm link to the next rank says: Connection::copiesRunSlow), the chain
  // otherwise. After stateRecheck_ flat ones in a row the verdict is forgotten, so that the
  // chain's copies time the machine again.
  bool flatBroadcastNow();
  // This rank's verdict on its ring link (Connection::copiesRunSlow), for a choice by state: a
  // trace line when it turns (`what` from minBytes go slowWay / fastWay), and forgotten after
  // `recheck` slow answers in a row (*since counts them; *told: the last one traced).
  bool ringVerdict(bool* told, uint32_t* since, uint32_t recheck, size_t minBytes, const char* what,
                   const char* slowWay, const char* fastWay);
  // Rank 0, a two-rank all-reduce over shm from exchangeMinBytes_, out of place: 1 (the
  // exchange) while copies into the ring's slots run slow, 0 (the ring) otherwise. After
  // exchangeRecheck_ such answers in a row the verdict is forgotten, so that the ring's copies
  // time the machine again.
  int exchangeNow();
  uint32_t exchangeRecheck_;
  uint32_t exchangeSinceVerdict_ = 0;
  size_t exchangeMinBytes_;       // two-rank shm all-reduces from this size by state (0: never)
  bool exchangeByState_ = false;  // rank 0's last choice (exchangeNow)
  int exchangeForced_ = -1;       // TUTTI_EXCHANGE: 1 always, 0 never, -1 by state
  uint32_t stateRecheck_;
  // Two-rank shm all-gathers: by address or through the slots, whichever runs faster now
  // (TUTTI_PAIR_TUNE pins one).
  enum PairWay { kPairTimed, kPairByAddress, kPairThroughSlots };
  PairWay pairWay_ = kPairTimed;
  TwoWayTuner pairTuner_;
  TwoWayTuner gatherTuner_;  // the crowded doubling all-gather's stages, the same way
  // Big crowded all-gathers (a power of two of ranks, from gatherTuneMinBytes_): recursive
  // doubling (way 0) or the ring (1), as rank 0's recent runs of each took (it tells the
  // others: cpu::passWay).
  TwoWayTuner algoTuner_;
  using Clock = std::chrono::steady_clock;
  // A timed run of `way` (begun at `start`) succeeded: records its time in t, and writes a
  // TUNING trace line when the size class's leaning turns. recordAlgoRun: algoTuner_'s.
  void recordRun(TwoWayTuner& t, int bucket, int way, Clock::time_point start, const char* what,
                 const char* way0, const char* way1);
  void recordAlgoRun(int bucket, int way, Clock::time_point start);
  Status runP2p(const std::vector<const CollArgs*>& ops);

  Comm& comm_;
  Status settingsAgree_;
  int minChannels_, maxChannels_;
  double timeoutS_;
  size_t pairMaxBytes_;        // two-rank all-reduces up to this size use the pair exchange (tcp)
  size_t rdMaxBytes_;          // all-reduces of 3+ ranks up to this size use recursive doubling
  size_t flatMaxBytes_;        // and up to this one (3+ ranks) the flat exchange
  size_t treeMaxBytes_;        // and those above it up to this size the binomial tree
  size_t halvingMinBytes_;     // all-reduces of 3+ ranks from this size (0: never) up to
  size_t halvingMaxBytes_;     // this one: recursive halving and doubling
  size_t flatGatherMaxBytes_;  // all-gathers of 3+ ranks up to this total: the flat exchange
  size_t rdGatherMaxBytes_;    // then (a power of two of ranks) recursive doubling
  size_t treeGatherMaxBytes_;  // then the binomial tree
  size_t gatherTuneMinBytes_;  // from this size doubling or the ring by timing (0: never)
  size_t flatBcastMinBytes_;   // broadcasts of 3+ ranks from this size: flat (0: never)
  size_t stateBcastMinBytes_;  // and from this size flat or chain by state (0: never)
  size_t stateBcastMaxBytes_;  // up to this one
  bool flatByState_ = false;   // the root's last choice (flatBroadcastNow)
  size_t areaBcastMinBytes_;   // broadcasts of 3+ ranks on one host over shm in this range go
  size_t areaBcastMaxBytes_;   // through the shared area (0: never)
  size_t areaGatherMinBytes_;  // all-gathers (totals) the same way
  size_t areaGatherMaxBytes_;
  int areaSlots_;
  size_t areaChunkBytes_;
  std::unique_ptr<transport::ShmArea> area_;
  uint64_t areaNext_ = 0;  // chunks this communicator's area has carried (alike on every rank)
  uint64_t areaOps_ = 0;   // broadcasts and all-gathers called so far (alike on every rank)
  uint32_t flatSinceVerdict_ = 0;
  int64_t spinNs_;  // how long a wait busy-polls before yielding (0 when oversubscribed)
  std::mutex mu_;   // one group at a time per communicator
  std::vector<std::unique_ptr<Worker>> channelWorkers_;
  // Ring links per channel once made (the common case skips Links entirely).
  static constexpr int kMaxChannels = 16;
  transport::FifoView* ringSend_[kMaxChannels] = {};
  transport::FifoView* ringRecv_[kMaxChannels] = {};
  cpu::RdLinks rdLinks_;  // recursive doubling's links once made
  bool rdReady_ = false;
  cpu::FlatLinks flatLinks_;  // the flat all-reduce's links once made
  Worker runner_;
};

}  // namespace tutti
