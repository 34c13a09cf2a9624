// The local launcher: environment, output prefixes, failure propagation, signal forwarding.
#include <gtest/gtest.h>

#include "harness/harness.h"

using namespace tutti::test;

namespace {
std::string runBin() { return TUTTI_RUN_BIN; }
}  // namespace

TEST(TuttiRun, SetsEnvironmentAndPrefixesOutput) {
  RunResult r = runShell(runBin() +
                         " -n 3 sh -c 'echo \"r=$RANK w=$WORLD_SIZE l=$LOCAL_RANK "
                         "a=$MASTER_ADDR\"; echo err >&2'");
  EXPECT_EQ(r.exitCode, 0) << r.output;
  for (int k = 0; k < 3; ++k) {
    std::string k_ = std::to_string(k);
    EXPECT_NE(r.output.find("[rank " + k_ + "] r=" + k_ + " w=3 l=" + k_ + " a=127.0.0.1"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("[rank " + k_ + "] err"), std::string::npos) << r.output;
  }
}

TEST(TuttiRun, PropagatesFailingRankStatusAndStopsTheRest) {
  RunResult r = runShell(runBin() + " -n 3 sh -c 'if [ $RANK = 1 ]; then exit 7; fi; sleep 60'");
  EXPECT_EQ(r.exitCode, 7) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with status 7"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 20) << "the other ranks were not stopped";
}

TEST(TuttiRun, ReportsARankKilledBySignal) {
  RunResult r =
      runShell(runBin() + " -n 2 sh -c 'if [ $RANK = 0 ]; then kill -9 $$; fi; sleep 60'");
  EXPECT_EQ(r.exitCode, 128 + 9) << r.output;
  EXPECT_NE(r.output.find("rank 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("signal 9"), std::string::npos) << r.output;
}

TEST(TuttiRun, ForwardsSignals) {
  // SIGTERM to the launcher reaches every rank; the ranks' trap prints and exits 3.
  RunResult r =
      runShell(runBin() +
               " -n 2 sh -c 'trap \"echo got-term; exit 3\" TERM; echo ready; "
               "while true; do sleep 0.1; done' & pid=$!; sleep 1; kill -TERM $pid; wait $pid; "
               "echo launcher-exit $?");
  EXPECT_NE(r.output.find("[rank 0] got-term"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] got-term"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("launcher-exit 3"), std::string::npos) << r.output;
}

TEST(TuttiRun, UsageErrors) {
  EXPECT_EQ(runShell(runBin()).exitCode, 2);
  EXPECT_EQ(runShell(runBin() + " -n 0 true").exitCode, 2);
  RunResult missing = runShell(runBin() + " -n 1 /nonexistent/program");
  EXPECT_EQ(missing.exitCode, 127) << missing.output;
  EXPECT_NE(missing.output.find("cannot run"), std::string::npos) << missing.output;
}
