// Streams the ranks on the one GPU share or change (label "gpu"; "cudaemu" on the emulated
// runtime): one stream passed to every rank by one thread, in a group and without, ranks on
// threads sharing a stream, one communicator's operations on two streams, the legacy default
// stream, per-thread streams, and a blocking stream beside the default one. Every test skips,
// saying why, where no GPU is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"

using namespace tutti::test;

namespace {

// n ranks driven by one thread (ncclCommInitAll, device 0 listed n times) and one stream
// (cudaStreamCreate's flags) that every rank is passed.
struct OneThreadRanks {
  std::vector<ncclComm_t> comms;
  cudaStream_t stream = nullptr;
  OneThreadRanks(int n, unsigned streamFlags) : comms(size_t(n)) {
    std::vector<int> devs(size_t(n), 0);
    EXPECT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess)
        << ncclGetLastError(nullptr);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, streamFlags), cudaSuccess);
  }
  ~OneThreadRanks() {
    for (ncclComm_t c : comms) ncclCommDestroy(c);
    cudaStreamDestroy(stream);
  }
};

// One thread drives every rank (ncclCommInitAll, the device listed four times) and passes the
// same stream to all: the group must launch every kernel before any can block the stream.
TEST(GpuStreams, FourRanksSharingOneStreamInOneGroupComplete) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  OneThreadRanks ranks(n, cudaStreamDefault);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::vector<ncclComm_t>& comms = ranks.comms;
  cudaStream_t stream = ranks.stream;
  for (size_t count : {size_t(1), size_t(1000), size_t(1) << 20}) {
    RankBuffers b(n, count);
    for (int r = 0; r < n; ++r) b.fill(r, float(r + 1), stream);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ncclAllReduce(b.bufs[size_t(r)], b.bufs[size_t(r)], count, ncclFloat, ncclSum,
                              comms[size_t(r)], stream),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int r = 0; r < n; ++r) EXPECT_EQ(b.check(r, 10.0f, stream), "") << "count " << count;
  }
}

// The same for sends and receives, where the ranks name different peers: a ring (each rank
// sends to the next and receives from the one before: the sets {r - 1, r, r + 1}) and a fan-out
// (rank 0 to ranks 1 and 2; rank 3 takes no part), one element and 16 MiB (past the 4 MiB
// FIFO, so a send waits for its receiver too). Their entries, shared by the set of ranks each
// names, did not match: each rank led on the shared stream, and the first kernel there waited
// for one queued behind it. Between the two groups a copy on the stream rewrites rank 0's send
// buffer, which the fan-out must send: rank 0's set in the fan-out, {0, 1, 2}, is rank 1's in
// the ring, whose entry (before the ring) it would have taken.
TEST(GpuStreams, FourRanksSendingRoundARingOnOneStreamInOneGroupComplete) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  OneThreadRanks ranks(n, cudaStreamNonBlocking);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::vector<ncclComm_t>& comms = ranks.comms;
  cudaStream_t stream = ranks.stream;
  for (size_t count : {size_t(1), size_t(1) << 22}) {
    RankBuffers in(n, count), ring(n, count), fan(n, count);
    for (int r = 0; r < n; ++r) {
      in.fill(r, float(r + 1), stream);
      ring.fill(r, -1.0f, stream);
      fan.fill(r, -1.0f, stream);
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(
          ncclSend(in.bufs[size_t(r)], count, ncclFloat, (r + 1) % n, comms[size_t(r)], stream),
          ncclSuccess);
      EXPECT_EQ(ncclRecv(ring.bufs[size_t(r)], count, ncclFloat, (r + n - 1) % n, comms[size_t(r)],
                         stream),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (size_t i = 0; i < count; ++i) in.staging[0][i] = 7.0f;  // in stream order, no wait
    ASSERT_EQ(cudaMemcpyAsync(in.bufs[0], in.staging[0], count * sizeof(float),
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int q : {1, 2}) {
      EXPECT_EQ(ncclSend(in.bufs[0], count, ncclFloat, q, comms[0], stream), ncclSuccess);
      EXPECT_EQ(ncclRecv(fan.bufs[size_t(q)], count, ncclFloat, 0, comms[size_t(q)], stream),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ring.check(r, float((r + n - 1) % n + 1), stream), "") << "count " << count;
    }
    for (int q : {1, 2}) EXPECT_EQ(fan.check(q, 7.0f, stream), "") << "count " << count;
    EXPECT_EQ(fan.check(3, -1.0f, stream), "") << "count " << count;
  }
}

// Four ranks on four threads pass the same stream, outside any group: stream order alone
// would make each rank's kernel wait behind another's join. They must all complete, round
// after round, with the right sums (the engine shares one stream entry among them).
TEST(GpuStreams, RanksOnThreadsSharingOneStreamWithoutAGroupComplete) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms = initThreads(n);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  RankBuffers b(n, 4096);
  for (int r = 0; r < n; ++r) b.fill(r, 1.0f, stream);
  onThreads(n, [&](int r) {
    for (int round = 0; round < 5; ++round) {
      EXPECT_EQ(ncclAllReduce(b.bufs[size_t(r)], b.bufs[size_t(r)], b.count, ncclFloat, ncclSum,
                              comms[size_t(r)], stream),
                ncclSuccess);
    }
  });
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int r = 0; r < n; ++r) EXPECT_EQ(b.check(r, 1024.0f, stream), "");  // 4^5
  destroyAll(comms);
  cudaStreamDestroy(stream);
}

// Ranks 0 and 1 exchange on the shared stream while ranks 2 and 3 do nothing, then all four
// all-reduce again, many times over, each from its own thread with no group around a
// collective. The exchange must not shift the others' group numbers (their entries would no
// longer match: each rank led on the stream, behind another's kernel), and a rank called
// between a sibling's enter and launch must not join the stream ahead of that sibling's kernel.
// The four meet after the exchange: had rank 2 queued its next all-reduce on the shared stream
// first, the exchange would queue behind that kernel, which waits for ranks 0 and 1's part,
// which comes after their exchange -- a cycle the stream's order makes, whatever the library
// does (the warning about a shared stream outside a group says so).
TEST(GpuStreams, SendsAmongSomeRanksThenCollectivesOnOneSharedStreamComplete) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms = initThreads(n);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  RankBuffers b(n, 4096), got(n, 4096);
  for (int r = 0; r < n; ++r) b.fill(r, float(r + 1), stream);
  ThreadBarrier barrier(n);
  onThreads(n, [&](int r) {
    ncclComm_t c = comms[size_t(r)];
    float* buf = b.bufs[size_t(r)];
    EXPECT_EQ(ncclAllReduce(buf, buf, b.count, ncclFloat, ncclSum, c, stream), ncclSuccess);
    for (int round = 0; round < 2 && r < 2; ++round) {
      EXPECT_EQ(ncclGroupStart(), ncclSuccess);
      EXPECT_EQ(ncclSend(buf, b.count, ncclFloat, 1 - r, c, stream), ncclSuccess);
      EXPECT_EQ(ncclRecv(got.bufs[size_t(r)], b.count, ncclFloat, 1 - r, c, stream), ncclSuccess);
      EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    }
    barrier.wait();
    for (int round = 0; round < 200; ++round) {  // all equal: the average keeps them
      EXPECT_EQ(ncclAllReduce(buf, buf, b.count, ncclFloat, ncclAvg, c, stream), ncclSuccess)
          << ncclGetLastError(c);
    }
    EXPECT_EQ(ncclAllReduce(buf, buf, b.count, ncclFloat, ncclSum, c, stream), ncclSuccess);
  });
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (int r = 0; r < n; ++r) EXPECT_EQ(b.check(r, 40.0f, stream), "");  // (1+2+3+4) * 4
  for (int r = 0; r < 2; ++r) EXPECT_EQ(got.check(r, 10.0f, stream), "");
  destroyAll(comms);
  cudaStreamDestroy(stream);
}

// One communicator's operations issued on two streams in turn, with nothing between them:
// each kernel reads its FIFO positions as it starts, so the library must run them one after
// another (a kernel that started while the one before still ran would claim the same steps:
// wrong sums, a slot size error or a hang). Big enough that each runs a while.
TEST(GpuStreams, OneCommunicatorsOperationsOnTwoStreamsRunInTurn) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2, kOps = 12;
  constexpr size_t kCount = size_t(1) << 20;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms = initThreads(n);
  std::vector<std::unique_ptr<RankBuffers>> in, out;
  for (int i = 0; i < kOps; ++i) {
    in.push_back(std::make_unique<RankBuffers>(n, kCount));
    out.push_back(std::make_unique<RankBuffers>(n, kCount));
  }
  RankFailures failures;
  onThreads(n, [&](int r) {
    auto fail = [&](const std::string& what) { failures.add(r, what); };
    ncclComm_t c = comms[size_t(r)];
    cudaStream_t s[2];
    for (cudaStream_t& x : s) cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking);
    for (int i = 0; i < kOps; ++i) in[size_t(i)]->fill(r, float((r + 1) * (i + 1)), s[0]);
    for (int i = 0; i < kOps; ++i) {
      if (ncclAllReduce(in[size_t(i)]->bufs[size_t(r)], out[size_t(i)]->bufs[size_t(r)], kCount,
                        ncclFloat, ncclSum, c, s[i % 2]) != ncclSuccess)
        return fail("operation " + std::to_string(i) + ": " + ncclGetLastError(c));
    }
    for (cudaStream_t x : s) {
      if (cudaStreamSynchronize(x) != cudaSuccess) fail("cudaStreamSynchronize");
    }
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(c, &async);
    if (async != ncclSuccess) fail(std::string("async error: ") + ncclGetLastError(c));
    for (int i = 0; i < kOps; ++i) {
      std::string bad = out[size_t(i)]->check(r, float(3 * (i + 1)), s[0]);
      if (!bad.empty()) fail("operation " + std::to_string(i) + ": " + bad);
    }
    for (cudaStream_t x : s) cudaStreamDestroy(x);
  });
  destroyAll(comms);
  failures.report();
}

// On the legacy default stream (0): the copies in, the all-reduces (two ranks driven from one
// thread in a group, as ncclCommInitAll users do) and the copies out, queued with nothing
// between them, run in that order (the kernels go on the engines' own streams, after an entry
// recorded on stream 0, and stream 0 waits for them).
TEST(GpuStreams, TheDefaultStreamOrdersCopiesAndCollectives) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2;
  constexpr size_t kCount = size_t(1) << 20;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  ncclComm_t comms[n];
  int devs[n] = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, n, devs), ncclSuccess) << ncclGetLastError(nullptr);
  RankBuffers b(n, kCount);
  for (int round = 1; round <= 3; ++round) {
    for (int r = 0; r < n; ++r) {
      float* h = b.staging[size_t(r)];
      for (size_t i = 0; i < kCount; ++i) h[i] = float(round * (r + 1));
      ASSERT_EQ(cudaMemcpyAsync(b.bufs[size_t(r)], h, kCount * 4, cudaMemcpyHostToDevice, nullptr),
                cudaSuccess);
    }
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ncclAllReduce(b.bufs[size_t(r)], b.bufs[size_t(r)], kCount, ncclFloat, ncclSum,
                              comms[r], nullptr),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(cudaMemcpyAsync(b.staging[size_t(r)], b.bufs[size_t(r)], kCount * 4,
                                cudaMemcpyDeviceToHost, nullptr),
                cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    for (int r = 0; r < n; ++r) {
      const float* h = b.staging[size_t(r)];
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_EQ(h[i], float(3 * round)) << "rank " << r << " round " << round << " element " << i;
      }
    }
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
}

// Rank threads that each pass cudaStreamPerThread pass different streams under one handle:
// each rank's all-reduce starts after its own thread's copy in, and its copy out after it.
TEST(GpuStreams, RanksOnTheirPerThreadStreamsKeepTheirOwnOrder) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2;
  constexpr size_t kCount = size_t(1) << 20;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms = initThreads(n);
  RankBuffers b(n, kCount);
  RankFailures failures;
  onThreads(n, [&](int r) {
    auto fail = [&](const std::string& what) { failures.add(r, what); };
    ncclComm_t comm = comms[size_t(r)];
    const size_t ri = size_t(r);
    float* h = b.staging[ri];
    for (int round = 1; round <= 3; ++round) {
      for (size_t i = 0; i < kCount; ++i) h[i] = float(round * (r + 1));
      cudaMemcpyAsync(b.bufs[ri], h, kCount * 4, cudaMemcpyHostToDevice, cudaStreamPerThread);
      if (ncclAllReduce(b.bufs[ri], b.bufs[ri], kCount, ncclFloat, ncclSum, comm,
                        cudaStreamPerThread) != ncclSuccess)
        return fail(std::string("all-reduce: ") + ncclGetLastError(comm));
      cudaMemcpyAsync(h, b.bufs[ri], kCount * 4, cudaMemcpyDeviceToHost, cudaStreamPerThread);
      if (cudaStreamSynchronize(cudaStreamPerThread) != cudaSuccess)
        return fail("cudaStreamSynchronize");
      for (size_t i = 0; i < kCount; ++i) {
        if (h[i] != float(3 * round)) {
          return fail("round " + std::to_string(round) + " element " + std::to_string(i) + ": " +
                      std::to_string(h[i]) + ", expected " + std::to_string(3 * round));
        }
      }
    }
  });
  destroyAll(comms);
  failures.report();
}

// One rank on the legacy default stream, the other on a blocking stream (cudaStreamCreate), in
// one group: the legacy stream and blocking streams wait for each other's earlier work, so
// kernels on both would each wait for the other; they must complete, round after round.
TEST(GpuStreams, RanksOnTheDefaultStreamAndABlockingStreamInOneGroupComplete) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  ncclComm_t comms[n];
  int devs[n] = {0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, n, devs), ncclSuccess) << ncclGetLastError(nullptr);
  cudaStream_t blocking;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  const cudaStream_t streams[n] = {nullptr, blocking};
  RankBuffers b(n, 4096);
  for (int r = 0; r < n; ++r) b.fill(r, 1.0f, streams[r]);
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ncclAllReduce(b.bufs[size_t(r)], b.bufs[size_t(r)], b.count, ncclFloat, ncclSum,
                              comms[r], streams[r]),
                ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comms[r], &async);
    EXPECT_EQ(async, ncclSuccess) << ncclGetLastError(comms[r]);
    EXPECT_EQ(b.check(r, 8.0f, streams[r]), "");  // 2^3
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  cudaStreamDestroy(blocking);
}

}  // namespace
