// Reading a job's shape from the environment that torchrun, tutti-run, Open MPI, PMI and Slurm
// leave behind (see tuttiCommInitFromEnv in tutti.h for the precedence).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "runtime/status.h"

namespace tutti {

using EnvLookup = std::function<std::optional<std::string>(const char*)>;

struct LaunchSpec {
  int rank = -1;
  int nranks = 0;
  int localRank = -1;      // -1: unknown
  // The launcher says the ranks are on more than one host (fewer local ranks than ranks, or
  // more than one node); false where it says not, or says nothing.
  bool spansHosts = false;
  std::string rendezvous;  // host:port of the root (rank 0 hosts it)
  std::string jobKey;      // what makes this job's handshake secret differ from another's
  std::string source;      // "torchrun", "Open MPI", ... for logs
};

Result<LaunchSpec> resolveLaunchEnv(const EnvLookup& env);
// The first host of a Slurm node list: "node[03-05,9],gpu1" -> "node03".
std::string firstSlurmHost(const std::string& nodelist);

}  // namespace tutti
