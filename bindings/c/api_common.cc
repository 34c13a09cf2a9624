#include "bindings/c/api_common.h"

#include "runtime/dtype.h"
#include "runtime/log.h"
#include "runtime/version.h"

namespace tutti::api {
namespace {
thread_local std::string tLastError;
}  // namespace

ncclResult_t fail(const char* fn, const Status& s) {
  tLastError = std::string(fn) + ": " + s.message();
  if (s.code() != Code::kInProgress) TUTTI_WARN("%s", tLastError.c_str());
  return static_cast<ncclResult_t>(s.code());
}

const char* lastError() { return tLastError.c_str(); }

Result<Comm*> lookup(const void* handle, Need need) {
  if (!handle) return invalidArgument("comm is NULL");
  if (!registry::contains(handle)) {
    char text[96];
    snprintf(text, sizeof(text), "comm %p is not a live communicator", handle);
    return invalidArgument(std::string(text) + " (already destroyed or aborted?)");
  }
  Comm* comm = static_cast<Comm*>(const_cast<void*>(handle));
  if (need == Need::kAny) return comm;
  switch (comm->state()) {
    case Comm::State::kReady:
      return comm;
    case Comm::State::kInitializing:  // NCCL's code for both (ncclCommEnsureReady)
      return invalidArgument(
          "the communicator is still initializing (nonblocking); poll ncclCommGetAsyncError "
          "until it returns ncclSuccess");
    case Comm::State::kFailed: {  // the error it failed with, as NCCL returns
      const Code c = comm->asyncCode();
      return Status(c == Code::kOk || c == Code::kInProgress ? Code::kInvalidUsage : c,
                    "the communicator failed to initialize: " + comm->asyncMessage());
    }
    case Comm::State::kFinalized:
      return invalidUsage("the communicator was finalized; only ncclCommDestroy is allowed");
  }
  return internalError("unknown communicator state");
}

Result<Comm*> lookupPinned(const void* handle, Need need, Pinned* pin) {
  if (Comm* c = handle ? registry::pin(handle) : nullptr) pin->hold(c);
  return lookup(handle, need);  // the checks; a destroy that began meanwhile is refused here
}

size_t typeSize(int t) { return dtypeSize(t); }
const char* typeName(int t) { return dtypeName(t); }
const char* opName(int op) { return redOpName(op); }

ncclResult_t notImplemented(const char* fn, const void* comm) {
  Pinned pin;
  Result<Comm*> c = lookupPinned(comm, Need::kReady, &pin);
  if (!c.ok()) return fail(fn, c.status());
  return fail(fn, invalidUsage(std::string("not implemented yet in tutti ") + kTuttiVersionString));
}

}  // namespace tutti::api
