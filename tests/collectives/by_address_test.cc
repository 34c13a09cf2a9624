// Payloads sent by address (shm single copy) in chunks bigger than a slot, and the choices
// between sending by address and through the slots: the flat broadcast, the two-rank exchange
// (by address, or by timing: TwoWayTuner), and broadcasts by the machine's state (two-rank
// all-reduces by state: exchange_test.cc). Ranks are threads of this process; every test also
// checks that a count mismatch fails at once.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "collectives/mismatched.h"
#include "harness/harness.h"
#include "runtime/comm.h"
#include "runtime/links.h"

using namespace tutti::test;

// The flat broadcast (ranks crowded on fewer cores, over shm): payloads sent by address go in
// chunks of up to 8 MiB, bigger than a slot, and the receivers tell them from slot-sized ones;
// without single copy every chunk is a slot. Every rank gets the root's bytes, in place or
// not; a rank that disagrees on the count fails naming the sizes, and none hangs.
TEST(FlatBroadcast, ChunksByAddressOrThroughSlotsAreExactAndACountMismatchFails) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
  ScopedEnv flat("TUTTI_FLAT_BROADCAST_MIN_BYTES", "65536");
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  const int n = 4;
  for (const char* single : {"1", "0"}) {
    ScopedEnv copy("TUTTI_SHM_SINGLE_COPY", single);
    SCOPED_TRACE(std::string("TUTTI_SHM_SINGLE_COPY=") + single);
    // By address: 8 + 8 + 4 MiB and 3 bytes; through slots: a few slots and a partial one.
    const size_t count = std::string(single) == "1" ? (20 << 20) + 3 : (1 << 20) + 3;
    std::vector<ncclComm_t> comms = initThreads(n);
    auto value = [](size_t i, int root) { return uint8_t(i * 131 + size_t(root) * 7 + 1); };
    onThreads(n, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      for (int root : {0, 2}) {
        for (bool inPlace : {false, true}) {
          std::vector<uint8_t> send(count), recv(count, 0);
          for (size_t i = 0; i < count; ++i) send[i] = r == root ? value(i, root) : 0;
          uint8_t* out = inPlace ? send.data() : recv.data();
          ASSERT_EQ(ncclBroadcast(send.data(), out, count, ncclUint8, root, c, nullptr),
                    ncclSuccess)
              << ncclGetLastError(c);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out[i], value(i, root))
                << "rank " << r << " root " << root << " in place " << inPlace << " at " << i;
          }
        }
      }
    });
    // Rank 3 expects half the bytes: it fails on the size, nobody hangs, and a rank that
    // returns success (its whole payload arrived before the failure) holds the root's bytes.
    std::vector<int> wrong(size_t(n), 0);
    auto [rc, msg] = runMismatched(comms, [&](int r, ncclComm_t c) {
      const size_t mine = r == 3 ? count / 2 : count;
      std::vector<uint8_t> buf(mine);
      for (size_t i = 0; i < mine; ++i) buf[i] = r == 0 ? value(i, 0) : 0;
      const ncclResult_t res =
          ncclBroadcast(buf.data(), buf.data(), mine, ncclUint8, 0, c, nullptr);
      for (size_t i = 0; i < mine && res == ncclSuccess; ++i) {
        wrong[size_t(r)] += buf[i] != value(i, 0);
      }
      return res;
    });
    EXPECT_NE(rc[3], ncclSuccess);
    EXPECT_NE(msg[3].find("bytes where this rank expected"), std::string::npos) << msg[3];
    for (int r = 0; r < n; ++r) EXPECT_EQ(wrong[size_t(r)], 0) << "rank " << r;
    for (auto& c : comms) ncclCommAbort(c);
  }
}

// The broadcast and the all-gather through the shared area (transports/shm/area.h), with
// slots of 4 KiB and 4 of them so that every broadcast wraps the area several times and ends
// in a part chunk. Roots
// change from one broadcast to the next (the area's chunk count runs on across them), other
// collectives run in between, in place or not, 3 and 4 ranks. A rank that disagrees on the
// count fails naming both sizes and none hangs; nothing stays in /dev/shm.
TEST(AreaBroadcast, WrappedChunksChangingRootsAndACountMismatch) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv area("TUTTI_AREA_BROADCAST_MIN_BYTES", "1");
  ScopedEnv areaGather("TUTTI_AREA_ALLGATHER_MIN_BYTES", "1");
  ScopedEnv chunk("TUTTI_SHM_AREA_CHUNK", "4096");
  ScopedEnv slots("TUTTI_SHM_AREA_SLOTS", "4");
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  auto value = [](size_t i, int root, size_t count) {
    return uint8_t(i * 131 + size_t(root) * 7 + count);
  };
  for (int n : {3, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    std::vector<ncclComm_t> comms = initThreads(n);
    onThreads(n, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      for (size_t count : {size_t(3 * 4 * 4096 + 5), size_t(1), size_t(4096)}) {
        for (int root = 0; root < n; ++root) {
          for (bool inPlace : {false, true}) {
            std::vector<uint8_t> send(count), recv(count, 0);
            for (size_t i = 0; i < count; ++i) send[i] = r == root ? value(i, root, count) : 0;
            uint8_t* out = inPlace ? send.data() : recv.data();
            ASSERT_EQ(ncclBroadcast(send.data(), out, count, ncclUint8, root, c, nullptr),
                      ncclSuccess)
                << ncclGetLastError(c);
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(out[i], value(i, root, count))
                  << "rank " << r << " root " << root << " in place " << inPlace << " at " << i;
            }
          }
        }
        float one = 1.0f, sum = 0.0f;  // another path between broadcasts
        ASSERT_EQ(ncclAllReduce(&one, &sum, 1, ncclFloat, ncclSum, c, nullptr), ncclSuccess);
        ASSERT_EQ(sum, float(n));
        // An all-gather through the area: every rank's block broadcast in turn.
        for (bool inPlace : {false, true}) {
          std::vector<uint8_t> all(count * size_t(n), 0), mine(count);
          for (size_t i = 0; i < count; ++i) mine[i] = value(i, r, count);
          uint8_t* in = inPlace ? all.data() + size_t(r) * count : mine.data();
          if (inPlace) std::copy(mine.begin(), mine.end(), in);
          ASSERT_EQ(ncclAllGather(in, all.data(), count, ncclUint8, c, nullptr), ncclSuccess)
              << ncclGetLastError(c);
          for (int k = 0; k < n; ++k) {
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(all[size_t(k) * count + i], value(i, k, count))
                  << "rank " << r << " block " << k << " in place " << inPlace << " at " << i;
            }
          }
        }
      }
    });
    EXPECT_EQ(leftoverShmSegments(), 0);
    // The last rank expects half the bytes (two of the root's 4 KiB chunks): it fails on the
    // first chunk's line, nobody hangs, and a rank that returns success holds the root's bytes.
    const size_t count = 4 * 4096;
    std::vector<int> wrong(size_t(n), 0);
    auto [rc, msg] = runMismatched(comms, [&](int r, ncclComm_t c) {
      const size_t mine = r == n - 1 ? count / 2 : count;
      std::vector<uint8_t> buf(mine);
      for (size_t i = 0; i < mine; ++i) buf[i] = r == 1 ? value(i, 1, count) : 0;
      const ncclResult_t res =
          ncclBroadcast(buf.data(), buf.data(), mine, ncclUint8, 1, c, nullptr);
      for (size_t i = 0; i < mine && res == ncclSuccess; ++i) {
        wrong[size_t(r)] += buf[i] != value(i, 1, count);
      }
      return res;
    });
    EXPECT_EQ(rc[size_t(n - 1)], ncclInvalidUsage);
    EXPECT_NE(msg[size_t(n - 1)].find("rank 1 sends 16384 bytes where this rank expects 8192"),
              std::string::npos)
        << msg[size_t(n - 1)];
    for (int r = 0; r < n; ++r) EXPECT_EQ(wrong[size_t(r)], 0) << "rank " << r;
    for (auto& c : comms) ncclCommAbort(c);
    // The last rank thinks it is the root, the others that rank 1 is: two writers. Whichever
    // claims the area's chunks second fails saying so (the claim comes before any wait), so
    // exactly one does; none hangs, and a rank that returns success holds its root's bytes
    // (readers of the first claimant may well succeed).
    comms = initThreads(n);
    std::vector<int> took(size_t(n), 0);
    auto [rc2, msg2] = runMismatched(comms, [&](int r, ncclComm_t c) {
      const int root = r == n - 1 ? n - 1 : 1;
      std::vector<uint8_t> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = r == root ? value(i, root, count) : 0;
      const ncclResult_t res =
          ncclBroadcast(buf.data(), buf.data(), count, ncclUint8, root, c, nullptr);
      for (size_t i = 0; i < count && res == ncclSuccess; ++i) {
        took[size_t(r)] += buf[i] != value(i, root, count);
      }
      return res;
    });
    int claimedSecond = 0;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(took[size_t(r)], 0) << "rank " << r;
      if (msg2[size_t(r)].find("another rank broadcasts as root") != std::string::npos) {
        EXPECT_EQ(rc2[size_t(r)], ncclInvalidUsage);
        EXPECT_TRUE(r == 1 || r == n - 1) << "rank " << r;
        ++claimedSecond;
      }
    }
    EXPECT_EQ(claimedSecond, 1);
    for (auto& c : comms) ncclCommAbort(c);
    // Sizes on both sides of the area's threshold: the last rank takes the area for 4 KiB
    // while the others run their 2 KiB by the ring chain, then all broadcast 4 KiB through
    // the area. The last rank meets that second call's chunk, fails naming both numbers, and
    // does not return it as its first call's bytes. (The others' 2 KiB chain needs nothing
    // from the last rank: it is the chain's end, and the FIFO into it has room.)
    ScopedEnv areaFrom("TUTTI_AREA_BROADCAST_MIN_BYTES", "4096");
    comms = initThreads(n);
    std::vector<int> bad(size_t(n), 0);
    auto [rc3, msg3] = runMismatched(comms, [&](int r, ncclComm_t c) {
      std::vector<uint8_t> buf(4096);
      for (size_t call = r == n - 1 ? 1 : 0; call < 2; ++call) {
        const size_t bytes = call == 0 ? 2048 : 4096;
        for (size_t i = 0; i < bytes; ++i) buf[i] = r == 0 ? value(i, 0, bytes) : 0;
        const ncclResult_t res =
            ncclBroadcast(buf.data(), buf.data(), bytes, ncclUint8, 0, c, nullptr);
        if (res != ncclSuccess) return res;
        for (size_t i = 0; i < bytes; ++i) bad[size_t(r)] += buf[i] != value(i, 0, bytes);
      }
      return ncclSuccess;
    });
    EXPECT_EQ(rc3[size_t(n - 1)], ncclInvalidUsage);
    EXPECT_NE(msg3[size_t(n - 1)].find("where this rank is at number"), std::string::npos)
        << msg3[size_t(n - 1)];
    for (int r = 0; r < n; ++r) EXPECT_EQ(bad[size_t(r)], 0) << "rank " << r;
    for (auto& c : comms) ncclCommAbort(c);
  }
}

// The two-rank shm all-gather by timing (TwoWayTuner): the first runs of each size alternate
// between sending by address and through the slots, then each rank sends the way its recent
// runs were faster, and tries the other now and then -- so a rank may send one way while its
// peer sends the other, and each takes what comes. Pinned through the slots
// (TUTTI_PAIR_TUNE=slots) a 6 MiB all-gather is many slot-sized steps, where by address it
// is one (PairByAddress).
TEST(PairTune, AllGathersByTimingOrThroughTheSlotsAreExact) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
  ScopedEnv channels("NCCL_MAX_NCHANNELS", "1");
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  ScopedEnv copy("TUTTI_SHM_SINGLE_COPY", "1");
  for (const char* way : {"1", "slots"}) {
    ScopedEnv tune("TUTTI_PAIR_TUNE", way);
    SCOPED_TRACE(std::string("TUTTI_PAIR_TUNE=") + way);
    std::vector<ncclComm_t> comms = initThreads(2);
    auto value = [](size_t i, int r, int op) { return uint8_t(i * 131 + size_t(r) * 7 + op); };
    std::vector<uint64_t> steps(2);
    onThreads(2, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      const std::vector<size_t> counts{(256 << 10) + 3, (6 << 20) + 3, 5000};
      const int ops = std::string(way) == "1" ? 60 : 3;
      for (int op = 0; op < ops; ++op) {
        const size_t count = counts[size_t(op) % counts.size()];
        std::vector<uint8_t> send(count), recv(2 * count, 0);
        for (size_t i = 0; i < count; ++i) send[i] = value(i, r, op);
        const tutti::transport::FifoView* f =
            reinterpret_cast<tutti::Comm*>(c)->links().send(1 - r, 0);
        const uint64_t before = f ? f->step : 0;
        ASSERT_EQ(ncclAllGather(send.data(), recv.data(), count, ncclUint8, c, nullptr),
                  ncclSuccess)
            << ncclGetLastError(c);
        if (count == counts[1] && f) {
          steps[size_t(r)] =
              reinterpret_cast<tutti::Comm*>(c)->links().send(1 - r, 0)->step - before;
        }
        for (int q = 0; q < 2; ++q) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(recv[size_t(q) * count + i], value(i, q, op))
                << "rank " << r << " op " << op << " count " << count << " block " << q << " at "
                << i;
          }
        }
      }
    });
    destroyAll(comms);
    if (std::string(way) == "slots") {
      EXPECT_GT(steps[0], 1u);
      EXPECT_GT(steps[1], 1u);
    }
  }
  // Through the slots, blocks of 2 MiB and 1 MiB go in chunks of one slot each, alike in size:
  // the last-chunk flag makes the rank expecting less fail, naming it, and nobody waits.
  ScopedEnv tune("TUTTI_PAIR_TUNE", "slots");
  std::vector<ncclComm_t> comms = initThreads(2);
  auto [rc, msg] = runMismatched(comms, [](int r, ncclComm_t c) {
    const size_t count = r == 0 ? 2 << 20 : 1 << 20;
    std::vector<uint8_t> send(count, 1), recv(2 * count);
    return ncclAllGather(send.data(), recv.data(), count, ncclUint8, c, nullptr);
  });
  EXPECT_NE(rc[1], ncclSuccess);
  EXPECT_NE(msg[1].find("rank 0 sent more where this rank expected the last chunk"),
            std::string::npos)
      << msg[1];
  EXPECT_NE(rc[0], ncclSuccess);
  for (auto& c : comms) ncclCommAbort(c);
}

// Broadcasts of 3+ ranks over shm from TUTTI_STATE_BROADCAST_MIN_BYTES: the root goes flat
// while its copies into the ring's slots run slow (adaptive single copy's verdict), by the ring
// chain otherwise; a flat one starts with a marker passed down the chain. With the threshold
// at 10^6 GB/s every copy is slow: the chain until the verdict, then 64 flat ones, then the
// chain again (the verdict forgotten, the copies timed anew); at 0 never slow: the chain
// throughout. The root's link to the rank two ahead shows which ran: no step for the chain,
// one or more for the flat one. Every rank gets the root's bytes, whichever way, from any root.
TEST(StateBroadcast, FlatWhileSlotCopiesRunSlowTheChainOtherwise) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
  ScopedEnv channels("NCCL_MAX_NCHANNELS", "1");
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  ScopedEnv mode("TUTTI_SHM_SINGLE_COPY", nullptr);
  ScopedEnv flat("TUTTI_FLAT_BROADCAST_MIN_BYTES", nullptr);
  ScopedEnv state("TUTTI_STATE_BROADCAST_MIN_BYTES", "65536");
  ScopedEnv recheck("TUTTI_STATE_BROADCAST_RECHECK", "64");
  const int n = 4, ops = 100;
  for (const char* slowGBps : {"1000000", "0"}) {
    SCOPED_TRACE(std::string("TUTTI_SHM_SLOW_GBPS=") + slowGBps);
    ScopedEnv slow("TUTTI_SHM_SLOW_GBPS", slowGBps);
    std::vector<ncclComm_t> comms = initThreads(n);
    const size_t count = (256 << 10) + 5;
    auto value = [](size_t i, int op) { return uint8_t(i * 131 + size_t(op) * 7 + 1); };
    // Root 0's sends to rank 2 per broadcast from rank 0: none by the chain (0 -> 1 -> 2 ...),
    // one or more flat.
    std::vector<uint64_t> steps(ops);
    uint64_t bigSteps = 1;
    onThreads(n, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      tutti::Links& links = reinterpret_cast<tutti::Comm*>(c)->links();
      std::vector<uint8_t> buf(count), out(count);
      for (int op = 0; op < ops; ++op) {
        // Root 0 mostly, now and then another (in place or not).
        const int root = op % 10 == 9 ? 1 + op % 3 : 0;
        const bool inPlace = op % 3 != 1;
        for (size_t i = 0; i < count; ++i) buf[i] = r == root ? value(i, op) : 0;
        std::fill(out.begin(), out.end(), 0);
        uint8_t* to = inPlace ? buf.data() : out.data();
        const tutti::transport::FifoView* f = links.send(2, 0);  // made by the first broadcast
        const uint64_t before = f ? f->step : 0;
        ASSERT_EQ(ncclBroadcast(buf.data(), to, count, ncclUint8, root, c, nullptr), ncclSuccess)
            << ncclGetLastError(c);
        if (r == 0 && root == 0) steps[size_t(op)] = links.send(2, 0)->step - before;
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(to[i], value(i, op)) << "rank " << r << " op " << op << " root " << root
                                         << " in place " << inPlace << " at " << i;
        }
      }
      // Above TUTTI_STATE_BROADCAST_MAX_BYTES (4 MiB): the chain.
      std::vector<uint8_t> big((4 << 20) + 1, r == 0 ? 7 : 0);
      const uint64_t before = r == 0 ? links.send(2, 0)->step : 0;
      ASSERT_EQ(ncclBroadcast(big.data(), big.data(), big.size(), ncclUint8, 0, c, nullptr),
                ncclSuccess);
      if (r == 0) bigSteps = links.send(2, 0)->step - before;
      EXPECT_EQ(std::count(big.begin(), big.end(), 7), std::ptrdiff_t(big.size())) << r;
    });
    EXPECT_EQ(bigSteps, 0u);
    destroyAll(comms);
    // The runs of flat (1+ steps) and chain (none) broadcasts from root 0, in order.
    std::vector<std::pair<bool, int>> runs;
    for (int op = 0; op < ops; ++op) {
      if (op % 10 == 9) continue;
      const bool isFlat = steps[size_t(op)] > 0;
      if (runs.empty() || runs.back().first != isFlat) runs.push_back({isFlat, 0});
      ++runs.back().second;
    }
    std::string shape;
    for (auto& [isFlat, len] : runs)
      shape += (isFlat ? " flat x" : " chain x") + std::to_string(len);
    SCOPED_TRACE("root 0's broadcasts:" + shape);
    if (std::string(slowGBps) == "0") {
      EXPECT_EQ(runs.size(), 1u);
      EXPECT_FALSE(runs[0].first);
    } else {
      // chain (until 8 timed copies), flat (root 0's 64 choices), chain.
      ASSERT_GE(runs.size(), 3u);
      EXPECT_FALSE(runs[0].first);
      EXPECT_LE(runs[0].second, 8);
      EXPECT_TRUE(runs[1].first);
      EXPECT_EQ(runs[1].second, 64);  // TUTTI_STATE_BROADCAST_RECHECK
      EXPECT_FALSE(runs[2].first);
    }
  }
  // A rank whose count differs from the root's fails at once, whichever way the root took:
  // flat (the copies ran slow in 8 broadcasts before), the marker naming the root's size; by
  // the chain (a fresh communicator, no verdict yet), the first payload's.
  for (bool flat : {true, false}) {
    SCOPED_TRACE(flat ? "flat" : "chain");
    ScopedEnv slow("TUTTI_SHM_SLOW_GBPS", "1000000");
    const size_t mine = 256 << 10, theirs = 40 << 10;
    std::vector<ncclComm_t> comms = initThreads(n);
    if (flat) {
      onThreads(n, [&](int r) {
        std::vector<uint8_t> buf(mine, 3);
        for (int i = 0; i < 8; ++i) {
          ASSERT_EQ(
              ncclBroadcast(buf.data(), buf.data(), mine, ncclUint8, 0, comms[size_t(r)], nullptr),
              ncclSuccess);
        }
      });
    }
    auto [rc, msg] = runMismatched(comms, [&](int r, ncclComm_t c) {
      std::vector<uint8_t> buf(r == 2 ? theirs : mine, 3);
      return ncclBroadcast(buf.data(), buf.data(), buf.size(), ncclUint8, 0, c, nullptr);
    });
    EXPECT_NE(rc[2], ncclSuccess);
    const std::string want = flat ? "rank 0 runs this operation on " + std::to_string(mine) +
                                        " bytes where this rank has " + std::to_string(theirs)
                                  : "bytes where this rank expected";
    EXPECT_NE(msg[2].find(want), std::string::npos) << msg[2];
    for (auto& c : comms) ncclCommAbort(c);
  }
  EXPECT_EQ(leftoverShmSegments(), 0);
}

// Big all-gathers of a power of two of ranks from TUTTI_ALLGATHER_TUNE_MIN_BYTES: rank 0 times
// recursive doubling and the ring and picks (alternating at first, doubling first), telling
// the others by a marker down the ring chain. Rank 0's link to rank 2 shows which ran:
// doubling's second stage uses it, the ring does not. Every rank gets every block, in place
// or not; a rank whose count differs from rank 0's fails naming both, and nobody waits.
TEST(GatherTune, DoublingOrTheRingByRankZerosTimingIsExact) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  ScopedEnv tune("TUTTI_ALLGATHER_TUNE_MIN_BYTES", "65536");
  const int n = 4, ops = 40;
  std::vector<ncclComm_t> comms = initThreads(n);
  auto value = [](size_t i, int r, int op) { return uint8_t(i * 131 + size_t(r) * 7 + op); };
  std::vector<uint64_t> steps(ops);  // rank 0's sends to rank 2 in each
  onThreads(n, [&](int r) {
    ncclComm_t c = comms[size_t(r)];
    tutti::Links& links = reinterpret_cast<tutti::Comm*>(c)->links();
    for (int op = 0; op < ops; ++op) {
      // Mostly 64 KiB + 3 a rank (in one size class), now and then 3 bytes (not tuned).
      const size_t count = op % 8 == 7 ? 3 : (64 << 10) + 3;
      const bool inPlace = op % 3 == 1;
      std::vector<uint8_t> send(count), recv(size_t(n) * count, 0);
      for (size_t i = 0; i < count; ++i) send[i] = value(i, r, op);
      if (inPlace) std::copy(send.begin(), send.end(), recv.begin() + size_t(r) * count);
      const void* from = inPlace ? recv.data() + size_t(r) * count : send.data();
      const tutti::transport::FifoView* f = links.send(2, 0);
      const uint64_t before = f ? f->step : 0;
      ASSERT_EQ(ncclAllGather(from, recv.data(), count, ncclUint8, c, nullptr), ncclSuccess)
          << ncclGetLastError(c);
      if (r == 0 && links.send(2, 0)) steps[size_t(op)] = links.send(2, 0)->step - before;
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv[size_t(q) * count + i], value(i, q, op))
              << "rank " << r << " op " << op << " block " << q << " at " << i;
        }
      }
    }
  });
  destroyAll(comms);
  std::string ways;  // D: doubling, R: the ring, per tuned all-gather
  for (int op = 0; op < ops; ++op) {
    if (op % 8 != 7) ways += steps[size_t(op)] > 0 ? 'D' : 'R';
  }
  SCOPED_TRACE("ways: " + ways);
  EXPECT_EQ(ways.substr(0, 6), "DRDRDR");  // until each way has two runs that count
  // (Which way wins later depends on the machine's load: TwoWayTuner's own tests cover that.)

  // On a fresh communicator (doubling's links are made before the marker, so no rank waits in
  // a link's setup for one that failed), rank 2 disagrees: on a size that is tuned too (it
  // gets the marker and fails on rank 0's size), or on one that is not (it runs the ring and
  // finds the marker where it expects data).
  const size_t mine = 128 << 10;
  for (auto [theirs, want] :
       {std::pair<size_t, std::string>{(64 << 10) + 3, "rank 0 runs this operation on " +
                                                           std::to_string(n * mine) +
                                                           " bytes where this rank has " +
                                                           std::to_string(n * ((64 << 10) + 3))},
        std::pair<size_t, std::string>{
            (8 << 10) + 1, "rank 1 sent the way of an operation where this rank expected data"}}) {
    SCOPED_TRACE("rank 2: " + std::to_string(theirs) + " bytes a rank");
    std::vector<ncclComm_t> mismatched = initThreads(n);
    auto [rc, msg] = runMismatched(mismatched, [&, theirs = theirs](int r, ncclComm_t c) {
      const size_t count = r == 2 ? theirs : mine;
      std::vector<uint8_t> send(count, 1), recv(size_t(n) * count);
      return ncclAllGather(send.data(), recv.data(), count, ncclUint8, c, nullptr);
    });
    EXPECT_NE(rc[2], ncclSuccess);
    EXPECT_NE(msg[2].find(want), std::string::npos) << msg[2];
    for (auto& c : mismatched) ncclCommAbort(c);
  }
  EXPECT_EQ(leftoverShmSegments(), 0);
}

// Two ranks over shm, an all-gather (an exchange) or a broadcast: each block is sent by
// address in one chunk bigger than a slot (kAddressChunkBytes), in 2+ pieces of which each
// side copies some; a block under the single-copy minimum, or any without single copy, goes
// in slot-sized chunks. Every rank gets the blocks, in place or not, from either root; a rank
// that disagrees on the count fails naming the sizes, and none hangs.
TEST(PairByAddress, ChunksByAddressOrThroughSlotsAreExactAndACountMismatchFails) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv tune("TUTTI_PAIR_TUNE", "0");  // the all-gather by address, not by timing
  ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
  ScopedEnv channels("NCCL_MAX_NCHANNELS", "1");
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  for (const char* single : {"1", "0"}) {
    ScopedEnv copy("TUTTI_SHM_SINGLE_COPY", single);
    SCOPED_TRACE(std::string("TUTTI_SHM_SINGLE_COPY=") + single);
    const bool byAddress = std::string(single) == "1";
    std::vector<ncclComm_t> comms = initThreads(2);
    auto value = [](size_t i, int r) { return uint8_t(i * 131 + size_t(r) * 7 + 1); };
    // By address: 6 MiB and 3 bytes (one chunk in 7 pieces); 8 MiB and 1000 bytes (broadcast:
    // a chunk by address, then the rest through a slot; all-gather: over 16 MiB in all, the
    // ring); 3000 bytes (under the 4 KiB minimum between threads: through a slot). Through
    // slots: several slots and a partial one.
    const std::vector<size_t> counts =
        byAddress ? std::vector<size_t>{(6 << 20) + 3, (8 << 20) + 1000, 3000}
                  : std::vector<size_t>{(1 << 20) + 3};
    onThreads(2, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      for (size_t count : counts) {
        for (bool inPlace : {false, true}) {
          std::vector<uint8_t> recv(2 * count, 0), send(count);
          for (size_t i = 0; i < count; ++i) send[i] = value(i, r);
          const uint8_t* in = send.data();
          if (inPlace) {
            memcpy(recv.data() + size_t(r) * count, send.data(), count);
            in = recv.data() + size_t(r) * count;
          }
          ASSERT_EQ(ncclAllGather(in, recv.data(), count, ncclUint8, c, nullptr), ncclSuccess)
              << ncclGetLastError(c);
          for (int q = 0; q < 2; ++q) {
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(recv[size_t(q) * count + i], value(i, q))
                  << "rank " << r << " count " << count << " in place " << inPlace << " block " << q
                  << " at " << i;
            }
          }
          for (int root : {0, 1}) {
            std::vector<uint8_t> out(count, 0);
            uint8_t* to = inPlace ? send.data() : out.data();
            if (r != root) std::fill(send.begin(), send.end(), 0);
            ASSERT_EQ(ncclBroadcast(send.data(), to, count, ncclUint8, root, c, nullptr),
                      ncclSuccess)
                << ncclGetLastError(c);
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(to[i], value(i, root))
                  << "broadcast: rank " << r << " count " << count << " in place " << inPlace
                  << " root " << root << " at " << i;
            }
            for (size_t i = 0; i < count; ++i) send[i] = value(i, r);
          }
        }
      }
    });
    // One channel, by address: a 6 MiB all-gather is one step each way, and an 8 MiB + 1000
    // broadcast two steps from the root (so the path above is the one under test).
    if (byAddress) {
      std::vector<uint64_t> gatherSteps(2), bcastSteps(2);
      onThreads(2, [&](int r) {
        ncclComm_t c = comms[size_t(r)];
        const tutti::transport::FifoView* f =
            reinterpret_cast<tutti::Comm*>(c)->links().send(1 - r, 0);
        ASSERT_NE(f, nullptr);
        std::vector<uint8_t> a((8 << 20) + 1000, 1), b(2 * a.size());
        uint64_t before = f->step;
        ASSERT_EQ(ncclAllGather(a.data(), b.data(), (6 << 20) + 3, ncclUint8, c, nullptr),
                  ncclSuccess);
        gatherSteps[size_t(r)] = f->step - before;
        before = f->step;
        ASSERT_EQ(ncclBroadcast(a.data(), a.data(), a.size(), ncclUint8, 0, c, nullptr),
                  ncclSuccess);
        bcastSteps[size_t(r)] = f->step - before;
      });
      EXPECT_EQ(gatherSteps[0], 1u);
      EXPECT_EQ(gatherSteps[1], 1u);
      EXPECT_EQ(bcastSteps[0], 2u);
      EXPECT_EQ(bcastSteps[1], 0u);
    }
    // Rank 1 expects half the bytes. All-gather: both fail on the size (each gets a payload
    // of the other's size). Broadcast from rank 0: rank 1 fails on the size. Nobody hangs.
    const size_t count = counts[0];
    for (bool gather : {true, false}) {
      SCOPED_TRACE(gather ? "all-gather" : "broadcast");
      std::vector<ncclComm_t> cs = initThreads(2);
      auto [rc, msg] = runMismatched(cs, [&](int r, ncclComm_t c) {
        const size_t mine = r == 1 ? count / 2 : count;
        std::vector<uint8_t> send(mine, 1), recv(2 * mine);
        return gather ? ncclAllGather(send.data(), recv.data(), mine, ncclUint8, c, nullptr)
                      : ncclBroadcast(send.data(), send.data(), mine, ncclUint8, 0, c, nullptr);
      });
      for (int r = gather ? 0 : 1; r < 2; ++r) {
        EXPECT_NE(rc[size_t(r)], ncclSuccess) << "rank " << r;
        EXPECT_NE(msg[size_t(r)].find("bytes where this rank expected"), std::string::npos)
            << "rank " << r << ": " << msg[size_t(r)];
      }
      for (auto& c : cs) ncclCommAbort(c);
    }
    destroyAll(comms);
  }
}

// Over tcp no payload comes by address, so the doubling all-gather of ranks crowded on fewer
// cores (which sends by address where a link can) must not look at a payload before it says
// where it wants it: the socket's bytes then land in the output, none in a slot to be copied
// out again (Connection::landedInSlot). 8 ranks on one CPU, small slots so that each stage
// takes several chunks, the last one short; in place and not, exact.
TEST(TcpDoubling, CrowdedAllGatherStagesLandInTheOutput) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "1");
  ScopedEnv buff("NCCL_BUFFSIZE", "262144");      // 32 KiB slots, and steps
  ScopedEnv direct("TUTTI_TCP_DIRECT", nullptr);  // =0 would land nothing anywhere
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &all)) ++cpu;
  const int n = 8;
  const ncclUniqueId id = makeId();
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<uint64_t> inSlot(n, 0), steps(n, 0);
  auto value = [](size_t i, int r, int op) { return uint8_t(i * 29 + size_t(r) * 11 + op); };
  onThreads(n, [&](int r) {
    cpu_set_t one;  // the rank records this as its CPUs: 8 ranks on 1, crowded
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    ASSERT_EQ(ncclCommInitRank(&comms[size_t(r)], n, id, r), ncclSuccess);
    ncclComm_t c = comms[size_t(r)];
    for (int op = 0; op < 4; ++op) {
      const size_t count = (100 << 10) + 3;
      const bool inPlace = op % 2 == 1;
      std::vector<uint8_t> send(count), recv(size_t(n) * count, 0);
      for (size_t i = 0; i < count; ++i) send[i] = value(i, r, op);
      if (inPlace) std::copy(send.begin(), send.end(), recv.begin() + size_t(r) * count);
      const void* from = inPlace ? recv.data() + size_t(r) * count : send.data();
      ASSERT_EQ(ncclAllGather(from, recv.data(), count, ncclUint8, c, nullptr), ncclSuccess)
          << ncclGetLastError(c);
      for (int q = 0; q < n; ++q) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv[size_t(q) * count + i], value(i, q, op))
              << "rank " << r << " op " << op << " block " << q << " at " << i;
        }
      }
    }
    tutti::Links& links = reinterpret_cast<tutti::Comm*>(c)->links();
    for (int k = 0; k < 3; ++k) {  // doubling's partners
      const tutti::transport::FifoView* f = links.recv(r ^ (1 << k), 0);
      ASSERT_NE(f, nullptr) << "rank " << r << " stage " << k;
      steps[size_t(r)] += f->step;
      inSlot[size_t(r)] += f->conn->landedInSlot;
    }
  });
  destroyAll(comms);
  for (int r = 0; r < n; ++r) {
    // Stages of 1, 2 and 4 blocks of 100 KiB + 3 in 32 KiB chunks: 4 + 7 + 13 steps, 4 times.
    EXPECT_EQ(steps[size_t(r)], 96u) << "rank " << r;
    EXPECT_EQ(inSlot[size_t(r)], 0u) << "rank " << r;
  }
}
