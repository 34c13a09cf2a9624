// tutti-train the program, under real launchers (tutti-run, Open MPI's mpirun) and as threads
// (--threads): what its users see, end to end.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <string>
#include <vector>

#include "examples/trainer/blas_core.h"
#include "examples/trainer/checkpoint.h"
#include "harness/harness.h"
#include "trainer/trainer_support.h"

namespace trainer {
namespace {

// Rank 0's per-epoch lines of a run of `epochs` epochs: train loss and test accuracy.
struct EpochLine {
  double trainLoss, testAcc;
};
std::vector<EpochLine> epochLines(const std::string& out, int epochs) {
  const std::regex line("epoch (\\d)/" + std::to_string(epochs) +
                        R"( .* train loss ([0-9.]+) .* test loss [0-9.]+ acc ([0-9.]+)%)");
  std::vector<EpochLine> lines;
  for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it)
    lines.push_back({std::stod((*it)[2]), std::stod((*it)[3])});
  return lines;
}

// The real program under real launchers: tutti-run, and Open MPI's mpirun where it is installed
// (scripts/test installs it), which on one host needs no rendezvous address.
TEST(TrainerProcesses, LearnsUnderTuttiRunAndMpirun) {
  const std::string args = " --epochs 2 --train-limit 8000 --test-limit 2000";
  std::vector<std::string> cmds = {std::string(TUTTI_RUN_BIN) + " -n 2 " + TUTTI_TRAIN_BIN + args};
  if (tutti::test::runShell("command -v mpirun").exitCode == 0) {
    cmds.push_back(
        "env -u NCCL_COMM_ID -u MASTER_ADDR -u TUTTI_PORT mpirun --allow-run-as-root "
        "--oversubscribe -np 3 " +
        std::string(TUTTI_TRAIN_BIN) + args + " --batch 96");
  } else {
    printf("no mpirun here: tutti-run alone\n");
  }
  for (const std::string& cmd : cmds) {
    const tutti::test::RunResult r = tutti::test::runShell(cmd);
    const std::string& out = r.output;
    ASSERT_EQ(r.exitCode, 0) << cmd << "\n" << out;
    const bool mpi = cmd.find("mpirun") != std::string::npos;
    EXPECT_NE(out.find(mpi ? "3 CPU ranks" : "2 CPU ranks"), std::string::npos) << cmd << "\n"
                                                                                << out;
    const std::vector<EpochLine> e = epochLines(out, 2);
    ASSERT_EQ(e.size(), 2u) << "only rank 0 reports, once an epoch\n" << cmd << "\n" << out;
    EXPECT_LT(e[1].trainLoss, e[0].trainLoss) << cmd << "\n" << out;
    EXPECT_GT(e[1].testAcc, 70.0) << cmd << "\n" << out;  // chance is 10%
    if (!mpi) {
      EXPECT_NE(out.find("[rank 0] epoch 2/2"), std::string::npos) << out;
    }
  }
}

// The README's main command (./scripts/demo): 4 processes, 3 epochs of the whole set, the
// default options. The issue's bar for it is 85% test accuracy after the third epoch; the
// loss falls every epoch.
TEST(TrainerProcesses, TheReadmesMainRunPasses85PercentInThreeEpochs) {
  const std::string cmd = std::string(TUTTI_RUN_BIN) + " -n 4 " + TUTTI_TRAIN_BIN + " --epochs 3";
  const tutti::test::RunResult r = tutti::test::runShell(cmd);
  ASSERT_EQ(r.exitCode, 0) << cmd << "\n" << r.output;
  const std::vector<EpochLine> e = epochLines(r.output, 3);
  ASSERT_EQ(e.size(), 3u) << r.output;
  EXPECT_LT(e[1].trainLoss, e[0].trainLoss) << r.output;
  EXPECT_LT(e[2].trainLoss, e[1].trainLoss) << r.output;
  EXPECT_GE(e[2].testAcc, 85.0) << r.output;
}

// A job that tutti-run starts again after a rank failed (--max-restarts, as torchrun's) picks
// up its last checkpoint with --auto-resume and ends where an uninterrupted run does, bit for bit
// (tests/launch/torchrun.sh does the same under a real torchrun).
TEST(TrainerProcesses, ARestartedJobEndsWhereAnUninterruptedOneDoes) {
  const std::string dir = ::testing::TempDir();
  const std::string straight = dir + "/tutti_ck_restart_straight",
                    restarted = dir + "/tutti_ck_restarted";
  std::remove(restarted.c_str());
  const std::string args =
      " --epochs 2 --batch 64 --train-limit 2000 --test-limit 500 --save-every 5";
  const tutti::test::RunResult a = tutti::test::runShell(
      std::string(TUTTI_RUN_BIN) + " -n 2 " + TUTTI_TRAIN_BIN + args + " --checkpoint " + straight);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  const tutti::test::RunResult b = tutti::test::runShell(
      "TUTTI_TRAINER_FAIL_AT=1:12 " + std::string(TUTTI_RUN_BIN) + " -n 2 --max-restarts 1 " +
      TUTTI_TRAIN_BIN + args + " --checkpoint " + restarted + " --auto-resume");
  ASSERT_EQ(b.exitCode, 0) << b.output;
  for (const std::string& want :
       {"no checkpoint at " + restarted + " yet: starting afresh",
        std::string("rank 1: failed at step 12 as TUTTI_TRAINER_FAIL_AT asked"),
        std::string("starting all 2 rank(s) again (restart 1 of 1)"),
        "resumed from " + restarted + " at step 10", std::string("[rank 0] epoch 2/2")}) {
    EXPECT_NE(b.output.find(want), std::string::npos) << want << "\n" << b.output;
  }
  Checkpoint ka, kb;
  std::string err;
  ASSERT_TRUE(loadCheckpoint(straight, &ka, &err)) << err;
  ASSERT_TRUE(loadCheckpoint(restarted, &kb, &err)) << err;
  EXPECT_EQ(kb.step, ka.step);
  EXPECT_EQ(kb.params, ka.params);
  EXPECT_EQ(kb.momentum, ka.momentum);
  std::remove(straight.c_str());
  std::remove(restarted.c_str());
}

// An error every rank makes alike is printed once, not once per rank: by the one process of
// --threads, and by rank 0 alone of tutti-run's processes.
TEST(TrainerProcesses, AnErrorEveryRankMakesIsPrintedOnce) {
  const std::string args = " --batch 64 --max-steps 1 --train-limit 256 --test-limit 64";
  for (const std::string& cmd : {std::string(TUTTI_TRAIN_BIN) + " --threads 3" + args,
                                 std::string(TUTTI_RUN_BIN) + " -n 3 " + TUTTI_TRAIN_BIN + args}) {
    const tutti::test::RunResult r = tutti::test::runShell(cmd);
    const std::string& out = r.output;
    EXPECT_NE(r.exitCode, 0) << cmd << "\n" << out;
    EXPECT_EQ(tutti::test::timesIn(out, "is not divisible by 3 ranks"), 1u) << cmd << "\n" << out;
  }
}

// A rank process runs the widest BLAS kernels its CPU has, also where OpenBLAS does not know the
// CPU (Debian 12's OpenBLAS takes a 5th-generation Xeon, family 6 model 207, for a Prescott, 3x
// slower: tutti-train runs itself again with OPENBLAS_CORETYPE set), under tutti-run too; a
// core the user sets is kept.
TEST(TrainerProcesses, RanksRunTheWidestBlasKernelsTheCpuHas) {
  // tutti-train links the BLAS this test does (the GPU machines' build takes netlib's).
  if (blasCoreName().empty()) GTEST_SKIP() << "the BLAS is not OpenBLAS";
  const std::string args = " --epochs 1 --batch 64 --train-limit 256 --test-limit 64";
  const std::regex line(R"(BLAS: OpenBLAS, (\w+) kernels)");
  for (const std::string& cmd :
       {"env -u OPENBLAS_CORETYPE -u TUTTI_TRAIN_BLAS_CHOSE " + std::string(TUTTI_TRAIN_BIN) + args,
        "env -u OPENBLAS_CORETYPE -u TUTTI_TRAIN_BLAS_CHOSE " + std::string(TUTTI_RUN_BIN) +
            " -n 2 " + TUTTI_TRAIN_BIN + args}) {
    const tutti::test::RunResult r = tutti::test::runShell(cmd);
    ASSERT_EQ(r.exitCode, 0) << cmd << "\n" << r.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, line)) << cmd << "\n" << r.output;
    EXPECT_EQ(betterBlasCore(m[1], cpuVectors()), "")
        << "OpenBLAS runs " << m[1] << " kernels on a CPU with AVX\n"
        << cmd << "\n"
        << r.output;
    EXPECT_NE(r.output.find("epoch 1/1"), std::string::npos) << cmd << "\n" << r.output;
  }
  const tutti::test::RunResult r = tutti::test::runShell("env OPENBLAS_CORETYPE=PRESCOTT " +
                                                         std::string(TUTTI_TRAIN_BIN) + args);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("BLAS: OpenBLAS, Prescott kernels (OPENBLAS_CORETYPE=PRESCOTT)"),
            std::string::npos)
      << r.output;
}

// A rank that fails alone in mid-step (TUTTI_TRAINER_FAIL_AT; on the GPU, a CUDA error) must
// not leave the other threads waiting for it until TUTTI_TIMEOUT (600 s here, beyond this
// test's limit): tutti-train aborts every communicator at the first failure.
TEST(TrainerThreads, ARankThatFailsAloneStopsTheOthers) {
  const tutti::test::RunResult r = tutti::test::runShell(
      std::string("TUTTI_TIMEOUT=600 TUTTI_TRAINER_FAIL_AT=2:3 ") + TUTTI_TRAIN_BIN +
      " --threads 4 --epochs 1 --train-limit 4000 --test-limit 500");
  const std::string& out = r.output;
  ASSERT_NE(r.exitCode, -1) << "killed by a signal\n" << out;  // -1: not a normal exit
  EXPECT_EQ(r.exitCode, 1) << out;
  EXPECT_NE(out.find("tutti-train: rank 2: failed at step 3 as TUTTI_TRAINER_FAIL_AT asked"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("epoch 1/1"), std::string::npos) << "the epoch cannot have ended\n" << out;
}

}  // namespace
}  // namespace trainer
