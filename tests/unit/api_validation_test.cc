// Every exported function rejects bad input with the right code and a message that
// ncclGetLastError returns; nothing crashes and nothing hangs.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>

#include "harness/harness.h"
#include "nccl.h"
#include "tutti.h"

// NCCL 2.28's device-API host calls (nccl_device/*.h; their types are NCCL's own).
extern "C" ncclResult_t ncclDevCommCreate(ncclComm_t, const void*, void*);
extern "C" ncclResult_t ncclDevCommDestroy(ncclComm_t, const void*);

namespace {

class ApiValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    ncclUniqueId id = tutti::test::makeId();
    ASSERT_EQ(ncclCommInitRank(&comm_, 1, id, 0), ncclSuccess) << ncclGetLastError(nullptr);
  }
  void TearDown() override {
    if (comm_) EXPECT_EQ(ncclCommDestroy(comm_), ncclSuccess);
  }
  // Asserts the code and that the last error mentions `needle`.
  void expectError(ncclResult_t got, ncclResult_t want, const std::string& needle) {
    EXPECT_EQ(got, want) << ncclGetLastError(nullptr);
    std::string msg = ncclGetLastError(nullptr);
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg;
  }
  ncclComm_t comm_ = nullptr;
  float buf_[16] = {};
};

TEST_F(ApiValidation, NullOutputPointers) {
  ncclUniqueId id{};
  expectError(ncclGetVersion(nullptr), ncclInvalidArgument, "version is NULL");
  expectError(ncclGetUniqueId(nullptr), ncclInvalidArgument, "uniqueId is NULL");
  expectError(ncclCommInitRank(nullptr, 1, id, 0), ncclInvalidArgument, "output pointer");
  expectError(ncclCommInitAll(nullptr, 1, nullptr), ncclInvalidArgument, "comms is NULL");
  expectError(ncclCommCount(comm_, nullptr), ncclInvalidArgument, "count is NULL");
  expectError(ncclCommUserRank(comm_, nullptr), ncclInvalidArgument, "rank is NULL");
  expectError(ncclCommCuDevice(comm_, nullptr), ncclInvalidArgument, "device is NULL");
  expectError(ncclCommGetAsyncError(comm_, nullptr), ncclInvalidArgument, "asyncError is NULL");
  expectError(ncclCommSplit(comm_, 0, 0, nullptr, nullptr), ncclInvalidArgument, "newcomm");
  expectError(ncclMemAlloc(nullptr, 8), ncclInvalidArgument, "ptr is NULL");
  expectError(ncclCommInitRankScalable(nullptr, 1, 0, 1, nullptr, nullptr), ncclInvalidArgument,
              "commIds is NULL");
  expectError(tuttiCommInitFromEnv(nullptr), ncclInvalidArgument, "NULL");
}

TEST_F(ApiValidation, NullCommHandles) {
  int x;
  ncclResult_t e;
  ncclComm_t out;
  expectError(ncclCommCount(nullptr, &x), ncclInvalidArgument, "comm is NULL");
  expectError(ncclCommUserRank(nullptr, &x), ncclInvalidArgument, "comm is NULL");
  expectError(ncclCommCuDevice(nullptr, &x), ncclInvalidArgument, "comm is NULL");
  expectError(ncclCommGetAsyncError(nullptr, &e), ncclInvalidArgument, "comm is NULL");
  expectError(ncclCommFinalize(nullptr), ncclInvalidArgument, "comm is NULL");
  expectError(ncclCommSplit(nullptr, 0, 0, &out, nullptr), ncclInvalidArgument, "comm is NULL");
  expectError(ncclAllReduce(buf_, buf_, 1, ncclFloat, ncclSum, nullptr, nullptr),
              ncclInvalidArgument, "comm is NULL");
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
}

TEST_F(ApiValidation, RankAndSizeOutOfRange) {
  ncclUniqueId id = tutti::test::makeId();
  ncclComm_t c = nullptr;
  expectError(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument, "nranks is 0");
  expectError(ncclCommInitRank(&c, -3, id, 0), ncclInvalidArgument, "nranks is -3");
  expectError(ncclCommInitRank(&c, 4, id, 4), ncclInvalidArgument, "rank 4 is out of range");
  expectError(ncclCommInitRank(&c, 4, id, -1), ncclInvalidArgument, "rank -1 is out of range");
  EXPECT_EQ(c, nullptr);
  expectError(ncclCommInitAll(&c, 0, nullptr), ncclInvalidArgument, "ndev is 0");
  int badDev[1] = {1000};
  expectError(ncclCommInitAll(&c, 1, badDev), ncclInvalidArgument, "devlist[0] is 1000");
  expectError(ncclCommInitRankScalable(&c, 2, 0, 0, &id, nullptr), ncclInvalidArgument, "nId");
}

TEST_F(ApiValidation, ForeignUniqueIdIsRejected) {
  ncclUniqueId junk;
  memset(junk.internal, 0xab, sizeof(junk.internal));
  ncclComm_t c = nullptr;
  expectError(ncclCommInitRank(&c, 2, junk, 0), ncclInvalidArgument, "ncclGetUniqueId");
}

TEST_F(ApiValidation, BadConfig) {
  ncclUniqueId id = tutti::test::makeId();
  ncclComm_t c = nullptr;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.magic = 0;
  expectError(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument, "magic");
  ncclConfig_t tiny = NCCL_CONFIG_INITIALIZER;
  tiny.size = 1;
  expectError(ncclCommInitRankConfig(&c, 1, id, 0, &tiny), ncclInvalidArgument, "size");
  ncclConfig_t split = NCCL_CONFIG_INITIALIZER;
  split.magic = 7;
  ncclComm_t sub = nullptr;
  expectError(ncclCommSplit(comm_, 0, 0, &sub, &split), ncclInvalidArgument, "magic");
  expectError(ncclCommSplit(comm_, -5, 0, &sub, nullptr), ncclInvalidArgument, "color is -5");
}

TEST_F(ApiValidation, DestroyedAndAbortedCommsAreRefused) {
  ncclUniqueId id = tutti::test::makeId();
  ncclComm_t c = nullptr;
  ASSERT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
  int x;
  expectError(ncclCommCount(c, &x), ncclInvalidArgument, "not a live communicator");
  expectError(ncclAllReduce(buf_, buf_, 1, ncclFloat, ncclSum, c, nullptr), ncclInvalidArgument,
              "not a live communicator");
  expectError(ncclCommDestroy(c), ncclInvalidArgument, "not a live communicator");

  id = tutti::test::makeId();
  ASSERT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommAbort(c), ncclSuccess);
  expectError(ncclCommUserRank(c, &x), ncclInvalidArgument, "not a live communicator");
  expectError(ncclCommAbort(c), ncclInvalidArgument, "not a live communicator");
}

TEST_F(ApiValidation, FinalizedCommAllowsOnlyDestroy) {
  ASSERT_EQ(ncclCommFinalize(comm_), ncclSuccess);
  int x;
  expectError(ncclCommCount(comm_, &x), ncclInvalidUsage, "finalized");
  expectError(ncclAllReduce(buf_, buf_, 1, ncclFloat, ncclSum, comm_, nullptr), ncclInvalidUsage,
              "finalized");
  expectError(ncclCommFinalize(comm_), ncclInvalidUsage, "finalized");
}

TEST_F(ApiValidation, CollectiveArguments) {
  auto* c = comm_;
  expectError(ncclAllReduce(buf_, buf_, 4, static_cast<ncclDataType_t>(12), ncclSum, c, nullptr),
              ncclInvalidArgument, "datatype 12");
  expectError(ncclAllReduce(buf_, buf_, 4, static_cast<ncclDataType_t>(-1), ncclSum, c, nullptr),
              ncclInvalidArgument, "datatype -1");
  expectError(ncclAllReduce(buf_, buf_, 4, ncclFloat, static_cast<ncclRedOp_t>(5), c, nullptr),
              ncclInvalidArgument, "reduction op 5");
  expectError(ncclReduce(buf_, buf_, 4, ncclFloat, static_cast<ncclRedOp_t>(-2), 0, c, nullptr),
              ncclInvalidArgument, "reduction op -2");
  expectError(ncclAllReduce(buf_, buf_, SIZE_MAX / 2, ncclFloat, ncclSum, c, nullptr),
              ncclInvalidArgument, "overflows");
  expectError(ncclAllGather(buf_, buf_, SIZE_MAX / 4, ncclDouble, c, nullptr), ncclInvalidArgument,
              "overflows");
  expectError(ncclBroadcast(buf_, buf_, 4, ncclFloat, 1, c, nullptr), ncclInvalidArgument,
              "root 1 is out of range");
  expectError(ncclBcast(buf_, 4, ncclFloat, -1, c, nullptr), ncclInvalidArgument,
              "root -1 is out of range");
  expectError(ncclReduce(buf_, buf_, 4, ncclFloat, ncclSum, 3, c, nullptr), ncclInvalidArgument,
              "root 3");
  expectError(ncclGather(buf_, buf_, 4, ncclFloat, 2, c, nullptr), ncclInvalidArgument, "root 2");
  expectError(ncclScatter(buf_, buf_, 4, ncclFloat, 2, c, nullptr), ncclInvalidArgument, "root 2");
  expectError(ncclSend(buf_, 4, ncclFloat, 1, c, nullptr), ncclInvalidArgument, "peer 1");
  expectError(ncclRecv(buf_, 4, ncclFloat, -1, c, nullptr), ncclInvalidArgument, "peer -1");
  expectError(ncclAllReduce(nullptr, buf_, 4, ncclFloat, ncclSum, c, nullptr), ncclInvalidArgument,
              "sendbuff is NULL");
  expectError(ncclReduceScatter(buf_, nullptr, 4, ncclFloat, ncclSum, c, nullptr),
              ncclInvalidArgument, "recvbuff is NULL");
  expectError(ncclAlltoAll(nullptr, buf_, 4, ncclFloat, c, nullptr), ncclInvalidArgument,
              "sendbuff is NULL");
  // Well-formed calls run (this is a one-rank communicator).
  EXPECT_EQ(ncclAllReduce(buf_, buf_, 4, ncclFloat, ncclSum, c, nullptr), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, c, nullptr), ncclSuccess);
  // Count 0 moves nothing and touches nothing: not even a PreMulSum scalar behind a pointer
  // that is not host memory (it once reached the CPU engine, which read it).
  ncclRedOp_t pre;
  float* nowhere = reinterpret_cast<float*>(uintptr_t(8));
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&pre, nowhere, ncclFloat, ncclScalarDevice, c), ncclSuccess)
      << ncclGetLastError(c);
  EXPECT_EQ(ncclAllReduce(buf_, buf_, 0, ncclFloat, pre, c, nullptr), ncclSuccess)
      << ncclGetLastError(c);
  EXPECT_EQ(ncclRedOpDestroy(pre, c), ncclSuccess);
}

TEST_F(ApiValidation, UserReductionOps) {
  auto* c = comm_;
  float two = 2;
  ncclRedOp_t op;
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &two, ncclFloat, ncclScalarHostImmediate, c),
            ncclSuccess);
  EXPECT_GE(static_cast<int>(op), static_cast<int>(ncclNumOps));
  expectError(ncclAllReduce(buf_, buf_, 1, ncclDouble, op, c, nullptr), ncclInvalidArgument,
              "was made for float, not double");
  ASSERT_EQ(ncclRedOpDestroy(op, c), ncclSuccess);
  expectError(ncclRedOpDestroy(op, c), ncclInvalidArgument, "not a live op");
  expectError(ncclAllReduce(buf_, buf_, 1, ncclFloat, op, c, nullptr), ncclInvalidArgument,
              "is not a valid ncclRedOp_t");
}

TEST_F(ApiValidation, FunctionsOfLaterLayers) {
  ncclComm_t out = nullptr;
  void* handle = nullptr;
  ncclWindow_t win = nullptr;
  ncclRedOp_t op;
  float scalar = 2;
  uint64_t stat;
  ncclUniqueId id;
  expectError(ncclCommShrink(comm_, nullptr, 0, &out, nullptr, 0), ncclInvalidUsage,
              "not implemented yet");
  expectError(ncclCommShrink(comm_, nullptr, 2, &out, nullptr, 0), ncclInvalidArgument,
              "excludeRanks");
  expectError(ncclCommRevoke(comm_, 0), ncclInvalidUsage, "not implemented yet");
  expectError(ncclCommGetUniqueId(comm_, &id), ncclInvalidUsage, "not implemented yet");
  expectError(ncclCommGetUniqueId(comm_, nullptr), ncclInvalidArgument, "uniqueId is NULL");
  expectError(ncclCommGrow(comm_, 2, nullptr, 0, &out, nullptr), ncclInvalidUsage,
              "not implemented yet");
  expectError(ncclCommSuspend(comm_, 0), ncclInvalidUsage, "not implemented yet");
  expectError(ncclCommResume(nullptr), ncclInvalidArgument, "comm is NULL");
  expectError(ncclCommMemStats(comm_, 0, nullptr), ncclInvalidArgument, "value is NULL");
  expectError(ncclCommMemStats(comm_, 0, &stat), ncclInvalidUsage, "not implemented yet");
  expectError(ncclCommRegister(comm_, buf_, sizeof(buf_), nullptr), ncclInvalidArgument,
              "handle is NULL");
  handle = &stat;
  EXPECT_EQ(ncclCommRegister(comm_, buf_, sizeof(buf_), &handle), ncclSuccess);
  EXPECT_EQ(handle, nullptr);  // registration is accepted and ignored, as NCCL without it
  expectError(ncclCommRegister(comm_, nullptr, 8, &handle), ncclInvalidArgument, "buff is NULL");
  expectError(ncclCommRegister(nullptr, buf_, sizeof(buf_), &handle), ncclInvalidArgument,
              "comm is NULL");
  EXPECT_EQ(ncclCommDeregister(comm_, handle), ncclSuccess);
  expectError(ncclCommDeregister(comm_, &stat), ncclInvalidArgument, "not one ncclCommRegister");
  expectError(ncclCommDeregister(nullptr, handle), ncclInvalidArgument, "comm is NULL");
  expectError(ncclCommWindowRegister(comm_, buf_, sizeof(buf_), nullptr, 0), ncclInvalidArgument,
              "win is NULL");
  expectError(ncclCommWindowRegister(comm_, buf_, sizeof(buf_), &win, 0), ncclInvalidUsage,
              "not implemented yet");
  expectError(ncclCommWindowDeregister(comm_, win), ncclInvalidUsage, "not implemented yet");
  expectError(ncclRedOpCreatePreMulSum(nullptr, &scalar, ncclFloat, ncclScalarHostImmediate, comm_),
              ncclInvalidArgument, "op is NULL");
  expectError(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat, ncclScalarHostImmediate, comm_),
              ncclInvalidArgument, "scalar is NULL");
  expectError(ncclRedOpCreatePreMulSum(&op, &scalar, static_cast<ncclDataType_t>(40),
                                       ncclScalarHostImmediate, comm_),
              ncclInvalidArgument, "datatype 40");
  expectError(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat,
                                       static_cast<ncclScalarResidence_t>(9), comm_),
              ncclInvalidArgument, "residence 9");
  expectError(ncclRedOpDestroy(ncclSum, comm_), ncclInvalidArgument, "built-in");
  char devComm[64];
  expectError(ncclDevCommCreate(comm_, nullptr, devComm), ncclInvalidUsage, "device API");
  expectError(ncclDevCommCreate(comm_, nullptr, nullptr), ncclInvalidArgument, "outDevComm");
  expectError(ncclDevCommDestroy(comm_, devComm), ncclInvalidUsage, "device API");
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  expectError(ncclGroupSimulateEnd(nullptr), ncclInvalidArgument, "simInfo is NULL");
  sim.magic = 1;
  expectError(ncclGroupSimulateEnd(&sim), ncclInvalidArgument, "magic");
}

TEST_F(ApiValidation, GroupsNestAndMismatchedEndIsRefused) {
  expectError(ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart");
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
  expectError(ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart");
}

// NCCL's rule: a call refused inside a group fails the group; ncclGroupEnd runs none of it and
// returns that error. The next group runs.
TEST_F(ApiValidation, ARefusedCallFailsItsWholeGroup) {
  float recv[4];
  for (int i = 0; i < 4; ++i) buf_[i] = 1.5f + i;
  std::fill(recv, recv + 4, -7.0f);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buf_, recv, 4, ncclFloat, ncclSum, comm_, nullptr), ncclSuccess);
  expectError(
      ncclAllReduce(buf_, recv, 4, static_cast<ncclDataType_t>(99), ncclSum, comm_, nullptr),
      ncclInvalidArgument, "rank 0 of 1: datatype 99");
  expectError(ncclGroupEnd(), ncclInvalidArgument, "none of them ran");
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("datatype 99"), std::string::npos);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(recv[i], -7.0f) << i;  // the good call did not run
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buf_, recv, 4, ncclFloat, ncclSum, comm_, nullptr), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(recv[i], buf_[i]) << i;
  // A refused call outside a group leaves the next group alone.
  expectError(ncclBroadcast(buf_, recv, 4, ncclFloat, 3, comm_, nullptr), ncclInvalidArgument,
              "root 3");
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
}

// ncclGroupSimulateEnd is not implemented, but it closes the group like NCCL's: the queued
// operations are dropped, and later calls run at once instead of joining a group never ended.
TEST_F(ApiValidation, GroupSimulateEndClosesTheGroup) {
  float recv[4];
  std::fill(recv, recv + 4, -7.0f);
  buf_[0] = 3.0f;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  EXPECT_EQ(ncclAllReduce(buf_, recv, 1, ncclFloat, ncclSum, comm_, nullptr), ncclSuccess);
  expectError(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, "none ran");
  EXPECT_EQ(recv[0], -7.0f);
  expectError(ncclGroupEnd(), ncclInvalidUsage, "without a matching ncclGroupStart");
  EXPECT_EQ(ncclAllReduce(buf_, recv, 1, ncclFloat, ncclSum, comm_, nullptr), ncclSuccess);
  EXPECT_EQ(recv[0], 3.0f);  // ran at the call: no group is open
}

TEST_F(ApiValidation, MemAllocAndFree) {
  void* p = nullptr;
  p = buf_;
  EXPECT_EQ(ncclMemAlloc(&p, 0), ncclSuccess);  // as cudaMalloc of 0 bytes: NULL
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(ncclMemAlloc(&p, 1 << 20), ncclSuccess) << ncclGetLastError(nullptr);
  ASSERT_NE(p, nullptr);
  int dev = -2;
  ASSERT_EQ(ncclCommCuDevice(comm_, &dev), ncclSuccess);
  if (dev < 0) memset(p, 1, 1 << 20);  // host memory where there is no GPU: usable as such
  EXPECT_EQ(ncclMemFree(p), ncclSuccess);
  expectError(ncclMemFree(buf_), ncclInvalidArgument, "not allocated by ncclMemAlloc");
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
}

TEST_F(ApiValidation, InitFromEnvWithoutLauncher) {
  tutti::test::ScopedEnv a("RANK", nullptr), b("OMPI_COMM_WORLD_RANK", nullptr),
      c("PMI_RANK", nullptr), d("SLURM_PROCID", nullptr);
  ncclComm_t out = nullptr;
  expectError(tuttiCommInitFromEnv(&out), ncclInvalidUsage, "no launcher environment");
  EXPECT_EQ(out, nullptr);
}

}  // namespace
