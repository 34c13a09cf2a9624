// Programs of operations queued back to back on GPU buffers (label "gpu"; collectives/program.h):
// each rank queues the same seeded random list of collectives and sends/receives -- some in
// groups, on two streams of its own, eagerly or captured into one graph -- without waiting
// between them, then checks every result against the oracle. Every test skips, saying why,
// where no GPU is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/program.h"
#include "gpu/gpu_support.h"
#include "harness/harness.h"

using namespace tutti::test;

namespace {

constexpr size_t kFifoBytes = 8192;

struct ProgramSetup {
  int nranks;
  const char* proto;  // NCCL_PROTO, or "" for the automatic choice
  bool p2pDisabled;   // FIFOs in mapped host memory instead of GPU memory
  bool graph;         // captured into one graph per rank, launched once
  bool oneStream;     // both of a rank's streams are one (one thread: every rank's)
  bool oneThread;     // ncclCommInitAll, the GPU listed nranks times, one thread drives all
  bool hostSteps;     // some steps on pageable host buffers (eager programs only)
  uint32_t seed;
  int length;
};

void PrintTo(const ProgramSetup& s, std::ostream* os) {
  *os << s.nranks << " ranks, protocol " << (s.proto[0] ? s.proto : "auto") << ", "
      << (s.p2pDisabled ? "mapped host memory" : "GPU memory") << " FIFOs, "
      << (s.graph ? "graph" : "eager") << ", " << (s.oneStream ? "one stream" : "two streams")
      << ", " << (s.oneThread ? "one thread" : "a thread per rank")
      << (s.hostSteps ? ", host buffers too" : "") << ", seed " << s.seed << ", " << s.length
      << " steps";
}

std::string programName(const ::testing::TestParamInfo<ProgramSetup>& info) {
  const ProgramSetup& s = info.param;
  return std::to_string(s.nranks) + "ranks_" + (s.proto[0] ? s.proto : "auto") +
         (s.p2pDisabled ? "_mapped" : "_p2p") + (s.graph ? "_graph" : "_eager") +
         (s.oneStream ? "_1stream" : "_2streams") + (s.oneThread ? "_1thread" : "_threads") +
         (s.hostSteps ? "_host" : "") + "_seed" + std::to_string(s.seed);
}

class GpuPrograms : public ::testing::TestWithParam<ProgramSetup> {};

TEST_P(GpuPrograms, QueuedOperationsEachMatchTheOracle) {
  SKIP_WITHOUT_GPU();
  const ProgramSetup s = GetParam();
  // Small slots, so that the counts cross many steps of both protocols and several channels.
  ScopedEnv buff("NCCL_BUFFSIZE", "8192");
  ScopedEnv ll("TUTTI_LL_SLOT_BYTES", "1024");
  ScopedEnv ch("TUTTI_DEV_CHANNEL_BYTES", "4096");
  ScopedEnv timeout("TUTTI_TIMEOUT", "60");
  ScopedEnv proto("NCCL_PROTO", s.proto[0] ? s.proto : nullptr);
  ScopedEnv p2p("NCCL_P2P_DISABLE", s.p2pDisabled ? "1" : nullptr);
  // TUTTI_PROGRAM_SEED and TUTTI_PROGRAM_LENGTH replace the seed and the length (to try others
  // by hand).
  const char* seedEnv = getenv("TUTTI_PROGRAM_SEED");
  const char* lengthEnv = getenv("TUTTI_PROGRAM_LENGTH");
  const uint32_t seed = seedEnv && *seedEnv ? uint32_t(strtoul(seedEnv, nullptr, 0)) : s.seed;
  const int length = lengthEnv && *lengthEnv ? atoi(lengthEnv) : s.length;
  const std::vector<ProgramStep> program =
      randomProgram(s.nranks, kFifoBytes, seed, length, s.hostSteps);
  // TUTTI_PROGRAM_GPUS=G: ranks on threads go to GPU rank % G, so that links cross GPUs (peer
  // access) beside links within one.
  const int gpus = spreadGpus("TUTTI_PROGRAM_GPUS");
  std::vector<std::string> failures;
  auto makeStreams = [&](void* streams[2]) {
    for (int k = 0; k < (s.oneStream ? 1 : 2); ++k) {
      cudaStream_t st = nullptr;
      EXPECT_EQ(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
      streams[k] = st;
    }
    if (s.oneStream) streams[1] = streams[0];
  };
  auto dropStreams = [&](void* streams[2]) {
    cudaStreamDestroy(static_cast<cudaStream_t>(streams[0]));
    if (streams[1] != streams[0]) cudaStreamDestroy(static_cast<cudaStream_t>(streams[1]));
  };
  std::vector<ncclComm_t> comms;
  if (s.oneThread) {
    comms.resize(size_t(s.nranks));
    std::vector<int> devs(size_t(s.nranks), 0);
    ASSERT_EQ(ncclCommInitAll(comms.data(), s.nranks, devs.data()), ncclSuccess)
        << ncclGetLastError(nullptr);
    ProgramRun run{{}, s.nranks, s.graph, nullptr};
    void* shared[2] = {nullptr, nullptr};
    if (s.oneStream) makeStreams(shared);
    for (int r = 0; r < s.nranks; ++r) {
      ProgramRank pr{comms[size_t(r)], r, {shared[0], shared[1]}};
      if (!s.oneStream) makeStreams(pr.streams);
      run.ranks.push_back(pr);
    }
    failures = runProgram(run, program);
    releaseDeviceMemory();
    if (s.oneStream) {
      dropStreams(shared);
    } else {
      for (ProgramRank& pr : run.ranks) dropStreams(pr.streams);
    }
  } else {
    comms = initThreadsOnGpus(s.nranks, gpus);
    for (ncclComm_t c : comms) ASSERT_NE(c, nullptr);
    std::mutex mu;
    ThreadBarrier barrier(s.nranks);
    onThreads(s.nranks, [&](int rank) {
      EXPECT_EQ(cudaSetDevice(rank % gpus), cudaSuccess);
      ProgramRank pr{comms[size_t(rank)], rank, {nullptr, nullptr}};
      makeStreams(pr.streams);
      ProgramRun run{{pr}, s.nranks, s.graph, [&] { barrier.wait(); }};
      std::vector<std::string> bad = runProgram(run, program);
      barrier.wait();  // every kernel has ended before any rank frees memory
      releaseDeviceMemory();
      dropStreams(pr.streams);
      std::lock_guard<std::mutex> lock(mu);
      failures.insert(failures.end(), bad.begin(), bad.end());
    });
  }
  destroyAll(comms);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  if (!failures.empty())
    ADD_FAILURE() << "the program (seed " << seed << "):\n" << describeProgram(program);
}

// Every value of every axis at least once: 2 to 8 ranks, each protocol and the automatic
// choice, both kinds of FIFO memory, eager and captured, one stream and two, a thread per rank
// and one thread for all, with and without steps on host buffers.
INSTANTIATE_TEST_SUITE_P(
    Ranks, GpuPrograms,
    ::testing::Values(ProgramSetup{2, "", true, false, false, false, true, 1, 48},
                      ProgramSetup{3, "LL", false, false, false, false, false, 2, 48},
                      ProgramSetup{4, "", false, false, false, true, true, 3, 48},
                      ProgramSetup{4, "Simple", false, true, false, false, false, 4, 32},
                      ProgramSetup{5, "", false, true, true, false, false, 5, 32},
                      ProgramSetup{6, "LL", true, true, false, true, false, 6, 32},
                      ProgramSetup{8, "", false, false, true, true, false, 7, 32}),
    programName);

}  // namespace
