// Communicators formed by ranks running as threads of this process.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>

#include "harness/harness.h"
#include "nccl.h"

using namespace tutti::test;

class CommSizes : public ::testing::TestWithParam<int> {};

TEST_P(CommSizes, FormAsThreads) {
  int n = GetParam();
  auto comms = initThreads(n);
  for (int r = 0; r < n; ++r) {
    ASSERT_NE(comms[r], nullptr);
    int count = 0, rank = -1, dev = -2;
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommCount(comms[r], &count), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    EXPECT_EQ(ncclCommCuDevice(comms[r], &dev), ncclSuccess);
    EXPECT_EQ(ncclCommGetAsyncError(comms[r], &async), ncclSuccess);
    EXPECT_EQ(count, n);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_GE(dev, -1);
  }
  for (auto c : comms) EXPECT_EQ(ncclCommFinalize(c), ncclSuccess);
  destroyAll(comms);
}
INSTANTIATE_TEST_SUITE_P(Ranks, CommSizes, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(Comm, InitAllFromOneThread) {
  ncclComm_t comms[4] = {};
  ASSERT_EQ(ncclCommInitAll(comms, 4, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 4; ++r) {
    int rank = -1, count = 0;
    EXPECT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    EXPECT_EQ(ncclCommCount(comms[r], &count), ncclSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(count, 4);
  }
  for (auto c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(Comm, CpuRanksInDevlist) {
  int devs[2] = {-1, -1};
  ncclComm_t comms[2] = {};
  ASSERT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
  for (auto c : comms) {
    int dev = 0;
    EXPECT_EQ(ncclCommCuDevice(c, &dev), ncclSuccess);
    EXPECT_EQ(dev, -1);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

TEST(Comm, GroupedInitRankFromOneThread) {
  // The NCCL idiom for one thread driving several ranks: inits inside a group.
  ncclUniqueId id = makeId();
  ncclComm_t comms[3] = {};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 3; ++r) ASSERT_EQ(ncclCommInitRank(&comms[r], 3, id, r), ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 3; ++r) {
    int rank = -1;
    EXPECT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    EXPECT_EQ(rank, r);
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
  }
}

TEST(Comm, SplitByColourAndKey) {
  const int n = 6;
  auto comms = initThreads(n);
  // Colours: even ranks 0, odd ranks 1, rank 5 opts out. Keys reverse the order.
  std::vector<ncclComm_t> sub(n, nullptr);
  std::vector<ncclResult_t> rc(n);
  onThreads(n, [&](int r) {
    int color = r == 5 ? NCCL_SPLIT_NOCOLOR : r % 2;
    rc[r] = ncclCommSplit(comms[r], color, /*key=*/100 - r, &sub[r], nullptr);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(rc[r], ncclSuccess) << "rank " << r;
  EXPECT_EQ(sub[5], nullptr);
  // Even: parent ranks 0,2,4 with keys 100,98,96 -> new ranks 2,1,0. Odd: 1,3 -> 1,0.
  int expectRank[5] = {2, 1, 1, 0, 0};
  int expectCount[5] = {3, 2, 3, 2, 3};
  for (int r = 0; r < 5; ++r) {
    ASSERT_NE(sub[r], nullptr) << r;
    int rank = -1, count = 0;
    EXPECT_EQ(ncclCommUserRank(sub[r], &rank), ncclSuccess);
    EXPECT_EQ(ncclCommCount(sub[r], &count), ncclSuccess);
    EXPECT_EQ(rank, expectRank[r]) << "parent rank " << r;
    EXPECT_EQ(count, expectCount[r]) << "parent rank " << r;
  }
  destroyAll(sub);
  destroyAll(comms);
}

TEST(Comm, SplitEqualKeysKeepParentOrder) {
  auto comms = initThreads(3);
  std::vector<ncclComm_t> sub(3, nullptr);
  onThreads(
      3, [&](int r) { ASSERT_EQ(ncclCommSplit(comms[r], 7, 0, &sub[r], nullptr), ncclSuccess); });
  for (int r = 0; r < 3; ++r) {
    int rank = -1;
    ASSERT_EQ(ncclCommUserRank(sub[r], &rank), ncclSuccess);
    EXPECT_EQ(rank, r);
  }
  destroyAll(sub);
  destroyAll(comms);
}

TEST(Comm, NonblockingInitAndSplit) {
  const int n = 3;
  ncclUniqueId id = makeId();
  std::vector<ncclComm_t> comms(n, nullptr);
  ncclConfig_t cfg = nonblockingConfig();
  // One thread issues every rank's init: with blocking=0 each call returns at once.
  for (int r = 0; r < n; ++r) {
    ncclResult_t rc = ncclCommInitRankConfig(&comms[r], n, id, r, &cfg);
    ASSERT_TRUE(rc == ncclInProgress || rc == ncclSuccess) << rc;
    ASSERT_NE(comms[r], nullptr);
  }
  for (auto c : comms) ASSERT_EQ(waitInitialized(c), ncclSuccess) << ncclGetLastError(c);
  int count = 0;
  ASSERT_EQ(ncclCommCount(comms[1], &count), ncclSuccess);
  EXPECT_EQ(count, n);

  // Nonblocking split inherits blocking=0 from the parent when config is NULL.
  std::vector<ncclComm_t> sub(n, nullptr);
  for (int r = 0; r < n; ++r) {
    ncclResult_t rc = ncclCommSplit(comms[r], 0, r, &sub[r], nullptr);
    ASSERT_TRUE(rc == ncclInProgress || rc == ncclSuccess) << rc;
  }
  for (auto c : sub) ASSERT_EQ(waitInitialized(c), ncclSuccess) << ncclGetLastError(c);
  int rank = -1;
  ASSERT_EQ(ncclCommUserRank(sub[2], &rank), ncclSuccess);
  EXPECT_EQ(rank, 2);
  destroyAll(sub);
  destroyAll(comms);
}

TEST(Comm, MissingRankFailsWithinDeadlineNamingIt) {
  ScopedEnv timeout("TUTTI_BOOTSTRAP_TIMEOUT", "2");
  ncclUniqueId id = makeId();
  const int n = 4;  // rank 2 never arrives
  std::vector<ncclComm_t> comms(n, nullptr);
  std::vector<ncclResult_t> rc(n, ncclSuccess);
  std::vector<std::string> msg(n);
  double start = now();
  onThreads(n, [&](int r) {
    if (r == 2) return;
    rc[r] = ncclCommInitRank(&comms[r], n, id, r);
    msg[r] = ncclGetLastError(nullptr);
  });
  double took = secondsSince(start);
  EXPECT_LT(took, 15.0);
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(rc[r], ncclTimeout) << msg[r];
    EXPECT_EQ(comms[r], nullptr);
    EXPECT_NE(msg[r].find("rank(s) 2 of 4 did not check in"), std::string::npos) << msg[r];
    // (the tests' root is on 127.0.0.1, the usual loopback address: no word of other hosts)
    EXPECT_EQ(msg[r].find("loopback"), std::string::npos) << msg[r];
  }
}

TEST(Comm, AbortDuringPendingInitReturnsPromptly) {
  ncclUniqueId id = makeId();
  ncclConfig_t cfg = nonblockingConfig();
  ncclComm_t c = nullptr;
  // Rank 0 of 2: the other rank never comes, so init stays pending.
  ASSERT_EQ(ncclCommInitRankConfig(&c, 2, id, 0, &cfg), ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ncclResult_t state;
  ASSERT_EQ(ncclCommGetAsyncError(c, &state), ncclSuccess);
  EXPECT_EQ(state, ncclInProgress);
  int count;
  EXPECT_EQ(ncclCommCount(c, &count), ncclInvalidArgument);  // not ready yet (as NCCL)
  double start = now();
  EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  EXPECT_LT(secondsSince(start), 1.0);
}

TEST(Comm, AbortFromAnotherThreadUnblocksBlockingInitInGroup) {
  // A blocking init issued inside a group runs in the background; aborting the handle from
  // another thread ends it and ncclGroupEnd reports the abort instead of waiting out the deadline.
  ncclUniqueId id = makeId();
  ncclComm_t c = nullptr;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&c, 2, id, 1), ncclSuccess);
  std::thread aborter([c] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  });
  double start = now();
  ncclResult_t rc = ncclGroupEnd();
  aborter.join();
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_LT(secondsSince(start), 5.0);
}

TEST(Comm, SeveralSplitsInOneGroupPairUpInCallOrder) {
  // Each rank issues two splits of the same parent inside one group; they run in the
  // background at once and must still pair up across ranks in the order they were called.
  const int n = 4;
  auto comms = initThreads(n);
  std::vector<ncclComm_t> byParity(n, nullptr), byHalf(n, nullptr);
  std::vector<ncclResult_t> rc(n);
  onThreads(n, [&](int r) {
    ncclGroupStart();
    ncclCommSplit(comms[r], r % 2, r, &byParity[r], nullptr);
    ncclCommSplit(comms[r], r / 2, -r, &byHalf[r], nullptr);
    rc[r] = ncclGroupEnd();
  });
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(rc[r], ncclSuccess) << "rank " << r;
    int a = -1, b = -1;
    ASSERT_EQ(ncclCommUserRank(byParity[r], &a), ncclSuccess);
    ASSERT_EQ(ncclCommUserRank(byHalf[r], &b), ncclSuccess);
    EXPECT_EQ(a, r / 2) << "parity split, parent rank " << r;
    EXPECT_EQ(b, 1 - r % 2) << "half split (keys reversed), parent rank " << r;
  }
  destroyAll(byParity);
  destroyAll(byHalf);
  destroyAll(comms);
}

TEST(Comm, NonblockingInitInsideGroupReportsFromGroupEnd) {
  ncclUniqueId id = makeId();
  ncclConfig_t cfg = nonblockingConfig();
  ncclComm_t comms[2] = {};
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ncclCommInitRankConfig(&comms[r], 2, id, r, &cfg), ncclSuccess);
  }
  ncclResult_t end = ncclGroupEnd();
  EXPECT_TRUE(end == ncclInProgress || end == ncclSuccess) << end;
  for (auto c : comms) {
    EXPECT_EQ(waitInitialized(c), ncclSuccess) << ncclGetLastError(c);
    EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
}

TEST(Comm, AbortFreesTheRendezvousPortForARetry) {
  // NCCL_COMM_ID style: rank 0 hosts the root at a fixed port. After an aborted attempt the
  // same job must be able to rendezvous there again at once.
  RunResult port = runShell(
      "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); "
      "print(s.getsockname()[1])'");
  ASSERT_EQ(port.exitCode, 0);
  std::string addr = "127.0.0.1:" + port.output.substr(0, port.output.find('\n'));
  ScopedEnv commId("NCCL_COMM_ID", addr.c_str());
  ncclUniqueId id = makeId();
  ncclConfig_t cfg = nonblockingConfig();
  ncclComm_t lonely = nullptr;
  ASSERT_EQ(ncclCommInitRankConfig(&lonely, 2, id, 0, &cfg), ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(ncclCommAbort(lonely), ncclSuccess);
  auto comms = initThreads(2);  // makes its id from NCCL_COMM_ID too
  for (auto c : comms) EXPECT_NE(c, nullptr);
  destroyAll(comms);
}

// A watchdog pattern: one thread asks a communicator for its state while another aborts it.
// The calls are answered or refused ("not a live communicator"), never made on a freed
// communicator (every query pins it; under ASAN a use after free fails this test).
TEST(Comm, QueriesDuringAnAbortOnAnotherThreadAreAnsweredOrRefused) {
  for (int round = 0; round < 20; ++round) {
    ncclComm_t comms[2] = {};
    ASSERT_EQ(ncclCommInitAll(comms, 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
    std::atomic<bool> stop{false};
    std::atomic<int> answered{0};
    std::thread asker([&] {
      while (!stop.load()) {
        int n = 0;
        ncclResult_t async = ncclSuccess;
        const ncclResult_t a = ncclCommCount(comms[0], &n);
        const ncclResult_t b = ncclCommGetAsyncError(comms[0], &async);
        ncclGetLastError(comms[0]);
        if (a == ncclSuccess) EXPECT_EQ(n, 2);
        if (a != ncclSuccess) EXPECT_EQ(a, ncclInvalidArgument);
        if (b != ncclSuccess) EXPECT_EQ(b, ncclInvalidArgument);
        answered += a == ncclSuccess;
      }
    });
    while (answered.load() == 0) std::this_thread::yield();
    EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
    stop = true;
    asker.join();
    int n = 0;
    EXPECT_EQ(ncclCommCount(comms[0], &n), ncclInvalidArgument);
    EXPECT_EQ(ncclCommAbort(comms[1]), ncclSuccess);
  }
}

// A child aborted while its split still waits for an earlier split's turn: the abort returns at
// once, and the parent's ranks still pair their later splits up (the aborted rank takes part in
// the exchange it would have run, as a rank of no colour, so the others' new communicator forms
// without it). Rank 1 comes late, so rank 0's second split waits behind its first.
TEST(Comm, AChildAbortedBeforeItsSplitsTurnLeavesTheParentWhole) {
  ScopedEnv timeout("TUTTI_BOOTSTRAP_TIMEOUT", "10");
  const int n = 2;
  auto comms = initThreads(n);
  ncclConfig_t cfg = nonblockingConfig();
  std::vector<std::string> fail(n);
  std::vector<int> secondSize(n, -1), thirdSize(n, -1);
  std::atomic<double> abortTook{-1};
  onThreads(n, [&](int r) {
    auto expect = [&](bool ok, const std::string& what) {
      if (!ok && fail[r].empty()) fail[r] = what;
      return ok;
    };
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ncclComm_t first = nullptr, second = nullptr, third = nullptr;
    ncclResult_t rc = ncclCommSplit(comms[r], 0, r, &first, &cfg);
    if (!expect(rc == ncclSuccess || rc == ncclInProgress, "first split")) return;
    rc = ncclCommSplit(comms[r], 0, r, &second, &cfg);
    if (!expect(rc == ncclSuccess || rc == ncclInProgress, "second split")) return;
    if (r == 0) {
      const double start = now();
      expect(ncclCommAbort(second) == ncclSuccess, "aborting the second child");
      abortTook = secondsSince(start);
      second = nullptr;
    }
    if (!expect(waitInitialized(first) == ncclSuccess, "first child")) return;
    if (second) {
      ncclResult_t state = waitInitialized(second);
      if (state == ncclSuccess) ncclCommCount(second, &secondSize[r]);
      ncclCommDestroy(second);
    }
    rc = ncclCommSplit(comms[r], 0, r, &third, nullptr);  // blocking
    if (!expect(rc == ncclSuccess, std::string("third split: ") + ncclGetLastError(comms[r])))
      return;
    ncclCommCount(third, &thirdSize[r]);
    ncclCommDestroy(third);
    ncclCommDestroy(first);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(fail[r], "") << "rank " << r;
  EXPECT_GE(abortTook.load(), 0.0);
  EXPECT_LT(abortTook.load(), 1.0);
  EXPECT_EQ(secondSize[1], 1);  // rank 1 alone: rank 0 took part with no colour
  EXPECT_EQ(thirdSize[0], 2);
  EXPECT_EQ(thirdSize[1], 2);
  destroyAll(comms);
}
