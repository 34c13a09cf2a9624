// StreamEntries: the entries ranks sharing a GPU leave each other on a shared stream
// (runtime/device_engine.cc). Events are ints here; release records what came back.
#include "runtime/stream_entries.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace {

using tutti::StreamEntries;
using tutti::StreamEntryKey;

int streams[2];  // two distinct stream handles
const void* const A = &streams[0];
const void* const B = &streams[1];

TEST(StreamEntries, EachSiblingClaimsTheEntryOnceThenItGoes) {
  // What happened to events, in order: "use N" for a claim's use, "release N".
  std::vector<std::string> log;
  StreamEntries<int> t(1024, [&](int e) { log.push_back("release " + std::to_string(e)); });
  auto claim = [&](const StreamEntryKey& k) {
    int got = -1;
    const bool found = t.claim(k, [&](int e) {
      got = e;
      log.push_back("use " + std::to_string(e));
    });
    EXPECT_EQ(found, got >= 0) << "claim says it found an entry exactly when it used one";
    return got;
  };
  t.add({7, A, 1}, 100, 3);  // the first of 4 ranks on stream A, group 1
  EXPECT_EQ(claim({7, A, 2}), -1) << "another group";
  EXPECT_EQ(claim({7, B, 1}), -1) << "another stream";
  EXPECT_EQ(claim({8, A, 1}), -1) << "another communicator";
  for (int i = 0; i < 3; ++i) EXPECT_EQ(claim({7, A, 1}), 100) << "sibling " << i;
  // The last sibling's use comes before the event goes back (release may destroy it).
  EXPECT_EQ(log, (std::vector<std::string>{"use 100", "use 100", "use 100", "release 100"}));
  EXPECT_EQ(claim({7, A, 1}), -1) << "a fourth claim finds nothing";
  EXPECT_EQ(t.size(), 0u);
}

// The event a claim returns, or -1.
int claimed(StreamEntries<int>& t, const StreamEntryKey& k) {
  int got = -1;
  t.claim(k, [&](int e) { got = e; });
  return got;
}

TEST(StreamEntries, UnclaimedEntriesStayWithinTheBoundOldestGoFirst) {
  std::vector<int> released;
  StreamEntries<int> t(4, [&](int e) { released.push_back(e); });
  // Siblings with a stream each: nobody claims. Every new entry beyond 4 pushes the oldest out.
  for (int g = 0; g < 10; ++g) t.add({7, A, uint64_t(g)}, 100 + g, 1);
  EXPECT_EQ(t.size(), 4u);
  EXPECT_EQ(released, (std::vector<int>{100, 101, 102, 103, 104, 105}));
  EXPECT_EQ(claimed(t, {7, A, 5}), -1);
  for (int g = 6; g < 10; ++g) EXPECT_EQ(claimed(t, {7, A, uint64_t(g)}), 100 + g);
  EXPECT_EQ(t.size(), 0u);
  // Claimed entries still hold their place in the order once: the bound counts them until
  // they pass, and no live entry is pushed out early by them.
  released.clear();
  t.add({7, B, 20}, 200, 1);
  t.add({7, B, 21}, 201, 1);
  EXPECT_TRUE(released.empty()) << "the claimed keys went first";
  EXPECT_EQ(claimed(t, {7, B, 20}), 200);
  EXPECT_EQ(claimed(t, {7, B, 21}), 201);
}

TEST(StreamEntries, ManyEntriesAreFoundByKey) {
  int releases = 0;
  StreamEntries<int> t(1024, [&](int) { ++releases; });
  for (int g = 0; g < 1000; ++g) t.add({uint64_t(g % 3), g % 2 ? A : B, uint64_t(g)}, g, 1);
  for (int g = 999; g >= 0; --g) {
    EXPECT_EQ(claimed(t, {uint64_t(g % 3), g % 2 ? A : B, uint64_t(g)}), g);
  }
  EXPECT_EQ(releases, 1000);
}

}  // namespace

namespace {

// Three ranks of one communicator on one GPU in one process: ranks 0 and 1 share stream A
// (rank 0 enters first and leads), rank 2 has stream B of its own and leads there alone.
// Each group, as device_engine.cc's enter() does: report the group, then claim or add.
struct Siblings {
  int releases = 0;
  StreamEntries<int> t{8192, [this](int) { ++releases; }};
  void enter(int rank, uint64_t g) {
    t.entered(7, rank, 3, g);
    const StreamEntryKey key{7, rank == 2 ? B : A, g};
    if (claimed(t, key) < 0) t.add(key, int(g), 2);
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
    s.t.entered(7, 1, 3, g);
    ASSERT_EQ(claimed(s.t, {7, A, g}), int(g)) << "rank 1 lost rank 0's entry of group " << g;
  }
  EXPECT_LE(s.t.size(), 2u) << "caught up: only the latest group's entries are left";
}

TEST(StreamEntries, TheBoundHoldsWhereASiblingNeverEnters) {
  int releases = 0;
  StreamEntries<int> t(16, [&](int) { ++releases; });
  for (uint64_t g = 0; g < 100; ++g) {
    t.entered(7, 0, 2, g);  // rank 1 of 2 never comes: progress cannot tell
    t.add({7, A, g}, int(g), 1);
  }
  EXPECT_EQ(t.size(), 16u);
  EXPECT_EQ(releases, 84);
}

}  // namespace
