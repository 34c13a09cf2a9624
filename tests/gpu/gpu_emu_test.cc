// GPU tests that only the emulated CUDA runtime (tests/cudaemu) can run: they need a GPU of a
// size the test chooses (TUTTI_EMU_SMS), so they run this binary again with it set.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"

using namespace tutti::test;

namespace {

constexpr int kRanks = 12;

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
  ncclResult_t res = ncclGroupStart();
  for (int r = 0; r < kRanks && res == ncclSuccess; ++r)
    res = ncclAllReduce(b.bufs[size_t(r)], b.bufs[size_t(r)], 1, ncclFloat, ncclSum,
                        comms[size_t(r)], streams[size_t(r)]);
  const ncclResult_t end = ncclGroupEnd();
  EXPECT_EQ(res, ncclSuccess);
  EXPECT_EQ(end, ncclSuccess);
  RankFailures failures;
  for (int r = 0; r < kRanks; ++r)
    expectResults(failures, r, comms[size_t(r)], streams[size_t(r)], {{&b, float(kRanks)}});
  failures.report();
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

// What the child printed, and whether it passed.
std::string runChild(int sms, bool* passed) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  self[n] = 0;
  // A hang fails within the test's limit, with the child's output; a cap of sends' blocks from
  // the environment would change what is said.
  const std::string cmd =
      "env -u TUTTI_P2P_MAX_BLOCKS TUTTI_TIMEOUT=30 TUTTI_EMU_SMS=" + std::to_string(sms) +
      " NCCL_DEBUG=WARN '" + self +
      "' --gtest_also_run_disabled_tests "
      "--gtest_filter=GpuEmuChild.DISABLED_TwelveRanksAllReduceOnce 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  *passed = pclose(p) == 0;
  return out;
}

// 12 ranks on a GPU of 16 resident blocks: collectives fit (12 blocks), a group of sends and
// receives among all of them would not (24): the lowest rank says so when its engine starts (its
// first operation on GPU buffers), once. On an H100's 132, nothing is said.
TEST(GpuEmu, RanksOnAGpuTooSmallForTheirSendsAndReceivesAreWarnedOnce) {
  SKIP_WITHOUT_GPU();
  bool passed = false;
  const std::string small = runChild(16, &passed);
  EXPECT_TRUE(passed) << small;
  const std::string warning =
      "rank 0: 12 ranks of this communicator share GPU 0, which runs 16 blocks of tutti's "
      "kernels at once: collectives fit (one per rank), and a group in which each of them "
      "sends and receives needs 24";
  const size_t at = small.find(warning);
  EXPECT_NE(at, std::string::npos) << small;
  EXPECT_EQ(small.find("share GPU 0, which runs", at + warning.size()), std::string::npos) << small;
  const std::string big = runChild(132, &passed);
  EXPECT_TRUE(passed) << big;
  EXPECT_EQ(big.find("share GPU 0, which runs"), std::string::npos) << big;
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
