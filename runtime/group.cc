#include "runtime/group.h"

#include <chrono>
#include <vector>

namespace tutti::group {
namespace {

struct Deferred {
  std::shared_future<Status> work;
  bool blocking;
};

struct ThreadGroup {
  int depth = 0;
  std::vector<Deferred> deferred;
};

thread_local ThreadGroup tGroup;

}  // namespace

bool active() { return tGroup.depth > 0; }

void start() { ++tGroup.depth; }

void defer(std::shared_future<Status> work, bool blocking) {
  tGroup.deferred.push_back({std::move(work), blocking});
}

Status end() {
  if (tGroup.depth == 0) {
    return invalidUsage("ncclGroupEnd called without a matching ncclGroupStart");
  }
  if (--tGroup.depth > 0) return Status::Ok();
  std::vector<Deferred> work;
  work.swap(tGroup.deferred);
  Status first;
  bool pending = false;
  for (Deferred& d : work) {
    if (!d.blocking) {
      pending |= d.work.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
      continue;
    }
    Status s = d.work.get();
    if (first.ok() && !s.ok()) first = s;
  }
  if (!first.ok()) return first;
  if (pending) return Status(Code::kInProgress, "nonblocking operations still in progress");
  return Status::Ok();
}

}  // namespace tutti::group
