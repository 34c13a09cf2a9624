// Entry points exported for binary compatibility whose implementation belongs to later
// layers. Each validates what it can, then returns ncclInvalidUsage with a message saying so
// (buffer registration excepted: a hint, accepted and ignored).
#include "bindings/c/api_common.h"
#include "runtime/group.h"
#include "runtime/log.h"

using namespace tutti;
using tutti::api::fail;
using tutti::api::notImplemented;

TUTTI_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* exclude, int n, ncclComm_t* newcomm,
                                      ncclConfig_t*, int) {
  if (!newcomm) return fail("ncclCommShrink", invalidArgument("newcomm is NULL"));
  *newcomm = nullptr;
  if (n < 0 || (n > 0 && !exclude)) {
    return fail("ncclCommShrink", invalidArgument("excludeRanksList/excludeRanksCount invalid"));
  }
  return notImplemented("ncclCommShrink", comm);
}

TUTTI_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int) {
  return notImplemented("ncclCommRevoke", comm);
}

TUTTI_API ncclResult_t ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId* id) {
  if (!id) return fail("ncclCommGetUniqueId", invalidArgument("uniqueId is NULL"));
  return notImplemented("ncclCommGetUniqueId", comm);
}

TUTTI_API ncclResult_t ncclCommGrow(ncclComm_t comm, int, const ncclUniqueId*, int,
                                    ncclComm_t* newcomm, ncclConfig_t*) {
  if (!newcomm) return fail("ncclCommGrow", invalidArgument("newcomm is NULL"));
  *newcomm = nullptr;
  return fail("ncclCommGrow", invalidUsage("not implemented yet in tutti 0.1.0"));
  (void)comm;
}

TUTTI_API ncclResult_t ncclCommSuspend(ncclComm_t comm, int) {
  return notImplemented("ncclCommSuspend", comm);
}

TUTTI_API ncclResult_t ncclCommResume(ncclComm_t comm) {
  return notImplemented("ncclCommResume", comm);
}

TUTTI_API ncclResult_t ncclCommMemStats(ncclComm_t comm, int, uint64_t* value) {
  if (!value) return fail("ncclCommMemStats", invalidArgument("value is NULL"));
  return notImplemented("ncclCommMemStats", comm);
}

// Registration is a hint that lets NCCL skip copies through its own buffers; tutti registers
// nothing (as NCCL with NCCL_LOCAL_REGISTER=0): the call succeeds with a NULL handle, and
// deregistering that handle succeeds. PyTorch's allocator hooks and nccl-tests -R call these.
TUTTI_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size,
                                        void** handle) {
  if (!handle) return fail("ncclCommRegister", invalidArgument("handle is NULL"));
  *handle = nullptr;
  if (!buff && size > 0) return fail("ncclCommRegister", invalidArgument("buff is NULL"));
  api::Pinned pin;
  if (Result<Comm*> c = api::lookupPinned(comm, api::Need::kReady, &pin); !c.ok()) {
    return fail("ncclCommRegister", c.status());
  }
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  api::Pinned pin;
  if (Result<Comm*> c = api::lookupPinned(comm, api::Need::kAny, &pin); !c.ok()) {
    return fail("ncclCommDeregister", c.status());
  }
  if (handle) {
    return fail("ncclCommDeregister",
                invalidArgument("handle is not one ncclCommRegister returned (tutti's are NULL)"));
  }
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                              ncclWindow_t* win, int) {
  if (!win) return fail("ncclCommWindowRegister", invalidArgument("win is NULL"));
  *win = nullptr;
  if (!buff && size > 0) return fail("ncclCommWindowRegister", invalidArgument("buff is NULL"));
  return notImplemented("ncclCommWindowRegister", comm);
}

TUTTI_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t) {
  return notImplemented("ncclCommWindowDeregister", comm);
}

TUTTI_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar,
                                                ncclDataType_t datatype,
                                                ncclScalarResidence_t residence, ncclComm_t comm) {
  const char* fn = "ncclRedOpCreatePreMulSum";
  if (!op) return fail(fn, invalidArgument("op is NULL"));
  if (!scalar) return fail(fn, invalidArgument("scalar is NULL"));
  if (api::typeSize(datatype) == 0) {
    return fail(fn, invalidArgument("datatype " + std::to_string(datatype) + " is not valid"));
  }
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate) {
    return fail(fn, invalidArgument("residence " + std::to_string(residence) + " is not valid"));
  }
  api::Pinned pin;
  Result<Comm*> c = api::lookupPinned(comm, api::Need::kReady, &pin);
  if (!c.ok()) return fail(fn, c.status());
  // A device-resident scalar is read when each operation runs; an immediate one now.
  Result<int> made = c.value()->createPreMulSum(scalar, datatype, residence == ncclScalarDevice);
  if (!made.ok()) return fail(fn, made.status());
  *op = static_cast<ncclRedOp_t>(made.value());
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (op >= 0 && op < ncclNumOps) {
    return fail("ncclRedOpDestroy", invalidArgument("op " + std::to_string(op) +
                                                    " is a built-in op, not a custom one"));
  }
  api::Pinned pin;
  Result<Comm*> c = api::lookupPinned(comm, api::Need::kAny, &pin);
  if (!c.ok()) return fail("ncclRedOpDestroy", c.status());
  if (Status s = c.value()->destroyOp(op); !s.ok()) return fail("ncclRedOpDestroy", s);
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* info) {
  if (!info) return fail("ncclGroupSimulateEnd", invalidArgument("simInfo is NULL"));
  if (info->magic != NCCL_SIM_INFO_MAGIC) {
    return fail("ncclGroupSimulateEnd",
                invalidArgument("simInfo->magic is wrong; use NCCL_SIM_INFO_INITIALIZER"));
  }
  // It still closes the group as NCCL's does (else every later call on this thread would be
  // queued to a group that never ends), dropping the queued operations unrun.
  Status s = group::end(/*run=*/false);
  if (s.code() == Code::kInProgress) s = Status::Ok();
  if (!s.ok()) return fail("ncclGroupSimulateEnd", s);
  return fail("ncclGroupSimulateEnd",
              invalidUsage("not implemented yet in tutti 0.1.0 (this group level is closed; "
                           "at the outermost, its operations were dropped, none ran)"));
}

// NCCL 2.28's device API (nccl_device/*.h): host calls that set up communicators for kernels
// the application writes against NCCL's device library, which tutti does not provide. Exported
// so that a program built against NCCL 2.28 loads with tutti (PyTorch's symmetric memory
// references the first two); each fails with a message. The barrier calls take a struct by
// value whose layout NCCL keeps private: no argument is read.
TUTTI_API ncclResult_t ncclDevCommCreate(ncclComm_t comm, const void*, void* outDevComm) {
  if (!outDevComm) return fail("ncclDevCommCreate", invalidArgument("outDevComm is NULL"));
  return notImplemented("ncclDevCommCreate (NCCL's device API)", comm);
}

TUTTI_API ncclResult_t ncclDevCommDestroy(ncclComm_t comm, const void*) {
  return notImplemented("ncclDevCommDestroy (NCCL's device API)", comm);
}

TUTTI_API ncclResult_t ncclLsaBarrierCreateRequirement(...) {
  return fail("ncclLsaBarrierCreateRequirement",
              invalidUsage("NCCL's device API is not implemented in tutti"));
}

TUTTI_API ncclResult_t ncclGinBarrierCreateRequirement(...) {
  return fail("ncclGinBarrierCreateRequirement",
              invalidUsage("NCCL's device API is not implemented in tutti"));
}

// Deprecated in NCCL, still exported there: the next log line reads NCCL_DEBUG* again.
TUTTI_API void ncclResetDebugInit() { log::reinitForTest(); }
