// tuttiCommInitFromEnv: a communicator from the launcher's environment.
#include <cstdlib>

#include "bindings/c/api_common.h"
#include "runtime/cuda_shim.h"
#include "runtime/launch_env.h"
#include "runtime/lifecycle.h"
#include "runtime/log.h"
#include "tutti.h"

using namespace tutti;
using tutti::api::fail;

TUTTI_API ncclResult_t tuttiCommInitFromEnv(ncclComm_t* comm) {
  const char* fn = "tuttiCommInitFromEnv";
  log::printVersionOnce();
  if (!comm) return fail(fn, invalidArgument("comm (the output pointer) is NULL"));
  *comm = nullptr;
  Result<LaunchSpec> spec = resolveLaunchEnv([](const char* name) -> std::optional<std::string> {
    const char* v = getenv(name);
    return v ? std::optional<std::string>(v) : std::nullopt;
  });
  if (!spec.ok()) return fail(fn, spec.status());
  const LaunchSpec& s = spec.value();

  int device = -1;
  if (int count = cuda::deviceCount(); count > 0) {
    device = s.localRank >= 0 ? s.localRank % count : cuda::currentDevice();
    if (Status st = cuda::setDevice(device); !st.ok()) return fail(fn, st);
  }
  TUTTI_INFO(log::kInit, "%s: rank %d of %d (%s), local rank %d, rendezvous %s%s, %s", fn,
             s.rank, s.nranks, s.source.c_str(), s.localRank, s.rendezvous.c_str(),
             s.spansHosts ? " (ranks on several hosts)" : "",
             device >= 0 ? ("cudaDev " + std::to_string(device)).c_str() : "CPU rank");
  Result<wire::UniqueId> id = idForAddress(s.rendezvous, s.jobKey, s.spansHosts);
  if (!id.ok()) return fail(fn, id.status());
  Result<Started> r = initRank(s.nranks, id.value(), s.rank, device, CommConfig{});
  if (!r.ok()) return fail(fn, r.status());
  *comm = reinterpret_cast<ncclComm_t>(r.value().comm);
  return ncclSuccess;
}
