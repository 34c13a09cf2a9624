// ncclGroupStart / ncclGroupEnd: a per-thread nesting depth and the work deferred to the
// outermost GroupEnd. Communicator inits issued inside a group run concurrently, so a single
// thread can create several ranks' communicators (the ncclCommInitAll pattern).
#pragma once

#include <future>

#include "runtime/status.h"

namespace tutti::group {

bool active();
void start();
// Closes one level; the outermost close waits for deferred blocking work and returns the
// first error, or kInProgress when nonblocking work is still running.
Status end();
// Registers work started inside the current group.
void defer(std::shared_future<Status> work, bool blocking);

}  // namespace tutti::group
