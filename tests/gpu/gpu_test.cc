// The GPU data path (label "gpu"): collectives on device buffers as kernels, ranks sharing
// the one GPU as threads and as processes, both protocols, the p2p transport in GPU memory and
// through mapped host memory (NCCL_P2P_DISABLE=1), streams shared by ranks or changing between
// calls, abort and the kernels' deadline (CUDA graphs: gpu_graph_test.cc). Every test skips, saying
// why, where no GPU is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <regex>
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
  const std::regex link(R"(rank (\d+) -> rank (\d+) channel \d+ via (\S+))");
  int links = 0;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), link), end; it != end; ++it) {
    ++links;
    const int from = std::stoi((*it)[1]), to = std::stoi((*it)[2]);
    const bool off =
        s.p2pDisabledRank >= s.nranks || from == s.p2pDisabledRank || to == s.p2pDisabledRank;
    EXPECT_EQ((*it)[3], off ? "shm/mapped" : "p2p") << (*it)[0];
  }
  if (s.nranks > 1) EXPECT_GT(links, 0) << r.output;
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
