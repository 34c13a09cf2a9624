// Ranks sharing a GPU as threads, whose kernels wait for each other: their communicators make
// their GPU links at creation (DeviceEngine::connectAtCreation), since making them later
// allocates device memory, which may wait for the whole GPU while a sibling's kernel waits for
// the allocating thread. Communicators split from another (ncclCommSplit) running collectives
// on GPU buffers beside their parent, as PyTorch's new_group does once its default group was
// made with a device; and the first sends and receives of a pipeline beside a collective. And,
// with ranks as processes, a non-blocking split beside the parent's first collective.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/lifecycle.h"
#include "gpu/gpu_support.h"
#include "harness/harness.h"

using namespace tutti::test;

namespace {

// n ranks as threads on GPU 0, a non-blocking stream each; destroyed at the test's end (after
// any communicator split from them, which the test destroys itself).
struct ThreadRanks {
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  explicit ThreadRanks(int n) : comms(initThreads(n)), streams(size_t(n)) {
    for (auto& s : streams)
      EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  }
  ~ThreadRanks() {
    destroyAll(comms);
    for (auto& s : streams) cudaStreamDestroy(s);
  }
};

// Four ranks as threads on one GPU split by parity (keys reversed: rank r is the child's rank
// 1 - r / 2); rank 3 takes no part in a second split (NCCL_SPLIT_NOCOLOR). Each rank sums in
// place, on its stream, a small (LL) and a larger (Simple) buffer in the parent and in its
// child in turn, three rounds: every result depends on each earlier one, in the right
// communicator.
TEST(GpuSplit, SplitCommunicatorsRunCollectivesBesideTheirParent) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  ThreadRanks ranks(n);
  std::vector<ncclComm_t>& parent = ranks.comms;
  std::vector<cudaStream_t>& streams = ranks.streams;
  std::vector<ncclComm_t> child(n, nullptr), trio(n, nullptr);
  RankBuffers ps(n, 64), pb(n, 1 << 18), cs(n, 64), cb(n, 1 << 18), ts(n, 64);
  RankFailures failures;
  onThreads(n, [&](int r) {
    cudaStream_t s = streams[size_t(r)];
    if (!failures.ok(r, ncclCommSplit(parent[size_t(r)], r % 2, n - r, &child[size_t(r)], nullptr),
                     parent[size_t(r)], "ncclCommSplit"))
      return;
    if (!failures.ok(r,
                     ncclCommSplit(parent[size_t(r)], r == 3 ? NCCL_SPLIT_NOCOLOR : 0, r,
                                   &trio[size_t(r)], nullptr),
                     parent[size_t(r)], "ncclCommSplit (NOCOLOR)"))
      return;
    if ((r == 3) != (trio[size_t(r)] == nullptr)) failures.add(r, "NOCOLOR: wrong communicator");
    int childRank = -1;
    ncclCommUserRank(child[size_t(r)], &childRank);
    if (childRank != 1 - r / 2) failures.add(r, "child rank " + std::to_string(childRank));
    ps.fill(r, float(r + 1), s);
    pb.fill(r, float(r + 1), s);
    cs.fill(r, float(10 * (r + 1)), s);
    cb.fill(r, float(10 * (r + 1)), s);
    ts.fill(r, float(r + 1), s);
    for (int round = 0; round < 3; ++round) {
      for (RankBuffers* b : {&ps, &pb, &cs, &cb}) {
        ncclComm_t c = (b == &ps || b == &pb) ? parent[size_t(r)] : child[size_t(r)];
        if (!failures.ok(r,
                         ncclAllReduce(b->bufs[size_t(r)], b->bufs[size_t(r)], b->count, ncclFloat,
                                       ncclSum, c, s),
                         c, "ncclAllReduce"))
          return;
      }
      if (trio[size_t(r)] &&
          !failures.ok(r,
                       ncclAllReduce(ts.bufs[size_t(r)], ts.bufs[size_t(r)], ts.count, ncclFloat,
                                     ncclSum, trio[size_t(r)], s),
                       trio[size_t(r)], "ncclAllReduce (trio)"))
        return;
    }
    // Parent: 1 + 2 + 3 + 4, then times 4 twice. Children: even ranks 10 + 30, odd 20 + 40,
    // then times 2 twice. The trio: 1 + 2 + 3, times 3 twice; rank 3's buffer untouched.
    const float parentSum = 10.0f * 16, childSum = (r % 2 == 0 ? 40.0f : 60.0f) * 4;
    expectResults(failures, r, parent[size_t(r)], s, {{&ps, parentSum}, {&pb, parentSum}});
    expectResults(failures, r, child[size_t(r)], s, {{&cs, childSum}, {&cb, childSum}});
    const std::string trioBad = ts.check(r, r == 3 ? 4.0f : 6.0f * 9, s);
    if (!trioBad.empty()) failures.add(r, "trio: " + trioBad);
  });
  failures.report();
  destroyAll(trio);
  destroyAll(child);
}

// Non-blocking splits: rank 3, left out of the new communicator, gets no communicator and goes
// on at once with a collective of the parent, whose kernel waits for ranks 0-2 -- still
// making their new communicator's links in the background. The parent's operation waits for
// that split to end first (Comm::waitHelpers), so no kernel of it runs while they allocate.
TEST(GpuSplit, ANonBlockingSplitEndsBeforeTheParentsNextCollective) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  ThreadRanks ranks(n);
  std::vector<ncclComm_t>& parent = ranks.comms;
  std::vector<cudaStream_t>& streams = ranks.streams;
  std::vector<ncclComm_t> child(n, nullptr);
  RankBuffers ps(n, 64), cs(n, 64);
  RankFailures failures;
  onThreads(n, [&](int r) {
    cudaStream_t s = streams[size_t(r)];
    ncclComm_t p = parent[size_t(r)];
    ps.fill(r, float(r + 1), s);
    cs.fill(r, float(r + 1), s);
    float* pb = ps.bufs[size_t(r)];
    if (!failures.ok(r, ncclAllReduce(pb, pb, ps.count, ncclFloat, ncclSum, p, s), p,
                     "first all-reduce"))
      return;
    ncclConfig_t config = nonblockingConfig();
    if (r < 3) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 3 first
    const ncclResult_t rc =
        ncclCommSplit(p, r == 3 ? NCCL_SPLIT_NOCOLOR : 0, r, &child[size_t(r)], &config);
    if (rc != ncclInProgress && !failures.ok(r, rc, p, "ncclCommSplit")) return;
    // Ranks 0-2 wait for their new communicator, as a non-blocking application does, before
    // they call the parent again.
    if (r < 3 && waitInitialized(child[size_t(r)]) != ncclSuccess)
      return failures.add(r, "the new communicator did not come up");
    if (!failures.ok(r, ncclAllReduce(pb, pb, ps.count, ncclFloat, ncclSum, p, s), p,
                     "second all-reduce"))
      return;
    if (r < 3) {
      float* cb = cs.bufs[size_t(r)];
      ncclComm_t c = child[size_t(r)];
      if (!failures.ok(r, ncclAllReduce(cb, cb, cs.count, ncclFloat, ncclSum, c, s), c,
                       "child all-reduce"))
        return;
    }
    expectResults(failures, r, p, s, {{&ps, 40.0f}});
    if (r < 3) expectResults(failures, r, child[size_t(r)], s, {{&cs, 6.0f}});
  });
  failures.report();
  destroyAll(child);
}

// Three ranks as threads on one GPU; P = {0, 1} and Q = {0, 2}, split from them. Rank 2 (not in
// P) queues an all-reduce on Q at once: its kernel waits for rank 0. Rank 0 splits P without
// blocking, then calls that all-reduce; rank 1 splits P and waits for the new communicator. The
// split's links wait for the GPU, which rank 2's kernel holds until rank 0's joins it: rank 0's
// operation may wait for its split (Comm::waitFamilyHelpersFor) but not for ever.
TEST(GpuSplit, AKernelQueuedBeforeANonBlockingSplitByARankOutsideItEnds) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 3;
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  ThreadRanks ranks(n);
  std::vector<ncclComm_t> p(n, nullptr), q(n, nullptr), child(n, nullptr);
  RankBuffers warm(n, 64), qs(n, 64), cs(n, 64);
  RankFailures failures;
  onThreads(n, [&](int r) {
    cudaStream_t s = ranks.streams[size_t(r)];
    ncclComm_t parent = ranks.comms[size_t(r)];
    warm.fill(r, float(r + 1), s);
    qs.fill(r, float(r + 1), s);
    cs.fill(r, float(r + 1), s);
    if (!failures.ok(
            r, ncclCommSplit(parent, r < 2 ? 0 : NCCL_SPLIT_NOCOLOR, r, &p[size_t(r)], nullptr),
            parent, "split P") ||
        !failures.ok(
            r, ncclCommSplit(parent, r != 1 ? 0 : NCCL_SPLIT_NOCOLOR, r, &q[size_t(r)], nullptr),
            parent, "split Q"))
      return;
    ncclComm_t qc = q[size_t(r)];
    if (r != 1) {  // Q's links first, and both its ranks past them
      float* wb = warm.bufs[size_t(r)];
      if (!failures.ok(r, ncclAllReduce(wb, wb, warm.count, ncclFloat, ncclSum, qc, s), qc,
                       "warm-up on Q"))
        return;
      if (cudaStreamSynchronize(s) != cudaSuccess) return failures.add(r, "warm-up on Q failed");
    }
    float* qb = qs.bufs[size_t(r)];
    if (r == 2) {
      if (!failures.ok(r, ncclAllReduce(qb, qb, qs.count, ncclFloat, ncclSum, qc, s), qc,
                       "all-reduce on Q"))
        return;
      expectResults(failures, r, qc, s, {{&warm, 4.0f}, {&qs, 4.0f}});
      return;
    }
    if (r == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 2 first
    ncclConfig_t config = nonblockingConfig();
    ncclComm_t pc = p[size_t(r)];
    const ncclResult_t rc = ncclCommSplit(pc, 0, r, &child[size_t(r)], &config);
    if (rc != ncclInProgress && !failures.ok(r, rc, pc, "non-blocking split of P")) return;
    if (r == 0 && !failures.ok(r, ncclAllReduce(qb, qb, qs.count, ncclFloat, ncclSum, qc, s), qc,
                               "all-reduce on Q"))
      return;
    if (waitInitialized(child[size_t(r)], 30) != ncclSuccess)
      return failures.add(r, "the new communicator did not come up");
    float* cb = cs.bufs[size_t(r)];
    ncclComm_t c = child[size_t(r)];
    if (!failures.ok(r, ncclAllReduce(cb, cb, cs.count, ncclFloat, ncclSum, c, s), c,
                     "all-reduce on the new communicator"))
      return;
    expectResults(failures, r, c, s, {{&cs, 3.0f}});
    if (r == 0) expectResults(failures, r, qc, s, {{&warm, 4.0f}, {&qs, 4.0f}});
  });
  failures.report();
  destroyAll(child);
  destroyAll(q);
  destroyAll(p);
}

// Four ranks on threads all-reduce together, then pass a buffer down a pipeline (0 -> 1 -> 2
// -> 3, each rank's first sends and receives), ranks 2 and 3 coming late, then all-reduce
// again. Rank 0 queues that second all-reduce as soon as its send is set up, while rank 2 is
// still setting up its send to the later rank 3: had the links of sends and receives been made
// then, rank 2's allocation would wait for rank 0's kernel, which waits for rank 2.
TEST(GpuSplit, APipelinesFirstSendsBesideACollectiveAlreadyQueued) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  ThreadRanks ranks(n);
  std::vector<ncclComm_t>& comms = ranks.comms;
  std::vector<cudaStream_t>& streams = ranks.streams;
  RankBuffers sums(n, 64), pipe(n, 1024);
  RankFailures failures;
  onThreads(n, [&](int r) {
    cudaStream_t s = streams[size_t(r)];
    ncclComm_t c = comms[size_t(r)];
    sums.fill(r, float(r + 1), s);
    pipe.fill(r, r == 0 ? 7.0f : 0.0f, s);
    float* sum = sums.bufs[size_t(r)];
    if (!failures.ok(r, ncclAllReduce(sum, sum, sums.count, ncclFloat, ncclSum, c, s), c,
                     "first all-reduce"))
      return;
    if (r >= 2) std::this_thread::sleep_for(std::chrono::milliseconds(150 * (r - 1)));
    float* p = pipe.bufs[size_t(r)];
    // (Receive, then send what came: two calls, in stream order.)
    if (r > 0 && !failures.ok(r, ncclRecv(p, pipe.count, ncclFloat, r - 1, c, s), c, "ncclRecv"))
      return;
    if (r < n - 1 &&
        !failures.ok(r, ncclSend(p, pipe.count, ncclFloat, r + 1, c, s), c, "ncclSend"))
      return;
    if (!failures.ok(r, ncclAllReduce(sum, sum, sums.count, ncclFloat, ncclSum, c, s), c,
                     "second all-reduce"))
      return;
    expectResults(failures, r, c, s, {{&sums, 40.0f}, {&pipe, 7.0f}});
  });
  failures.report();
}

// Ranks as processes, whose first collective on GPU buffers makes the ring's links and ends with
// a barrier on the bootstrap ring, which a non-blocking split's exchange (two all-gathers, on
// the split's helper thread) also uses. Work adopted by the communicator as a user of the ring
// (Comm::adoptRingUser, as the split's exchange is), all-gathering a second late on rank 0: the
// first collective waits for it (without the wait, rank 0's barrier ran first and rank 1's the
// other way round, and both all-gathers read the other's bytes: 128 of 128 wrong).
TEST(GpuProcesses, TheFirstCollectiveWaitsForWorkAdoptedOnTheBootstrapRing) {
  SKIP_WITHOUT_GPU();
  RunResult r = runShell(std::string("TUTTI_TIMEOUT=30 TUTTI_BOOTSTRAP_TIMEOUT=30 ") +
                         TUTTI_RUN_BIN + " -n 2 " + TUTTI_TEST_RANK_BIN + " ringshare-device 2>&1");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("ringshare: all-gather ok, 0 bytes wrong"), std::string::npos)
      << r.output;
}

// The same with a real split: 4 processes, non-blocking ncclCommSplit by parity and at once
// the parent's first all-reduce, rank 2 a second late (so rank 0's all-reduce reaches the
// ring while its split's exchange waits for rank 2).
TEST(GpuProcesses, ANonBlockingSplitBesideTheParentsFirstCollective) {
  SKIP_WITHOUT_GPU();
  RunResult r = runShell(std::string("TUTTI_TIMEOUT=30 TUTTI_BOOTSTRAP_TIMEOUT=30 ") +
                         TUTTI_RUN_BIN + " -n 4 " + TUTTI_TEST_RANK_BIN + " splitbusy-device 2>&1");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.output.find("splitbusy: ok on rank " + std::to_string(rank)), std::string::npos)
        << r.output;
  }
}

// Lifecycle programs (collectives/lifecycle.h) on GPU buffers: splits (blocking, non-blocking,
// in a group), destroys and aborts of children beside all-reduces on the parent and on the
// children, ranks as threads on the one GPU and, below, as processes.
class GpuLifecycle : public ::testing::TestWithParam<std::pair<int, uint32_t>> {};

TEST_P(GpuLifecycle, SplitsDestroysAndAbortsBesideCollectivesOnGpuBuffers) {
  SKIP_WITHOUT_GPU();
  const char* ranksEnv = getenv("TUTTI_LIFECYCLE_RANKS");  // (to try more by hand)
  const int n = ranksEnv && *ranksEnv ? atoi(ranksEnv) : GetParam().first;
  const char* seedEnv = getenv("TUTTI_LIFECYCLE_SEED");  // (to try others by hand)
  const uint32_t seed =
      seedEnv && *seedEnv ? uint32_t(strtoul(seedEnv, nullptr, 0)) : GetParam().second;
  ScopedEnv bootstrap("TUTTI_BOOTSTRAP_TIMEOUT", "30");
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  const char* lengthEnv = getenv("TUTTI_LIFECYCLE_LENGTH");
  const int length = lengthEnv && *lengthEnv ? atoi(lengthEnv) : 30;
  const std::vector<LifecycleStep> steps = randomLifecycle(n, seed, length);
  // TUTTI_LIFECYCLE_GPUS=G: rank r on GPU r % G (links across GPUs too).
  const int gpus = spreadGpus("TUTTI_LIFECYCLE_GPUS");
  // Buffers and streams first, on this thread: cudaMalloc may wait for the whole GPU.
  std::vector<LifecycleDevice> dev(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    LifecycleDevice& d = dev[size_t(r)];
    cudaStream_t s = nullptr;
    ASSERT_EQ(cudaSetDevice(r % gpus), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&d.device, kLifecycleMaxCount * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&d.pinned, kLifecycleMaxCount * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    d.stream = s;
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  std::vector<ncclComm_t> comms = initThreadsOnGpus(n, gpus);
  for (ncclComm_t c : comms) ASSERT_NE(c, nullptr);
  std::vector<std::string> errors(static_cast<size_t>(n));
  ThreadBarrier barrier(n);
  onThreads(n, [&](int r) {
    EXPECT_EQ(cudaSetDevice(r % gpus), cudaSuccess);
    errors[size_t(r)] = runLifecycle(
        comms[size_t(r)], r, n, steps, [&] { barrier.wait(); }, &dev[size_t(r)]);
  });
  destroyAll(comms);
  bool failed = false;
  for (const std::string& e : errors) {
    if (!e.empty()) ADD_FAILURE() << e;
    failed = failed || !e.empty();
  }
  if (failed) ADD_FAILURE() << "the program (seed " << seed << "):\n" << describeLifecycle(steps);
  for (int r = 0; r < n; ++r) {
    LifecycleDevice& d = dev[size_t(r)];
    cudaSetDevice(r % gpus);
    cudaDeviceSynchronize();
    cudaFree(d.device);
    cudaFreeHost(d.pinned);
    cudaStreamDestroy(static_cast<cudaStream_t>(d.stream));
  }
}

INSTANTIATE_TEST_SUITE_P(Threads, GpuLifecycle,
                         ::testing::Values(std::pair<int, uint32_t>{2, 11},
                                           std::pair<int, uint32_t>{3, 12},
                                           std::pair<int, uint32_t>{4, 13}),
                         [](const ::testing::TestParamInfo<std::pair<int, uint32_t>>& i) {
                           return std::to_string(i.param.first) + "ranks_seed" +
                                  std::to_string(i.param.second);
                         });

TEST(GpuProcesses, LifecycleProgramsWithThreeProcessesOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (const char* seed : {"21", "22"}) {
    RunResult r = runShell(std::string("TUTTI_TIMEOUT=30 TUTTI_BOOTSTRAP_TIMEOUT=30 "
                                       "TUTTI_LIFECYCLE_SEED=") +
                           seed + " " + TUTTI_RUN_BIN + " -n 3 " + TUTTI_TEST_RANK_BIN +
                           " lifecycle-device 2>&1");
    EXPECT_EQ(r.exitCode, 0) << "seed " << seed << ": " << r.output;
    EXPECT_NE(r.output.find("steps passed on rank 2"), std::string::npos) << r.output;
  }
}

}  // namespace
