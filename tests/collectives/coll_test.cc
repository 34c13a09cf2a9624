// The correctness matrix with ranks as threads of this process, over shm and over tcp
// (NCCL_SHM_DISABLE=1), on every communicator size of DESIGN.md.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "collectives/matrix.h"
#include "harness/harness.h"

using namespace tutti::test;

namespace {

constexpr size_t kFifoBytes = 8192;  // NCCL_BUFFSIZE in these tests: 1 KiB slots

struct MatrixSetup {
  int nranks;
  const char* transport;  // "shm" or "tcp"
  int minChannels;
};

void PrintTo(const MatrixSetup& s, std::ostream* os) {
  *os << s.nranks << " ranks over " << s.transport << ", " << s.minChannels << "+ channels";
}

std::string setupName(const ::testing::TestParamInfo<MatrixSetup>& info) {
  return std::string(info.param.transport) + "_" + std::to_string(info.param.nranks) + "ranks_" +
         std::to_string(info.param.minChannels) + "ch";
}

class Matrix : public ::testing::TestWithParam<MatrixSetup> {};

TEST_P(Matrix, EveryCollectiveMatchesTheOracle) {
  const MatrixSetup s = GetParam();
  ScopedEnv buff("NCCL_BUFFSIZE", std::to_string(kFifoBytes).c_str());
  ScopedEnv shm("NCCL_SHM_DISABLE", std::string(s.transport) == "tcp" ? "1" : nullptr);
  ScopedEnv ch("NCCL_MIN_NCHANNELS", std::to_string(s.minChannels).c_str());
  ScopedEnv timeout("TUTTI_TIMEOUT", "60");
  std::vector<ncclComm_t> comms = initThreads(s.nranks);
  ASSERT_EQ(comms.size(), size_t(s.nranks));
  std::vector<Case> cases = matrixCases(s.nranks, kFifoBytes);
  std::mutex mu;
  std::vector<std::string> failures;
  onThreads(s.nranks, [&](int rank) {
    std::vector<std::string> bad = runCases(comms[size_t(rank)], rank, s.nranks, cases);
    std::lock_guard<std::mutex> lock(mu);
    failures.insert(failures.end(), bad.begin(), bad.end());
  });
  destroyAll(comms);
  EXPECT_EQ(leftoverShmSegments(), 0);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  RecordProperty("cases", int(cases.size()));
}

// Every nranks value on both transports; the two-channel runs split each operation across
// channels (and their workers) even at small sizes.
INSTANTIATE_TEST_SUITE_P(Threads, Matrix,
                         ::testing::Values(MatrixSetup{1, "shm", 1}, MatrixSetup{2, "shm", 1},
                                           MatrixSetup{3, "shm", 2}, MatrixSetup{4, "shm", 1},
                                           MatrixSetup{5, "shm", 1}, MatrixSetup{8, "shm", 2},
                                           MatrixSetup{1, "tcp", 1}, MatrixSetup{2, "tcp", 2},
                                           MatrixSetup{3, "tcp", 1}, MatrixSetup{4, "tcp", 2},
                                           MatrixSetup{5, "tcp", 1}, MatrixSetup{8, "tcp", 1}),
                         setupName);

}  // namespace
