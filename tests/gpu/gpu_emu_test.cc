// GPU tests that only the emulated CUDA runtime (tests/cudaemu) can run: they need a GPU of a
// size the test chooses (TUTTI_EMU_SMS), so they run this binary again with it set.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"
#include "runtime/comm.h"
#include "runtime/device_engine.h"

extern "C" int cudaemuContextMade(int d);  // tests/cudaemu

using namespace tutti::test;

namespace {

constexpr int kRanks = 12;

// Every communicator all-reduces its buffer of b in place, in one group, on streams[c] (or on
// the one stream given): ncclGroupEnd's result, or the first call's that failed.
ncclResult_t allReduceInOneGroup(const std::vector<ncclComm_t>& comms, RankBuffers& b,
                                 const std::vector<cudaStream_t>& streams) {
  ncclResult_t res = ncclGroupStart();
  for (size_t c = 0; c < comms.size() && res == ncclSuccess; ++c)
    res = ncclAllReduce(b.bufs[c], b.bufs[c], b.count, ncclFloat, ncclSum, comms[c],
                        streams[streams.size() == 1 ? 0 : c]);
  const ncclResult_t end = ncclGroupEnd();
  return res != ncclSuccess ? res : end;
}

// Run by the test below in a child: 12 ranks on GPU 0, made by one thread, all-reduce one
// float in one group.
TEST(GpuEmuChild, DISABLED_TwelveRanksAllReduceOnce) {
  SKIP_WITHOUT_GPU();
  std::vector<ncclComm_t> comms(kRanks);
  std::vector<int> devs(kRanks, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), kRanks, devs.data()), ncclSuccess);
  RankBuffers b(kRanks, 1);
  std::vector<cudaStream_t> streams(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking), cudaSuccess);
    b.fill(r, 1.0f, streams[size_t(r)]);
  }
  EXPECT_EQ(allReduceInOneGroup(comms, b, streams), ncclSuccess);
  RankFailures failures;
  for (int r = 0; r < kRanks; ++r)
    expectResults(failures, r, comms[size_t(r)], streams[size_t(r)], {{&b, float(kRanks)}});
  failures.report();
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

// Runs this binary's test GpuEmuChild.DISABLED_<test> with `env` set (runChildTest).
std::string runChild(const std::string& env, const std::string& test, bool* passed) {
  return runChildTest(env, "GpuEmuChild.DISABLED_" + test, passed);
}

// 12 ranks on a GPU of 16 resident blocks: collectives fit (12 blocks), a group of sends and
// receives among all of them would not (24): the lowest rank says so when its engine starts (its
// first operation on GPU buffers), once. On an H100's 132, nothing is said.
TEST(GpuEmu, RanksOnAGpuTooSmallForTheirSendsAndReceivesAreWarnedOnce) {
  SKIP_WITHOUT_GPU();
  bool passed = false;
  // (A cap of sends' blocks from the environment would change what is said.)
  auto runAt = [&](int sms) {
    return runChild("-u TUTTI_P2P_MAX_BLOCKS NCCL_DEBUG=WARN TUTTI_EMU_SMS=" + std::to_string(sms),
                    "TwelveRanksAllReduceOnce", &passed);
  };
  const std::string small = runAt(16);
  EXPECT_TRUE(passed) << small;
  const std::string warning =
      "rank 0: 12 ranks of this communicator share GPU 0, which runs 16 blocks of tutti's "
      "kernels at once: collectives fit (one per rank), and a group in which each of them "
      "sends and receives needs 24";
  const size_t at = small.find(warning);
  EXPECT_NE(at, std::string::npos) << small;
  EXPECT_EQ(small.find("share GPU 0, which runs", at + warning.size()), std::string::npos) << small;
  const std::string big = runAt(132);
  EXPECT_TRUE(passed) << big;
  EXPECT_EQ(big.find("share GPU 0, which runs"), std::string::npos) << big;
}

// Run by the test below in a child, with two GPUs: ranks 0 and 1 of two communicators on GPU
// 1, made and called by a thread that chose GPU 1, in one group across the communicators
// (whose parts the others' engines prepare on threads of their own), then destroyed.
TEST(GpuEmuChild, DISABLED_TwoCommunicatorsOnGpu1InOneGroup) {
  SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  std::vector<ncclComm_t> comms(4);
  std::vector<int> devs(2, 1);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, devs.data()), ncclSuccess);
  ASSERT_EQ(ncclCommInitAll(comms.data() + 2, 2, devs.data()), ncclSuccess);
  RankBuffers b(4, 64);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  for (int r = 0; r < 4; ++r) b.fill(r, 1.0f, s);
  for (int round = 0; round < 2; ++round)  // the first makes the engines
    ASSERT_EQ(allReduceInOneGroup(comms, b, {s}), ncclSuccess);
  RankFailures failures;
  for (int c = 0; c < 4; ++c) expectResults(failures, c, comms[size_t(c)], s, {{&b, 4.0f}});
  failures.report();
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  cudaStreamDestroy(s);
  EXPECT_EQ(cudaemuContextMade(0), 0) << "a context was made on GPU 0";
  EXPECT_EQ(cudaemuContextMade(1), 1);
}

// A process whose ranks are all on GPU 1 takes nothing on GPU 0: none of tutti's threads makes
// a context there (a thread that never chose a device has device 0 current, and CUDA 12 makes a
// device's context at cudaSetDevice: restoring "the caller's" device 0 on such a thread made
// one, as torchrun's processes on GPUs 1-7 each would, taking GPU 0's memory).
TEST(GpuEmu, RanksOnGpu1MakeNoContextOnGpu0) {
  SKIP_WITHOUT_GPU();
  bool passed = false;
  const std::string out = runChild("TUTTI_EMU_GPUS=2", "TwoCommunicatorsOnGpu1InOneGroup", &passed);
  EXPECT_TRUE(passed) << out;
}

// Run by the test below in a child with two GPUs: two ranks on GPU 1 made by a thread that
// chose GPU 1, then, from threads of the application's: a thread that never chose a GPU reads
// an error state and aborts one, a thread that works on GPU 0 destroys the other.
TEST(GpuEmuChild, DISABLED_AppThreadsEndCommunicatorsOnGpu1) {
  SKIP_WITHOUT_GPU();
  std::vector<ncclComm_t> comms(2);
  std::vector<int> devs(2, 1);
  std::thread([&] {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    ASSERT_EQ(ncclCommInitAll(comms.data(), 2, devs.data()), ncclSuccess);
    RankBuffers b(2, 64);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    for (int r = 0; r < 2; ++r) b.fill(r, 1.0f, s);
    ASSERT_EQ(allReduceInOneGroup(comms, b, {s}), ncclSuccess);
    RankFailures failures;
    for (int r = 0; r < 2; ++r) expectResults(failures, r, comms[size_t(r)], s, {{&b, 2.0f}});
    failures.report();
    cudaStreamDestroy(s);
  }).join();
  ASSERT_EQ(cudaemuContextMade(0), 0);
  // A watchdog's thread, say: its device is 0 without a context there, and stays so.
  std::thread([&] {
    ncclResult_t async = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(comms[0], &async), ncclSuccess);
    EXPECT_EQ(async, ncclSuccess);
    EXPECT_EQ(ncclCommAbort(comms[0]), ncclSuccess);
  }).join();
  EXPECT_EQ(cudaemuContextMade(0), 0) << "a thread that never chose a GPU got GPU 0's context";
  // A thread that works on GPU 0 gets GPU 0 back.
  std::thread([&] {
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(ncclCommDestroy(comms[1]), ncclSuccess);
    int d = -1;
    EXPECT_EQ(cudaGetDevice(&d), cudaSuccess);
    EXPECT_EQ(d, 0);
  }).join();
}

// tutti works on a communicator's GPU from whatever thread calls it, and gives the thread its
// own device back -- except a device it never used (device 0 by default, without a context):
// going back to it would make that context (cudaSetDevice does, since CUDA 12), and GPU 0
// would hold a context of every process whose watchdog thread aborts or destroys, as
// torchrun's processes on GPUs 1-7 would.
TEST(GpuEmu, AppThreadsThatNeverChoseAGpuGetNoContextOnGpu0) {
  SKIP_WITHOUT_GPU();
  bool passed = false;
  const std::string out = runChild("TUTTI_EMU_GPUS=2", "AppThreadsEndCommunicatorsOnGpu1", &passed);
  EXPECT_TRUE(passed) << out;
}

// Run by the test below in a child with two GPUs: four ranks, rank r on GPU r % 2, made and
// called by this thread, sum in place in one group twice, each on a stream of its GPU.
TEST(GpuEmuChild, DISABLED_FourRanksOnTwoGpusAllReduce) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs = {0, 1, 0, 1};
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess);
  std::vector<float*> bufs(n);
  std::vector<cudaStream_t> streams(n);
  for (size_t r = 0; r < n; ++r) {
    ASSERT_EQ(cudaSetDevice(devs[r]), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&bufs[r], 2 * sizeof(float)), cudaSuccess);
    const float v[2] = {float(r + 1), float(r + 1)};
    ASSERT_EQ(cudaMemcpy(bufs[r], v, sizeof(v), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // (the copy may return before it lands)
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), cudaSuccess);
  }
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (size_t r = 0; r < n; ++r)
      EXPECT_EQ(ncclAllReduce(bufs[r], bufs[r], 2, ncclFloat, ncclSum, comms[r], streams[r]),
                ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  }
  for (size_t r = 0; r < n; ++r) {
    ASSERT_EQ(cudaSetDevice(devs[r]), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    float v[2] = {0, 0};
    ASSERT_EQ(cudaMemcpy(v, bufs[r], sizeof(v), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(v[0], 40.0f) << "rank " << r;  // 1 + 2 + 3 + 4, then four times that
    EXPECT_EQ(v[1], 40.0f) << "rank " << r;
    EXPECT_FALSE(reinterpret_cast<tutti::Comm*>(comms[r])->deviceEngine().launchesWholeParams())
        << "rank " << r << " fell back to whole parameters";
  }
  for (size_t r = 0; r < n; ++r) {
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
    cudaStreamDestroy(streams[r]);
    cudaFree(bufs[r]);
  }
}

// Ranks on two GPUs of one process: each engine launches with its own GPU's function (a
// CUfunction belongs to one context; the emulated driver refuses another's), so none falls back
// to passing whole parameters.
TEST(GpuEmu, RanksOnTwoGpusLaunchWithTheirOwnGpusFunctions) {
  SKIP_WITHOUT_GPU();
  bool passed = false;
  const std::string out =
      runChild("TUTTI_EMU_GPUS=2 NCCL_DEBUG=WARN", "FourRanksOnTwoGpusAllReduce", &passed);
  EXPECT_TRUE(passed) << out;
  EXPECT_EQ(out.find("pass them all from now on"), std::string::npos) << out;
}

// Ranks on two GPUs that cannot reach each other's memory (cudaDeviceCanAccessPeer says no:
// no NVLink, or PCIe that refuses peer traffic; TUTTI_EMU_NO_PEER_ACCESS=1) link through
// mapped host memory, and their all-reduces are right; where they can, through GPU memory.
// Four ranks, rank r on GPU r % 2: every link of the ring crosses the GPUs.
TEST(GpuEmu, GpusThatCannotReachEachOtherLinkThroughMappedHostMemory) {
  SKIP_WITHOUT_GPU();
  for (const char* denied : {"1", "0"}) {
    bool passed = false;
    const std::string out = runChild(std::string("TUTTI_EMU_GPUS=2 TUTTI_EMU_NO_PEER_ACCESS=") +
                                         denied + " NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT",
                                     "FourRanksOnTwoGpusAllReduce", &passed);
    EXPECT_TRUE(passed) << out;
    // The links between the GPUs (ranks 0 and 2 on GPU 0 also link to each other, directly).
    int across = 0;
    for (const LinkLine& l : linkLines(out)) {
      if (l.from % 2 == l.to % 2) continue;
      ++across;
      EXPECT_EQ(l.via, denied[0] == '1' ? "shm/mapped" : "p2p")
          << "no peer access: " << denied << ": " << l.line;
    }
    EXPECT_GT(across, 0) << out;
  }
}

// Processes that each see only their own GPU (CUDA_VISIBLE_DEVICES=<rank>, as launchers set
// it; TUTTI_EMU_VISIBLE_DEVICES to the emulator) cannot ask CUDA whether their GPUs reach each
// other, but a sender can open its receiver's FIFO with CUDA IPC all the same: where the GPUs
// reach each other their links are in GPU memory, silently; where they cannot
// (TUTTI_EMU_NO_PEER_ACCESS=1: the open fails with cudaErrorPeerAccessUnsupported) they go
// through mapped host memory, which each sender says at INFO, and the sums are right either
// way. Where rank 0 sees both GPUs and rank 1 its own, rank 0 asks CUDA about the link into it
// and rank 1 offers the choice for the other. Both processes seeing the same GPU: GPU memory.
TEST(GpuEmu, ProcessesThatSeeOnlyTheirOwnGpuLinkThroughGpuMemoryWhereTheGpusReachEachOther) {
  SKIP_WITHOUT_GPU();
  struct Case {
    const char* visible;
    const char* denied;
    const char* via;
    size_t fellBack;  // senders whose IPC open failed
  };
  const char* asymmetric = "$([ $RANK = 0 ] && echo 0,1 || echo 1)";
  for (const Case& c : {Case{"$RANK", "0", "p2p", 0}, Case{"$RANK", "1", "shm/mapped", 2},
                        Case{asymmetric, "0", "p2p", 0}, Case{asymmetric, "1", "shm/mapped", 1},
                        Case{"1", "0", "p2p", 0}}) {
    const std::string what = std::string("visible ") + c.visible + ", no peer access " + c.denied;
    const std::string cmd = std::string(
                                "TUTTI_EMU_GPUS=2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "
                                "TUTTI_MATRIX_FILTER='AllReduce float' TUTTI_EMU_NO_PEER_ACCESS=") +
                            c.denied + " " + TUTTI_RUN_BIN +
                            " -n 2 sh -c 'TUTTI_EMU_VISIBLE_DEVICES=" + c.visible +
                            " exec \"$0\" coll-device' " + TUTTI_TEST_RANK_BIN + " 2>&1";
    RunResult r = runShell(cmd);
    EXPECT_EQ(r.exitCode, 0) << what << ": " << r.output;
    EXPECT_NE(r.output.find("cases passed on rank 1\n"), std::string::npos) << what << r.output;
    const std::vector<LinkLine> links = linkLines(r.output);
    for (const LinkLine& l : links) EXPECT_EQ(l.via, c.via) << what << ": " << l.line;
    EXPECT_GT(links.size(), 0u) << r.output;
    // Each sender that fell back says so once, with CUDA's reason; none warns.
    EXPECT_EQ(timesIn(r.output, "cannot be reached from this one (cudaErrorPeerAccessUnsupported"),
              c.fellBack)
        << what << ": " << r.output;
    EXPECT_EQ(r.output.find("cannot open rank"), std::string::npos) << what << ": " << r.output;
    // Neither the segment not taken nor the other's broken-word page outlives the run.
    const std::vector<std::string> pids = pidsIn(r.output);
    EXPECT_EQ(pids.size(), 2u) << what << ": " << r.output;
    EXPECT_EQ(shmLeftBy(pids), std::vector<std::string>{}) << what;
  }
}

// A kernel whose peer process exits stops (the survivor's peer watch marks its links broken)
// on the links of processes that each see only their own GPU, whichever their senders took:
// GPU memory, or the spare mapped segment (no peer access), for a surviving receiver; for a
// surviving sender, GPU memory, or (its send link made after the ring's, once its peer knows
// the answer) mapped memory offered as such.
TEST(GpuEmu, AKernelWaitingForAPeerThatSeesOnlyItsOwnGpuStopsWhenThePeerExits) {
  SKIP_WITHOUT_GPU();
  for (const char* denied : {"0", "1"}) {
    for (const char* mode : {"peerexit-device", "peerexit-device-big"}) {
      const std::string what = std::string(mode) + ", no peer access " + denied;
      RunResult r = runShell(std::string("TUTTI_EMU_GPUS=2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT "
                                         "TUTTI_TIMEOUT=600 TUTTI_EMU_NO_PEER_ACCESS=") +
                             denied + " timeout 60 " + TUTTI_RUN_BIN +
                             " -n 2 sh -c 'TUTTI_EMU_VISIBLE_DEVICES=$RANK exec \"$0\" \"$1\"' " +
                             TUTTI_TEST_RANK_BIN + " " + mode + " 2>&1");
      EXPECT_EQ(r.exitCode, 0) << what << ": " << r.output;
      EXPECT_NE(r.output.find("device survivor: "), std::string::npos) << what << r.output;
      const std::vector<LinkLine> links = linkLines(r.output);
      EXPECT_GT(links.size(), 0u) << what << ": " << r.output;
      for (const LinkLine& l : links)
        EXPECT_EQ(l.via, denied[0] == '1' ? "shm/mapped" : "p2p") << what << ": " << l.line;
    }
  }
}

// Ranks of separate processes on one GPU without MPS take turns on it (time slices): the lowest
// of them says so once, naming the pipe directory it looked in, and says nothing where an MPS
// control daemon's pipe is there. Emulated only: a "control" file that is no daemon's pipe
// would have a real CUDA try to connect to it.
TEST(GpuEmu, ProcessesSharingAGpuWithoutMpsAreWarnedOnce) {
  SKIP_WITHOUT_GPU();
  char dir[] = "/tmp/tutti-mps-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string cmd = std::string(
                              "NCCL_DEBUG=WARN TUTTI_MATRIX_FILTER='AllReduce float' "
                              "CUDA_MPS_PIPE_DIRECTORY=") +
                          dir + " " + TUTTI_RUN_BIN + " -n 3 " + TUTTI_TEST_RANK_BIN +
                          " coll-device 2>&1";
  RunResult without = runShell(cmd);
  EXPECT_EQ(without.exitCode, 0) << without.output;
  EXPECT_EQ(timesIn(without.output, "no MPS daemon"), 1u) << without.output;
  EXPECT_NE(without.output.find("rank 0: 2 rank(s) of other processes share GPU 0"),
            std::string::npos)
      << without.output;
  EXPECT_NE(without.output.find(std::string(dir) + "/control"), std::string::npos)
      << without.output;

  const std::string control = std::string(dir) + "/control";
  FILE* f = fopen(control.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  RunResult with = runShell(cmd);
  EXPECT_EQ(with.exitCode, 0) << with.output;
  EXPECT_EQ(with.output.find("no MPS daemon"), std::string::npos) << with.output;
  unlink(control.c_str());
  rmdir(dir);
}

// Run by the test below in a child whose launches after its first fail: ranks 0 and 1 on GPU 0,
// made by one thread, all-reduce in one group; rank 0's kernel is launched, rank 1's is not.
TEST(GpuEmuChild, DISABLED_TwoRanksWhoseSecondLaunchFails) {
  SKIP_WITHOUT_GPU();
  std::vector<ncclComm_t> comms(2);
  std::vector<int> devs(2, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, devs.data()), ncclSuccess);
  RankBuffers b(2, 1024);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(allReduceInOneGroup(comms, b, {s}), ncclUnhandledCudaError);
  const std::string msg = ncclGetLastError(comms[1]);
  EXPECT_NE(msg.find("rank 1: launching the kernel of ncclAllReduce (opCount 0) on GPU 0, "),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("cuLaunchKernel (CUresult 701): cudaErrorLaunchOutOfResources"),
            std::string::npos)
      << msg;
  // Rank 0's kernel, launched, waits for rank 1's, which will never come: it stops at once.
  const double start = now();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_LT(secondsSince(start), 10.0) << "rank 0's kernel waited for its deadline";
  for (ncclComm_t c : comms) {
    ncclResult_t async = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(c, &async), ncclSuccess);
    EXPECT_NE(async, ncclSuccess) << "both ranks' communicators fail";
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  }
  cudaStreamDestroy(s);
}

// A launch that fails (here the emulator's, TUTTI_EMU_FAIL_LAUNCH_AFTER) is reported naming the
// rank, the operation, the GPU and the launch's shape, fails the group and the communicators,
// and stops the kernels already launched for it instead of leaving them to wait for their
// deadline.
TEST(GpuEmu, AFailedLaunchIsNamedAndStopsTheKernelsLaunchedWithIt) {
  SKIP_WITHOUT_GPU();
  bool passed = false;
  const std::string out =
      runChild("TUTTI_EMU_FAIL_LAUNCH_AFTER=1", "TwoRanksWhoseSecondLaunchFails", &passed);
  EXPECT_TRUE(passed) << out;
}

// The emulator's memcheck: a cudaMalloc'd buffer ends (to CUDA's 256-byte alignment) at a page
// that faults, so an access past it crashes where it happens, as compute-sanitizer would report
// it; up to the end it is memory like any other. (Before the buffer, only what precedes the
// memfd's first page faults.)
TEST(GpuEmu, AnAccessPastTheEndOfDeviceMemoryFaults) {
  SKIP_WITHOUT_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  char* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 1000), cudaSuccess);
  volatile char* v = p;
  v[0] = 1;
  v[1023] = 2;  // within the 256-byte rounding
  EXPECT_DEATH(v[1024] = 3, "");
  EXPECT_DEATH(v[-4097] = 3, "");  // before the memfd's first page: the page ahead faults
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

}  // namespace
