// The binary interface facts of nccl.h: values and layouts that compiled programs depend on.
#include <gtest/gtest.h>

#include <cstddef>
#include <set>
#include <string>

#include "nccl.h"
#include "tutti.h"

TEST(Abi, VersionMacrosAndCall) {
  EXPECT_EQ(NCCL_VERSION_CODE, 22707);
  EXPECT_EQ(NCCL_VERSION(2, 27, 7), 22707);
  EXPECT_EQ(NCCL_VERSION(2, 8, 4), 2804);  // old formula below 2.9
  EXPECT_EQ(NCCL_VERSION(2, 28, 9), 22809);
  EXPECT_EQ(NCCL_VERSION(3, 0, 1), 30001);
  int v = 0;
  ASSERT_EQ(ncclGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, NCCL_VERSION_CODE);
  ASSERT_EQ(tuttiGetVersion(&v), ncclSuccess);
  EXPECT_EQ(v, TUTTI_VERSION_MAJOR * 10000 + TUTTI_VERSION_MINOR * 100 + TUTTI_VERSION_PATCH);
}

TEST(Abi, EnumValues) {
  EXPECT_EQ(ncclSuccess, 0);
  EXPECT_EQ(ncclUnhandledCudaError, 1);
  EXPECT_EQ(ncclSystemError, 2);
  EXPECT_EQ(ncclInternalError, 3);
  EXPECT_EQ(ncclInvalidArgument, 4);
  EXPECT_EQ(ncclInvalidUsage, 5);
  EXPECT_EQ(ncclRemoteError, 6);
  EXPECT_EQ(ncclInProgress, 7);
  EXPECT_EQ(ncclTimeout, 8);
  EXPECT_EQ(ncclNumResults, 9);
  EXPECT_EQ(ncclAvg, 4);
  EXPECT_EQ(ncclNumOps, 5);
  EXPECT_EQ(ncclMaxRedOp, 0x7fffffff);
  EXPECT_EQ(ncclChar, ncclInt8);
  EXPECT_EQ(ncclUint32, 3);
  EXPECT_EQ(ncclHalf, 6);
  EXPECT_EQ(ncclDouble, 8);
  EXPECT_EQ(ncclBfloat16, 9);
  EXPECT_EQ(ncclFloat8e4m3, 10);
  EXPECT_EQ(ncclFloat8e5m2, 11);
  EXPECT_EQ(ncclNumTypes, 12);
  EXPECT_EQ(ncclScalarHostImmediate, 1);
  EXPECT_EQ(NCCL_SPLIT_NOCOLOR, -1);
  EXPECT_EQ(NCCL_CONFIG_UNDEF_INT, INT_MIN);
  EXPECT_EQ(sizeof(ncclUniqueId), 128u);
}

TEST(Abi, ConfigLayoutIsAppendOnly) {
  // x86-64 / aarch64 LP64 offsets, fixed by the published field order.
  EXPECT_EQ(offsetof(ncclConfig_t, size), 0u);
  EXPECT_EQ(offsetof(ncclConfig_t, magic), 8u);
  EXPECT_EQ(offsetof(ncclConfig_t, version), 12u);
  EXPECT_EQ(offsetof(ncclConfig_t, blocking), 16u);
  EXPECT_EQ(offsetof(ncclConfig_t, netName), 32u);
  EXPECT_EQ(offsetof(ncclConfig_t, splitShare), 40u);
  EXPECT_EQ(offsetof(ncclConfig_t, trafficClass), 44u);
  EXPECT_EQ(offsetof(ncclConfig_t, commName), 48u);
  EXPECT_EQ(offsetof(ncclConfig_t, collnetEnable), 56u);
  EXPECT_EQ(offsetof(ncclConfig_t, nvlsCTAs), 68u);
  EXPECT_EQ(offsetof(ncclConfig_t, nChannelsPerNetPeer), 72u);
  EXPECT_EQ(offsetof(ncclConfig_t, graphUsageMode), 80u);
  EXPECT_EQ(offsetof(ncclConfig_t, maxP2pPeers), 88u);
  EXPECT_EQ(offsetof(ncclConfig_t, graphStreamOrdering), 92u);
  EXPECT_EQ(sizeof(ncclConfig_t), 96u);

  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  EXPECT_EQ(c.size, sizeof(ncclConfig_t));
  EXPECT_EQ(c.magic, 0xcafebeefu);
  EXPECT_EQ(c.version, static_cast<unsigned>(NCCL_VERSION_CODE));
  EXPECT_EQ(c.blocking, NCCL_CONFIG_UNDEF_INT);
  EXPECT_EQ(c.netName, nullptr);
  EXPECT_EQ(c.commName, nullptr);
  EXPECT_EQ(c.graphStreamOrdering, NCCL_CONFIG_UNDEF_INT);

  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  EXPECT_EQ(sim.magic, 0x74685283u);
  EXPECT_EQ(sizeof(ncclSimInfo_t), 24u);
}

TEST(Abi, ErrorStringsAreDistinct) {
  std::set<std::string> seen;
  for (int r = 0; r < ncclNumResults; ++r) {
    const char* s = ncclGetErrorString(static_cast<ncclResult_t>(r));
    ASSERT_NE(s, nullptr);
    EXPECT_TRUE(seen.insert(s).second) << "duplicate text for result " << r;
  }
  EXPECT_STREQ(ncclGetErrorString(static_cast<ncclResult_t>(99)), "unknown result code");
}
