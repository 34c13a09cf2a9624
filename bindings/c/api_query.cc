// Queries, error reporting and memory allocation entry points.
#include <cstdlib>
#include <mutex>
#include <unordered_set>

#include "bindings/c/api_common.h"
#include "runtime/cuda_shim.h"
#include "runtime/log.h"

using namespace tutti;
using tutti::api::fail;

TUTTI_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the tutti developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclTimeout:
      return "operation timed out";
    default:
      return "unknown result code";
  }
}

TUTTI_API const char* ncclGetLastError(ncclComm_t comm) {
  // A communicator's asynchronous error (a failed nonblocking init, a split helper) is what a
  // caller passing that communicator is asking about; otherwise this thread's last error.
  if (Comm* c = comm ? registry::pin(comm) : nullptr) {
    api::Pinned pin;  // a destroy on another thread waits for these two calls
    pin.hold(c);
    static thread_local std::string async;
    c->pollDeviceErrors();
    async = c->asyncMessage();
    if (!async.empty()) return async.c_str();
  }
  return api::lastError();
}

TUTTI_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!asyncError) return fail("ncclCommGetAsyncError", invalidArgument("asyncError is NULL"));
  api::Pinned pin;
  Result<Comm*> c = api::lookupPinned(comm, api::Need::kAny, &pin);
  if (!c.ok()) return fail("ncclCommGetAsyncError", c.status());
  c.value()->pollDeviceErrors();
  *asyncError = static_cast<ncclResult_t>(c.value()->asyncCode());
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!count) return fail("ncclCommCount", invalidArgument("count is NULL"));
  api::Pinned pin;
  Result<Comm*> c = api::lookupPinned(comm, api::Need::kReady, &pin);
  if (!c.ok()) return fail("ncclCommCount", c.status());
  *count = c.value()->nranks();
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!device) return fail("ncclCommCuDevice", invalidArgument("device is NULL"));
  api::Pinned pin;
  Result<Comm*> c = api::lookupPinned(comm, api::Need::kReady, &pin);
  if (!c.ok()) return fail("ncclCommCuDevice", c.status());
  *device = c.value()->cudaDev();
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!rank) return fail("ncclCommUserRank", invalidArgument("rank is NULL"));
  api::Pinned pin;
  Result<Comm*> c = api::lookupPinned(comm, api::Need::kReady, &pin);
  if (!c.ok()) return fail("ncclCommUserRank", c.status());
  *rank = c.value()->rank();
  return ncclSuccess;
}

namespace {
// ncclMemAlloc hands out host memory where there is no GPU, so CPU-only programs written
// against the NCCL API run unchanged; this set tells ncclMemFree which allocator to use.
std::mutex gHostMu;
std::unordered_set<void*>& hostAllocations() {
  static auto* s = new std::unordered_set<void*>();
  return *s;
}
}  // namespace

TUTTI_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  const char* fn = "ncclMemAlloc";
  if (!ptr) return fail(fn, invalidArgument("ptr is NULL"));
  *ptr = nullptr;
  if (size == 0) return ncclSuccess;  // NCCL: cudaMalloc of 0 bytes, a NULL pointer
  if (cuda::deviceCount() > 0) {
    Status s = cuda::deviceMalloc(ptr, size);
    if (!s.ok()) return fail(fn, s);
    TUTTI_INFO(log::kAlloc, "ncclMemAlloc %zu bytes of device memory at %p", size, *ptr);
    return ncclSuccess;
  }
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size) != 0) {
    return fail(fn, systemError("cannot allocate " + std::to_string(size) + " bytes"));
  }
  {
    std::lock_guard<std::mutex> lock(gHostMu);
    hostAllocations().insert(p);
  }
  *ptr = p;
  TUTTI_INFO(log::kAlloc, "ncclMemAlloc %zu bytes of host memory at %p (no CUDA device)", size, p);
  return ncclSuccess;
}

TUTTI_API ncclResult_t ncclMemFree(void* ptr) {
  if (!ptr) return ncclSuccess;
  {
    std::lock_guard<std::mutex> lock(gHostMu);
    if (hostAllocations().erase(ptr)) {
      free(ptr);
      return ncclSuccess;
    }
  }
  if (cuda::isDevicePointer(ptr)) {
    Status s = cuda::deviceFree(ptr);
    return s.ok() ? ncclSuccess : fail("ncclMemFree", s);
  }
  return fail("ncclMemFree", invalidArgument("pointer was not allocated by ncclMemAlloc"));
}
