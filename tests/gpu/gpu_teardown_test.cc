// Tearing a communicator down while other communicators of the same ranks work on the same GPU
// (ranks as threads of one process): a cudaFree waits for the whole GPU, where a kernel of
// another communicator may wait for the very thread that is tearing down.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"
#include "runtime/cuda_shim.h"

using namespace tutti::test;

namespace {

// Ranks 0 and 1 on threads share GPU 0 and two communicators, A and B, both used before. Rank 0
// starts an all-reduce on B, whose kernel waits for rank 1; then both destroy A; then rank 1
// joins the all-reduce. Had A's destroy freed its memory (cudaFree waits for the GPU), it would
// have waited for B's kernel, which waits for rank 1's call after its destroy: a deadlock until
// B's kernel gives up (TUTTI_TIMEOUT). A's memory is freed on a thread of tutti's instead.
TEST(GpuTeardown, ADestroyDoesNotWaitForAnotherCommunicatorsKernelThatWaitsForItsThread) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> a = initThreads(2), b = initThreads(2);
  RankBuffers buf(2, 256);
  std::vector<cudaStream_t> streams(2);
  for (auto& s : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto allReduce = [&](int r, ncclComm_t c) {
    EXPECT_EQ(ncclAllReduce(buf.bufs[size_t(r)], buf.bufs[size_t(r)], buf.count, ncclFloat, ncclSum,
                            c, streams[size_t(r)]),
              ncclSuccess)
        << ncclGetLastError(c);
  };
  onThreads(2, [&](int r) {  // both engines made: FIFOs allocated
    allReduce(r, a[size_t(r)]);
    allReduce(r, b[size_t(r)]);
    EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
  });
  for (int r = 0; r < 2; ++r) buf.fill(r, float(r + 1), streams[size_t(r)]);
  for (auto& s : streams) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ThreadBarrier barrier(2);
  const double start = now();
  onThreads(2, [&](int r) {
    if (r == 0) allReduce(0, b[0]);
    barrier.wait();
    EXPECT_EQ(ncclCommDestroy(a[size_t(r)]), ncclSuccess);
    if (r == 1) allReduce(1, b[1]);
    EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
  });
  EXPECT_LT(secondsSince(start), 15.0) << "a destroy waited for the other communicator's kernel";
  RankFailures failures;
  for (int r = 0; r < 2; ++r)
    expectResults(failures, r, b[size_t(r)], streams[size_t(r)], {{&buf, 3.0f}});
  failures.report();
  for (ncclComm_t c : b) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (auto& s : streams) cudaStreamDestroy(s);
}

// Rank 0 aborts, idle, while rank 1 -- another process, which writes into rank 0's FIFO through
// CUDA IPC -- has a kernel under way that sent into it. Freeing that FIFO could hand it to rank
// 0's next allocation while rank 1 writes: rank 0 keeps it, and says so; rank 1's kernel stops
// with the abort; and the next communicator of rank 0's process frees what was kept (here 1 s on).
TEST(GpuTeardown, AnAbortKeepsTheFifosOtherProcessesWriteIntoAWhile) {
  SKIP_WITHOUT_GPU();
  RunResult r = runShell(std::string("NCCL_DEBUG=INFO TUTTI_ABORT_KEEP_S=1 TUTTI_TIMEOUT=600 ") +
                         "timeout 60 " + TUTTI_RUN_BIN + " -n 2 " + TUTTI_TEST_RANK_BIN +
                         " abortidle-device 2>&1");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("abort peer: "), std::string::npos) << r.output;
  const std::string kept = "rank 0: aborted: ";
  const size_t at = r.output.find(kept);
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(its FIFOs that ranks in other processes write into, which their "
                          "kernels may still do) stay allocated a while"),
            std::string::npos)
      << r.output;
  const std::string bytes =
      r.output.substr(at + kept.size(), r.output.find(' ', at + kept.size()) - at - kept.size());
  // (By whichever rank of the new communicator made its links first.)
  EXPECT_NE(r.output.find(": freed " + bytes + " bytes of GPU memory an abort kept", at),
            std::string::npos)
      << r.output;
}

// Run by the test below in a child: 3 ranks on threads, an all-reduce together (which links
// them), then another that rank 2 calls 3 s after the others; rank 0 destroys its communicator
// right after its own call, rank 1 4 s after.
TEST(GpuTeardownChild, DISABLED_ADestroyRightAfterTheCallWhileASiblingIsLate) {
  SKIP_WITHOUT_GPU();
  std::vector<ncclComm_t> comms = initThreads(3);
  RankBuffers buf(3, 256);
  std::vector<cudaStream_t> streams(3);
  for (auto& s : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  onThreads(3, [&](int r) {
    auto allReduce = [&] {
      EXPECT_EQ(ncclAllReduce(buf.bufs[size_t(r)], buf.bufs[size_t(r)], buf.count, ncclFloat,
                              ncclSum, comms[size_t(r)], streams[size_t(r)]),
                ncclSuccess);
    };
    allReduce();
    EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
    if (r == 2) std::this_thread::sleep_for(std::chrono::seconds(3));
    allReduce();
    if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
    EXPECT_EQ(ncclCommDestroy(comms[size_t(r)]), ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
  });
  for (auto& s : streams) cudaStreamDestroy(s);
}

// There, rank 0's destroy finds rank 1's kernel of the same communicator waiting (for rank 2)
// more than 2 s. That kernel waits for ranks' calls already made or to come from their own
// threads, never for rank 0's thread: the destroy waits for its own kernel and frees its memory,
// as any destroy (it took the kernel for another communicator's, and left its memory).
TEST(GpuTeardown, ADestroyWhileItsOwnCommunicatorsSiblingIsLateFreesItsMemory) {
  SKIP_WITHOUT_GPU();
  bool passed = false;
  const std::string out = runChildTest(
      "NCCL_DEBUG=WARN", "GpuTeardownChild.DISABLED_ADestroyRightAfterTheCallWhileASiblingIsLate",
      &passed);
  EXPECT_TRUE(passed) << out;
  EXPECT_EQ(out.find("stay allocated until the process exits"), std::string::npos) << out;
}

// Run by the test below in a child, a process that has not used a GPU yet.
TEST(GpuTeardownChild, DISABLED_Gpu0sContextIsMadeByChoosingIt) {
  SKIP_WITHOUT_GPU();
  EXPECT_FALSE(tutti::cuda::contextMade(0)) << "a context on GPU 0 before the process used it";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);  // CUDA 12 makes the device's context here
  EXPECT_TRUE(tutti::cuda::contextMade(0)) << "no context on GPU 0 after cudaSetDevice(0)";
}

// A destroy or an abort gives the calling thread its device back only where the process has a
// context there (runtime/cuda_scope.h: a thread that never chose a GPU has device 0, and going
// back to it would make GPU 0's context). Whether a context exists is the driver's answer
// (cuDevicePrimaryCtxGetState): here, that it tells a device the process never used (on one
// GPU, what the guard needs cannot be run whole: that takes a communicator on GPU 1).
TEST(GpuTeardown, TheDriverTellsWhetherAProcessHasAContextOnAGpu) {
  SKIP_WITHOUT_GPU();
  bool passed = false;
  const std::string out =
      runChildTest("", "GpuTeardownChild.DISABLED_Gpu0sContextIsMadeByChoosingIt", &passed);
  EXPECT_TRUE(passed) << out;
}

// A CUDA error the application has not read yet (a failed cudaMalloc of its own) is still
// there for it after a destroy or an abort, whose own CUDA calls succeed; an error of tutti's
// own is not left for it.
TEST(GpuTeardown, DestroyAndAbortLeaveTheApplicationsPendingCudaErrorForIt) {
  SKIP_WITHOUT_GPU();
  for (bool abort : {false, true}) {
    std::vector<ncclComm_t> comms = initThreads(2);
    RankBuffers buf(2, 256);
    std::vector<cudaStream_t> streams(2);
    for (auto& s : streams)
      ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    onThreads(2, [&](int r) {  // engines made: their teardown has memory to free
      EXPECT_EQ(ncclAllReduce(buf.bufs[size_t(r)], buf.bufs[size_t(r)], buf.count, ncclFloat,
                              ncclSum, comms[size_t(r)], streams[size_t(r)]),
                ncclSuccess);
      EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
    });
    void* huge = nullptr;
    ASSERT_NE(cudaMalloc(&huge, size_t(1) << 62), cudaSuccess);
    for (ncclComm_t c : comms)
      EXPECT_EQ(abort ? ncclCommAbort(c) : ncclCommDestroy(c), ncclSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation) << (abort ? "abort" : "destroy");
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
    for (auto& s : streams) cudaStreamDestroy(s);
  }
}

}  // namespace
