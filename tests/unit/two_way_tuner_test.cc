// TwoWayTuner: the run-time choice between two ways of running an operation, by their times.
#include "runtime/two_way_tuner.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

using tutti::TwoWayTuner;

// Runs `runs` picks in one size class, each way taking the time `cost` gives it for that run;
// returns the ways picked.
template <class Cost>
std::vector<int> drive(TwoWayTuner& t, int bucket, int runs, Cost cost) {
  std::vector<int> picked;
  for (int i = 0; i < runs; ++i) {
    const int way = t.pick(bucket);
    picked.push_back(way);
    t.record(bucket, way, cost(i, way));
  }
  return picked;
}

int count(const std::vector<int>& v, int way, size_t from = 0) {
  int c = 0;
  for (size_t i = from; i < v.size(); ++i) c += v[i] == way;
  return c;
}

// How many of runs first..last (counted from 1, the alternating six included) explore: one
// in `every`.
int explorations(int first, int last, uint32_t every) {
  int c = 0;
  for (int r = first; r <= last; ++r) c += uint32_t(r) % every == 0;
  return c;
}

TEST(TwoWayTuner, SizeClassesAreLog2OfTheBytes) {
  EXPECT_EQ(TwoWayTuner::bucketOf(0), 0);
  EXPECT_EQ(TwoWayTuner::bucketOf(1), 0);
  EXPECT_EQ(TwoWayTuner::bucketOf(1 << 20), 20);
  EXPECT_EQ(TwoWayTuner::bucketOf((1 << 21) - 1), 20);
  EXPECT_EQ(TwoWayTuner::bucketOf(~0ull), TwoWayTuner::kBuckets - 1);
}

// The ways alternate until each has two runs that count (the first of each does not: it
// carries first touches, here 100x slower), then the faster one takes every run but one in
// kExplore -- one in kExploreFar where the other is far behind (more than kFarBehind).
TEST(TwoWayTuner, AlternatesThenTakesTheFasterWayAndExploresTheOther) {
  struct Case {
    int fast;
    double slowCost;
    uint32_t every;
  };
  for (const Case& c : {Case{0, 60.0, TwoWayTuner::kExplore}, Case{1, 60.0, TwoWayTuner::kExplore},
                        Case{0, 100.0, TwoWayTuner::kExploreFar}}) {
    SCOPED_TRACE("faster way " + std::to_string(c.fast) + ", the other " +
                 std::to_string(c.slowCost) + " against 50");
    TwoWayTuner t;
    std::vector<int> seen(2, 0);
    const int runs = 6 + 2 * int(TwoWayTuner::kExploreFar);
    const std::vector<int> picked = drive(t, 20, runs, [&](int, int way) {
      return (seen[size_t(way)]++ == 0 ? 100.0 : 1.0) * (way == c.fast ? 50.0 : c.slowCost);
    });
    EXPECT_EQ((std::vector<int>(picked.begin(), picked.begin() + 6)),
              (std::vector<int>{0, 1, 0, 1, 0, 1}));
    EXPECT_EQ(t.leaning(20), c.fast);
    EXPECT_EQ(count(picked, 1 - c.fast, 6), explorations(7, runs, c.every));
    EXPECT_EQ(t.leaning(19), -1);  // another size class knows nothing yet
  }
}

// Two ways within kMargin of each other: the one taken stays, whichever noise says the other
// is a little faster.
TEST(TwoWayTuner, KeepsItsWayWhenTheOtherIsOnlySlightlyFaster) {
  TwoWayTuner t;
  const std::vector<int> picked =
      drive(t, 5, 100, [](int, int way) { return way == 0 ? 50.0 : 47.0; });
  EXPECT_EQ(t.leaning(5), 0);
  EXPECT_EQ(count(picked, 0, 6), 94 - explorations(7, 100, TwoWayTuner::kExplore));
}

// When the machine changes so that the other way becomes faster, the explored runs show it
// and the choice follows within a few explorations; a single slow outlier does not flip it.
TEST(TwoWayTuner, FollowsAChangeOfStateButNotOneOutlier) {
  TwoWayTuner t;
  int run = 0;
  auto cost = [&](int, int way) {
    const bool flipped = run++ >= 200;
    const bool outlier = run == 100;  // one preempted run of the faster way
    const double base = (way == 0) != flipped ? 40.0 : 60.0;
    return outlier ? 1e6 : base;
  };
  std::vector<int> picked = drive(t, 10, 200, cost);
  EXPECT_EQ(t.leaning(10), 0);
  EXPECT_GE(count(picked, 0, 100), 100 - 100 / int(TwoWayTuner::kExplore) - 1);
  picked = drive(t, 10, 200, cost);
  EXPECT_EQ(t.leaning(10), 1);
  // Within kKeep explorations of way 1 and then way 0's kept runs going stale, at most.
  EXPECT_GE(count(picked, 1, 100), 100 - 100 / int(TwoWayTuner::kExplore) - 1);
}

}  // namespace

// A trace line for each change of leaning: newLeaning returns the way once when the size
// class first leans, again only when it turns, and fastest() the times behind it.
TEST(TwoWayTuner, NewLeaningReportsEachChangeOnce) {
  TwoWayTuner t;
  const int b = 20;
  EXPECT_EQ(t.fastest(b, 0), 0.0);
  bool slowWay1 = true;
  std::vector<int> changes;
  for (int i = 0; i < 200; ++i) {
    if (i == 100) slowWay1 = false;  // way 1 becomes the fast one
    const int way = t.pick(b);
    t.record(b, way, way == 1 && slowWay1 ? 80.0 : way == 1 ? 20.0 : 50.0);
    if (int l = t.newLeaning(b); l >= 0) changes.push_back(l);
  }
  EXPECT_EQ(changes, (std::vector<int>{0, 1}));
  EXPECT_EQ(t.fastest(b, 0), 50.0);
  EXPECT_EQ(t.fastest(b, 1), 20.0);
  EXPECT_EQ(t.newLeaning(b), -1);
}
