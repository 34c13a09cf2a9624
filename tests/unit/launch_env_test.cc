#include "runtime/launch_env.h"

#include <gtest/gtest.h>

#include <map>

using tutti::LaunchSpec;
using tutti::resolveLaunchEnv;

namespace {
tutti::Result<LaunchSpec> resolve(const std::map<std::string, std::string>& vars) {
  return resolveLaunchEnv([&](const char* n) -> std::optional<std::string> {
    auto it = vars.find(n);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
}
}  // namespace

TEST(LaunchEnv, Torchrun) {
  auto s = resolve({{"RANK", "3"},
                    {"WORLD_SIZE", "8"},
                    {"LOCAL_RANK", "1"},
                    {"MASTER_ADDR", "10.1.2.3"},
                    {"MASTER_PORT", "29500"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s.value().rank, 3);
  EXPECT_EQ(s.value().nranks, 8);
  EXPECT_EQ(s.value().localRank, 1);
  EXPECT_EQ(s.value().rendezvous, "10.1.2.3:29501");  // MASTER_PORT is torchrun's own store
  EXPECT_EQ(s.value().source, "torchrun");
}

TEST(LaunchEnv, TuttiPortAndIpv6) {
  auto s = resolve({{"RANK", "0"},
                    {"WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "fd00::1"},
                    {"MASTER_PORT", "1000"},
                    {"TUTTI_PORT", "2000"}});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value().rendezvous, "[fd00::1]:2000");
}

TEST(LaunchEnv, OpenMpiNeedsARendezvous) {
  std::map<std::string, std::string> v = {{"OMPI_COMM_WORLD_RANK", "1"},
                                          {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}};
  auto s = resolve(v);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("NCCL_COMM_ID"), std::string::npos);
  v["NCCL_COMM_ID"] = "node7:5000";
  s = resolve(v);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s.value().source, "Open MPI");
  EXPECT_EQ(s.value().rank, 1);
  EXPECT_EQ(s.value().rendezvous, "node7:5000");
}

// mpirun on one host needs no address: rank 0 is local, and the job id (Open MPI 5: the PMIx
// namespace) picks the port, 29600 + its FNV-1a hash % 1000, alike on every rank.
TEST(LaunchEnv, OpenMpiOnOneHostRendezvousesLocally) {
  std::map<std::string, std::string> v = {{"OMPI_COMM_WORLD_RANK", "2"},
                                          {"OMPI_COMM_WORLD_SIZE", "4"},
                                          {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                          {"OMPI_MCA_ess_base_jobid", "2063794177"}};
  auto s = resolve(v);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s.value().rendezvous, "127.0.0.1:29953");
  EXPECT_NE(s.value().jobKey.find("2063794177"), std::string::npos);
  v["OMPI_COMM_WORLD_RANK"] = v["OMPI_COMM_WORLD_LOCAL_RANK"] = "0";  // rank 0 hosts it there
  EXPECT_EQ(resolve(v).value().rendezvous, "127.0.0.1:29953");
  // The next mpirun's id: Open MPI 4 adds 1 << 16 (its remainder by 1000 alone would give 125
  // ports in all).
  v["OMPI_MCA_ess_base_jobid"] = "2063859713";
  EXPECT_EQ(resolve(v).value().rendezvous, "127.0.0.1:30483");
  v.erase("OMPI_MCA_ess_base_jobid");
  v["PMIX_NAMESPACE"] = "prterun-vm-1234@1";
  EXPECT_EQ(resolve(v).value().rendezvous, "127.0.0.1:29659");
  v["TUTTI_PORT"] = "31000";
  EXPECT_EQ(resolve(v).value().rendezvous, "127.0.0.1:31000");
  v["NCCL_COMM_ID"] = "node7:5000";  // an address the user gives wins
  EXPECT_EQ(resolve(v).value().rendezvous, "node7:5000");
  v.erase("NCCL_COMM_ID");
  v["OMPI_COMM_WORLD_LOCAL_SIZE"] = "2";  // two hosts: where rank 0 runs is not known
  s = resolve(v);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("ranks on several hosts"), std::string::npos)
      << s.status().message();
  v["OMPI_COMM_WORLD_LOCAL_SIZE"] = "4";
  v.erase("PMIX_NAMESPACE");  // nothing names the job
  EXPECT_FALSE(resolve(v).ok());
}

TEST(LaunchEnv, SlurmUsesFirstNodeAndJobPort) {
  auto s = resolve({{"SLURM_PROCID", "5"},
                    {"SLURM_NTASKS", "16"},
                    {"SLURM_LOCALID", "1"},
                    {"SLURM_STEP_NODELIST", "gpu[07-09,12],cpu1"},
                    {"SLURM_JOB_ID", "123456"}});
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s.value().rank, 5);
  EXPECT_EQ(s.value().rendezvous, "gpu07:" + std::to_string(29600 + 456));
  EXPECT_NE(s.value().jobKey.find("123456"), std::string::npos);
}

TEST(LaunchEnv, SlurmNodeLists) {
  EXPECT_EQ(tutti::firstSlurmHost("node1"), "node1");
  EXPECT_EQ(tutti::firstSlurmHost("node[3-5]"), "node3");
  EXPECT_EQ(tutti::firstSlurmHost("a[010,2],b[1-2]"), "a010");
  EXPECT_EQ(tutti::firstSlurmHost("x1,x2"), "x1");
}

TEST(LaunchEnv, MissingOrBadEnvironment) {
  auto s = resolve({});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), tutti::Code::kInvalidUsage);
  s = resolve({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), tutti::Code::kInvalidArgument);
  s = resolve({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}});
  ASSERT_FALSE(s.ok());
}

// Whether the launcher puts the ranks on several hosts (a rendezvous name that is a loopback
// address on rank 0's host must then not keep the root and the ranks on loopback): from the
// local size each launcher gives, or Slurm's node count; unknown counts as one host.
TEST(LaunchEnv, RanksOnSeveralHostsAreTold) {
  struct Case {
    std::map<std::string, std::string> vars;
    bool spans;
  };
  const std::map<std::string, std::string> torch = {
      {"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}};
  auto with = [](std::map<std::string, std::string> v, const char* k, const char* x) {
    v[k] = x;
    return v;
  };
  const std::map<std::string, std::string> ompi = {{"OMPI_COMM_WORLD_RANK", "1"},
                                                   {"OMPI_COMM_WORLD_SIZE", "4"},
                                                   {"NCCL_COMM_ID", "node0:5000"}};
  const std::map<std::string, std::string> pmi = {
      {"PMI_RANK", "1"}, {"PMI_SIZE", "4"}, {"NCCL_COMM_ID", "node0:5000"}};
  const std::map<std::string, std::string> slurm = {{"SLURM_PROCID", "1"},
                                                    {"SLURM_NTASKS", "4"},
                                                    {"SLURM_STEP_NODELIST", "node[0-1]"},
                                                    {"SLURM_JOB_ID", "7"}};
  const Case cases[] = {
      {torch, false},
      {with(torch, "LOCAL_WORLD_SIZE", "2"), true},
      {with(torch, "LOCAL_WORLD_SIZE", "4"), false},
      {with(ompi, "OMPI_COMM_WORLD_LOCAL_SIZE", "2"), true},
      {with(ompi, "OMPI_COMM_WORLD_LOCAL_SIZE", "4"), false},
      {with(pmi, "MPI_LOCALNRANKS", "1"), true},
      {with(pmi, "MPI_LOCALNRANKS", "4"), false},
      {slurm, false},
      {with(slurm, "SLURM_STEP_NUM_NODES", "2"), true},
      {with(slurm, "SLURM_STEP_NUM_NODES", "1"), false},
      {with(slurm, "SLURM_NNODES", "2"), true},
      {with(slurm, "SLURM_JOB_NUM_NODES", "2"), true},
      // the step's count before the job's: a one-node step of a two-node job
      {with(with(slurm, "SLURM_STEP_NUM_NODES", "1"), "SLURM_JOB_NUM_NODES", "2"), false},
      // a script under srun that sets torchrun's variables itself: srun's node count tells
      {with(torch, "SLURM_STEP_NUM_NODES", "2"), true},
      {with(with(torch, "SLURM_STEP_NUM_NODES", "2"), "LOCAL_WORLD_SIZE", "4"), false},
      {with(with(torch, "OMPI_COMM_WORLD_LOCAL_SIZE", "2"), "OMPI_COMM_WORLD_SIZE", "4"), true},
      // a local size that says one host wins over a multi-node allocation around it
      {with(with(with(torch, "OMPI_COMM_WORLD_LOCAL_SIZE", "4"), "OMPI_COMM_WORLD_SIZE", "4"),
            "SLURM_JOB_NUM_NODES", "2"),
       false},
  };
  for (const Case& c : cases) {
    auto s = resolve(c.vars);
    ASSERT_TRUE(s.ok()) << s.status().message();
    std::string vars;
    for (const auto& [k, v] : c.vars) vars += k + "=" + v + " ";
    EXPECT_EQ(s.value().spansHosts, c.spans) << vars;
  }
}
