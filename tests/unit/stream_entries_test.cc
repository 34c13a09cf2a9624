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
