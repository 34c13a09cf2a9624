#include "runtime/group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/cuda/dev_work.h"
#include "runtime/comm.h"
#include "runtime/cuda_shim.h"
#include "runtime/device_engine.h"
#include "runtime/device_plan.h"
#include "runtime/dtype.h"
#include "runtime/engine.h"
#include "runtime/links.h"
#include "runtime/log.h"

namespace tutti::group {
namespace {

struct Deferred {
  std::shared_future<Status> work;
  bool blocking;
};

struct Batch {
  Comm* comm;
  std::vector<CollArgs> ops;
};

struct ThreadGroup {
  int depth = 0;
  std::vector<Deferred> deferred;
  std::vector<Batch> batches;  // one per communicator, in order of first use
  // Emptied op lists of batches that ran, kept for the next groups: a program (nccl-tests,
  // tutti-perf) that wraps every call in a group then allocates nothing per call.
  std::vector<std::vector<CollArgs>> spare;
  Status refused;  // the first call refused inside the group (noteError)
};

// A thread_local with a constructor or destructor is reached through an init wrapper on every
// use (__tls_init: 5% of 8 crowded ranks' time on 64 B broadcasts, each call in a group); a
// plain pointer is not. tOwner, touched once per thread, frees the group state at its exit.
thread_local ThreadGroup* tGroupState = nullptr;
thread_local bool tOwnerGone = false;  // tOwner was destroyed (the thread is exiting)
struct GroupOwner {
  ThreadGroup* owned = nullptr;
  ~GroupOwner() {
    delete owned;
    tGroupState = nullptr;
    tOwnerGone = true;
  }
};
thread_local GroupOwner tOwner;

ThreadGroup& threadGroup() {
  if (ThreadGroup* g = tGroupState) return *g;
  tGroupState = new ThreadGroup();
  // Its first use registers its destructor. A call from another thread_local's destructor
  // after it ran gets a state that is never freed (rare, and small).
  if (!tOwnerGone) tOwner.owned = tGroupState;
  return *tGroupState;
}

}  // namespace

bool active() {
  const ThreadGroup* g = tGroupState;
  return g && g->depth > 0;
}

void start() { ++threadGroup().depth; }

void noteError(const Status& s) {
  ThreadGroup& g = threadGroup();
  if (g.depth > 0 && g.refused.ok()) g.refused = s;
}

void defer(std::shared_future<Status> work, bool blocking) {
  threadGroup().deferred.push_back({std::move(work), blocking});
}

namespace {

// Every communicator's batch at once; the caller's thread takes the first. Kernels (GPU
// buffers) are only prepared there; then every communicator's kernels are launched in
// phases -- all stream entries recorded, all kernels launched, all caller streams made to
// wait -- so that ranks sharing a GPU and a stream never queue one kernel behind another that
// waits for it.
Status runBatches(std::vector<Batch>& batches) {
  if (batches.size() == 1) return batches[0].comm->engine().run(batches[0].ops);
  std::vector<Status> results(batches.size());
  for (size_t i = 1; i < batches.size(); ++i) {
    batches[i].comm->engine().runAsync(&batches[i].ops, &results[i], true);
  }
  results[0] = batches[0].comm->engine().run(batches[0].ops.data(), batches[0].ops.size(), true);
  for (size_t i = 1; i < batches.size(); ++i) batches[i].comm->engine().waitAsync();
  Status first;
  for (const Status& s : results) {
    if (first.ok() && !s.ok()) first = s;
  }
  std::vector<Comm*> dev;
  for (size_t i = 0; i < batches.size(); ++i) {
    bool any = false;
    for (const CollArgs& op : batches[i].ops) any |= op.device;
    if (any && results[i].ok()) dev.push_back(batches[i].comm);
  }
  const bool before = first.ok();
  for (Comm* c : dev) {
    Status s = first.ok() ? c->deviceEngine().enter(/*grouped=*/true) : Status::Ok();
    if (first.ok() && !s.ok()) first = s;
  }
  for (Comm* c : dev) {
    Status s = first.ok() ? c->deviceEngine().launch() : Status::Ok();
    if (first.ok() && !s.ok()) first = s;
  }
  for (Comm* c : dev) {
    Status s = c->deviceEngine().leave();  // also drops what a failure left unlaunched
    if (first.ok() && !s.ok()) first = s;
  }
  if (!first.ok()) {
    // Some of the group's kernels may be queued and others not (none where a communicator's
    // own part failed first, though the others prepared theirs): every communicator with
    // device work fails, and its peers stop waiting for this rank (as Engine::run does for
    // one; a failure there was reported already).
    if (before) TUTTI_WARN("%s", first.message().c_str());
    for (Comm* c : dev) {
      c->setAsyncError(first);
      c->links().breakAll();
      c->deviceEngine().breakLinks();
    }
  }
  return first;
}

std::string ptrText(const void* p) {
  char buf[32];
  snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

// A communicator's device work in a group goes into one CUDA graph or into none. Its streams
// mixing captured and uncaptured ones, or two captures, would pull an uncaptured stream into a
// capture that never joins it back (cudaStreamEndCapture then fails), or put eager kernels
// into a graph. Refused before anything runs; the communicator stays usable. Only a
// communicator that uses two or more streams in the group is asked (nothing is allocated but
// a refusal's message).

Status checkCaptures(const Batch& b) {
  const CollArgs* first = nullptr;
  bool several = false;
  for (const CollArgs& op : b.ops) {
    if (!op.device) continue;
    if (!first) first = &op;
    several |= op.stream != first->stream;
  }
  if (!several) return Status::Ok();
  auto who = [&b] { return "rank " + std::to_string(b.comm->rank()) + ": ncclGroupEnd: "; };
  unsigned long long firstId = 0;
  for (size_t i = 0; i < b.ops.size(); ++i) {
    const CollArgs& op = b.ops[i];
    if (!op.device) continue;
    bool asked = false;  // this stream already, for an earlier operation
    for (size_t j = 0; j < i && !asked; ++j)
      asked = b.ops[j].device && b.ops[j].stream == op.stream;
    if (asked) continue;
    unsigned long long id = 0;
    Status s = cuda::captureIdOn(op.stream, b.comm->cudaDev(), &id);
    if (!s.ok()) {
      return Status(s.code(), who() + "stream " + ptrText(op.stream) + ": " + s.message());
    }
    if (&op == first) {
      firstId = id;
    } else if (id != firstId) {
      auto what = [](unsigned long long c) {
        return c ? "captured into graph capture " + std::to_string(c) : std::string("not captured");
      };
      return invalidUsage(who() + "the communicator's operations use stream " +
                          ptrText(first->stream) + " (" + what(firstId) + ") and stream " +
                          ptrText(op.stream) + " (" + what(id) +
                          "): one communicator's streams in a group must all be captured by "
                          "the same graph or all not captured; nothing queued in the group ran");
    }
  }
  return Status::Ok();
}

// Ranks that read different settings would run steps that do not meet (a wrong result, or a
// wait until TUTTI_TIMEOUT): every rank finds that alike, from the peer table, and refuses the
// operations those settings shape -- GPU buffers' (checkDeviceSettingsAgree) or host buffers'
// (checkHostSettingsAgree) -- before anything runs, so the communicator stays usable for the
// others.
Status checkSettings(Comm* comm, const CollArgs* ops, size_t n) {
  if (comm->nranks() == 1) return Status::Ok();
  bool device = false, host = false;
  for (size_t i = 0; i < n; ++i) (ops[i].device ? device : host) = true;
  auto refuse = [comm](const Status& agree, const char* what) {
    return agree.withContext("rank " + std::to_string(comm->rank()) + ": refusing " + what +
                             " operations; nothing ran");
  };
  if (host && !comm->engine().settingsAgree().ok()) {
    return refuse(comm->engine().settingsAgree(), "host-buffer");
  }
  if (device && !comm->deviceEngine().settingsAgree().ok()) {
    return refuse(comm->deviceEngine().settingsAgree(), "GPU");
  }
  return Status::Ok();
}

// A group's sends and receives on GPU buffers run in launches of whole rounds (the peers at one
// distance round the ranks), at most dev::kMaxP2pOps operations each (devplan::checkP2pRounds):
// a round of more is refused before anything runs, so the communicator stays usable (the
// planner's own check comes after its links connect, and breaks it). It is this rank's own
// verdict: a peer whose group holds the other ends waits for it until TUTTI_TIMEOUT. (The
// blocks they take need no check: the planner fits them to what can be resident,
// DeviceEngine::findP2pBlockCap.)
Status checkSendRecvs(Comm* comm, const CollArgs* ops, size_t n) {
  // Only the GPU buffers' operations: host ones run on the CPU engine, with no such limit.
  std::vector<CollArgs> onGpu;
  size_t count = 0;
  for (size_t i = 0; i < n; ++i) count += ops[i].device;
  if (count == 0) return Status::Ok();
  const CollArgs* dev = ops;
  if (count < n) {
    for (size_t i = 0; i < n; ++i)
      if (ops[i].device) onGpu.push_back(ops[i]);
    dev = onGpu.data();
  }
  const Status s = devplan::checkP2pRounds(comm->rank(), comm->nranks(), dev, count);
  return s.ok() ? s : Status(s.code(), s.message() + "; nothing ran");
}

// Host buffers on a GPU rank: the CPU engine runs them as the group runs, after the work the
// caller queued before on their streams (a copy into the buffer, a kernel that wrote it), as
// NCCL's kernels would. On the caller's thread (cudaStreamPerThread names its stream). A
// device-resident PreMulSum scalar is read then, in the stream's order. The legacy default
// stream is waited for only where a buffer is page-locked: a process that uses no GPU would
// get a CUDA context from that, and work on it cannot write pageable memory but through a
// synchronous copy.
bool needsStreams(const Comm* comm, const CollArgs* ops, size_t n) {
  if (comm->cudaDev() < 0) return false;
  for (size_t i = 0; i < n; ++i) {
    if (!ops[i].device &&
        (!cuda::isLegacyStream(ops[i].stream) || ops[i].red.scalarPtr || ops[i].pageLocked)) {
      return true;
    }
  }
  return false;
}

Status followStreams(const Comm* comm, CollArgs* ops, size_t n) {
  const std::string who = "rank " + std::to_string(comm->rank()) + ": ";
  std::vector<void*> waited;
  for (size_t i = 0; i < n; ++i) {
    CollArgs& op = ops[i];
    if (op.device) continue;
    const bool wait = (!cuda::isLegacyStream(op.stream) || op.pageLocked) &&
                      std::find(waited.begin(), waited.end(), op.stream) == waited.end();
    if (wait) {
      TUTTI_TRY(cuda::streamSynchronize(op.stream, comm->cudaDev())
                    .withContext(who + "waiting for the caller's stream before a host-buffer " +
                                 op.name));
      waited.push_back(op.stream);
    }
    if (op.red.scalarPtr && cuda::pointerKind(op.red.scalarPtr).device) {
      TUTTI_TRY(cuda::readInStreamOrder(op.red.scalar, op.red.scalarPtr, dtypeSize(op.dtype),
                                        op.stream, comm->cudaDev())
                    .withContext(who + op.name + ": reading the PreMulSum scalar"));
      op.red.scalarPtr = nullptr;
    }
  }
  return Status::Ok();
}

// A caller's stream could not be waited for (a CUDA error, sticky as a rule): nothing of the
// group runs, and the peers of each of its communicators stop waiting for this rank.
void broken(std::vector<Batch>& batches, const Status& why) {
  TUTTI_WARN("%s", why.message().c_str());
  for (Batch& b : batches) {
    b.comm->setAsyncError(why);
    b.comm->breakLinks();  // host links, and GPU links where a device engine was made
  }
}

}  // namespace

Status submit(Comm* comm, const CollArgs* ops, size_t n) {
  if (!active()) {
    Status s = checkSettings(comm, ops, n);
    if (s.ok()) s = checkSendRecvs(comm, ops, n);
    std::vector<CollArgs> followed;
    if (s.ok() && needsStreams(comm, ops, n)) {
      followed.assign(ops, ops + n);
      s = followStreams(comm, followed.data(), n);
      ops = followed.data();
      if (!s.ok()) {
        std::vector<Batch> one{{comm, {}}};
        broken(one, s);
      }
    }
    if (s.ok()) s = comm->engine().run(ops, n);
    comm->unpin();
    return s;
  }
  ThreadGroup& tGroup = threadGroup();
  for (Batch& b : tGroup.batches) {
    if (b.comm == comm) {
      b.ops.insert(b.ops.end(), ops, ops + n);
      comm->unpin();  // the batch already holds a pin on this comm
      return Status::Ok();
    }
  }
  std::vector<CollArgs> list;
  if (!tGroup.spare.empty()) {
    list = std::move(tGroup.spare.back());
    tGroup.spare.pop_back();
  }
  list.assign(ops, ops + n);
  tGroup.batches.push_back({comm, std::move(list)});
  return Status::Ok();
}

bool holds(const Comm* comm) {
  const ThreadGroup* g = tGroupState;
  if (!g || g->depth == 0) return false;
  for (const Batch& b : g->batches) {
    if (b.comm == comm) return true;
  }
  return false;
}

void discard(Comm* comm) {
  if (!tGroupState) return;  // this thread never grouped anything
  auto& b = tGroupState->batches;
  for (auto it = b.begin(); it != b.end(); ++it) {
    if (it->comm == comm) {
      comm->unpin();
      b.erase(it);
      return;
    }
  }
}

Status end(bool run) {
  ThreadGroup& tGroup = threadGroup();
  if (tGroup.depth == 0) {
    return invalidUsage("ncclGroupEnd called without a matching ncclGroupStart");
  }
  if (--tGroup.depth > 0) return Status::Ok();
  Status refused;
  std::swap(refused, tGroup.refused);
  std::vector<Deferred> work;
  work.swap(tGroup.deferred);
  std::vector<Batch> batches;
  batches.swap(tGroup.batches);
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
  if (first.ok() && !refused.ok()) {
    size_t queued = 0;
    for (const Batch& b : batches) queued += b.ops.size();
    first = Status(refused.code(), "an operation of this group was refused (" + refused.message() +
                                       "): the group's other " + std::to_string(queued) +
                                       " queued operations were dropped, none of them ran");
  }
  if (!batches.empty()) {
    for (Batch& b : batches) {
      if (first.ok() && run) first = checkSettings(b.comm, b.ops.data(), b.ops.size());
      if (first.ok() && run) first = checkSendRecvs(b.comm, b.ops.data(), b.ops.size());
      if (first.ok() && run) first = checkCaptures(b);
    }
    for (Batch& b : batches) {
      if (first.ok() && run && needsStreams(b.comm, b.ops.data(), b.ops.size())) {
        first = followStreams(b.comm, b.ops.data(), b.ops.size());
        if (!first.ok()) broken(batches, first);
      }
    }
    if (first.ok() && run) first = runBatches(batches);
    for (Batch& b : batches) {
      b.comm->unpin();
      b.ops.clear();
      tGroup.spare.push_back(std::move(b.ops));
    }
    batches.clear();
    if (tGroup.batches.empty()) tGroup.batches.swap(batches);  // keep the capacity
  }
  if (!first.ok()) return first;
  if (pending) return Status(Code::kInProgress, "nonblocking operations still in progress");
  return Status::Ok();
}

}  // namespace tutti::group
