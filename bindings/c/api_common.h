// Shared by the extern "C" entry points: argument checks, the last-error text and the single
// place where an internal Status becomes an ncclResult_t.
#pragma once

#include <string>

#include "nccl.h"
#include "runtime/comm.h"
#include "runtime/status.h"

#define TUTTI_API extern "C" __attribute__((visibility("default")))

namespace tutti::api {

// Records the message for ncclGetLastError (and logs it as a WARN) and returns the code.
ncclResult_t fail(const char* fn, const Status& s);
// ncclSuccess, and clears nothing: NCCL keeps the last error until the next one.
inline ncclResult_t ok() { return ncclSuccess; }
const char* lastError();

enum class Need { kAny, kReady };
// Resolves a handle: null, destroyed/aborted (not in the registry), and -- with kReady --
// still initializing, failed or finalized comms are refused with a message.
Result<Comm*> lookup(const void* handle, Need need);

// A communicator pinned for the length of a call (Comm::pin): ncclCommDestroy or
// ncclCommAbort on another thread waits for the call before freeing it.
class Pinned {
 public:
  Pinned() = default;
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  ~Pinned() {
    if (comm_) comm_->unpin();
  }
  void hold(Comm* c) { comm_ = c; }

 private:
  Comm* comm_ = nullptr;
};
// lookup, with the communicator pinned in *pin while it lives: for every entry point but
// ncclCommDestroy and ncclCommAbort (which wait for the pins).
Result<Comm*> lookupPinned(const void* handle, Need need, Pinned* pin);

// Size of one element, 0 for an unknown datatype.
size_t typeSize(int datatype);
const char* typeName(int datatype);
const char* opName(int op);

// For an API that is not built yet: checks the comm, then ncclInvalidUsage saying so.
ncclResult_t notImplemented(const char* fn, const void* comm);

}  // namespace tutti::api
