// The GPU data path's sends and receives, run on the CPU as tests/emu runs it (emu_comm.h):
// groups past one kernel's operations, all-to-alls, blocks that run several pairs in turn,
// launches of whole rounds; and its failures (sizes that differ, abort, a peer that never
// comes).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "emu/emu_comm.h"
#include "harness/harness.h"

using namespace tutti;
using namespace tutti::test;

namespace {

// A group's sends and receives past one kernel's kMaxOps go to p2pManyKernel, up to
// kMaxP2pOps; more is refused by the planner, naming the limit. 2 ranks: rank 0 sends 36
// messages of different sizes to rank 1 and receives 26 (their order kept per direction).
TEST(EmuSteps, ManySendsAndReceivesInOneGroup) {
  EmuComm comm(2);
  constexpr int kSends = 36, kRecvs = 26;
  auto count = [](int m) { return size_t(1 + 37 * m); };  // one LL-free Simple step or several
  std::vector<std::vector<float>> out0(kRecvs), in1(kSends), out1(kSends), in0(kSends);
  std::string e0, e1;
  std::thread t([&] {
    std::vector<CollArgs> ops;
    for (int m = 0; m < kSends; ++m) {
      in0[size_t(m)].assign(count(m), float(m));
      ops.push_back(args(CollKind::kSend, in0[size_t(m)].data(), nullptr, count(m), ncclFloat, 1));
    }
    for (int m = 0; m < kRecvs; ++m) {
      out0[size_t(m)].assign(count(m), -1.0f);
      ops.push_back(args(CollKind::kRecv, nullptr, out0[size_t(m)].data(), count(m), ncclFloat, 1));
    }
    e0 = comm.run(0, ops);
  });
  std::vector<CollArgs> ops;
  for (int m = 0; m < kRecvs; ++m) {  // sends of its own first: another order than rank 0's
    in1[size_t(m)].assign(count(m), float(100 + m));
    ops.push_back(args(CollKind::kSend, in1[size_t(m)].data(), nullptr, count(m), ncclFloat, 0));
  }
  for (int m = 0; m < kSends; ++m) {
    out1[size_t(m)].assign(count(m), -1.0f);
    ops.push_back(args(CollKind::kRecv, nullptr, out1[size_t(m)].data(), count(m), ncclFloat, 0));
  }
  e1 = comm.run(1, ops);
  t.join();
  ASSERT_EQ(e0, "");
  ASSERT_EQ(e1, "");
  for (int m = 0; m < kSends; ++m)
    EXPECT_EQ(out1[size_t(m)], std::vector<float>(count(m), float(m))) << "message " << m;
  for (int m = 0; m < kRecvs; ++m)
    EXPECT_EQ(out0[size_t(m)], std::vector<float>(count(m), float(100 + m))) << "message " << m;

  // 65 to other ranks: refused before any kernel runs.
  std::vector<float> x(4);
  std::vector<CollArgs> tooMany(65, args(CollKind::kSend, x.data(), nullptr, 4, ncclFloat, 1));
  EXPECT_NE(comm.run(0, tooMany).find("at most 64 are supported yet"), std::string::npos);
}

// An all-to-all of 12 ranks, as ncclAlltoAll queues it: 22 sends and receives to other ranks
// on each (past one kernel's kMaxOps), and a copy of its own block.
TEST(EmuSteps, AnAllToAllOfTwelveRanks) {
  constexpr int n = 12;
  constexpr size_t kCount = 300;  // floats per block
  EmuComm comm(n);
  std::mutex mu;
  std::vector<std::string> bad;
  onThreads(n, [&](int r) {
    std::vector<float> in(kCount * n), out(kCount * n, -1.0f);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < kCount; ++i)
        in[size_t(q) * kCount + i] = float(1000 * r + 10 * q) + float(i % 7);
    std::vector<CollArgs> ops;
    for (int q = 0; q < n; ++q) {
      ops.push_back(
          args(CollKind::kSend, in.data() + size_t(q) * kCount, nullptr, kCount, ncclFloat, q));
      ops.push_back(
          args(CollKind::kRecv, nullptr, out.data() + size_t(q) * kCount, kCount, ncclFloat, q));
    }
    std::string e = comm.run(r, ops);
    for (int q = 0; q < n && e.empty(); ++q)
      for (size_t i = 0; i < kCount && e.empty(); ++i)
        if (out[size_t(q) * kCount + i] != float(1000 * q + 10 * r) + float(i % 7))
          e = "block " + std::to_string(q) + " element " + std::to_string(i);
    if (!e.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      bad.push_back("rank " + std::to_string(r) + ": " + e);
      for (auto& st : comm.ranks) __atomic_store_n(&st->abort, 1u, __ATOMIC_RELEASE);
    }
  });
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

// Every rank of comm sends `per` messages to every rank (itself included) and receives `per`
// from each, all in an order of its own (shuffled per rank from seed, each pair's messages in
// turn; seed 0: every send, then every receive), the later messages on each pair past the
// FIFO's 8 slots (they must wait for their receiver). Returns what went wrong on each rank.
std::vector<std::string> exchangeEveryWay(EmuComm& comm, int per, unsigned seed) {
  const int n = comm.n;
  auto count = [](int from, int to, int m) {  // floats; 256 per 1 KiB slot
    return m == 0 ? size_t(1 + 97 * ((from * 5 + to) % 7))
                  : size_t(2600 + 700 * ((from + 2 * to + m) % 5));
  };
  auto value = [](int from, int to, int m, size_t i) {
    return float(10000 * from + 100 * to + 10 * m) + float(i % 9);
  };
  std::mutex mu;
  std::vector<std::string> bad;
  onThreads(n, [&](int r) {
    // [peer * per + m]: this rank's m-th message to / from peer.
    std::vector<std::vector<float>> in(size_t(n * per)), out(size_t(n * per));
    for (int q = 0; q < n; ++q) {
      for (int m = 0; m < per; ++m) {
        std::vector<float>& i = in[size_t(q * per + m)];
        i.resize(count(r, q, m));
        for (size_t k = 0; k < i.size(); ++k) i[k] = value(r, q, m, k);
        out[size_t(q * per + m)].assign(count(q, r, m), -1.0f);
      }
    }
    // Every (peer, direction) `per` times, shuffled: its k-th turn takes message k.
    std::vector<int> turns;
    for (int t = 0; t < 2 * n; t += 2) turns.insert(turns.end(), size_t(per), t);
    for (int t = 1; t < 2 * n; t += 2) turns.insert(turns.end(), size_t(per), t);
    if (seed != 0) std::shuffle(turns.begin(), turns.end(), std::mt19937(seed + 13 * unsigned(r)));
    std::vector<int> taken(size_t(2 * n), 0);
    std::vector<CollArgs> ops;
    for (int t : turns) {
      const int q = t / 2, m = taken[size_t(t)]++;
      if (t % 2 == 0) {
        std::vector<float>& i = in[size_t(q * per + m)];
        ops.push_back(args(CollKind::kSend, i.data(), nullptr, i.size(), ncclFloat, q));
      } else {
        std::vector<float>& o = out[size_t(q * per + m)];
        ops.push_back(args(CollKind::kRecv, nullptr, o.data(), o.size(), ncclFloat, q));
      }
    }
    std::string e = comm.run(r, ops);
    for (int q = 0; q < n && e.empty(); ++q)
      for (int m = 0; m < per && e.empty(); ++m)
        for (size_t k = 0; k < count(q, r, m) && e.empty(); ++k)
          if (out[size_t(q * per + m)][k] != value(q, r, m, k))
            e = "message " + std::to_string(m) + " from rank " + std::to_string(q) + ", element " +
                std::to_string(k);
    if (!e.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      bad.push_back("rank " + std::to_string(r) + ": " + e);
      for (auto& st : comm.ranks) __atomic_store_n(&st->abort, 1u, __ATOMIC_RELEASE);
    }
  });
  return bad;
}

// Ranks sharing a GPU may each have only so many blocks resident (DeviceEngine::findP2pBlockCap):
// past that, a block runs several (peer, direction) pairs in turn, each block only sending or
// only receiving, its pairs in the order of their distance round the ranks. 9 ranks exchanging
// 2 messages every way, with at most 2, 3 and 5 blocks a rank (1 takes 2: a block for each
// direction) and with no cap. A block that both sent and received, or took its pairs in each
// rank's call order, deadlocks here (tried: the kernels then give up at the deadline).
TEST(EmuSteps, SendsAndReceivesFoldedIntoFewBlocksComplete) {
  constexpr int n = 9;
  for (int cap : {1, 2, 3, 5, 0}) {
    EmuComm comm(n);
    comm.cfg.maxP2pBlocks = cap;
    comm.timeoutNs = 20ull * 1000000000ull;
    for (const std::string& b : exchangeEveryWay(comm, 2, 77 + unsigned(cap)))
      ADD_FAILURE() << "cap " << cap << ": " << b;
    // 16 pairs a rank: within the cap where there is one (at least 2), else a block each.
    EXPECT_EQ(comm.mostP2pBlocks.load(), cap > 0 ? std::max(cap, 2) : 2 * (n - 1)) << "cap " << cap;
    EXPECT_EQ(comm.mostP2pLaunches.load(), 1) << "cap " << cap;
  }
}

// Past dev::kMaxP2pOps sends and receives, a group runs in several launches of whole rounds
// (the peers at one distance), in the order of the rounds: 40 ranks exchanging 2 messages
// every way (every send first, then in shuffled orders), 156 operations with other ranks each,
// 4 per round: 3 launches of up to 16 rounds, at most 4 blocks each. A launch that split a
// round (its sends in one launch, its receives in the next) deadlocks here (tried). A round of more
// than kMaxP2pOps is refused, naming its peers; a 2-rank group is one round.
TEST(EmuSteps, ManySendsAndReceivesRunInLaunchesOfWholeRounds) {
  constexpr int n = 40;
  EmuComm comm(n);
  comm.cfg.maxP2pBlocks = 4;
  comm.timeoutNs = 20ull * 1000000000ull;
  for (unsigned seed : {0u, 5u}) {
    for (const std::string& b : exchangeEveryWay(comm, 2, seed))
      ADD_FAILURE() << (seed ? "shuffled: " : "sends first: ") << b;
  }
  EXPECT_EQ(comm.mostP2pLaunches.load(), 3);
  EXPECT_EQ(comm.mostP2pBlocks.load(), 4);

  EmuComm two(2);
  std::vector<float> x(4), y(4);
  std::vector<CollArgs> round(40, args(CollKind::kSend, x.data(), nullptr, 4, ncclFloat, 1));
  round.insert(round.end(), 25, args(CollKind::kRecv, nullptr, y.data(), 4, ncclFloat, 1));
  const std::string e = two.run(0, round);
  EXPECT_NE(e.find("40 sends to rank 1 and 25 receives from rank 1 in one group on GPU buffers "
                   "(the peers 1 apart round the ranks, whose operations run together): at "
                   "most 64 are supported yet"),
            std::string::npos)
      << e;
}

// A receiver that expects another message than the sender sends fails with the sizes, on
// the first differing step and on a missing last step, instead of taking the wrong bytes.
TEST(EmuFailures, SendRecvSizeMismatchIsCaught) {
  for (auto [sendCount, recvCount] : {std::pair<size_t, size_t>{100, 200},       // one step each
                                      std::pair<size_t, size_t>{1536, 1024}}) {  // 6 vs 4 slots
    EmuComm comm(2);
    std::vector<float> a = filled(sendCount, 1), b = filled(recvCount, 0);
    std::string e0, e1;
    std::thread t([&] {
      e0 = comm.run(0, {args(CollKind::kSend, a.data(), nullptr, sendCount, ncclFloat, 1)});
    });
    e1 = comm.run(1, {args(CollKind::kRecv, nullptr, b.data(), recvCount, ncclFloat, 0)});
    comm.ranks[0]->abort = 1;  // the sender may still wait for room the receiver never frees
    t.join();
    EXPECT_NE(e1.find("kernel error 3"), std::string::npos)
        << sendCount << " vs " << recvCount << ": " << e1;
    EXPECT_EQ(comm.ranks[1]->err.peer, 0);
    EXPECT_TRUE(comm.fifo(0, 1, devplan::kP2pChannel).broken())
        << "the receiver marks the link broken";
  }
}

// A rank waiting for a peer that never comes: the abort word ends it (code 1), the FIFOs it
// used are marked broken, and a rank waiting on a broken FIFO gives up too (code 4).
TEST(EmuFailures, AbortEndsTheWaitAndBreaksTheLinks) {
  EmuComm comm(2);
  std::vector<float> a = filled(4096, 1);
  std::string e0;
  std::thread t([&] {
    e0 = comm.run(0, {args(CollKind::kAllReduce, a.data(), a.data(), a.size(), ncclFloat, 0)});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  __atomic_store_n(&comm.ranks[0]->abort, 1u, __ATOMIC_RELEASE);
  t.join();
  EXPECT_NE(e0.find("kernel error 1"), std::string::npos) << e0;
  EXPECT_TRUE(comm.fifo(0, 1, 0).broken() || comm.fifo(1, 0, 0).broken());

  // Rank 1 comes late: its first wait sees the broken link instead of waiting for ever.
  std::vector<float> b = filled(4096, 1);
  const std::string e1 =
      comm.run(1, {args(CollKind::kAllReduce, b.data(), b.data(), b.size(), ncclFloat, 0)});
  EXPECT_NE(e1.find("kernel error 4"), std::string::npos) << e1;
}

// No progress for the deadline: the wait gives up with code 2 and names the peer.
TEST(EmuFailures, ALonelyRankTimesOutNamingItsPeer) {
  EmuComm comm(3);
  comm.timeoutNs = 200 * 1000000ull;
  std::vector<float> a = filled(64, 1);
  const auto start = std::chrono::steady_clock::now();
  const std::string e =
      comm.run(1, {args(CollKind::kAllReduce, a.data(), a.data(), a.size(), ncclFloat, 0)});
  EXPECT_NE(e.find("kernel error 2"), std::string::npos) << e;
  EXPECT_EQ(comm.ranks[1]->err.peer, 0) << "rank 1 receives from rank 0 first";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

}  // namespace
