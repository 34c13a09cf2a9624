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
constexpr int kChannelCap = 16;
// Mid-sized messages are cut into about this many steps per channel, but no step is smaller
// than kMinChunkBytes (each step costs a counter round trip).
constexpr size_t kPipelineSteps = 4;
constexpr size_t kMinChunkBytes = 16 << 10;
// Two-rank all-gathers and broadcasts over shm up to this total send by address (below).
constexpr size_t kPairByAddressMaxBytes = 16 << 20;

}  // namespace

Engine::Engine(Comm& comm) : comm_(comm), runner_(comm.cudaDev()) {
  // Channels must agree on every rank, so the default comes from what all ranks share: the
  // fewest hardware threads per local rank on any host, capped at 4.
  int fit = INT_MAX;
  for (const PeerInfo& p : comm.peers()) {
    int local = 0;
    for (const PeerInfo& q : comm.peers()) local += q.hostHash == p.hostHash;
    fit = std::min(fit, std::max(1, p.cpus / std::max(1, local)));
  }
  maxChannels_ = static_cast<int>(
      std::clamp<int64_t>(env::getInt("NCCL_MAX_NCHANNELS", std::min(fit, 4)), 1, kChannelCap));
  minChannels_ =
      static_cast<int>(std::clamp<int64_t>(env::getInt("NCCL_MIN_NCHANNELS", 1), 1, kChannelCap));
  maxChannels_ = std::max(maxChannels_, minChannels_);
  timeoutS_ = env::getDouble("TUTTI_TIMEOUT", 1800);
  pairMaxBytes_ = static_cast<size_t>(env::getInt("TUTTI_PAIR_MAX_BYTES", 64 << 10));
  // Small all-reduces of 3+ ranks skip the ring's 2(n-1) dependent steps, by size:
  //  - flat: every rank sends its input to every other and combines all n itself (one step,
  //    n(n-1) messages);
  //  - recursive doubling: log2(n) exchange steps, n log2(n) messages;
  //  - the binomial tree over doubling's links: 2 log2(n) steps, 2(n-1) messages.
  // The choice must agree on every rank, so it looks at every machine: does one hold more
  // ranks than it has CPUs (network namespaces share the CPUs)? With a core per rank, steps
  // cost most: doubling over tcp up to 256 KiB (each ring step is a socket round trip), over
  // shm up to 2 KiB (it moves log2(n) whole vectors per rank where the ring moves about two).
  // With ranks sharing cores, what every message costs (system calls, being scheduled)
  // counts as much. 8 ranks on 2 cores, medians of 6-8 interleaved runs, us:
  //  - tcp 8 B: tree 129-143, doubling 141-169, Open MPI 167-170; 32 KiB: 187-204, 279-300,
  //    394; 256 KiB: tree 923-937, ring 1445-1648, Open MPI 1641-1982. With 4 ranks doubling
  //    still wins the small sizes (8 B: 49 against the tree's 57): the tree from 8 ranks.
  //  - shm 8 B: flat 17, doubling 25-37, Open MPI 24-26; 2 KiB: 34, 45, 43; 8 KiB: 88, 73,
  //    123; 64 KiB: tree 115, doubling 162, ring 166; 256 KiB: ring 324, tree 472.
  bool anyNet = false;
  for (int p = 1; p < comm.nranks(); ++p) anyNet |= comm.links().netBetween(0, p);
  bool crowded = false, oversubscribed = false;  // some machine / this rank's machine
  const std::vector<PeerInfo>& peers = comm.peers();
  for (const PeerInfo& p : peers) {
    int local = 0;
    for (const PeerInfo& q : peers) local += q.machineHash == p.machineHash;
    const bool over = local > machineCpus(peers.data(), peers.size(), p.machineHash);
    crowded |= over;
    if (p.rank == comm.rank()) oversubscribed = over;
  }
  rdLinks_.gatherByAddress = crowded;
  rdLinks_.gatherTimed = crowded && !anyNet;  // tcp sends every way alike
  size_t rdDefault = anyNet ? 256 << 10 : 2 << 10, treeDefault = 0, flatDefault = 0;
  size_t flatGatherDefault = 0, rdGatherDefault = 0, treeGatherDefault = 0, stateBcastDefault = 0;
  size_t gatherTuneDefault = 0, areaBcastDefault = 0, areaGatherDefault = 0;
  if (crowded) {
    rdDefault = anyNet ? (comm.nranks() >= 8 ? 0 : 256 << 10) : 16 << 10;
    treeDefault = anyNet ? 256 << 10 : 128 << 10;
    flatDefault = anyNet || comm.nranks() > 8 ? 0 : 2 << 10;  // n(n-1) links: measured to 8
    // All-gathers, 8 ranks on 2 cores, 3-6 interleaved runs, us: shm 64 B-16 KiB flat 12-32,
    // ring 16-38, Open MPI 16-77; 64 KiB flat 72-105, ring 31-55. tcp 64 B-16 KiB tree
    // 99-205, doubling 152-230, ring 221-631, Open MPI 132-197; 256 KiB tree 572-617, ring
    // 558-785, Open MPI 665-984; 1 MiB ring 1347-1941, tree 1827-2386. With 4 ranks over tcp
    // all were within each other's noise (51-107): the ring stays.
    // Since then the doubling all-gather (below) took over from the ring, and against it the
    // flat exchange won up to 256 KiB at 8 ranks: a survey, every variant in turn in random
    // order, 9 minutes, medians, us (flat / doubling / Open MPI with yield_when_idle): fast
    // state, 129-139 runs each: 32 KiB 25 / 33 / 84; 128 KiB 61 / 78 / 135; 256 KiB 141 / 143
    // / 187; 512 KiB 343 / 293 / 289; slow state, 10-17 runs: 32 KiB 60 / 69 / 130; 128 KiB
    // 167 / 215 / 285; 256 KiB 281 / 310 / 507; 512 KiB 390 / 627 / 766. So to 256 KiB at 8
    // ranks (its slots touch 256 KiB of each of the 56 links: 14 MiB of shm); fewer ranks were
    // not surveyed and keep 16 KiB.
    flatGatherDefault = anyNet || comm.nranks() > 8 ? 0 : comm.nranks() == 8 ? 256 << 10 : 16 << 10;
    // Since doubling sends by address (tcp: from the output, no copy into a slot), it beats the
    // tree over tcp from 32 KiB: 8 ranks on 2 cores, 3-4 interleaved runs, medians, us: 4 KiB
    // tree 88, doubling 97, Open MPI 164; 32 KiB 111, 107, 146; 256 KiB 356, 220, 523; 2 MiB
    // ring 2259, doubling 1948, Open MPI 2136; 16 MiB 26993 (tree), 24973, 27524.
    treeGatherDefault = anyNet && comm.nranks() >= 8 ? 32 << 10 : 0;
    // Then doubling for every size, every block sent by address (shm single copy:
    // RdLinks::gatherByAddress): each byte is copied once, where the ring through slots copies
    // it twice, and the cores are what is short. Over shm, 8 ranks on 2 cores, 3-4 interleaved
    // runs, medians, us: 32 KiB doubling 37, ring 48, Open MPI 68; 128 KiB 92, 96, 125; 256 KiB
    // 169, 214, 211; 2 MiB 1103, 1314, 1061; 16 MiB 15035, 14205, 13998. With 4 ranks the ring
    // stays (256 KiB: ring 60, doubling 91, Open MPI 85; 2 MiB 667, 687, 547).
    rdGatherDefault = comm.nranks() < 8 ? 0 : size_t(1) << 62;
    // But from 8 MiB the ring beat doubling while a cache line crossed fast, and lost while it
    // crossed slow: so rank 0 times both and picks (TwoWayTuner), telling the others by a
    // marker down the ring chain. 8 ranks, survey, medians, us (tuned / doubling / ring / Open
    // MPI): fast state, 13-17 runs each: 4 MiB 2039 / 2070 / 2154 / 2577; 16 MiB 8833 / 11893 /
    // 8504 / 13428; 64 MiB 34863 / 48943 / 35540 / 51859; slow state, 3-8 runs: 4 MiB 3287 /
    // 3186 / 3379 / 4296; 16 MiB 11541 / 12382 / 14543 / 13702; 64 MiB 43297 / 41316 / 55804 /
    // 45284; in two interleaved runs, fast, 8 MiB 6032-6904 / 4364-4870 (doubling / ring). At
    // 4 MiB the ways are even: from 8 MiB.
    gatherTuneDefault = !anyNet && comm.nranks() >= 8 ? 8 << 20 : 0;
    // Broadcasts by size alone stay on the ring chain by default. The flat broadcast (every
    // receiver reading the root's buffer by address) measured ahead of it once (8 ranks, 256 KiB:
    // 153 against 214 us) but behind it since the per-message savings of d07441b-d837d1d: 8 ranks
    // on 2 cores, in place, 6-8 interleaved runs, medians, us (flat / chain / Open MPI): 64 KiB 62
    // / 38 / 53; 256 KiB 183 / 95 / 150; 2 MiB 1249 / 1104 / 1038; 16 MiB 13280 / 8912 / 11071; 64
    // MiB 54612 / 43237 / 42293 (runs begun in both cache states). But while the two vCPUs sit on
    // different dies (a cache line's round trip ~330 ns, not ~85) the chain's hand-offs of freshly
    // written lines cost most and the flat broadcast, reading the root's clean buffer, wins: 256
    // KiB 281-363 / 158-159 / 186-229 (chain / flat / Open MPI); 2 MiB 2322-2576 / 1205-1337 /
    // 1311-1382; 16 MiB 11638 / 11145 / 10823; in the fast state at the same minutes 2 MiB 628-736
    // / 915-1188 / 805-1362, 16 MiB 7954-8079 / 9325-10780 / 9252-9573. Over shm the root can pick
    // by state (flatBroadcastNow: its copies into the ring's slots run slow in the slow state) and
    // tell the others first, from 128 KiB to 4 MiB. A survey of 8 ranks, in place, each run between
    // two line round trips, every variant in turn, 17 minutes, medians, us (state / chain / flat /
    // Open MPI): both round trips under 150 ns, 80-104 runs each: 256 KiB 91 / 87 / 162 / 145; 1
    // MiB 357 / 378 / 593 / 490; 2 MiB 999 / 1012 / 1150 / 974; 4 MiB 2113 / 2046 / 2441 / 2316; 16
    // MiB (chain) 8681 / 12662 / 11843; both over 250 ns, 5-20 runs each: 256 KiB 242 / 397 / 195 /
    // 217; 1 MiB 817 / 1296 / 826 / 854; 2 MiB 1755 / 1963 / 1615 / 1623; 4 MiB 3148 / 3573 / 3484
    // / 3312; 16 MiB (chain) 12825 / 14221 / 12891, so not above 4 MiB. The root tells the others
    // only when it goes flat, by a marker (with its byte count) that each rank passes down the ring
    // chain before its flat receive; the chain's own first payload says "chain", so the chain and
    // the sizes outside the range pay nothing. (A 16-byte header from the root on every broadcast,
    // as first built, doubled the tiny ones: 8 B 8.75 against 4.28 us.) A survey of 8 ranks,
    // in place, every variant in turn in random order, 13 minutes, medians, us (state / chain /
    // flat / Open MPI): fast state, 70-78 runs each: 8 B 3.0 / 2.9 / - / 1.7; 32 KiB 18.2 /
    // 18.3 / - / 36.9; 256 KiB 89 / 85 / 161 / 140; 1 MiB 324 / 320 / 536 / 477; 4 MiB 2101 /
    // 2120 / 2482 / 2288; slow state, 8-16 runs each: 8 B 3.5 / 3.1 / - / 2.0; 256 KiB 254 /
    // 401 / 201 / 197; 1 MiB 896 / 1239 / 759 / 696; 4 MiB 3607 / 3575 / 3573 / 3015. On by
    // default where it was measured, ranks crowded over shm; the flat broadcast by size alone
    // (TUTTI_FLAT_BROADCAST_MIN_BYTES) stays off. The verdict is timed anew (by the chain, some
    // 8 broadcasts) after every TUTTI_STATE_BROADCAST_RECHECK flat ones: a survey, slow state,
    // 28-34 runs each, us (every 256 / every 64 / chain / flat / Open MPI): 256 KiB 209 / 234 /
    // 333 / 196 / 185; 1 MiB 710 / 840 / 1198 / 616 / 642; fast state, 263-279 runs: 256 KiB
    // 80 / 83 / 83 / 153 / 134; 1 MiB 306 / 314 / 305 / 503 / 449. So 256.
    stateBcastDefault = anyNet || comm.nranks() > 8 ? 0 : 128 << 10;
    // From 8 ranks, broadcasts from 4 KiB to 4 MiB go through the shared area instead
    // (transports/shm/area.h): the root copies each chunk once, every other rank copies it
    // out -- n copies where the chain makes 2(n-1) and the flat broadcast n-1 by
    // process_vm_readv (5-11 GB/s here against memcpy's 27-46). Surveys of 8 ranks, every
    // variant in turn in random order, medians, us (area / default before it / Open MPI),
    // fast state, 70-230 runs each: 512 B 1.32 / 1.12 / 9.78; 2 KiB 1.63 / 1.48 / -; 4 KiB
    // 2.17 / 3.42 / -; 8 KiB 2.75 / 4.86 / 24.30; 32 KiB 8.16 / 15.31 / 30.14; 256 KiB 51.3 /
    // 80.5 / 115.6; 2 MiB 789 / 1078 / 838; 4 MiB 2137 / 2383 / 1901; 16 MiB 9350 / 9285 /
    // 10040; slow state, 13-25 runs: 8 KiB 6.07 / 10.05 / 31.02; 32 KiB 20.1 / 41.3 / 38.0;
    // 256 KiB 167 / 224 / 181; 2 MiB 1529 / 1850 / 1375; 4 MiB 3693 / 3521 / 2561; 16 MiB
    // 13732 / 12936 / 11079. So from 4 KiB (cells carry up to 2 KiB at 64 steps ahead) to 4 MiB.
    // With 3 and 4 ranks the area won the fast state (4 ranks, 256 KiB: 27.5 / 46.5 / 53.3) but
    // lost the slow one by 2-3x (2 MiB: 1155 / 608 / 1332; 3 ranks 1069 / 337 / 386), so it is
    // on at 8 ranks, where it was measured (5-7 and more than 8 were not; it also makes the
    // n(n-1) flat links, for its waits' health checks and names). More slots barely helped (4
    // MiB with 16 / 32 / 64 slots of 128 KiB: 2242 / 2252 / 2102 fast): 16, 2 MiB per
    // communicator.
    areaBcastDefault = anyNet || comm.nranks() != 8 ? 0 : 4 << 10;
    // All-gathers the same way, every rank's block in turn (the rounds pipeline through the
    // slots as one broadcast whose root changes): n writes and n(n-1) reads, all memcpy. A
    // survey of 8 ranks, medians, us (area / default before it / Open MPI), fast state,
    // 98-115 runs each: 4 KiB 32.2 / 12.3 / 31.6; 32 KiB 37.6 / 20.8 / 78.8; 256 KiB 87.5 /
    // 105.2 / 180.1; 2 MiB 839 / 1072 / 900; 16 MiB 9118 / 12542 / 12764; 64 MiB 37248 / 44389 /
    // 55721; slow state, 10-20 runs: 32 KiB 55.3 / 46.4 / 111.7; 256 KiB 186 / 257 / 378; 2
    // MiB 1445 / 2204 / 2343; 16 MiB 13322 / 17573 / 11592; 64 MiB 55717 / 73433 / 51550. So
    // from 256 KiB (the flat exchange's last size) at 8 ranks.
    areaGatherDefault = anyNet || comm.nranks() != 8 ? 0 : 256 << 10;
  }
  flatMaxBytes_ = static_cast<size_t>(env::getInt("TUTTI_FLAT_MAX_BYTES", int64_t(flatDefault)));
  flatGatherMaxBytes_ = static_cast<size_t>(
      env::getInt("TUTTI_FLAT_ALLGATHER_MAX_BYTES", int64_t(flatGatherDefault)));
  rdGatherMaxBytes_ =
      static_cast<size_t>(env::getInt("TUTTI_RD_ALLGATHER_MAX_BYTES", int64_t(rdGatherDefault)));
  treeGatherMaxBytes_ = static_cast<size_t>(
      env::getInt("TUTTI_TREE_ALLGATHER_MAX_BYTES", int64_t(treeGatherDefault)));
  rdMaxBytes_ = static_cast<size_t>(env::getInt("TUTTI_RD_MAX_BYTES", int64_t(rdDefault)));
  flatBcastMinBytes_ = static_cast<size_t>(env::getInt("TUTTI_FLAT_BROADCAST_MIN_BYTES", 0));
  // Two-rank shm all-gathers: by timing (unset or 1), by address (0), through the slots.
  if (std::optional<std::string> v = env::getString("TUTTI_PAIR_TUNE")) {
    pairWay_ = *v == "0" ? kPairByAddress : *v == "slots" ? kPairThroughSlots : kPairTimed;
    if (*v != "0" && *v != "1" && *v != "slots") {
      TUTTI_WARN("TUTTI_PAIR_TUNE=%s is not 1, 0 or slots: timing the two ways (1)", v->c_str());
    }
  }
  // The way markers (cpu::passWay) are peeked at in the slot before the receive is posted:
  // built and tested over shm only (tcp receives straight into the output once a receive is
  // posted, and over tcp the root's copy verdict never says slow anyway).
  auto shmOnly = [&](const char* name, int64_t byDefault) {
    const auto v = static_cast<size_t>(env::getInt(name, byDefault));
    if (v != 0 && anyNet && comm.rank() == 0) {
      TUTTI_WARN("%s=%zu: ignored, some links go over the network", name, v);
    }
    return anyNet ? 0 : v;
  };
  stateBcastMinBytes_ = shmOnly("TUTTI_STATE_BROADCAST_MIN_BYTES", int64_t(stateBcastDefault));
  stateBcastMaxBytes_ =
      static_cast<size_t>(env::getInt("TUTTI_STATE_BROADCAST_MAX_BYTES", int64_t(4) << 20));
  areaBcastMinBytes_ = shmOnly("TUTTI_AREA_BROADCAST_MIN_BYTES", int64_t(areaBcastDefault));
  areaBcastMaxBytes_ =
      static_cast<size_t>(env::getInt("TUTTI_AREA_BROADCAST_MAX_BYTES", int64_t(4) << 20));
  areaGatherMinBytes_ = shmOnly("TUTTI_AREA_ALLGATHER_MIN_BYTES", int64_t(areaGatherDefault));
  areaGatherMaxBytes_ =
      static_cast<size_t>(env::getInt("TUTTI_AREA_ALLGATHER_MAX_BYTES", int64_t(1) << 62));
  areaSlots_ = int(std::clamp<int64_t>(env::getInt("TUTTI_SHM_AREA_SLOTS", 16), 2, 1024));
  areaChunkBytes_ = size_t(std::clamp<int64_t>(env::getInt("TUTTI_SHM_AREA_CHUNK", 128 << 10), 4096,
                                               int64_t(64) << 20)) /
                    64 * 64;
  // Two ranks over shm: all-reduces from this size go by exchange while copies between the
  // two CPUs run slow (Engine::runCollective).
  // TUTTI_EXCHANGE=1 takes the exchange whatever the state (calls out of place), 0 never
  // (tests, surveys).
  exchangeMinBytes_ = shmOnly("TUTTI_EXCHANGE_MIN_BYTES", int64_t(4) << 20);
  exchangeRecheck_ = static_cast<uint32_t>(
      std::clamp<int64_t>(env::getInt("TUTTI_EXCHANGE_RECHECK", 64), 1, 1 << 20));
  if (std::optional<std::string> v = env::getString("TUTTI_EXCHANGE"); v && !v->empty()) {
    exchangeForced_ = *v == "1" ? 1 : *v == "0" ? 0 : -1;
    if (exchangeForced_ < 0 && comm.rank() == 0) {
      TUTTI_WARN("TUTTI_EXCHANGE=%s is not 1 or 0: by the machine's state", v->c_str());
    }
  }
  stateRecheck_ = static_cast<uint32_t>(
      std::clamp<int64_t>(env::getInt("TUTTI_STATE_BROADCAST_RECHECK", 256), 1, 1 << 20));
  treeMaxBytes_ = static_cast<size_t>(env::getInt("TUTTI_TREE_MAX_BYTES", int64_t(treeDefault)));
  gatherTuneMinBytes_ = shmOnly("TUTTI_ALLGATHER_TUNE_MIN_BYTES", int64_t(gatherTuneDefault));
  // With a core per rank, waits busy-poll (answers come in well under a microsecond), for up
  // to 1 ms so that a short hiccup of the peer (another process, the hypervisor) does not
  // send this rank into yields and naps. With more ranks than cores on this machine (counted
  // across network namespaces: they share the CPUs; cores: the union of the ranks' affinity
  // masks, so ranks bound to a core each are not oversubscribed) waits yield at once, or the
  // rank being waited for never gets to run.
  spinNs_ = env::getInt("TUTTI_SPIN_NS", oversubscribed ? 0 : 1000000);
  if (timeoutS_ <= 0) timeoutS_ = 1e9;
  for (int c = 1; c < maxChannels_; ++c) {
    channelWorkers_.push_back(std::make_unique<Worker>(comm.cudaDev()));
  }
  TUTTI_INFO(
      log::kInit,
      "rank %d: CPU engine, %d-%d channels, %zu-byte ring chunks at most; all-reduce by "
      "flat exchange up to %zu bytes, recursive doubling up to %zu, binomial tree up to %zu; "
      "all-gather by flat exchange up to %zu, binomial tree up to %zu, recursive doubling up to "
      "%zu, by doubling or the ring as rank 0 times them from %zu (0: never); flat broadcast "
      "from %zu (0: never), flat or chain by the machine's state from %zu (0: never) to %zu "
      "(timed anew every %u flat ones); two-rank all-reduce by exchange or the ring by the "
      "machine's state from %zu (0: never)%s; "
      "waits spin up to %lld ns",
      comm.rank(), minChannels_, maxChannels_, comm.links().ringStepBytes(), flatMaxBytes_,
      rdMaxBytes_, treeMaxBytes_, flatGatherMaxBytes_, treeGatherMaxBytes_, rdGatherMaxBytes_,
      gatherTuneMinBytes_, flatBcastMinBytes_, stateBcastMinBytes_, stateBcastMaxBytes_,
      stateRecheck_, exchangeMinBytes_, crowded ? " (more ranks than CPUs on a machine)" : "",
      static_cast<long long>(spinNs_));
}

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
  Code c = comm_.asyncCode();
  if (c != Code::kOk && c != Code::kInProgress) {
    return Status(c, "rank " + std::to_string(comm_.rank()) +
                         ": the communicator failed earlier and cannot run more operations "
                         "(abort it and make a new one): " +
                         comm_.asyncMessage());
  }
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
  // Two ranks, a small all-reduce, no pre-scaling: one exchange beats the ring's two steps.
  // (Over shm the ring is as fast for small messages and faster for larger ones.)
  cpu::Algo algo = op.kind == CollKind::kAllReduce && n == 2 && !op.red.pre &&
                           total <= pairMaxBytes_ && comm_.links().usesNet((r + 1) % n)
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
      return runRecursiveDoubling(op, state, false);
    }
    if (total <= treeMaxBytes_) return runRecursiveDoubling(op, state, true);
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
      return runRecursiveDoubling(op, state, /*tree=*/total <= treeGatherMaxBytes_);
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
      total >= exchangeMinBytes_ && !op.red.pre && cpu::rdSymmetric(op) &&
      !comm_.links().ringUsesNet()) {
    // (Buffers that overlap in part count as in place.)
    const auto* in = static_cast<const char*>(op.send);
    const auto* out = static_cast<const char*>(op.recv);
    const bool outOfPlace = in + total <= out || out + total <= in;
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
      Status s = runRecursiveDoubling(op, state, false);
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

Status Engine::runRecursiveDoubling(const CollArgs& op, OpState& state, bool tree) {
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
    cpu::runRecursiveDoubling(op, r, n, rdLinks_, tree, &w);
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
