// Ranks as separate processes, started by tutti-run or by hand.
#include <gtest/gtest.h>
#include <sched.h>

#include <string>
#include <vector>

#include "harness/harness.h"

using namespace tutti::test;

namespace {
std::string rankBin() { return TUTTI_TEST_RANK_BIN; }
std::string runBin() { return TUTTI_RUN_BIN; }
int countOk(const std::string& out) {
  int n = 0;
  for (size_t p = out.find("] ok\n"); p != std::string::npos; p = out.find("] ok\n", p + 1)) ++n;
  return n;
}
}  // namespace

class Processes : public ::testing::TestWithParam<int> {};

TEST_P(Processes, FormFromLauncherEnvironment) {
  int n = GetParam();
  RunResult r = runShell(runBin() + " -n " + std::to_string(n) + " " + rankBin() + " init");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(countOk(r.output), n) << r.output;
}
INSTANTIATE_TEST_SUITE_P(Ranks, Processes, ::testing::Values(1, 2, 3, 5, 8));

TEST(Processes, SplitAcrossProcesses) {
  RunResult r = runShell(runBin() + " -n 5 " + rankBin() + " split");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(countOk(r.output), 5) << r.output;
}

TEST(Processes, NcclCommIdLetsEveryRankMakeTheId) {
  // As with NCCL: with NCCL_COMM_ID set, every process calls ncclGetUniqueId itself.
  RunResult port = runShell(
      "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); "
      "print(s.getsockname()[1])'");
  ASSERT_EQ(port.exitCode, 0);
  std::string p = port.output.substr(0, port.output.find('\n'));
  RunResult r =
      runShell("NCCL_COMM_ID=127.0.0.1:" + p + " " + runBin() + " -n 4 " + rankBin() + " getid");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  EXPECT_EQ(countOk(r.output), 4) << r.output;
}

TEST(Processes, MissingProcessIsNamed) {
  // Three ranks expected, two started: both report rank 2 missing within the deadline.
  RunResult r = runShell(
      "export TUTTI_BOOTSTRAP_TIMEOUT=2 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=0 "
      "TUTTI_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); "
      "print(s.getsockname()[1])'); "
      "RANK=0 " +
      rankBin() + " init & RANK=1 " + rankBin() +
      " init; a=$?; wait $!; b=$?; "
      "echo codes $a $b");
  EXPECT_NE(r.output.find("codes 1 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("rank(s) 2 of 3 did not check in"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 20);
}

// Whether ranks share cores counts the CPUs that the ranks on a machine may use together (the
// union of their affinity masks), not each rank's own: two ranks bound to a core each (as
// mpirun or srun bind them) are not oversubscribed, so their waits spin and small all-reduces
// keep the defaults for ranks with a core each; two ranks bound to one core are.
TEST(Processes, RanksBoundToACoreEachAreNotCrowded) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c) {
    if (CPU_ISSET(c, &all)) cpus.push_back(c);
  }
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  for (bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "both ranks on one CPU" : "a CPU each");
    const std::string second = std::to_string(shared ? cpus[0] : cpus[1]);
    RunResult r =
        runShell("NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT " + runBin() +
                 " -n 2 sh -c 'if [ \"$LOCAL_RANK\" = 0 ]; then c=" + std::to_string(cpus[0]) +
                 "; else c=" + second + "; fi; exec taskset -c $c " + rankBin() + " init'");
    ASSERT_EQ(r.exitCode, 0) << r.output;
    int lines = 0, crowded = 0, spinning = 0;
    for (size_t p = r.output.find("CPU engine"); p != std::string::npos;
         p = r.output.find("CPU engine", p + 1)) {
      const std::string line = r.output.substr(p, r.output.find('\n', p) - p);
      ++lines;
      crowded += line.find("more ranks than CPUs") != std::string::npos;
      spinning += line.find("waits spin up to 1000000 ns") != std::string::npos;
    }
    EXPECT_EQ(lines, 2) << r.output;
    EXPECT_EQ(crowded, shared ? 2 : 0) << r.output;
    EXPECT_EQ(spinning, shared ? 0 : 2) << r.output;
  }
}

TEST(Processes, HelloDemoRuns) {
  RunResult r = runShell("NCCL_DEBUG=INFO " + runBin() + " -n 4 " + TUTTI_HELLO_BIN);
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int k = 0; k < 4; ++k) {
    EXPECT_NE(r.output.find("[rank " + std::to_string(k) + "] rank " + std::to_string(k) +
                            " of 4 joined"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("rank " + std::to_string(k) + ": AllReduce(sum of ranks) = 6,"),
              std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find("NCCL INFO NCCL version 2.27.7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("Init COMPLETE"), std::string::npos) << r.output;
}

// The correctness matrix with every rank a process: shm between processes maps segments
// across address spaces, tcp crosses process boundaries through each side's proxy thread.
struct ProcessMatrixSetup {
  int nranks;
  const char* transport;
};
void PrintTo(const ProcessMatrixSetup& s, std::ostream* os) {
  *os << s.nranks << " processes over " << s.transport;
}
class ProcessMatrix : public ::testing::TestWithParam<ProcessMatrixSetup> {};

TEST_P(ProcessMatrix, EveryCollectiveMatchesTheOracle) {
  const ProcessMatrixSetup s = GetParam();
  std::string env =
      std::string("NCCL_BUFFSIZE=8192 TUTTI_TIMEOUT=60 NCCL_SHM_DISABLE=") +
      (std::string(s.transport) == "tcp" ? "1" : "0") +
      // 3 processes: two channels, and shm single copy (process_vm_readv) for
      // every slot of 256 bytes or more instead of only for big ones -- except from rank 1,
      // whose minimum is 1 MiB: each receiver goes by its sender's minimum, not its own.
      (s.nranks == 3 ? " NCCL_MIN_NCHANNELS=2 TUTTI_SHM_SINGLE_COPY=1 TUTTI_SHM_SINGLE_COPY_MIN=256"
                     : "") +
      // 4 processes: two channels, and every broadcast and all-gather through the shared
      // area, in 4 KiB slots (4 of them, so that every call from 16 KiB wraps the area).
      (s.nranks == 4 ? " NCCL_MIN_NCHANNELS=2 TUTTI_AREA_BROADCAST_MIN_BYTES=1"
                       " TUTTI_AREA_ALLGATHER_MIN_BYTES=1 TUTTI_SHM_AREA_CHUNK=4096"
                       " TUTTI_SHM_AREA_SLOTS=4"
                     : "") +
      // 8 processes: adaptive single copy told that every slot copy is slow, so that each
      // connection moves from slots to addresses mid-run (from 256 bytes up); broadcasts of
      // 4 KiB or more by state: the ring chain until the root's verdict, flat after it (the
      // root's buffer read by every receiver, between processes) -- not through the shared
      // area, which 8 crowded ranks take by default.
      // 2 processes: all-gathers and broadcasts by address (process_vm_readv) from 256 bytes,
      // in chunks bigger than the 8 KiB slots -- from rank 0 only: rank 1 turns single copy
      // off for its sends, and must still take rank 0's. All-reduces above 2 KiB (recursive
      // doubling's limit) with both calls out of place by exchange (rank 0's input by address,
      // rank 1's through the slots).
      (s.nranks == 2 && std::string(s.transport) == "shm"
           ? " TUTTI_SHM_SINGLE_COPY_MIN=256 TUTTI_EXCHANGE=1 TUTTI_EXCHANGE_MIN_BYTES=1024"
           : "") +
      (s.nranks == 8 && std::string(s.transport) == "shm"
           ? " TUTTI_SHM_SLOW_GBPS=1000000 TUTTI_SHM_SINGLE_COPY_MIN=256"
             " TUTTI_STATE_BROADCAST_MIN_BYTES=4096 TUTTI_AREA_BROADCAST_MIN_BYTES=0"
           : "") +
      // 2 and 8 processes: every copy of a rank's own block into the output of 64 bytes or
      // more with streaming stores (cpu::simd::copyBig), which the matrix's sizes would
      // otherwise never reach (shm's pieces between processes go through the kernel); 3, 4
      // and 5 keep the default (memcpy).
      (s.nranks == 2 || s.nranks == 8 ? " TUTTI_STREAM_COPY_MIN=64" : "");
  const bool shm2 = s.nranks == 2 && std::string(s.transport) == "shm";
  const std::string rank =
      s.nranks == 3 ? "sh -c '[ $RANK = 1 ] && export TUTTI_SHM_SINGLE_COPY_MIN=1048576; exec " +
                          rankBin() + " coll'"
      : shm2
          ? "sh -c '[ $RANK = 1 ] && export TUTTI_SHM_SINGLE_COPY=0; exec " + rankBin() + " coll'"
          : rankBin() + " coll";
  RunResult r = runShell(env + " " + runBin() + " -n " + std::to_string(s.nranks) + " " + rank);
  EXPECT_EQ(r.exitCode, 0) << r.output;
  int passed = 0;
  for (size_t p = r.output.find("matrix: "); p != std::string::npos;
       p = r.output.find("matrix: ", p + 1)) {
    ++passed;
  }
  EXPECT_EQ(passed, s.nranks) << r.output;
}
INSTANTIATE_TEST_SUITE_P(
    Processes, ProcessMatrix,
    ::testing::Values(ProcessMatrixSetup{2, "tcp"}, ProcessMatrixSetup{2, "shm"},
                      ProcessMatrixSetup{3, "shm"}, ProcessMatrixSetup{4, "shm"},
                      ProcessMatrixSetup{5, "tcp"}, ProcessMatrixSetup{8, "shm"}),
    [](const ::testing::TestParamInfo<ProcessMatrixSetup>& i) {
      return std::string(i.param.transport) + "_" + std::to_string(i.param.nranks) + "procs";
    });
