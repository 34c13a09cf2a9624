// Communicator lifecycle entry points.
#include <cstring>
#include <vector>

#include "bindings/c/api_common.h"
#include "bindings/c/config.h"
#include "runtime/cuda_shim.h"
#include "runtime/group.h"
#include "runtime/lifecycle.h"
#include "runtime/log.h"
#include "runtime/version.h"

using namespace tutti;
using tutti::api::fail;

namespace {

ncclResult_t finishInit(const char* fn, ncclComm_t* out, Result<Started> r) {
  if (!r.ok()) {
    *out = nullptr;
    return fail(fn, r.status());
  }
  *out = reinterpret_cast<ncclComm_t>(r.value().comm);
  return r.value().inProgress ? ncclInProgress : ncclSuccess;
}

Status checkRank(int nranks, int rank) {
  if (nranks < 1) return invalidArgument("nranks is " + std::to_string(nranks) + ", must be >= 1");
  if (rank < 0 || rank >= nranks) {
    return invalidArgument("rank " + std::to_string(rank) + " is out of range for nranks " +
                           std::to_string(nranks));
  }
  return Status::Ok();
}

Result<wire::UniqueId> decodeId(const ncclUniqueId& raw) {
  wire::UniqueId id;
  memcpy(&id, raw.internal, sizeof(id));
  if (id.magic != wire::kIdMagic) {
    return invalidArgument(
        "the ncclUniqueId was not produced by ncclGetUniqueId (bad magic): pass the same 128 "
        "bytes to every rank");
  }
  return id;
}

ncclResult_t initRankChecked(const char* fn, ncclComm_t* comm, int nranks,
                             const ncclUniqueId& rawId, int rank, int cudaDev,
                             const ncclConfig_t* config) {
  log::printVersionOnce();
  if (!comm) return fail(fn, invalidArgument("comm (the output pointer) is NULL"));
  *comm = nullptr;
  if (Status s = checkRank(nranks, rank); !s.ok()) return fail(fn, s);
  Result<CommConfig> cfg = api::parseConfig(config, nullptr);
  if (!cfg.ok()) return fail(fn, cfg.status());
  Result<wire::UniqueId> id = decodeId(rawId);
  if (!id.ok()) return fail(fn, id.status());
  return finishInit(fn, comm, initRank(nranks, id.value(), rank, cudaDev, cfg.take()));
}

}  // namespace

TUTTI_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) return fail("ncclGetVersion", invalidArgument("version is NULL"));
  *version = kNcclVersionCode;
  return ncclSuccess;
}

TUTTI_API ncclResult_t tuttiGetVersion(int* version) {
  if (!version) return fail("tuttiGetVersion", invalidArgument("version is NULL"));
  *version = kTuttiVersionCode;
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclGetUniqueId(ncclUniqueId* out) {
  log::printVersionOnce();
  if (!out) return fail("ncclGetUniqueId", invalidArgument("uniqueId is NULL"));
  Result<wire::UniqueId> id = newUniqueId();
  if (!id.ok()) return fail("ncclGetUniqueId", id.status());
  memcpy(out->internal, &id.value(), sizeof(out->internal));
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                        int rank) {
  return initRankChecked("ncclCommInitRank", comm, nranks, commId, rank, cuda::currentDevice(),
                         nullptr);
}

TUTTI_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                              int rank, ncclConfig_t* config) {
  return initRankChecked("ncclCommInitRankConfig", comm, nranks, commId, rank,
                         cuda::currentDevice(), config);
}

// Every rank receives the same array of ids; tutti's single root scales to the rank counts
// it targets, so ids[0] is the rendezvous and the others are accepted and unused.
TUTTI_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank,
                                                int nId, ncclUniqueId* commIds,
                                                ncclConfig_t* config) {
  const char* fn = "ncclCommInitRankScalable";
  if (nId < 1) return fail(fn, invalidArgument("nId is " + std::to_string(nId) + ", must be >= 1"));
  if (!commIds) return fail(fn, invalidArgument("commIds is NULL"));
  return initRankChecked(fn, newcomm, nranks, commIds[0], myrank, cuda::currentDevice(), config);
}

TUTTI_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  const char* fn = "ncclCommInitAll";
  log::printVersionOnce();
  if (!comms) return fail(fn, invalidArgument("comms is NULL"));
  if (ndev < 1)
    return fail(fn, invalidArgument("ndev is " + std::to_string(ndev) + ", must be >= 1"));
  int count = cuda::deviceCount();
  std::vector<int> devices(static_cast<size_t>(ndev));
  for (int i = 0; i < ndev; ++i) {
    // tutti extension: without devlist and without GPUs the ranks are CPU ranks; several ranks
    // may share a GPU (rank i uses device i % count), and a devlist entry of -1 is a CPU rank.
    int d = devlist ? devlist[i] : (count > 0 ? i % count : -1);
    if (d < -1 || d >= count) {
      return fail(fn,
                  invalidArgument("devlist[" + std::to_string(i) + "] is " + std::to_string(d) +
                                  " but " + std::to_string(count) + " CUDA device(s) are present" +
                                  (count == 0 ? " (" + cuda::unavailableReason() + ")" : "") +
                                  "; -1 makes a CPU rank"));
    }
    devices[static_cast<size_t>(i)] = d;
  }
  Result<wire::UniqueId> id = newUniqueId();
  if (!id.ok()) return fail(fn, id.status());
  for (int i = 0; i < ndev; ++i) comms[i] = nullptr;
  group::start();
  ncclResult_t first = ncclSuccess;
  for (int i = 0; i < ndev; ++i) {
    Result<Started> r =
        initRank(ndev, id.value(), i, devices[static_cast<size_t>(i)], CommConfig{});
    if (!r.ok()) {
      first = fail(fn, r.status());
      break;
    }
    comms[i] = reinterpret_cast<ncclComm_t>(r.value().comm);
  }
  Status s = group::end();
  if (first == ncclSuccess && !s.ok()) first = fail(fn, s);
  if (first != ncclSuccess) {
    for (int i = 0; i < ndev; ++i) {
      if (comms[i]) destroyComm(reinterpret_cast<Comm*>(comms[i]), true);
      comms[i] = nullptr;
    }
  }
  return first;
}

TUTTI_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                     ncclConfig_t* config) {
  const char* fn = "ncclCommSplit";
  if (!newcomm) return fail(fn, invalidArgument("newcomm is NULL"));
  *newcomm = nullptr;
  api::Pinned pin;
  Result<Comm*> parent = api::lookupPinned(comm, api::Need::kReady, &pin);
  if (!parent.ok()) return fail(fn, parent.status());
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return fail(fn, invalidArgument("color is " + std::to_string(color) +
                                    "; use a non-negative colour or NCCL_SPLIT_NOCOLOR"));
  }
  Result<CommConfig> cfg = api::parseConfig(config, &parent.value()->config());
  if (!cfg.ok()) return fail(fn, cfg.status());
  return finishInit(fn, newcomm, splitComm(parent.value(), color, key, cfg.take()));
}

TUTTI_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  api::Pinned pin;
  Result<Comm*> c = api::lookupPinned(comm, api::Need::kReady, &pin);
  if (!c.ok()) return fail("ncclCommFinalize", c.status());
  c.value()->markFinalized();
  TUTTI_INFO(log::kInit, "comm %p rank %d - Finalize", static_cast<void*>(c.value()),
             c.value()->rank());
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;  // as NCCL: destroying NULL is a no-op
  Result<Comm*> c = api::lookup(comm, api::Need::kAny);
  if (!c.ok()) return fail("ncclCommDestroy", c.status());
  TUTTI_INFO(log::kInit, "comm %p rank %d nranks %d - Destroy", static_cast<void*>(c.value()),
             c.value()->rank(), c.value()->nranks());
  destroyComm(c.value(), false);
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  Result<Comm*> c = api::lookup(comm, api::Need::kAny);
  if (!c.ok()) return fail("ncclCommAbort", c.status());
  TUTTI_INFO(log::kInit, "comm %p rank %d - Abort", static_cast<void*>(c.value()),
             c.value()->rank());
  destroyComm(c.value(), true);
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclGroupStart(void) {
  group::start();
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclGroupEnd(void) {
  Status s = group::end();
  if (s.code() == Code::kInProgress) return ncclInProgress;
  return s.ok() ? ncclSuccess : fail("ncclGroupEnd", s);
}
