// The GPU data path (label "gpu"): collectives on device buffers as kernels, ranks sharing
// the one GPU as threads and as processes, both protocols, the p2p transport in GPU memory and
// through mapped host memory (NCCL_P2P_DISABLE=1), abort and the kernels' deadline (streams:
// gpu_streams_test.cc; CUDA graphs: gpu_graph_test.cc). Every test skips, saying why, where no
// GPU is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/matrix.h"
#include "gpu/gpu_support.h"
#include "harness/harness.h"

using namespace tutti::test;

namespace {

constexpr size_t kFifoBytes = 8192;  // NCCL_BUFFSIZE: 1 KiB Simple slots

// The value already in the environment if there is one (to chase a failure by hand), else v.
const char* orEnv(const char* name, const char* v) {
  const char* set = getenv(name);
  return set && *set ? set : v;
}

// Small slots everywhere, so the matrix's counts cross many steps of both protocols, and
// several channels even for small operations.
struct SmallFifos {
  ScopedEnv buff{"NCCL_BUFFSIZE", orEnv("NCCL_BUFFSIZE", "8192")};
  ScopedEnv ll{"TUTTI_LL_SLOT_BYTES", orEnv("TUTTI_LL_SLOT_BYTES", "1024")};
  ScopedEnv ch{"TUTTI_DEV_CHANNEL_BYTES", orEnv("TUTTI_DEV_CHANNEL_BYTES", "4096")};
  ScopedEnv timeout{"TUTTI_TIMEOUT", orEnv("TUTTI_TIMEOUT", "60")};
};

struct GpuSetup {
  int nranks;
  const char* proto;  // NCCL_PROTO, or "" for the automatic choice
  bool p2pDisabled;   // FIFOs in mapped host memory instead of GPU memory
};

void PrintTo(const GpuSetup& s, std::ostream* os) {
  *os << s.nranks << " ranks, protocol " << (s.proto[0] ? s.proto : "auto") << ", "
      << (s.p2pDisabled ? "mapped host memory" : "GPU memory") << " FIFOs";
}

std::string gpuName(const ::testing::TestParamInfo<GpuSetup>& info) {
  return std::to_string(info.param.nranks) + "ranks_" +
         (info.param.proto[0] ? info.param.proto : "auto") +
         (info.param.p2pDisabled ? "_mapped" : "_p2p");
}

class GpuMatrix : public ::testing::TestWithParam<GpuSetup> {};

TEST_P(GpuMatrix, EveryCollectiveOnDeviceBuffersMatchesTheOracle) {
  SKIP_WITHOUT_GPU();
  const GpuSetup s = GetParam();
  SmallFifos fifos;
  ScopedEnv proto("NCCL_PROTO", s.proto[0] ? s.proto : nullptr);
  ScopedEnv p2p("NCCL_P2P_DISABLE", s.p2pDisabled ? "1" : nullptr);
  std::vector<ncclComm_t> comms = initThreads(s.nranks);
  ASSERT_EQ(comms.size(), size_t(s.nranks));
  const std::vector<Case> cases = matrixCases(s.nranks, kFifoBytes);
  std::mutex mu;
  std::vector<std::string> failures;
  ThreadBarrier barrier(s.nranks);
  onThreads(s.nranks, [&](int rank) {
    cudaStream_t stream;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    std::vector<std::string> bad;
    std::string err = reserveDeviceMemory(cases, s.nranks);
    if (!err.empty()) bad.push_back("rank " + std::to_string(rank) + ": " + err);
    barrier.wait();  // no rank allocates while another's kernel waits for it
    if (err.empty()) {
      bad = runCases(comms[size_t(rank)], rank, s.nranks, cases, 10, Memory::kDevice, stream);
    }
    barrier.wait();
    releaseDeviceMemory();
    cudaStreamDestroy(stream);
    std::lock_guard<std::mutex> lock(mu);
    failures.insert(failures.end(), bad.begin(), bad.end());
  });
  destroyAll(comms);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  RecordProperty("cases", int(cases.size()));
}

// Every communicator size of DESIGN.md, both protocols and the automatic choice, and the
// mapped-memory path, each at least once.
INSTANTIATE_TEST_SUITE_P(Threads, GpuMatrix,
                         ::testing::Values(GpuSetup{1, "", false}, GpuSetup{2, "LL", false},
                                           GpuSetup{2, "Simple", true},
                                           GpuSetup{3, "Simple", false}, GpuSetup{4, "", false},
                                           GpuSetup{4, "LL", true}, GpuSetup{5, "LL", false},
                                           GpuSetup{8, "Simple", false}, GpuSetup{8, "", false}),
                         gpuName);

// The matrix with ranks as processes on the one GPU: FIFOs in GPU memory over CUDA IPC, or
// (NCCL_P2P_DISABLE=1) in POSIX shared memory that each end maps and registers with CUDA; set on
// every rank, or on one alone (each pair of ranks decides alike from both ends' settings).
struct ProcessSetup {
  int nranks;
  const char* proto;    // NCCL_PROTO, or "" for the automatic choice
  int p2pDisabledRank;  // -1: none; nranks: every rank; else that rank alone
};

void PrintTo(const ProcessSetup& s, std::ostream* os) {
  *os << s.nranks << " processes, protocol " << (s.proto[0] ? s.proto : "auto") << ", "
      << (s.p2pDisabledRank < 0 ? std::string("FIFOs in GPU memory")
          : s.p2pDisabledRank >= s.nranks
              ? std::string("NCCL_P2P_DISABLE=1 on every rank")
              : "NCCL_P2P_DISABLE=1 on rank " + std::to_string(s.p2pDisabledRank));
}

std::string processName(const ::testing::TestParamInfo<ProcessSetup>& info) {
  const ProcessSetup& s = info.param;
  return std::to_string(s.nranks) + "procs_" + (s.proto[0] ? s.proto : "auto") +
         (s.p2pDisabledRank < 0           ? "_p2p"
          : s.p2pDisabledRank >= s.nranks ? "_mapped"
                                          : "_mappedOnRank" + std::to_string(s.p2pDisabledRank));
}

class GpuProcessMatrix : public ::testing::TestWithParam<ProcessSetup> {};

TEST_P(GpuProcessMatrix, EveryCollectiveOnDeviceBuffersMatchesTheOracle) {
  SKIP_WITHOUT_GPU();
  const ProcessSetup s = GetParam();
  std::string env =
      "NCCL_BUFFSIZE=8192 TUTTI_LL_SLOT_BYTES=1024 TUTTI_DEV_CHANNEL_BYTES=4096 TUTTI_TIMEOUT=60 "
      "NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT ";  // the links made, one line each
  if (s.proto[0]) env += std::string("NCCL_PROTO=") + s.proto + " ";
  if (s.p2pDisabledRank >= s.nranks) env += "NCCL_P2P_DISABLE=1 ";
  std::string rankCmd = std::string(TUTTI_TEST_RANK_BIN) + " coll-device";
  if (s.p2pDisabledRank >= 0 && s.p2pDisabledRank < s.nranks) {  // tutti-run sets RANK
    rankCmd = "sh -c 'if [ \"$RANK\" = " + std::to_string(s.p2pDisabledRank) +
              " ]; then export NCCL_P2P_DISABLE=1; fi; exec \"$0\" coll-device' " +
              TUTTI_TEST_RANK_BIN;
  }
  RunResult r = runShell("env -u NCCL_P2P_DISABLE -u NCCL_PROTO " + env + TUTTI_RUN_BIN + " -n " +
                         std::to_string(s.nranks) + " " + rankCmd + " 2>&1");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int rank = 0; rank < s.nranks; ++rank) {
    EXPECT_NE(r.output.find("cases passed on rank " + std::to_string(rank) + "\n"),
              std::string::npos)
        << "rank " << rank << ": " << r.output;
  }
  // Each link the ranks made: through mapped host memory where either end disabled p2p, else
  // through GPU memory.
  const std::vector<LinkLine> links = linkLines(r.output);
  for (const LinkLine& l : links) {
    const bool off =
        s.p2pDisabledRank >= s.nranks || l.from == s.p2pDisabledRank || l.to == s.p2pDisabledRank;
    EXPECT_EQ(l.via, off ? "shm/mapped" : "p2p") << l.line;
  }
  if (s.nranks > 1) EXPECT_GT(links.size(), 0u) << r.output;
}

// 1-8 processes, both protocols and the automatic choice, and the mapped path on all ranks and
// on one, each at least once.
INSTANTIATE_TEST_SUITE_P(GpuProcesses, GpuProcessMatrix,
                         ::testing::Values(ProcessSetup{1, "", -1}, ProcessSetup{2, "LL", 2},
                                           ProcessSetup{3, "Simple", 1}, ProcessSetup{4, "", -1},
                                           ProcessSetup{8, "LL", 5}),
                         processName);

// Queued programs (collectives/program.h) with ranks as processes on the one GPU: FIFOs over
// CUDA IPC, eagerly on two streams each (some steps on host buffers), and captured into a graph.
TEST(GpuProcesses, QueuedProgramsWithThreeProcessesOnOneGpu) {
  SKIP_WITHOUT_GPU();
  for (const char* graph : {"0", "1"}) {
    RunResult r = runShell(std::string("NCCL_BUFFSIZE=8192 TUTTI_LL_SLOT_BYTES=1024 "
                                       "TUTTI_DEV_CHANNEL_BYTES=4096 TUTTI_TIMEOUT=60 "
                                       "TUTTI_PROGRAM_SEED=11 TUTTI_PROGRAM_HOST=") +
                           (graph[0] == '0' ? "1" : "0") + " TUTTI_PROGRAM_GRAPH=" + graph + " " +
                           TUTTI_RUN_BIN + " -n 3 " + TUTTI_TEST_RANK_BIN + " program-device 2>&1");
    EXPECT_EQ(r.exitCode, 0) << "graph " << graph << ": " << r.output;
    EXPECT_NE(r.output.find("steps passed on rank 2"), std::string::npos) << r.output;
  }
}

// A peer process that exits while this rank's kernel waits for it: the kernel stops within the
// peer watch's period, not at TUTTI_TIMEOUT (600 s here, beyond the test's limit), and the
// error names the rank that exited and its pid. Waiting to receive (on its own FIFO), and
// waiting to send into the FIFO of the process that exited (reading memory an exited process
// exported over CUDA IPC is undefined: this says what the driver does).
class GpuPeerExit : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuPeerExit, AKernelWaitingForAPeerProcessThatExitedStops) {
  SKIP_WITHOUT_GPU();
  RunResult r = runShell(std::string("TUTTI_TIMEOUT=600 timeout 60 ") + TUTTI_RUN_BIN + " -n 2 " +
                         TUTTI_TEST_RANK_BIN + " " + GetParam() + " 2>&1");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("device survivor: "), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(GpuProcesses, GpuPeerExit,
                         ::testing::Values("peerexit-device", "peerexit-device-big"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.index == 0 ? "Receiving" : "Sending");
                         });

// Two ranks on threads that all-reduce once together (so their links exist); then rank 0
// enqueues an all-reduce that rank 1 never joins.
struct LonelyRank {
  std::vector<ncclComm_t> comms = initThreads(2);
  RankBuffers b{2, 1 << 14};
  std::vector<cudaStream_t> streams = std::vector<cudaStream_t>(2);
  LonelyRank() {
    for (auto& s : streams) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    onThreads(2, [&](int r) {
      EXPECT_EQ(ncclAllReduce(b.bufs[size_t(r)], b.bufs[size_t(r)], b.count, ncclFloat, ncclSum,
                              comms[size_t(r)], streams[size_t(r)]),
                ncclSuccess);
      cudaStreamSynchronize(streams[size_t(r)]);
    });
    EXPECT_EQ(
        ncclAllReduce(b.bufs[0], b.bufs[0], b.count, ncclFloat, ncclSum, comms[0], streams[0]),
        ncclSuccess);
  }
  ~LonelyRank() {
    for (auto& s : streams) cudaStreamDestroy(s);
  }
};

// The lonely kernel spins until ncclCommAbort, which must end it promptly; the handle is then
// refused. The deadline is well above the 10 s allowed to the abort, so only the abort can
// pass the test, and low enough that a broken abort costs 30 s, not the test's whole limit.
TEST(GpuAbort, AbortEndsAKernelWhosePeerNeverArrives) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  LonelyRank t;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cudaStreamQuery(t.streams[0]), cudaErrorNotReady) << "the kernel did not wait";
  const double start = now();
  EXPECT_EQ(ncclCommAbort(t.comms[0]), ncclSuccess);
  EXPECT_LT(secondsSince(start), 10.0);
  // The kernel itself stopped at the abort, not at the 30 s deadline.
  EXPECT_EQ(cudaStreamSynchronize(t.streams[0]), cudaSuccess);
  EXPECT_LT(secondsSince(start), 10.0);
  int count = 0;
  EXPECT_EQ(ncclCommCount(t.comms[0], &count), ncclInvalidArgument);
  ncclCommAbort(t.comms[1]);
}

// A watchdog aborts an idle communicator while another one's kernel on the GPU waits for a peer
// that never comes (LonelyRank), then that one. The first abort must not wait for the stuck
// kernel (cudaFree waits for the whole GPU: until the 30 s deadline here); it leaves its memory
// to the process's exit instead.
TEST(GpuAbort, AnIdleCommunicatorsAbortDoesNotWaitForAnothersStuckKernel) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> idle = initThreads(2);
  RankBuffers b(2, 1024);
  std::vector<cudaStream_t> streams(2);
  for (auto& s : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  onThreads(2, [&](int r) {  // its engine made (FIFOs allocated), then idle
    EXPECT_EQ(ncclAllReduce(b.bufs[size_t(r)], b.bufs[size_t(r)], b.count, ncclFloat, ncclSum,
                            idle[size_t(r)], streams[size_t(r)]),
              ncclSuccess);
    EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
  });
  LonelyRank t;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cudaStreamQuery(t.streams[0]), cudaErrorNotReady) << "the kernel did not wait";
  const double start = now();
  for (ncclComm_t c : idle) EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  EXPECT_LT(secondsSince(start), 10.0) << "the idle communicator's abort waited for the GPU";
  EXPECT_EQ(ncclCommAbort(t.comms[0]), ncclSuccess);
  EXPECT_EQ(cudaStreamSynchronize(t.streams[0]), cudaSuccess);
  EXPECT_LT(secondsSince(start), 10.0);
  ncclCommAbort(t.comms[1]);
  for (auto& s : streams) cudaStreamDestroy(s);
}

// With a short TUTTI_TIMEOUT the lonely kernel gives up by itself, and the error names the
// rank, the operation and the peer it waited for, and, the ranks being threads sharing the GPU,
// what holds such a rank's thread; the next call on that comm is refused.
TEST(GpuTimeout, AKernelThatWaitsTooLongReportsRankOperationAndPeer) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "2");
  LonelyRank t;
  const double start = now();
  EXPECT_EQ(cudaStreamSynchronize(t.streams[0]), cudaSuccess);
  EXPECT_LT(secondsSince(start), 30.0);
  ncclResult_t async = ncclSuccess;
  EXPECT_EQ(ncclCommGetAsyncError(t.comms[0], &async), ncclSuccess);
  EXPECT_NE(async, ncclSuccess);
  const std::string msg = ncclGetLastError(t.comms[0]);
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("AllReduce"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 1"), std::string::npos) << msg;
  // Both ranks are threads of this process on GPU 0: the message says how such ranks deadlock.
  EXPECT_NE(msg.find("Ranks 0 and 1 are threads of this process on GPU 0"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("CUDA_MODULE_LOADING=EAGER"), std::string::npos) << msg;
  EXPECT_NE(ncclAllReduce(t.b.bufs[0], t.b.bufs[0], t.b.count, ncclFloat, ncclSum, t.comms[0],
                          t.streams[0]),
            ncclSuccess);
  for (ncclComm_t c : t.comms) ncclCommAbort(c);
}

TEST(GpuValidation, HostAndDeviceBuffersInOneCallAreRefused) {
  SKIP_WITHOUT_GPU();
  std::vector<ncclComm_t> comms = initThreads(1);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * sizeof(float)), cudaSuccess);
  std::vector<float> h(64, 1.0f);
  EXPECT_EQ(ncclAllReduce(h.data(), d, 64, ncclFloat, ncclSum, comms[0], nullptr),
            ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("one kind"), std::string::npos)
      << ncclGetLastError(comms[0]);
  cudaFree(d);
  destroyAll(comms);
}

TEST(GpuValidation, DeviceBuffersOnACpuRankAreRefused) {
  SKIP_WITHOUT_GPU();
  ncclComm_t comm;
  int devs[1] = {-1};
  ASSERT_EQ(ncclCommInitAll(&comm, 1, devs), ncclSuccess) << ncclGetLastError(nullptr);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 64 * sizeof(float)), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(d, d, 64, ncclFloat, ncclSum, comm, nullptr), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comm)).find("CPU rank"), std::string::npos)
      << ncclGetLastError(comm);
  cudaFree(d);
  ncclCommDestroy(comm);
}

}  // namespace
