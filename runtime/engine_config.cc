// The CPU engine's construction: its channels and workers, and every size threshold and switch
// that picks an algorithm, each from the environment or a default measured where it was set
// (the measurements are in the comments beside them).
#include <algorithm>
#include <climits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/comm.h"
#include "runtime/engine.h"
#include "runtime/env.h"
#include "runtime/host_settings.h"
#include "runtime/links.h"
#include "runtime/log.h"

namespace tutti {
Engine::Engine(Comm& comm)
    : comm_(comm),
      settingsAgree_(checkHostSettingsAgree(comm.peers().data(), comm.peers().size())),
      runner_(comm.cudaDev()) {
  if (!settingsAgree_.ok() && comm.rank() == 0) {
    TUTTI_WARN("%s: host-buffer operations on this communicator will be refused",
               settingsAgree_.message().c_str());
  }
  // Channels must agree on every rank, so the default comes from what all ranks share: the
  // fewest hardware threads per local rank on any host, capped at 4.
  int fit = INT_MAX;
  for (const PeerInfo& p : comm.peers()) {
    int local = 0;
    for (const PeerInfo& q : comm.peers()) local += q.hostHash == p.hostHash;
    fit = std::min(fit, std::max(1, p.cpus / std::max(1, local)));
  }
  maxChannels_ = static_cast<int>(
      std::clamp<int64_t>(env::getInt("NCCL_MAX_NCHANNELS", std::min(fit, 4)), 1, kMaxChannels));
  minChannels_ =
      static_cast<int>(std::clamp<int64_t>(env::getInt("NCCL_MIN_NCHANNELS", 1), 1, kMaxChannels));
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
  //  - shm with fewer ranks the ring wins from 32 KiB: tutti-perf -n 60, the tree up to 128
  //    KiB (before) against the ring from 16 KiB, 4 interleaved runs each, out of place, us: 4
  //    ranks 32 KiB tree 27-33, ring 23-27; 64 KiB 48-61, 33-38; 128 KiB 96-111, 67-75; 3
  //    ranks 64 KiB 34-42, 32-39; 128 KiB 63-91, 58-63; 6 ranks 32 KiB 44-53, 47-72 (the tree
  //    ahead); 64 KiB 80-103, 64-106; 128 KiB 133-194, 117-168. 8 ranks: within each other's
  //    noise (128 KiB 236-315, 183-262): the tree stays. So the tree to 128 KiB from 8 ranks,
  //    to 32 KiB from 5 (5 and 7 not measured), not at all below (doubling takes 16 KiB).
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
    treeDefault = anyNet                                     ? 256 << 10
                  : comm.nranks() >= 8 || comm.nranks() <= 2 ? 128 << 10  // 2: not measured
                  : comm.nranks() >= 5                       ? 32 << 10
                                                             : 0;
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
  // All-reduces of 3+ ranks over the network from 64 KiB to 256 KiB a core rank (p2 of them,
  // a power of two; 128 KiB with extra ranks folding in): recursive halving and doubling,
  // log2(p2) steps each way where the ring takes 2(n-1), each a wait for a partner that may
  // first have to be scheduled. (Below, recursive doubling or the tree take them anyway.)
  // Ranks as processes on this machine's 2 cores over tcp, ring / halving / Open MPI
  // (--oversubscribe, yield_when_idle), 3 interleaved runs, medians, us:
  //   8 ranks: 512 KiB 2878 / 1107 / 1769; 1 MiB 3292 / 2233 / 2383; 2 MiB 5231 / 4929 /
  //   4999; 4 MiB 8674 / 11414 / 10865. 4 ranks: 512 KiB 708 / 318 / 562; 1 MiB 1032 / 700 /
  //   959; 2 MiB 1734 / 1890 / 1865. 6 ranks: 512 KiB 1311 / 654 / 940; 1 MiB 1748 / 1693 /
  //   1331; 2 MiB 2372 / 3667 / 3671. 3 ranks: 512 KiB 289 / 340 / 405.
  // With its sends straight from the output (as since), the default against halving
  // everywhere and Open MPI: 8 ranks 1 MiB 1932 / 2155 / 2483, 2 MiB 4196 / 4088 / 4900, 4 MiB
  // (the ring) 8943 / 9377 / 10902; 4 ranks 2 MiB (the ring) 2023 / 1745 / 2188, 4 MiB 3149 /
  // 4189 / 4655. Runs of one algorithm spread by 10-20% here.
  // Over shm (8 ranks) it won at 512 KiB only (284 against 339) and lost from 1 MiB (2 MiB
  // 2095 against 1224): off there. Ranks with a core each over a real network: not measured.
  // At most 2 MiB (8 ranks lost at 4 MiB; 16 and more were not measured). With 3 ranks the
  // range lies under doubling's and the tree's limits, so it never runs (it lost at 512 KiB).
  int p2 = 1;
  while (p2 * 2 <= comm.nranks()) p2 *= 2;
  const bool halving = anyNet && comm.nranks() > 2;
  halvingMinBytes_ = static_cast<size_t>(
      env::getInt("TUTTI_HALVING_MIN_BYTES", halving ? int64_t(64 << 10) * p2 : 0));
  halvingMaxBytes_ = static_cast<size_t>(env::getInt(
      "TUTTI_HALVING_MAX_BYTES",
      std::min<int64_t>(int64_t(p2 == comm.nranks() ? 256 << 10 : 128 << 10) * p2, 2 << 20)));
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
      "machine's state from %zu (0: never)%s; all-reduce by halving and doubling from %zu (0: "
      "never) to %zu; waits spin up to %lld ns",
      comm.rank(), minChannels_, maxChannels_, comm.links().ringStepBytes(), flatMaxBytes_,
      rdMaxBytes_, treeMaxBytes_, flatGatherMaxBytes_, treeGatherMaxBytes_, rdGatherMaxBytes_,
      gatherTuneMinBytes_, flatBcastMinBytes_, stateBcastMinBytes_, stateBcastMaxBytes_,
      stateRecheck_, exchangeMinBytes_, crowded ? " (more ranks than CPUs on a machine)" : "",
      halvingMinBytes_, halvingMaxBytes_, static_cast<long long>(spinNs_));
}

}  // namespace tutti
