#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <deque>
#include <map>

#include "collectives/recursive_doubling.h"
#include "kernels/cpu/ring_dispatch.h"
#include "runtime/comm.h"
#include "runtime/device_engine.h"
#include "runtime/dtype.h"
#include "runtime/env.h"
#include "runtime/links.h"
#include "runtime/log.h"
#include "runtime/waiter.h"

namespace tutti {
namespace {

// Below this many bytes per channel another channel costs more than it gains.
constexpr size_t kMinChannelBytes = 256 << 10;
// Mid-sized messages are cut into about this many steps per channel, but no step is smaller
// than kMinChunkBytes (each step costs a counter round trip).
constexpr size_t kPipelineSteps = 4;
constexpr size_t kMinChunkBytes = 16 << 10;
// Two-rank all-gathers and broadcasts over shm up to this total send by address (below).
constexpr size_t kPairByAddressMaxBytes = 16 << 20;

}  // namespace

Engine::~Engine() = default;

int Engine::channelsFor(size_t bytes) const {
  size_t want = bytes / kMinChannelBytes;
  return static_cast<int>(std::clamp<size_t>(want, size_t(minChannels_), size_t(maxChannels_)));
}

void Engine::runAsync(const std::vector<CollArgs>* ops, Status* out, bool deferDeviceLaunch) {
  runner_.post([this, ops, out, deferDeviceLaunch] {
    *out = run(ops->data(), ops->size(), deferDeviceLaunch);
  });
}

void Engine::waitAsync() { runner_.wait(); }

Status Engine::run(const CollArgs* ops, size_t nops, bool deferDeviceLaunch) {
  std::lock_guard<std::mutex> lock(mu_);
  TUTTI_TRY(comm_.failedEarlier());
  Status s;
  std::vector<const CollArgs*> p2p;
  std::vector<CollArgs> onDevice;
  for (size_t i = 0; i < nops; ++i) {
    const CollArgs& op = ops[i];
    if (op.device) {
      onDevice.push_back(op);
      continue;
    }
    if (op.kind == CollKind::kSend || op.kind == CollKind::kRecv) {
      p2p.push_back(&op);
      continue;
    }
    s = runCollective(op);
    if (!s.ok()) break;
  }
  if (s.ok() && !p2p.empty()) s = runP2p(p2p);
  if (s.ok() && !onDevice.empty()) {
    DeviceEngine& d = comm_.deviceEngine();
    s = d.prepare(onDevice.data(), onDevice.size());
    if (s.ok() && !deferDeviceLaunch) s = d.launchPrepared();
  }
  if (!s.ok()) {
    TUTTI_WARN("%s", s.message().c_str());
    comm_.setAsyncError(s);
    comm_.links().breakAll();  // the peers stop waiting for this rank
    if (!onDevice.empty()) comm_.deviceEngine().breakLinks();  // their kernels too
  }
  return s;
}

Status Engine::runCollective(const CollArgs& op) {
  const int n = comm_.nranks(), r = comm_.rank();
  const uint64_t seq = comm_.nextSeq();
  const size_t elem = dtypeSize(op.dtype);
  const bool bytes = cpu::movesBytes(op.kind);
  const size_t count = op.count * (bytes ? elem : 1);  // per-rank units the algorithm sees
  size_t total = op.count * elem;
  if (op.kind == CollKind::kAllGather || op.kind == CollKind::kReduceScatter) total *= size_t(n);
  const int nch = n == 1 ? 1 : channelsFor(total);
  // Two ranks, a small all-reduce: one exchange beats the ring's two steps. (Over shm the ring
  // is as fast for small messages and faster for larger ones.) Each rank combines both inputs
  // itself: only for ops whose operands commute bit for bit, scaled (Avg) by the receiver --
  // never a PreMulSum, whose scalar each rank chooses for its own input.
  cpu::Algo algo = op.kind == CollKind::kAllReduce && n == 2 && total <= pairMaxBytes_ &&
                           cpu::rdSymmetric(op) && cpu::scalesAlike(op) &&
                           comm_.links().usesNet((r + 1) % n)
                       ? cpu::Algo::kPair
                       : cpu::Algo::kRing;
  TUTTI_INFO(log::kColl,
             "%s: opCount %llx sendbuff %p recvbuff %p count %zu datatype %d op %d root %d comm "
             "%p [nranks=%d] nchannels %d",
             collKindName(op.kind), static_cast<unsigned long long>(seq), op.send,
             static_cast<void*>(op.recv), op.count, op.dtype, op.op, op.root,
             static_cast<void*>(&comm_), n, nch);

  OpState state(comm_, &op, seq, 0, timeoutS_);
  state.setSpinNs(spinNs_);
  // Counted before any path is chosen, on every rank alike (see runAreaBroadcast).
  if (op.kind == CollKind::kBroadcast || op.kind == CollKind::kAllGather) ++areaOps_;
  // More than two ranks, a small all-reduce: recursive doubling or the binomial tree (see the
  // constructor). (Two ranks over tcp have the pair exchange below, which skips recursive
  // doubling's local copy of the input.)
  if (op.kind == CollKind::kAllReduce && n >= 2 && count > 0 && algo != cpu::Algo::kPair &&
      (n > 2 || total <= pairMaxBytes_)) {
    if (total <= flatMaxBytes_ && n > 2 && cpu::rdSymmetric(op)) return runFlat(op, state);
    if (total <= rdMaxBytes_ && cpu::rdSymmetric(op)) {
      return runRecursiveDoubling(op, state, cpu::RdShape::kDoubling);
    }
    if (total <= treeMaxBytes_) return runRecursiveDoubling(op, state, cpu::RdShape::kTree);
  }
  // Mid-sized all-reduces of 3+ ranks: recursive halving and doubling (see the constructor).
  if (op.kind == CollKind::kAllReduce && n > 2 && count > 0 && halvingMinBytes_ != 0 &&
      total >= halvingMinBytes_ && total <= halvingMaxBytes_) {
    return runRecursiveDoubling(op, state, cpu::RdShape::kHalving);
  }
  // Big all-gathers of a power of two of ranks: doubling or the ring, by rank 0's timing.
  // (gatherTunable: whatever this rank's size, so that doubling's links are made below.)
  const bool gatherTunable = op.kind == CollKind::kAllGather && n > 2 && (n & (n - 1)) == 0 &&
                             count > 0 && gatherTuneMinBytes_ != 0;
  const bool tuneGather = gatherTunable && total >= gatherTuneMinBytes_;
  if (op.kind == CollKind::kAllGather && n > 2 && count > 0 &&
      inArea(total, areaGatherMinBytes_, areaGatherMaxBytes_)) {
    return runAreaBroadcast(op, state);
  }
  if (op.kind == CollKind::kAllGather && n > 2 && count > 0) {
    if (total <= flatGatherMaxBytes_) return runFlat(op, state);
    // The tree for the smaller sizes, doubling above (the all-reduce's order is the other way).
    if ((n & (n - 1)) == 0 && total <= std::max(rdGatherMaxBytes_, treeGatherMaxBytes_) &&
        !tuneGather) {
      return runRecursiveDoubling(
          op, state, total <= treeGatherMaxBytes_ ? cpu::RdShape::kTree : cpu::RdShape::kDoubling);
    }
  }
  if (op.kind == CollKind::kBroadcast && n > 2 && count > 0 &&
      inArea(total, areaBcastMinBytes_, areaBcastMaxBytes_)) {
    return runAreaBroadcast(op, state);
  }
  if (op.kind == CollKind::kBroadcast && n > 2 && flatBcastMinBytes_ != 0 &&
      total >= flatBcastMinBytes_) {
    return runFlat(op, state);
  }
  transport::FifoView** sendTo = ringSend_;
  transport::FifoView** recvFrom = ringRecv_;
  if (n > 1 && count > 0 && !ringSend_[nch - 1]) {  // channels are set up in order
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<LinkNeed> needs;
    for (int c = 0; c < nch; ++c) {
      needs.push_back({next, c, true});
      needs.push_back({prev, c, false});
    }
    Status s = comm_.links().ensure(needs);
    if (!s.ok()) return s.withContext("rank " + std::to_string(r) + ": " + state.what());
    for (int c = 0; c < nch; ++c) {
      ringSend_[c] = comm_.links().send(next, c);
      ringRecv_[c] = comm_.links().recv(prev, c);
    }
  }
  // Two ranks over shm, a big all-reduce: the ring while copies between their CPUs run fast,
  // the exchange (cpu::exchangeAllReduce) while they run slow -- rank 0's verdict on its link,
  // passed to rank 1 ahead of the data (see the constructor). Both calls must be out of place
  // (the peer reads this rank's input while it writes its output): rank 1 answers whether they
  // go by exchange.
  if (op.kind == CollKind::kAllReduce && n == 2 && count > 0 && exchangeMinBytes_ != 0 &&
      total >= exchangeMinBytes_ && cpu::rdSymmetric(op) && cpu::scalesAlike(op) &&
      !comm_.links().ringUsesNet()) {
    // (Buffers that overlap in part count as in place.)
    const bool outOfPlace = op.outOfPlace(total);
    int way;
    {
      Waiter w(&state);
      way = cpu::passWay(0, total, r, n, ringRecv_[0], ringSend_[0],
                         r == 0 && outOfPlace ? exchangeNow() : 0, &w);
      if (way >= 0) {
        way = cpu::passWay(1, total, r, n, ringRecv_[0], ringSend_[0],
                           way == 1 && outOfPlace ? 1 : 0, &w);
      }
    }
    if (!state.status().ok()) return state.status();
    if (way == 1) algo = cpu::Algo::kExchange;
  }
  // Broadcasts by the machine's state (see the constructor): the root goes flat while its
  // copies into the ring's slots run slow and says so by a marker down the chain; the chain
  // needs no word ahead of its data.
  if (op.kind == CollKind::kBroadcast && n > 2 && count > 0 && stateBcastMinBytes_ != 0) {
    Status s = ensureFlatLinks(state);
    if (!s.ok()) return s;
    const bool rootFlat = r == op.root && total >= stateBcastMinBytes_ &&
                          total <= stateBcastMaxBytes_ && flatBroadcastNow();
    bool flat;
    {
      Waiter w(&state);
      flat = cpu::broadcastWay(op, total, r, n, ringRecv_[0], ringSend_[0], rootFlat, &w);
    }
    if (!state.status().ok()) return state.status();
    if (flat) return runFlat(op, state);
  }
  const int tuneBucket = tuneGather ? TwoWayTuner::bucketOf(total) : 0;
  const Clock::time_point tuneStart = tuneGather ? Clock::now() : Clock::time_point{};
  int gatherWay = -1;  // tuneGather: 0 doubling, 1 the ring
  if (gatherTunable) {
    // Doubling's links before any marker: a rank failing on the marker must not leave its
    // partners waiting for it in a link's setup (whatever the size of this rank's call).
    Status s = ensureRdLinks(state);
    if (!s.ok()) return s;
  }
  if (tuneGather) {
    {
      Waiter w(&state);
      gatherWay = cpu::passWay(0, total, r, n, ringRecv_[0], ringSend_[0],
                               r == 0 ? algoTuner_.pick(tuneBucket) : -1, &w);
    }
    if (!state.status().ok()) return state.status();
    if (gatherWay == 0) {
      Status s = runRecursiveDoubling(op, state, cpu::RdShape::kDoubling);
      if (r == 0 && s.ok()) recordAlgoRun(tuneBucket, 0, tuneStart);
      return s;
    }
  }

  // A slot's worth per step for big messages; smaller steps for mid-sized ones, so that a
  // message still crosses in several pipelined steps (copy-in on one side overlapping
  // copy-out on the other) instead of one slot at a time in lock-step.
  const size_t unit = bytes ? 1 : elem;
  // Two ranks over the network, broadcast: a step may fill a whole slot (Links).
  const bool wholeSlots = n == 2 && op.kind == CollKind::kBroadcast && comm_.links().ringUsesNet();
  const size_t slotUnits =
      (wholeSlots ? comm_.links().ringSlotBytes() : comm_.links().ringStepBytes()) / unit;
  const size_t perRankShare = op.kind == CollKind::kAllReduce ? count / size_t(n) : count;
  // Never more than a slot holds (a small NCCL_BUFFSIZE can make slots smaller than
  // kMinChunkBytes).
  // Two ranks over the network: cutting a slot into steps buys no overlap (there is no next
  // hop to forward to, and the sockets' buffers already pipeline the bytes) but costs each
  // step its system calls and wake-ups. Measured at 512 KiB over loopback tcp, 5 interleaved
  // runs each: all_reduce 109-153 us against 209-238 us, all_gather 63-117 against 107-145.
  // Two ranks, an all-gather over shm: an exchange, each rank as busy as the other, so
  // pipelining buys no overlap, and sending by address (single copy) halves what each copies
  // -- up to 16 MiB: beyond, memory bandwidth is what counts, both ways move the same bytes
  // through it, and slots win. Medians of 3-5 interleaved runs, us (by address in one step per
  // slot / through slots in 4 / Open MPI): 256 KiB 13.7 / 26.5 / 12.6; 1 MiB 65 / 109 / 84;
  // 2 MiB 181 / 217 / 162; 16 MiB 1516 / 1772 / 1473; 32 MiB 5431 / 4242 / 4476; 64 MiB
  // 14412 / 10900 / 11611. Each block now goes in one chunk (cpu::runPairByAddress).
  // A broadcast the same way, up to 16 MiB: the receiver and the root (helping) each copy
  // part of one big chunk at once, where the slots' pipeline copies everything twice. In
  // place, 5 interleaved runs, medians, us (by address / slots / Open MPI): 128 KiB 13.0 /
  // 59.9 (13.7-79.0) / 14.9; 256 KiB 20.4 / 26.7 / 26.5; 1 MiB 81.9 / 100.8 / 108.1; 4 MiB
  // 320 / 390 / 445; 16 MiB 3008 / 3706 / 3255; 64 MiB 12065 / 9903 / 9767.
  // All-gathers by timing (TwoWayTuner, below) take the pair path at every size: above 16 MiB
  // the slots win in the fast state and by address in the slow one (64 MiB: 15.5 ms through
  // the slots against Open MPI's 9.5, with a cache line's round trip at 335 ns).
  const bool pairByAddress = n == 2 && bytes && !comm_.links().ringUsesNet() &&
                             (total <= kPairByAddressMaxBytes ||
                              (op.kind == CollKind::kAllGather && pairWay_ != kPairByAddress));
  const bool exchange = pairByAddress && op.kind == CollKind::kAllGather;
  const size_t steps = (n == 2 && comm_.links().ringUsesNet()) || exchange ? 1 : kPipelineSteps;
  // The exchange's chunks that cannot go by address gain nothing from smaller steps (each rank
  // reduces what it receives; nothing goes on): a slot each.
  const size_t chunk = algo == cpu::Algo::kExchange
                           ? slotUnits
                           : algo::pipelinedChunk(slotUnits, perRankShare, nch, steps,
                                                  std::max<size_t>(kMinChunkBytes / unit, 1));
  const size_t per = algo::channelShare(count, nch);
  // The exchange by address or through the slots: whichever this rank's recent ones of this
  // size took less time (TwoWayTuner), for its own sends; the peer takes either.
  cpu::Pair pair = pairByAddress ? cpu::Pair::kByAddress : cpu::Pair::kNo;
  const int bucket = TwoWayTuner::bucketOf(total);
  // Only where the ways differ: a block under the link's single-copy minimum goes through the
  // slots (or cells) either way, and timing it costs two clock reads a call (2 ranks, 64 B
  // all-gathers: 18% of the time went to clock_gettime).
  const bool tune = exchange && pairWay_ == kPairTimed && sendTo[0] && sendTo[0]->conn &&
                    sendTo[0]->conn->sendsByAddress(per);
  if ((tune && pairTuner_.pick(bucket) == 1) || (exchange && pairWay_ == kPairThroughSlots)) {
    pair = cpu::Pair::kThroughSlots;
  }
  const Clock::time_point start = tune ? Clock::now() : Clock::time_point{};
  auto runChannel = [&](int c) {
    size_t base = std::min(per * size_t(c), count);
    algo::RingArgs ra{r, n, op.root, base, std::min(per, count - base), count, chunk};
    Waiter w(&state);
    cpu::runRingChannel(op, algo, ra, pair, sendTo[c], recvFrom[c], &w);
  };
  for (int c = 1; c < nch; ++c) {
    channelWorkers_[size_t(c - 1)]->post([&runChannel, c] { runChannel(c); });
  }
  runChannel(0);
  for (int c = 1; c < nch; ++c) channelWorkers_[size_t(c - 1)]->wait();
  if (tune && state.status().ok()) {
    recordRun(pairTuner_, bucket, pair == cpu::Pair::kThroughSlots ? 1 : 0, start,
              "two-rank all-gathers", "by address", "through the slots");
  }
  if (gatherWay == 1 && r == 0 && state.status().ok()) recordAlgoRun(tuneBucket, 1, tuneStart);
  return state.status();
}

Status Engine::ensureFlatLinks(OpState& state) {
  const int n = comm_.nranks(), r = comm_.rank();
  if (flatLinks_.send.empty()) {
    std::vector<LinkNeed> needs;
    for (int p = 0; p < n; ++p) {
      if (p != r) needs.insert(needs.end(), {{p, 0, true}, {p, 0, false}});
    }
    Status s = comm_.links().ensure(needs);
    if (!s.ok()) return s.withContext("rank " + std::to_string(r) + ": " + state.what());
    flatLinks_.chunkBytes = comm_.links().minSlotBytes();
    flatLinks_.send.assign(size_t(n), nullptr);
    flatLinks_.recv.assign(size_t(n), nullptr);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      flatLinks_.send[size_t(p)] = comm_.links().send(p, 0);
      flatLinks_.recv[size_t(p)] = comm_.links().recv(p, 0);
    }
  }
  return Status::Ok();
}

Status Engine::runFlat(const CollArgs& op, OpState& state) {
  const int n = comm_.nranks(), r = comm_.rank();
  Status s = ensureFlatLinks(state);
  if (!s.ok()) return s;
  Waiter w(&state);
  if (op.kind == CollKind::kAllGather) {
    cpu::runFlatAllGather(op, op.count * dtypeSize(op.dtype), r, n, flatLinks_, &w);
  } else if (op.kind == CollKind::kBroadcast) {
    cpu::runFlatBroadcast(op, op.count * dtypeSize(op.dtype), r, n, flatLinks_, &w);
  } else {
    cpu::runFlatAllReduce(op, r, n, flatLinks_, &w);
  }
  return state.status();
}

Status Engine::ensureRdLinks(OpState& state) {
  const int n = comm_.nranks(), r = comm_.rank();
  if (!rdReady_) {
    const algo::RdPlan plan = algo::rdPlan(r, n);
    std::vector<LinkNeed> needs;
    if (plan.fold >= 0) needs.insert(needs.end(), {{plan.fold, 0, true}, {plan.fold, 0, false}});
    for (int k = 0; k < plan.steps && !plan.extra; ++k) {
      const int peer = algo::rdPartner(r, k);
      needs.insert(needs.end(), {{peer, 0, true}, {peer, 0, false}});
    }
    Status s = comm_.links().ensure(needs);
    if (!s.ok()) return s.withContext("rank " + std::to_string(r) + ": " + state.what());
    if (plan.fold >= 0) {
      rdLinks_.foldSend = comm_.links().send(plan.fold, 0);
      rdLinks_.foldRecv = comm_.links().recv(plan.fold, 0);
    }
    for (int k = 0; k < plan.steps && !plan.extra; ++k) {
      rdLinks_.send[k] = comm_.links().send(algo::rdPartner(r, k), 0);
      rdLinks_.recv[k] = comm_.links().recv(algo::rdPartner(r, k), 0);
    }
    rdReady_ = true;
  }
  return Status::Ok();
}

Status Engine::runRecursiveDoubling(const CollArgs& op, OpState& state, cpu::RdShape shape) {
  const int n = comm_.nranks(), r = comm_.rank();
  Status s = ensureRdLinks(state);
  if (!s.ok()) return s;
  // Crowded all-gathers: each stage by address or through the slots, whichever this rank's
  // recent ones of this size took less time (TwoWayTuner; as the two-rank exchange).
  const bool timed = op.kind == CollKind::kAllGather && rdLinks_.gatherTimed;
  const int bucket = TwoWayTuner::bucketOf(op.count * dtypeSize(op.dtype) * size_t(n));
  if (timed) {
    rdLinks_.gatherByAddress =
        pairWay_ == kPairTimed ? gatherTuner_.pick(bucket) == 0 : pairWay_ == kPairByAddress;
  }
  const Clock::time_point start = timed ? Clock::now() : Clock::time_point{};
  {
    Waiter w(&state);
    cpu::runRecursiveDoubling(op, r, n, rdLinks_, shape, &w);
  }
  if (timed && pairWay_ == kPairTimed && state.status().ok()) {
    recordRun(gatherTuner_, bucket, rdLinks_.gatherByAddress ? 0 : 1, start,
              "doubling all-gather stages", "by address", "through the slots");
  }
  return state.status();
}

Status Engine::runP2p(const std::vector<const CollArgs*>& ops) {
  const int me = comm_.rank();
  const uint64_t seq = comm_.nextSeq();
  struct Item {
    const CollArgs* op;
    size_t bytes;
    size_t done = 0;
  };
  // Per peer, in issue order: the k-th send to a peer pairs with that peer's k-th receive.
  std::map<int, std::deque<Item>> sends, recvs;
  std::deque<Item> selfSends, selfRecvs;
  std::vector<LinkNeed> needs;
  for (const CollArgs* op : ops) {
    size_t bytes = op->count * dtypeSize(op->dtype);
    if (bytes == 0) continue;  // a zero-byte send/recv moves nothing on either side
    bool isSend = op->kind == CollKind::kSend;
    TUTTI_INFO(log::kP2p, "%s: opCount %llx buff %p count %zu datatype %d peer %d comm %p",
               collKindName(op->kind), static_cast<unsigned long long>(seq),
               isSend ? op->send : static_cast<const void*>(op->recv), op->count, op->dtype,
               op->root, static_cast<void*>(&comm_));
    if (op->root == me) {
      (isSend ? selfSends : selfRecvs).push_back({op, bytes});
      continue;
    }
    (isSend ? sends : recvs)[op->root].push_back({op, bytes});
    needs.push_back({op->root, 0, isSend});
  }
  OpState state(comm_, nullptr, seq, ops.size(), timeoutS_);
  state.setSpinNs(spinNs_);
  // Sends to self meet receives from self in order; they must agree in size.
  if (selfSends.size() != selfRecvs.size()) {
    return invalidUsage("rank " + std::to_string(me) + ": " + state.what() + " has " +
                        std::to_string(selfSends.size()) + " send(s) to itself but " +
                        std::to_string(selfRecvs.size()) + " receive(s) from itself");
  }
  for (size_t i = 0; i < selfSends.size(); ++i) {
    if (selfSends[i].bytes != selfRecvs[i].bytes) {
      return invalidUsage("rank " + std::to_string(me) + ": send to self of " +
                          std::to_string(selfSends[i].bytes) + " bytes meets a receive of " +
                          std::to_string(selfRecvs[i].bytes) + " bytes");
    }
    memmove(selfRecvs[i].op->recv, selfSends[i].op->send, selfSends[i].bytes);
  }
  if (needs.empty()) return Status::Ok();
  if (Status s = comm_.links().ensure(needs); !s.ok()) {
    return s.withContext("rank " + std::to_string(me) + ": " + state.what());
  }
  Waiter w(&state);
  Waiter::Clock::time_point since{}, spinStart{};
  bool spinning = spinNs_ > 0;
  Status lastChance;
  for (uint32_t idle = 0;;) {
    bool moved = false, pending = false;
    for (auto& [peer, q] : sends) {
      transport::FifoView& f = *comm_.links().send(peer, 0);
      while (!q.empty()) {
        Item& it = q.front();
        size_t n = std::min(comm_.links().stepBytesFor(peer), it.bytes - it.done);
        if (f.ctrl->head.load(std::memory_order_acquire) + f.window(n) <= f.step) break;
        memcpy(f.payload(f.step, n), static_cast<const char*>(it.op->send) + it.done, n);
        it.done += n;
        f.ctrl->sizes[f.step % transport::kSteps].store(
            n | (it.done == it.bytes ? transport::kLastSlot : 0), std::memory_order_relaxed);
        transport::postTail(f);
        moved = true;
        if (it.done == it.bytes) q.pop_front();
      }
      pending |= !q.empty();
    }
    for (auto& [peer, q] : recvs) {
      transport::FifoView& f = *comm_.links().recv(peer, 0);
      if (!q.empty() && f.conn->drivesIo()) f.conn->poll();  // tcp: read the socket ourselves
      while (!q.empty() && transport::posted(f)) {
        Item& it = q.front();
        uint64_t word = transport::postedWord(f);
        size_t n = word & transport::kSizeMask;
        bool last = word & transport::kLastSlot;
        if (it.done + n > it.bytes || (last && it.done + n < it.bytes)) {
          return invalidUsage("rank " + std::to_string(me) + ": rank " + std::to_string(peer) +
                              " sent a message of " + (last ? "" : "more than ") +
                              std::to_string(it.done + n) + " bytes to a receive of " +
                              std::to_string(it.bytes) + " bytes (" + state.what() + ")");
        }
        memcpy(static_cast<char*>(it.op->recv) + it.done, f.payload(f.step, n), n);
        it.done += n;
        transport::postHead(f);
        moved = true;
        if (it.done == it.bytes) q.pop_front();
      }
      pending |= !q.empty();
    }
    if (!pending) return Status::Ok();
    if (moved) {
      idle = 0;
      since = {};
      spinStart = {};
      spinning = spinNs_ > 0;
      lastChance = Status::Ok();
      continue;
    }
    ++idle;
    if (idle == 16 && spinning) {  // no busy-polling for a peer that shares this CPU (Waiter)
      for (auto& [peer, q] : sends) {
        if (!q.empty())
          spinning &= !Waiter::peerOnMyCpu(*comm_.links().send(peer, 0), Waiter::Dir::kSend);
      }
      for (auto& [peer, q] : recvs) {
        if (!q.empty())
          spinning &= !Waiter::peerOnMyCpu(*comm_.links().recv(peer, 0), Waiter::Dir::kRecv);
      }
    }
    if (spinning) {
      cpuRelax();
      if ((idle & 255) != 255) continue;
      auto t = Waiter::Clock::now();
      if (spinStart.time_since_epoch().count() == 0) spinStart = t;
      if (t - spinStart >= std::chrono::nanoseconds(spinNs_)) spinning = false, idle = 0;
      if ((idle & 4095) != 4095) continue;
    } else {
      if (idle < 4096) {
        sched_yield();
      } else {
        timespec ts{0, 50 * 1000};
        nanosleep(&ts, nullptr);
      }
      if ((idle & 31) != 0) continue;
    }
    // A problem found now fails the operation only if the next pass moves nothing: a peer
    // may have delivered its last slots just before it left.
    if (!lastChance.ok()) {
      w.fail(lastChance);
      return state.status();
    }
    for (auto& [peer, q] : sends) {
      if (q.empty() || !lastChance.ok()) continue;
      lastChance = w.problem(*comm_.links().send(peer, 0), "sending to", &since);
    }
    for (auto& [peer, q] : recvs) {
      if (q.empty() || !lastChance.ok()) continue;
      lastChance = w.problem(*comm_.links().recv(peer, 0), "receiving from", &since);
    }
  }
}

}  // namespace tutti
