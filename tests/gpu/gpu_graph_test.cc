// CUDA graphs on the GPU data path (label "gpu"): captured collectives replayed, replays
// mixed with eager calls of the same communicator, branches of one capture, and groups that
// mix captured and uncaptured streams. Every test skips, saying why, where no GPU is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"

using namespace tutti::test;

namespace {

// Captured once into a CUDA graph, replayed with new inputs: each replay all-reduces them.
TEST(GpuGraphs, CapturedAllReduceGivesTheRightResultOnEveryReplay) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms = initThreads(n);
  RankBuffers b(n, 4096);
  RankFailures failures;
  onThreads(n, [&](int r) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    auto fail = [&](const std::string& what) { failures.add(r, what); };
    float* buf = b.bufs[size_t(r)];
    // Eager first: the links are made outside the capture.
    b.fill(r, 1.0f, s);
    if (ncclAllReduce(buf, buf, b.count, ncclFloat, ncclSum, comms[size_t(r)], s) != ncclSuccess)
      return fail(std::string("eager: ") + ncclGetLastError(comms[size_t(r)]));
    cudaStreamSynchronize(s);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      return fail("cudaStreamBeginCapture");
    ncclResult_t res = ncclAllReduce(buf, buf, b.count, ncclFloat, ncclSum, comms[size_t(r)], s);
    if (cudaStreamEndCapture(s, &graph) != cudaSuccess || res != ncclSuccess)
      return fail(std::string("capture: ") + ncclGetLastError(comms[size_t(r)]));
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return fail("instantiate");
    for (int k = 1; k <= 3; ++k) {
      b.fill(r, float(k * (r + 1)), s);
      if (cudaGraphLaunch(exec, s) != cudaSuccess || cudaStreamSynchronize(s) != cudaSuccess)
        return fail("replay " + std::to_string(k));
      std::string bad = b.check(r, float(k * 3), s);  // k*1 + k*2
      if (!bad.empty()) return fail("replay " + std::to_string(k) + ": " + bad);
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
  });
  destroyAll(comms);
  failures.report();
}

// A captured all-reduce replayed on one stream while eager all-reduces of the same
// communicator go to another, nothing between them (NCCL supports this mix): each replay
// waits for the launch before it and the next launch waits for it.
TEST(GpuGraphs, ReplaysAndEagerCallsOnAnotherStreamTakeTurns) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2, kRounds = 8;
  constexpr size_t kCount = size_t(1) << 20;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms = initThreads(n);
  RankBuffers a(n, kCount), b(n, kCount), c(n, kCount), d(n, kCount);
  RankFailures failures;
  onThreads(n, [&](int r) {
    auto fail = [&](const std::string& what) { failures.add(r, what); };
    ncclComm_t comm = comms[size_t(r)];
    cudaStream_t g, e;
    cudaStreamCreateWithFlags(&g, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&e, cudaStreamNonBlocking);
    a.fill(r, float(r + 1), g);
    c.fill(r, float(10 * (r + 1)), e);
    const size_t ri = size_t(r);
    if (ncclAllReduce(c.bufs[ri], d.bufs[ri], kCount, ncclFloat, ncclSum, comm, e) != ncclSuccess)
      return fail(std::string("eager: ") + ncclGetLastError(comm));
    cudaStreamSynchronize(e);
    d.fill(r, -1.0f, e);  // the eager calls between the replays must write it again
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(g, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      return fail("cudaStreamBeginCapture");
    ncclResult_t res = ncclAllReduce(a.bufs[ri], b.bufs[ri], kCount, ncclFloat, ncclSum, comm, g);
    if (cudaStreamEndCapture(g, &graph) != cudaSuccess || res != ncclSuccess)
      return fail(std::string("capture: ") + ncclGetLastError(comm));
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return fail("instantiate");
    for (int k = 0; k < kRounds; ++k) {
      if (cudaGraphLaunch(exec, g) != cudaSuccess) return fail("replay " + std::to_string(k));
      if (ncclAllReduce(c.bufs[ri], d.bufs[ri], kCount, ncclFloat, ncclSum, comm, e) != ncclSuccess)
        return fail("eager " + std::to_string(k) + ": " + ncclGetLastError(comm));
    }
    if (cudaStreamSynchronize(g) != cudaSuccess || cudaStreamSynchronize(e) != cudaSuccess)
      fail("cudaStreamSynchronize");
    expectResults(failures, r, comm, e, {{&b, 3.0f}, {&d, 30.0f}});
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(g);
    cudaStreamDestroy(e);
  });
  destroyAll(comms);
  failures.report();
}

// Two branches of one capture (forked before either all-reduce, joined after both): nothing
// in the graph orders the two kernels, so the library's own edge must, on every replay; also
// with NCCL_GRAPH_MIXING_SUPPORT=0, which only leaves out the nodes that order the graph
// against other calls.
class GpuGraphBranches : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuGraphBranches, TwoBranchesOfOneCaptureTakeTurns) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2;
  constexpr size_t kCount = size_t(1) << 20;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  ScopedEnv mixing("NCCL_GRAPH_MIXING_SUPPORT", GetParam());
  std::vector<ncclComm_t> comms = initThreads(n);
  RankBuffers a(n, kCount), b(n, kCount), c(n, kCount), d(n, kCount), e(n, kCount), f(n, kCount);
  const bool mixed = std::string(GetParam()) == "1";
  RankFailures failures;
  onThreads(n, [&](int r) {
    auto fail = [&](const std::string& what) { failures.add(r, what); };
    ncclComm_t comm = comms[size_t(r)];
    const size_t ri = size_t(r);
    cudaStream_t g, g2, s3;
    cudaStreamCreateWithFlags(&s3, cudaStreamNonBlocking);
    e.fill(r, float(100 * (r + 1)), s3);
    cudaEvent_t fork, join;
    cudaStreamCreateWithFlags(&g, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&g2, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
    a.fill(r, float(r + 1), g);
    c.fill(r, float(10 * (r + 1)), g);
    // Eager first: the links are made outside the capture.
    if (ncclAllReduce(a.bufs[ri], b.bufs[ri], kCount, ncclFloat, ncclSum, comm, g) != ncclSuccess)
      return fail(std::string("eager: ") + ncclGetLastError(comm));
    cudaStreamSynchronize(g);
    b.fill(r, -1.0f, g);  // the replays' first branch must write it again
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    if (cudaStreamBeginCapture(g, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      return fail("cudaStreamBeginCapture");
    cudaEventRecord(fork, g);
    cudaStreamWaitEvent(g2, fork, 0);
    ncclResult_t r1 = ncclAllReduce(a.bufs[ri], b.bufs[ri], kCount, ncclFloat, ncclSum, comm, g);
    ncclResult_t r2 = ncclAllReduce(c.bufs[ri], d.bufs[ri], kCount, ncclFloat, ncclSum, comm, g2);
    cudaEventRecord(join, g2);
    cudaStreamWaitEvent(g, join, 0);
    if (cudaStreamEndCapture(g, &graph) != cudaSuccess || r1 != ncclSuccess || r2 != ncclSuccess)
      return fail(std::string("capture: ") + ncclGetLastError(comm));
    if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return fail("instantiate");
    // With mixing on, an eager all-reduce on a third stream between the replays takes its turn
    // after each replay's last kernel, whichever branch that was.
    for (int k = 0; k < 5; ++k) {
      if (cudaGraphLaunch(exec, g) != cudaSuccess) return fail("replay " + std::to_string(k));
      if (mixed && ncclAllReduce(e.bufs[ri], f.bufs[ri], kCount, ncclFloat, ncclSum, comm, s3) !=
                       ncclSuccess)
        return fail(std::string("eager: ") + ncclGetLastError(comm));
    }
    if (cudaStreamSynchronize(g) != cudaSuccess || cudaStreamSynchronize(s3) != cudaSuccess)
      fail("cudaStreamSynchronize");
    expectResults(failures, r, comm, g, {{&b, 3.0f}, {&d, 30.0f}});
    if (mixed) expectResults(failures, r, comm, g, {{&f, 300.0f}});
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaStreamDestroy(g);
    cudaStreamDestroy(g2);
    cudaStreamDestroy(s3);
  });
  destroyAll(comms);
  failures.report();
}
INSTANTIATE_TEST_SUITE_P(Mixing, GpuGraphBranches, ::testing::Values("1", "0"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.index == 0 ? "On" : "Off");
                         });

// A group whose streams mix a capturing one and one that is not is refused before anything
// runs (its kernels would go half into a graph), with a message; the communicator goes on.
TEST(GpuGraphs, AGroupMixingCapturedAndUncapturedStreamsIsRefused) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms = initThreads(n);
  RankBuffers b(n, 4096), other(n, 4096);
  RankFailures failures;
  onThreads(n, [&](int r) {
    auto fail = [&](const std::string& what) { failures.add(r, what); };
    ncclComm_t comm = comms[size_t(r)];
    const size_t ri = size_t(r);
    cudaStream_t cap, eager;
    cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&eager, cudaStreamNonBlocking);
    b.fill(r, 1.0f, eager);
    other.fill(r, 1.0f, eager);
    if (cudaStreamBeginCapture(cap, cudaStreamCaptureModeThreadLocal) != cudaSuccess)
      return fail("cudaStreamBeginCapture");
    ncclGroupStart();
    ncclAllReduce(b.bufs[ri], b.bufs[ri], b.count, ncclFloat, ncclSum, comm, cap);
    ncclAllReduce(other.bufs[ri], other.bufs[ri], b.count, ncclFloat, ncclSum, comm, eager);
    const ncclResult_t res = ncclGroupEnd();
    const std::string msg = ncclGetLastError(comm);
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(cap, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    if (res != ncclInvalidUsage) fail("the mixed group returned " + std::to_string(res));
    if (msg.find("captured") == std::string::npos) fail("message: " + msg);
    // Nothing ran, and the communicator still works.
    if (ncclAllReduce(b.bufs[ri], b.bufs[ri], b.count, ncclFloat, ncclSum, comm, eager) !=
        ncclSuccess)
      return fail(std::string("after the refusal: ") + ncclGetLastError(comm));
    cudaStreamSynchronize(eager);
    for (auto [buf, want] : {std::pair<RankBuffers*, float>{&b, 2.0f}, {&other, 1.0f}}) {
      std::string bad = buf->check(r, want, eager);
      if (!bad.empty()) fail(bad);
    }
    cudaStreamDestroy(cap);
    cudaStreamDestroy(eager);
  });
  destroyAll(comms);
  failures.report();
}

}  // namespace
