// One thread drives several communicators inside one group (the ncclCommInitAll pattern):
// the operations of all of them must progress together or the ranks would deadlock.
#include <gtest/gtest.h>

#include <vector>

#include "harness/harness.h"

using namespace tutti::test;

TEST(Groups, OneThreadDrivesFourCommunicators) {
  constexpr int n = 4;
  ScopedEnv buff("NCCL_BUFFSIZE", "8192");  // many slots per call: real back-pressure
  std::vector<ncclComm_t> comms(n);
  int devs[n] = {-1, -1, -1, -1};
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs), ncclSuccess);
  const size_t count = 5000;
  std::vector<std::vector<double>> in(n, std::vector<double>(count)), out(n);
  std::vector<std::vector<double>> ring(n, std::vector<double>(count, -1));
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) in[size_t(r)][i] = r * 1000.0 + double(i);
    out[size_t(r)].assign(count * n, -1);
  }
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(ncclAllGather(in[size_t(r)].data(), out[size_t(r)].data(), count, ncclDouble,
                            comms[size_t(r)], nullptr),
              ncclSuccess);
    // And a ring shift of point-to-point messages in the same group.
    ASSERT_EQ(
        ncclSend(in[size_t(r)].data(), count, ncclDouble, (r + 1) % n, comms[size_t(r)], nullptr),
        ncclSuccess);
    ASSERT_EQ(ncclRecv(ring[size_t(r)].data(), count, ncclDouble, (r + n - 1) % n, comms[size_t(r)],
                       nullptr),
              ncclSuccess);
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < count; i += 499) {
        ASSERT_EQ(out[size_t(r)][size_t(q) * count + i], q * 1000.0 + double(i)) << r << " " << q;
      }
    }
    for (size_t i = 0; i < count; i += 499) {
      ASSERT_EQ(ring[size_t(r)][i], ((r + n - 1) % n) * 1000.0 + double(i));
    }
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

TEST(Groups, MismatchedSendAndRecvSizesAreNamed) {
  std::vector<ncclComm_t> comms = initThreads(2);
  std::vector<char> a(100), b(50);
  std::vector<ncclResult_t> res(2);
  onThreads(2, [&](int r) {
    ncclGroupStart();
    if (r == 0) ncclSend(a.data(), 100, ncclInt8, 1, comms[0], nullptr);
    if (r == 1) ncclRecv(b.data(), 50, ncclInt8, 0, comms[1], nullptr);
    res[size_t(r)] = ncclGroupEnd();
  });
  EXPECT_EQ(res[1], ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comms[1]))
                .find("rank 0 sent a message of 100 bytes to a receive of 50 bytes"),
            std::string::npos)
      << ncclGetLastError(comms[1]);
  for (ncclComm_t c : comms) ncclCommAbort(c);
}
