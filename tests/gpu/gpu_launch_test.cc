// How kernels are launched, on a GPU (and on the emulated runtime): each gets only the bytes of
// its parameter it uses, through the driver's cuLaunchKernel, and no communicator falls back to
// passing it whole (which it does, with a warning, where the driver refuses the short form).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"
#include "runtime/comm.h"
#include "runtime/device_engine.h"

using namespace tutti::test;

namespace {

bool anyPassesWholeParams(const std::vector<ncclComm_t>& comms) {
  bool any = false;
  for (ncclComm_t c : comms)
    any = any || reinterpret_cast<tutti::Comm*>(c)->deviceEngine().launchesWholeParams();
  return any;
}

// Four ranks on one GPU from this thread, a stream each: a group of two small all-reduces (one
// LL launch of two operations on one channel, 64 threads a block), a 4 MiB all-reduce (Simple,
// several channels) and a ring of sends and receives (a launch with no channels). Every result
// is right, and every launch went by the short parameter.
TEST(GpuLaunch, KernelsGetOnlyTheParameterBytesTheyUse) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs(n, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess);
  std::vector<cudaStream_t> streams(n);
  for (cudaStream_t& s : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  RankFailures failures;
  // Two small sums in one group.
  RankBuffers a(n, 2), b(n, 2);
  for (int r = 0; r < n; ++r) {
    a.fill(r, float(r + 1), streams[size_t(r)]);
    b.fill(r, float(2 * (r + 1)), streams[size_t(r)]);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r)
    for (RankBuffers* x : {&a, &b})
      EXPECT_EQ(ncclAllReduce(x->bufs[size_t(r)], x->bufs[size_t(r)], 2, ncclFloat, ncclSum,
                              comms[size_t(r)], streams[size_t(r)]),
                ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r)
    expectResults(failures, r, comms[size_t(r)], streams[size_t(r)], {{&a, 10.0f}, {&b, 20.0f}});
  // 4 MiB.
  RankBuffers big(n, size_t(1) << 20);
  for (int r = 0; r < n; ++r) big.fill(r, float(r + 1), streams[size_t(r)]);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r)
    EXPECT_EQ(ncclAllReduce(big.bufs[size_t(r)], big.bufs[size_t(r)], big.count, ncclFloat, ncclSum,
                            comms[size_t(r)], streams[size_t(r)]),
              ncclSuccess);
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r)
    expectResults(failures, r, comms[size_t(r)], streams[size_t(r)], {{&big, 10.0f}});
  // A ring: rank r sends its r + 1 to r + 1 and receives r's neighbour's r.
  RankBuffers send(n, 1000), recv(n, 1000);
  for (int r = 0; r < n; ++r) {
    send.fill(r, float(r + 1), streams[size_t(r)]);
    recv.fill(r, -1.0f, streams[size_t(r)]);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ncclSend(send.bufs[size_t(r)], send.count, ncclFloat, (r + 1) % n, comms[size_t(r)],
                       streams[size_t(r)]),
              ncclSuccess);
    EXPECT_EQ(ncclRecv(recv.bufs[size_t(r)], recv.count, ncclFloat, (r + n - 1) % n,
                       comms[size_t(r)], streams[size_t(r)]),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    expectResults(failures, r, comms[size_t(r)], streams[size_t(r)],
                  {{&recv, float((r + n - 1) % n + 1)}});
  }
  failures.report();
  EXPECT_FALSE(anyPassesWholeParams(comms))
      << "a communicator fell back to whole parameters (NCCL_DEBUG=WARN says why)";
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ncclCommDestroy(comms[size_t(r)]), ncclSuccess);
    cudaStreamDestroy(streams[size_t(r)]);
  }
}

}  // namespace
