#include "runtime/launch_env.h"

#include <cstdint>
#include <cstdlib>

namespace tutti {
namespace {

std::optional<int> asInt(const std::optional<std::string>& v) {
  if (!v || v->empty()) return std::nullopt;
  char* end = nullptr;
  long x = strtol(v->c_str(), &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 30)) return std::nullopt;
  return static_cast<int>(x);
}

}  // namespace

std::string firstSlurmHost(const std::string& list) {
  // Split at the first comma that is not inside brackets.
  int depth = 0;
  size_t end = list.size();
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i] == '[') ++depth;
    if (list[i] == ']') --depth;
    if (list[i] == ',' && depth == 0) {
      end = i;
      break;
    }
  }
  std::string first = list.substr(0, end);
  size_t open = first.find('[');
  if (open == std::string::npos) return first;
  std::string prefix = first.substr(0, open);
  std::string range = first.substr(open + 1);
  size_t stop = range.find_first_of(",-]");
  return prefix + range.substr(0, stop);
}

Result<LaunchSpec> resolveLaunchEnv(const EnvLookup& env) {
  LaunchSpec s;
  struct Source {
    const char* name;
    const char* rank;
    const char* size;
    const char* local;
    const char* localSize;  // ranks on this host
  };
  const Source sources[] = {
      {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
      {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
       "OMPI_COMM_WORLD_LOCAL_SIZE"},
      {"PMI", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
      {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr},
  };
  for (const Source& src : sources) {
    auto rank = asInt(env(src.rank));
    auto size = asInt(env(src.size));
    if (!rank || !size) continue;
    s.rank = *rank;
    s.nranks = *size;
    s.localRank = asInt(env(src.local)).value_or(-1);
    s.source = src.name;
    // Whether the ranks span hosts: from this launcher's local size, else from what another
    // one that started the process says (a script under srun that sets RANK and WORLD_SIZE
    // itself, say), all alike on every rank.
    auto fewerLocal = [&](const Source& x) -> std::optional<bool> {
      const int local = x.localSize ? asInt(env(x.localSize)).value_or(0) : 0;
      const int size = asInt(env(x.size)).value_or(0);
      if (local > 0 && size > 0) return local < size;
      return std::nullopt;
    };
    std::optional<bool> spans = fewerLocal(src);
    for (const Source& other : sources) {
      if (!spans) spans = fewerLocal(other);
    }
    if (!spans) {  // Slurm: the step's nodes (the job's, outside a step)
      auto nodes = asInt(env("SLURM_STEP_NUM_NODES"));
      if (!nodes) nodes = asInt(env("SLURM_JOB_NUM_NODES"));
      if (!nodes) nodes = asInt(env("SLURM_NNODES"));
      if (nodes) spans = *nodes > 1;
    }
    s.spansHosts = spans.value_or(false);
    break;
  }
  if (s.source.empty()) {
    return invalidUsage(
        "no launcher environment found: set RANK and WORLD_SIZE (torchrun, tutti-run), or run "
        "under mpirun (OMPI_COMM_WORLD_*) or srun (SLURM_PROCID, SLURM_NTASKS)");
  }
  if (s.nranks < 1 || s.rank >= s.nranks) {
    return invalidArgument(s.source + " environment gives rank " + std::to_string(s.rank) + " of " +
                           std::to_string(s.nranks));
  }

  auto get = [&](const char* n) { return env(n).value_or(""); };
  s.jobKey = s.source + "|" + std::to_string(s.nranks) + "|" + get("TORCHELASTIC_RUN_ID") + "|" +
             get("SLURM_JOB_ID") + "." + get("SLURM_STEP_ID") + "|" +
             get("OMPI_MCA_ess_base_jobid") + "|" + get("PMIX_NAMESPACE");
  if (auto id = env("NCCL_COMM_ID"); id && !id->empty()) {
    s.rendezvous = *id;
    return s;
  }
  std::optional<int> port = asInt(env("TUTTI_PORT"));
  if (auto addr = env("MASTER_ADDR"); addr && !addr->empty()) {
    // torchrun's own store listens on MASTER_PORT, so tutti's root takes the next port.
    auto masterPort = asInt(env("MASTER_PORT"));
    if (!port && masterPort) port = *masterPort + 1;
    if (!port) {
      return invalidUsage("MASTER_ADDR is set but neither MASTER_PORT nor TUTTI_PORT is");
    }
    bool v6 = addr->find(':') != std::string::npos;
    s.rendezvous = (v6 ? "[" + *addr + "]" : *addr) + ":" + std::to_string(*port);
    return s;
  }
  std::string nodes = get("SLURM_STEP_NODELIST");
  if (nodes.empty()) nodes = get("SLURM_JOB_NODELIST");
  if (!nodes.empty()) {
    auto job = asInt(env("SLURM_JOB_ID"));
    if (!port) port = 29600 + (job ? *job % 1000 : 0);
    s.rendezvous = firstSlurmHost(nodes) + ":" + std::to_string(*port);
    return s;
  }
  // mpirun on one host (every rank local): rank 0 is on this host, and Open MPI's job id
  // (Open MPI 5: its PMIx namespace), the same for every rank of one mpirun and another for the
  // next, picks the port: hashed, since Open MPI 4's ids are (family << 16) | 1 and their
  // remainders by 1000 would take 125 ports alone. Across hosts Open MPI does not say where rank
  // 0 runs.
  if (s.source == "Open MPI") {
    auto local = asInt(env("OMPI_COMM_WORLD_LOCAL_SIZE"));
    std::string job = get("OMPI_MCA_ess_base_jobid");
    if (job.empty()) job = get("PMIX_NAMESPACE");
    if (local && *local == s.nranks && !job.empty()) {
      if (!port) {
        uint32_t h = 2166136261u;  // FNV-1a
        for (unsigned char c : job) h = (h ^ c) * 16777619u;
        port = 29600 + int(h % 1000);
      }
      s.rendezvous = "127.0.0.1:" + std::to_string(*port);
      return s;
    }
    return invalidUsage(
        "found Open MPI rank and size" +
        std::string(local && *local < s.nranks ? " with ranks on several hosts" : "") +
        " but no rendezvous address: set NCCL_COMM_ID=host:port or MASTER_ADDR and MASTER_PORT "
        "(rank 0's host; mpirun -x passes them on), or run every rank on one host");
  }
  // PMI (MPICH's and Intel MPI's Hydra) names no job, so nothing picks a port alike on every
  // rank: the launcher passes an address on.
  return invalidUsage(
      "found " + s.source +
      " rank and size but no rendezvous address: set NCCL_COMM_ID=host:port or "
      "MASTER_ADDR and MASTER_PORT (rank 0's host)" +
      (s.source == "PMI" ? "; mpiexec -genv NCCL_COMM_ID host:port passes it on" : ""));
}

}  // namespace tutti
