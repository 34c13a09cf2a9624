// StreamEntries: the entries ranks sharing a GPU leave each other on a shared stream
// (runtime/device_engine.cc). Events are ints here; release records what came back.
#include "runtime/stream_entries.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using tutti::GroupCounter;
using tutti::GroupPos;
using tutti::StreamEntries;
using tutti::StreamEntryKey;
using Entries = StreamEntries<int>;
using Wait = Entries::Wait;

int streams[2];  // two distinct stream handles
const void* const A = &streams[0];
const void* const B = &streams[1];

StreamEntryKey key(uint64_t comm, const void* stream, uint64_t coll, uint64_t sub = 0,
                   int place = 0) {
  return {comm, place, stream, GroupPos{coll, sub}};
}

// Joins `k` as rank `rank`; a new entry gets event `make`. Returns the entry and whether the
// caller was first.
std::pair<Entries::Ref, bool> join(Entries& t, const StreamEntryKey& k, int make, int siblings = 1,
                                   int rank = 0, bool onStream = true) {
  bool first = false;
  Entries::Ref e = t.join(
      k, siblings, rank, onStream,
      [&](int* ev) {
        *ev = make;
        return true;
      },
      &first);
  return {e, first};
}

// The event a follower's join finds, or -1 where the caller became the first (its new entry
// then stays for siblings).
int claimed(Entries& t, const StreamEntryKey& k) {
  auto [e, first] = join(t, k, -1);
  return first ? -1 : e->event;
}

TEST(StreamEntries, EachSiblingJoinsTheFirstsEntryOnceThenItGoes) {
  std::mutex mu;
  std::vector<std::string> log;  // "release N", in order
  Entries t(1024, [&](int e) {
    std::lock_guard<std::mutex> lock(mu);
    log.push_back("release " + std::to_string(e));
  });
  auto [lead, first] = join(t, key(7, A, 1), 100, 3, /*rank=*/2);
  ASSERT_TRUE(first);
  EXPECT_EQ(lead->firstRank, 2);
  // Another group, stream, communicator or GPU: each is an entry of its own.
  for (const StreamEntryKey& other :
       {key(7, A, 2), key(7, B, 1), key(8, A, 1), key(7, A, 1, 1), key(7, A, 1, 0, 1)}) {
    auto [e, f] = join(t, other, 200);
    EXPECT_TRUE(f);
    EXPECT_EQ(e->event, 200);
  }
  EXPECT_EQ(t.size(), 6u);
  EXPECT_TRUE(log.empty()) << "entries wait for their siblings";
  std::vector<Entries::Ref> held;
  for (int i = 0; i < 3; ++i) {
    auto [e, f] = join(t, key(7, A, 1), -1);
    EXPECT_FALSE(f) << "sibling " << i;
    EXPECT_EQ(e->event, 100);
    held.push_back(e);
  }
  EXPECT_EQ(t.size(), 5u) << "used up by its three followers";
  EXPECT_TRUE(log.empty()) << "the event stays while the first and followers hold it";
  lead.reset();
  held.pop_back();
  held.pop_back();
  EXPECT_TRUE(log.empty());
  held.clear();
  EXPECT_EQ(log, std::vector<std::string>{"release 100"});
}

TEST(StreamEntries, NoEntryWhereTheEventCannotBeMade) {
  int releases = 0;
  Entries t(1024, [&](int) { ++releases; });
  bool first = false;
  auto e = t.join(
      key(7, A, 1), 1, 0, true, [](int*) { return false; }, &first);
  EXPECT_TRUE(first);
  EXPECT_EQ(e, nullptr);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_EQ(releases, 0);
  EXPECT_TRUE(join(t, key(7, A, 1), 5).second) << "the next sibling becomes the first";
}

TEST(StreamEntries, UnclaimedEntriesStayWithinTheBoundOldestGoFirst) {
  std::vector<int> released;
  Entries t(4, [&](int e) { released.push_back(e); });
  // Siblings with a stream each: nobody claims. Every new entry beyond 4 pushes the oldest out.
  for (int g = 0; g < 10; ++g) join(t, key(7, A, uint64_t(g)), 100 + g);
  EXPECT_EQ(t.size(), 4u);
  EXPECT_EQ(released, (std::vector<int>{100, 101, 102, 103, 104, 105}));
  for (int g = 6; g < 10; ++g) EXPECT_EQ(claimed(t, key(7, A, uint64_t(g))), 100 + g);
  EXPECT_EQ(t.size(), 0u);
  // Claimed entries still hold their place in the order once: the bound counts them until
  // they pass, and no live entry is pushed out early by them.
  released.clear();
  join(t, key(7, B, 20), 200);
  join(t, key(7, B, 21), 201);
  EXPECT_TRUE(released.empty()) << "the claimed keys went first";
  EXPECT_EQ(claimed(t, key(7, B, 20)), 200);
  EXPECT_EQ(claimed(t, key(7, B, 21)), 201);
}

TEST(StreamEntries, ManyEntriesAreFoundByKey) {
  int releases = 0;
  Entries t(1024, [&](int) { ++releases; });
  for (int g = 0; g < 1000; ++g) join(t, key(uint64_t(g % 3), g % 2 ? A : B, uint64_t(g)), g);
  for (int g = 999; g >= 0; --g) {
    EXPECT_EQ(claimed(t, key(uint64_t(g % 3), g % 2 ? A : B, uint64_t(g))), g);
  }
  EXPECT_EQ(releases, 1000);
}

// Three ranks of one communicator on one GPU in one process: ranks 0 and 1 share stream A
// (rank 0 enters first and leads), rank 2 has stream B of its own and leads there alone.
// Each group, as device_engine.cc's enter() does: report the group, then join.
struct Siblings {
  int releases = 0;
  Entries t{8192, [this](int) { ++releases; }};
  void enter(int rank, uint64_t g, int place = 0) {
    t.entered(7, place, rank, 3, GroupPos{g, 0});
    join(t, key(7, rank == 2 ? B : A, g, 0, place), int(g), 2, rank);
  }
};

TEST(StreamEntries, EntriesNoSiblingClaimsGoOnceAllPassedTheirGroup) {
  Siblings s;
  for (uint64_t g = 0; g < 5000; ++g) {
    for (int r = 0; r < 3; ++r) s.enter(r, g);
    // Rank 1 claimed A's entry of g; B's entry of g stays until all three passed g.
    EXPECT_LE(s.t.size(), 3u) << "group " << g;
  }
}

TEST(StreamEntries, ALateSiblingFindsEveryEntryHowFarBehindItIs) {
  Siblings s;
  // Ranks 0 and 2 run 3000 groups ahead of rank 1 (their kernels wait; their threads do not):
  // 6000 entries, more than the 1024 a bound alone used to keep.
  for (uint64_t g = 0; g < 3000; ++g) {
    s.enter(0, g);
    s.enter(2, g);
  }
  for (uint64_t g = 0; g < 3000; ++g) {
    s.t.entered(7, 0, 1, 3, GroupPos{g, 0});
    ASSERT_EQ(claimed(s.t, key(7, A, g)), int(g)) << "rank 1 lost rank 0's entry of group " << g;
  }
  EXPECT_LE(s.t.size(), 2u) << "caught up: only the latest group's entries are left";
}

TEST(StreamEntries, ProgressIsCountedPerGpu) {
  // Ranks 0 and 1 on GPU 0 share stream A; ranks 2 and 3 on GPU 1 share stream B; all four in
  // one process. Ranks 0, 2 and 3 run ahead; rank 1 has not entered group 0 yet. Counting the
  // siblings of all GPUs together, three ranks past group 0 looked like "all of them" (two
  // per GPU) and rank 0's entry for rank 1 went.
  Entries t(8192, [](int) {});
  for (uint64_t g = 0; g < 3; ++g) {
    t.entered(7, 0, 0, 2, GroupPos{g, 0});
    join(t, key(7, A, g, 0, 0), 10 + int(g), 1, 0);
    t.entered(7, 1, 2, 2, GroupPos{g, 0});
    join(t, key(7, B, g, 0, 1), 20 + int(g), 1, 2);
    t.entered(7, 1, 3, 2, GroupPos{g, 0});
    EXPECT_EQ(claimed(t, key(7, B, g, 0, 1)), 20 + int(g));
  }
  for (uint64_t g = 0; g < 3; ++g) {
    t.entered(7, 0, 1, 2, GroupPos{g, 0});
    EXPECT_EQ(claimed(t, key(7, A, g, 0, 0)), 10 + int(g)) << "group " << g;
  }
}

TEST(StreamEntries, TheBoundHoldsWhereASiblingNeverEnters) {
  int releases = 0;
  Entries t(16, [&](int) { ++releases; });
  for (uint64_t g = 0; g < 100; ++g) {
    t.entered(7, 0, 0, 2, GroupPos{g, 0});  // rank 1 of 2 never comes: progress cannot tell
    join(t, key(7, A, g), int(g), 1);
  }
  EXPECT_EQ(t.size(), 16u);
  EXPECT_EQ(releases, 84);
}

TEST(StreamEntries, SendsAmongSomeRanksDoNotShiftTheOthersCollectives) {
  // Ranks 0, 1 and 2: an all-reduce; ranks 0 and 2 exchange in two groups of their own (rank
  // 1 prepares nothing then); all three all-reduce again. Counting every group, rank 1's
  // second all-reduce was group 1 and the others' group 3: no sibling found the first's
  // entry, so each led on the shared stream, queued behind the other: a deadlock.
  GroupCounter r0, r1, r2;
  GroupPos p0 = r0.collective(), p1 = r1.collective(), p2 = r2.collective();
  EXPECT_TRUE(p0 == p1 && p1 == p2);
  for (int i = 0; i < 2; ++i) {
    p0 = r0.exchange({0, 2});
    p2 = r2.exchange({2, 0});
    EXPECT_TRUE(p0 == p2) << "the two in the exchange match each other";
    EXPECT_TRUE(p1 < p0) << "and come after the collective before";
  }
  p0 = r0.collective();
  p1 = r1.collective();
  p2 = r2.collective();
  EXPECT_TRUE(p0 == p1 && p1 == p2) << "the next collective matches on all three";
  EXPECT_EQ(p0.coll, 2u);
  EXPECT_EQ(p0.sub, 0u);
  EXPECT_EQ(p0.set, 0u);
}

TEST(StreamEntries, ExchangesMatchOnlyTheSameRanksExchange) {
  // A chain: rank 0 sends to 1; rank 1 receives from 0, then sends to 2 (two calls); rank 2
  // receives from 1. Counting each rank's exchanges, rank 2's only exchange matched rank 1's
  // first (with rank 0): rank 2 then waited for an event of another exchange, and rank 1's
  // second exchange had no partner.
  GroupCounter r0, r1, r2;
  const GroupPos a0 = r0.exchange({0, 1});
  const GroupPos a1 = r1.exchange({1, 0});
  const GroupPos b1 = r1.exchange({1, 2});
  const GroupPos b2 = r2.exchange({2, 1});
  EXPECT_TRUE(a0 == a1);
  EXPECT_TRUE(b1 == b2);
  EXPECT_FALSE(a1 == b1);
  EXPECT_FALSE(a0 == b2);
  // A fan-out: rank 0 sends to 1, then to 2, in two calls; a second round of each.
  GroupCounter f0, f1, f2;
  for (int round = 1; round <= 2; ++round) {
    const GroupPos x0 = f0.exchange({0, 1}), y0 = f0.exchange({2, 0, 2});
    const GroupPos x1 = f1.exchange({1, 0}), y2 = f2.exchange({0, 2});
    EXPECT_TRUE(x0 == x1) << "round " << round;
    EXPECT_TRUE(y0 == y2) << "round " << round;
    EXPECT_FALSE(x0 == y0);
    EXPECT_EQ(x0.sub, uint64_t(round));
  }
}

TEST(StreamEntries, UnclaimedExchangeEntriesGoOnceAllSiblingsReachTheNextCollective) {
  // Ranks 0 and 1 on one GPU, a stream each, exchange 100 times (each leads its own entry,
  // which nobody claims), then all-reduce.
  Entries t(8192, [](int) {});
  GroupCounter c0, c1;
  for (int i = 0; i < 100; ++i) {
    const GroupPos p0 = c0.exchange({0, 1}), p1 = c1.exchange({1, 0});
    t.entered(7, 0, 0, 2, p0);
    join(t, {7, 0, A, p0}, i);
    t.entered(7, 0, 1, 2, p1);
    join(t, {7, 0, B, p1}, i);
  }
  EXPECT_EQ(t.size(), 200u) << "a later exchange says nothing of an earlier one's partners";
  const GroupPos p0 = c0.collective(), p1 = c1.collective();
  t.entered(7, 0, 0, 2, p0);
  EXPECT_EQ(t.size(), 200u) << "rank 1 may still need one";
  t.entered(7, 0, 1, 2, p1);
  EXPECT_EQ(t.size(), 0u);
}

TEST(StreamEntries, AFollowerWaitsUntilTheFirstRecordedAndLaunched) {
  Entries t(1024, [](int) {});
  auto [lead, first] = join(t, key(7, A, 1), 42, 1, 0, /*onStream=*/true);
  ASSERT_TRUE(first);
  std::atomic<int> stage{0};  // what the first's thread has done: 1 recorded, 2 launched
  std::atomic<int> sawRecorded{-1}, sawLaunched{-1};
  std::thread follower([&] {
    auto [e, f] = join(t, key(7, A, 1), -1);
    EXPECT_FALSE(f);
    EXPECT_EQ(t.waitRecorded(e, 30, nullptr), Wait::kReady);
    sawRecorded = stage.load();
    EXPECT_EQ(t.waitLaunched(e, 30, nullptr), Wait::kReady);
    sawLaunched = stage.load();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stage = 1;
  t.recorded(lead, true);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  stage = 2;
  t.launched(lead);
  follower.join();
  EXPECT_EQ(sawRecorded, 1) << "the follower went on before the first recorded its event";
  EXPECT_EQ(sawLaunched, 2) << "the follower joined back before the first launched";
}

TEST(StreamEntries, AFollowersWaitEndsOnFailureAbortOrDeadline) {
  Entries t(1024, [](int) {});
  {
    auto [lead, first] = join(t, key(7, A, 1), 1);
    auto [e, f] = join(t, key(7, A, 1), -1);
    std::thread failer([&, lead = lead] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      t.recorded(lead, false);
    });
    EXPECT_EQ(t.waitRecorded(e, 30, nullptr), Wait::kFailed);
    EXPECT_EQ(t.waitLaunched(e, 30, nullptr), Wait::kFailed);
    failer.join();
  }
  {
    auto [lead, first] = join(t, key(7, A, 2), 2);
    auto [e, f] = join(t, key(7, A, 2), -1);
    std::atomic<bool> aborted{false};
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      aborted = true;
    });
    EXPECT_EQ(t.waitRecorded(e, 30, [&] { return aborted.load(); }), Wait::kStopped);
    aborter.join();
  }
  {
    auto [lead, first] = join(t, key(7, A, 3), 3);
    auto [e, f] = join(t, key(7, A, 3), -1);
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(t.waitRecorded(e, 0.1, nullptr), Wait::kTimedOut);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(100));
    t.recorded(lead, true);
    EXPECT_EQ(t.waitLaunched(e, 0.05, nullptr), Wait::kTimedOut) << "recorded, not launched";
  }
}

}  // namespace
