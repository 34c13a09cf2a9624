// Lifecycle programs (collectives/lifecycle.h) on host buffers, ranks as threads: splits,
// destroys and aborts of children beside collectives on the parent and the children.
#include "collectives/lifecycle.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/harness.h"
#include "nccl.h"

using namespace tutti::test;

namespace {

class LifecyclePrograms : public ::testing::TestWithParam<std::pair<int, uint32_t>> {};

TEST_P(LifecyclePrograms, SplitsDestroysAndAbortsKeepTheParentWhole) {
  const int n = GetParam().first;
  // TUTTI_LIFECYCLE_SEED and TUTTI_LIFECYCLE_LENGTH replace them (to try others by hand).
  const char* seedEnv = getenv("TUTTI_LIFECYCLE_SEED");
  const char* lengthEnv = getenv("TUTTI_LIFECYCLE_LENGTH");
  const uint32_t seed =
      seedEnv && *seedEnv ? uint32_t(strtoul(seedEnv, nullptr, 0)) : GetParam().second;
  const int length = lengthEnv && *lengthEnv ? atoi(lengthEnv) : 30;
  ScopedEnv bootstrap("TUTTI_BOOTSTRAP_TIMEOUT", "20");
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  const std::vector<LifecycleStep> steps = randomLifecycle(n, seed, length);
  std::vector<ncclComm_t> comms = initThreads(n);
  ASSERT_EQ(comms.size(), size_t(n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  ThreadBarrier barrier(n);
  onThreads(n, [&](int r) {
    errors[size_t(r)] = runLifecycle(comms[size_t(r)], r, n, steps, [&] { barrier.wait(); });
  });
  bool failed = false;
  for (const std::string& e : errors) {
    if (!e.empty()) ADD_FAILURE() << e;
    failed = failed || !e.empty();
  }
  if (failed) {
    destroyAll(comms);  // (aborted: a failed rank may have left the others waiting)
    ADD_FAILURE() << "the program (seed " << seed << "):\n" << describeLifecycle(steps);
    return;
  }
  // The parent still works for everyone.
  std::vector<float> sums(static_cast<size_t>(n), 0);
  onThreads(n, [&](int r) {
    float v = float(r + 1);
    if (ncclAllReduce(&v, &sums[size_t(r)], 1, ncclFloat, ncclSum, comms[size_t(r)], nullptr) !=
        ncclSuccess)
      sums[size_t(r)] = -1;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(sums[size_t(r)], float(n * (n + 1) / 2)) << "rank " << r;
  destroyAll(comms);
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, LifecyclePrograms,
    ::testing::Values(std::pair<int, uint32_t>{2, 1}, std::pair<int, uint32_t>{3, 2},
                      std::pair<int, uint32_t>{4, 3}, std::pair<int, uint32_t>{5, 4}),
    [](const ::testing::TestParamInfo<std::pair<int, uint32_t>>& i) {
      return std::to_string(i.param.first) + "ranks_seed" + std::to_string(i.param.second);
    });

}  // namespace
