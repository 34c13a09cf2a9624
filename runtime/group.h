// ncclGroupStart / ncclGroupEnd: a per-thread nesting depth and the work deferred to the
// outermost GroupEnd. Communicator inits issued inside a group run concurrently, so a single
// thread can create several ranks' communicators (the ncclCommInitAll pattern).
#pragma once

#include <future>
#include <vector>

#include "runtime/coll_args.h"
#include "runtime/status.h"

namespace tutti {
class Comm;
}

namespace tutti::group {

bool active();
void start();
// Closes one level; the outermost close waits for deferred blocking work and returns the
// first error, or kInProgress when nonblocking work is still running. With run false
// (ncclGroupSimulateEnd) the queued operations are dropped, not run.
Status end(bool run = true);
// A call inside the group was refused (a bad argument): NCCL's rule, the outermost
// ncclGroupEnd then runs nothing of the group and returns this first error.
void noteError(const Status& s);
// Registers work started inside the current group.
void defer(std::shared_future<Status> work, bool blocking);

// Runs a communicator's operations now, or -- inside a group -- queues them for the outermost
// ncclGroupEnd, which runs every communicator's queue at once (one thread per communicator
// beyond the first) so that one thread can drive the ranks of several communicators.
// The comm must be pinned by the caller; submit() takes over that pin.
Status submit(Comm* comm, const CollArgs* ops, size_t n);
// Whether this thread's open group holds operations of comm already.
bool holds(const Comm* comm);
// Drops this thread's queued operations on comm (it is being aborted inside the group).
void discard(Comm* comm);

}  // namespace tutti::group
