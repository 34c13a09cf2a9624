// The device engine's launch of a prepared group (runtime/device_engine.h): stream entries
// shared by sibling ranks, the order of one communicator's launches across streams and CUDA
// graph captures, the launch itself and the join back onto the caller's streams.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/comm.h"
#include "runtime/device_engine.h"
#include "runtime/log.h"
#include "runtime/stream_entries.h"

#ifdef TUTTI_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "runtime/cuda_scope.h"
#endif

namespace tutti {

#ifdef TUTTI_HAVE_CUDA

// Ranks of one communicator in this process on one GPU that pass the same stream share one
// entry per operation: the first to enter records it, the others wait for that same point.
// Stream order cannot hold for each of them separately -- the second call would queue behind
// the first call's join, which waits for the second rank's kernel -- so a rank called later
// from another thread waits only for the stream work issued before the first sibling's call.
// Inside one group (runBatches) all entries come before any join, and nothing changes.
// Nothing is queued on a stream under a lock the siblings share (runtime/stream_entries.h).
namespace {
bool isLegacyStream(const void* s) { return s == nullptr || s == cudaStreamLegacy; }

// Used events, per GPU, for next entries. All are kept: an event is made only where the pool is
// empty, so there are never more than the most entries ever held at once (at most the table's
// bound). A cap made a thread that runs ahead of its siblings (every eager loop does: nothing
// holds a rank's launches back until the GPU's queue is full) destroy events that others made
// again at once, about one of each per operation, each a CUDA call costing microseconds.
std::mutex gPoolMu;
std::map<int, std::vector<cudaEvent_t>> gFreeEvents;

void releaseEvent(DeviceEvent e) {
  std::lock_guard<std::mutex> lock(gPoolMu);
  gFreeEvents[e.device].push_back(static_cast<cudaEvent_t>(e.event));
}
// Entries of siblings that use streams of their own are never claimed: they go once every
// sibling has passed their group (StreamEntries::entered); the bound is for the rest.
StreamEntries<DeviceEvent> gShared(8192, releaseEvent);

// The rank of a communicator whose sends and receives last entered a stream outside a group,
// per (communicator, GPU, stream): only to tell a rank that it shares that stream with a
// sibling there.
struct StreamUse {
  uint64_t comm;
  int dev;
  const void* stream;
  bool operator<(const StreamUse& o) const {
    if (comm != o.comm) return comm < o.comm;
    return dev != o.dev ? dev < o.dev : stream < o.stream;
  }
};
std::mutex gUseMu;
std::map<StreamUse, int> gLastUser;

// Records `rank` as the stream's last user; returns the one before it (-1: none).
int swapLastUser(const StreamUse& use, int rank) {
  std::lock_guard<std::mutex> lock(gUseMu);
  if (gLastUser.size() > 4096) gLastUser.clear();  // a stale handle only costs a warning
  auto [it, made] = gLastUser.emplace(use, rank);
  const int before = made ? -1 : it->second;
  it->second = rank;
  return before;
}
}  // namespace

// direct: the group may launch on this stream itself (it names no other). A sibling that
// finds another rank's entry for this stream and group is a follower: its own stream waits
// for that entry, and it launches there.
Status DeviceEngine::enterStream(void* s, bool grouped, bool direct, bool* follower) {
  auto own = static_cast<cudaStream_t>(stream_);
  auto stream = static_cast<cudaStream_t>(s);
  // None takes part: the stream's order is safe. Or sends and receives among siblings in one
  // group with theirs (runBatches): every rank records its own entry here before any launch of
  // the group, so none waits behind another's join; a shared entry, keyed by the set of ranks
  // each names, could match a sibling's from an earlier group (a ring's {0, 1, 2} on rank 1, a
  // fan-out's on rank 0) and skip the stream work queued since.
  if (groupSiblings_ == 0 || (grouped && groupPos_.set != 0)) {
    if (direct) return Status::Ok();
    // The own stream waits for what the caller's stream holds now.
    auto e = static_cast<cudaEvent_t>(entry_);
    Status st = cudaCheck("cudaEventRecord on the caller's stream", cudaEventRecord(e, stream));
    return st.ok() ? cudaCheck("cudaStreamWaitEvent", cudaStreamWaitEvent(own, e, 0)) : st;
  }
  const int dev = comm_.cudaDev();
  // cudaStreamPerThread is another stream on each thread: its key names the thread.
  static thread_local char tPerThread;
  const void* streamKey = s == cudaStreamPerThread ? &tPerThread : s;
  const StreamEntryKey key{comm_.commHash(), dev, streamKey, groupPos_};
  const int lastUser =
      groupPos_.set != 0 ? swapLastUser({comm_.commHash(), dev, streamKey}, comm_.rank()) : -1;
  if (lastUser >= 0 && lastUser != comm_.rank() && !warnedSharedP2p_) {
    // Their entries match only where both name the same ranks (a pair's exchange): in a ring
    // (send to r + 1, receive from r - 1) each rank leads, behind the joins of those before.
    warnedSharedP2p_ = true;
    TUTTI_WARN(
        "rank %d sends or receives on stream %p, which rank %d of its communicator on GPU %d "
        "used too, called from another thread outside a group: unless every such group names "
        "the same ranks (a pair exchanging), each rank's kernel may queue behind another's "
        "join, which waits for it (a deadlock, until TUTTI_TIMEOUT). Call them in one "
        "ncclGroupStart/End, or give each rank a stream of its own",
        comm_.rank(), s, lastUser, dev);
  }
  Status made;
  auto make = [&](DeviceEvent* e) {
    e->device = dev;
    {
      std::lock_guard<std::mutex> lock(gPoolMu);
      std::vector<cudaEvent_t>& pool = gFreeEvents[dev];
      if (!pool.empty()) {
        e->event = pool.back();
        pool.pop_back();
        return true;
      }
    }
    cudaEvent_t ev;
    made = cudaCheck("cudaEventCreate", cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    e->event = ev;
    return made.ok();
  };
  if (isLegacyStream(s) && !grouped && !warnedLegacy_) {
    warnedLegacy_ = true;
    TUTTI_WARN(
        "rank %d passes the legacy default stream (0), not in one group with the other ranks of "
        "its communicator that share GPU %d: stream 0 and blocking streams wait for each "
        "other's earlier work, so a sibling's kernel queued on a blocking stream before this "
        "call would make this rank's entry on stream 0 wait for it, and that kernel waits for "
        "this rank (a deadlock). Give each rank a stream created with cudaStreamNonBlocking, or "
        "call them in one ncclGroupStart/End",
        comm_.rank(), dev);
  }
  bool first = false;
  Entries::Ref entry = gShared.join(key, groupSiblings_, comm_.rank(), direct, make, &first);
  if (!entry) return made;
  const auto ev = static_cast<cudaEvent_t>(entry->event.event);
  if (!first) {
    *follower = true;
    if (!grouped && !warnedShared_) {
      warnedShared_ = true;
      TUTTI_WARN(
          "rank %d shares stream %p with another rank of its communicator on GPU %d, called "
          "from another thread outside a group: each would wait for the other, so its "
          "operations start after the stream work issued before the first of them was called "
          "(work this thread queued on the stream since may not be finished). Call them in one "
          "ncclGroupStart/End, or give each rank a stream of its own",
          comm_.rank(), s, dev);
    }
    TUTTI_TRY(waitFirst(entry, /*launch=*/false));
    TUTTI_TRY(cudaCheck("cudaStreamWaitEvent", cudaStreamWaitEvent(own, ev, 0)));
    if (entry->onStream) following_.push_back(std::move(entry));
    return Status::Ok();
  }
  // The first of the siblings here: records where the stream stands for the others.
  Status st = cudaCheck("cudaEventRecord on the caller's stream", cudaEventRecord(ev, stream));
  if (st.ok() && !direct) st = cudaCheck("cudaStreamWaitEvent", cudaStreamWaitEvent(own, ev, 0));
  gShared.recorded(entry, st.ok());
  if (direct) {
    leading_.push_back(std::move(entry));  // launched() once its kernels are queued
  }
  return st;
}

// A follower waits for its first sibling's thread: until the entry is recorded, or (before
// joining the shared stream) until the first's kernels are queued there.
Status DeviceEngine::waitFirst(const Entries::Ref& e, bool launch) {
  using Wait = Entries::Wait;
  auto stop = [this] { return comm_.aborted(); };
  const Wait w =
      launch ? gShared.waitLaunched(e, timeoutS_, stop) : gShared.waitRecorded(e, timeoutS_, stop);
  if (w == Wait::kReady) return Status::Ok();  // every operation of a follower: no message
  const std::string what = "rank " + std::to_string(comm_.rank()) + " (GPU " +
                           std::to_string(comm_.cudaDev()) + ") waited for rank " +
                           std::to_string(e->firstRank) + ", which shares its stream, to " +
                           (launch ? "queue its kernels" : "record its entry event");
  switch (w) {
    case Wait::kReady:
      break;
    case Wait::kFailed:
      return remoteError(what + ": rank " + std::to_string(e->firstRank) +
                         " failed to record it (its own error says why)");
    case Wait::kStopped:
      return remoteError(what + ": the communicator was aborted (ncclCommAbort)");
    case Wait::kTimedOut:
      return timeoutError(what + " for more than " + std::to_string(int64_t(timeoutS_)) +
                          " s (TUTTI_TIMEOUT): is its thread stuck?");
  }
  return Status::Ok();
}

// The first sibling's kernels are queued (or will not be): followers may join the stream.
void DeviceEngine::releaseFollowers() {
  for (Entries::Ref& e : leading_) gShared.launched(e);
  leading_.clear();
}

Status DeviceEngine::enter(bool grouped) {
  std::lock_guard<std::mutex> lock(mu_);
  target_ = stream_;
  onCaller_ = false;
  launched_ = false;
  entered_ = false;
  if (!ready_ || (plan_.launches.empty() && plan_.copies.empty())) return Status::Ok();
  DeviceGuard guard(comm_.cudaDev());
  if (siblings_ > 0) {
    gShared.entered(comm_.commHash(), comm_.cudaDev(), comm_.rank(), siblings_ + 1, groupPos_);
  }
  // Not on the legacy default stream itself: it and every blocking stream wait for each
  // other's earlier work, so a kernel there and a sibling's on a blocking stream could each
  // wait for the other. Its kernels go on the own stream, after an entry recorded on it, and
  // it waits for them (as for a group on several streams).
  // Nor, in one group with its siblings (runBatches), a group of sends and receives among them:
  // their sets of ranks may differ (a ring: {r - 1, r, r + 1}), so their entries do not match,
  // each would lead on the shared stream, and the first kernel there waits for one queued
  // behind it. On the own stream, after an entry every rank of the group records on the
  // caller's stream before any launch, none waits behind another.
  const bool direct = streams_.size() == 1 && !isLegacyStream(streams_[0]) &&
                      !(grouped && groupPos_.set != 0 && groupSiblings_ > 0);
  // Before any record or wait: the own stream, once it joined a capture, is in it until that
  // capture ends; an eager group (or one for another capture) must not wait there.
  if (ownJoinedCapture_ && (!direct || groupSiblings_ > 0)) TUTTI_TRY(checkOwnCapture());
  bool follower = false;
  for (void* s : streams_) {
    Status st = enterStream(s, grouped, direct, &follower);
    if (!st.ok()) {
      // The own stream may have joined a capture before the failure: check from now on.
      if (!direct || groupSiblings_ > 0) ownJoinedCapture_ = true;
      return st;
    }
  }
  if (direct && !follower) {
    target_ = streams_[0];
    onCaller_ = true;
  }
  entered_ = true;
  return orderAfterLast();
}

// The target stream waits for this communicator's last launch (serial_) unless stream order
// already gives that: the same stream as the last launch, in the same capture or outside any,
// and no launch ever captured. One query per operation (legal in a capture); the wait only
// where needed. Copies alone (one rank) touch no FIFO and need no order. The default streams'
// handles (0, cudaStreamLegacy, cudaStreamPerThread) never count as the same stream: the
// per-thread one is another stream on each thread.
// In a capture: after a launch into the same capture, an edge from it (capEv_, recorded there;
// nothing where stream order gives it); else an external wait for serial_, so each replay
// waits for the launch before it (and records serial_ as its kernels end: markLaunched).
// NCCL_GRAPH_MIXING_SUPPORT=0 (as in NCCL) leaves out the external nodes: the caller promises
// that replays and other calls of the communicator never overlap. Launches within one graph
// are still ordered.
Status DeviceEngine::orderAfterLast() {
  capture_ = Capture::kNone;
  if (plan_.launches.empty() && onCaller_) return Status::Ok();
  auto target = static_cast<cudaStream_t>(target_);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  TUTTI_TRY(cudaCheck("cudaStreamGetCaptureInfo", cudaStreamGetCaptureInfo(target, &status, &id)));
  if (status != cudaStreamCaptureStatusNone && !onCaller_) ownJoinedCapture_ = true;
  if (plan_.launches.empty()) {  // copies alone need no order; their join needs to know
    if (status != cudaStreamCaptureStatusNone) capture_ = Capture::kUnordered;
    return Status::Ok();
  }
  const bool sameStream = lastTarget_ == target_ && reinterpret_cast<uintptr_t>(target_) > 2;
  if (status == cudaStreamCaptureStatusNone) {
    if (!capturedEver_ && lastKnown_ && sameStream && lastCapture_ == 0) return Status::Ok();
    return cudaCheck("cudaStreamWaitEvent for this communicator's last launch",
                     cudaStreamWaitEvent(target, static_cast<cudaEvent_t>(serial_), 0));
  }
  captureId_ = id;
  capture_ = graphMixing_ ? Capture::kOrdered : Capture::kUnordered;
  capturedEver_ = capturedEver_ || graphMixing_;
  if (capEvCapture_ == id) {
    if (sameStream && lastCapture_ == id) return Status::Ok();
    return cudaCheck("cudaStreamWaitEvent (in a graph capture)",
                     cudaStreamWaitEvent(target, static_cast<cudaEvent_t>(capEv_), 0));
  }
  if (!graphMixing_) return Status::Ok();
  return cudaCheck(
      "cudaStreamWaitEvent (external, in a graph capture)",
      cudaStreamWaitEvent(target, static_cast<cudaEvent_t>(serial_), cudaEventWaitExternal));
}

// The own stream joins a capture by waiting for the caller's streams, and stays in it until
// that capture ends. An eager group (or one for another capture) made to wait there would
// break that capture: refused, naming it, before anything is recorded. Asked only once the own
// stream has joined a capture.
Status DeviceEngine::checkOwnCapture() const {
  auto idOf = [this](void* stream, unsigned long long* id) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    Status st = cudaCheck("cudaStreamGetCaptureInfo",
                          cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, id));
    if (status == cudaStreamCaptureStatusNone) *id = 0;
    return st;
  };
  unsigned long long own = 0, id = 0;
  TUTTI_TRY(idOf(stream_, &own));
  TUTTI_TRY(idOf(streams_[0], &id));
  if (own == 0 || own == id) return Status::Ok();
  return invalidUsage("rank " + std::to_string(comm_.rank()) +
                      ": the communicator's own stream is still in graph capture " +
                      std::to_string(own) +
                      " (a group on several streams, or ranks sharing a stream, were captured "
                      "there and the capture has not ended), and this operation's stream is " +
                      (id ? "in capture " + std::to_string(id) : std::string("not captured")) +
                      ": end that capture first");
}

// Right after the kernels are queued, before followers may queue behind them on a shared
// stream: serial_ marks their end (for the next launch, the destructor and abort); in a
// capture capEv_ too, for the next launch of the same capture.
Status DeviceEngine::markLaunched() {
  launched_ = true;
  if (plan_.launches.empty()) return Status::Ok();  // copies alone: serial_ still holds
  auto target = static_cast<cudaStream_t>(target_);
  lastKnown_ = false;
  lastTarget_ = target_;
  lastCapture_ = capture_ == Capture::kNone ? 0 : captureId_;
  if (capture_ != Capture::kNone) capEvCapture_ = 0;  // until capEv_ is recorded below
  Status r;
  // serial_ first: in a capture, capEv_ then follows its external record, so the next launch
  // of the capture comes after it and the graph's records of serial_ form one chain (an eager
  // wait after a replay waits for the last).
  if (capture_ != Capture::kUnordered) {
    r = cudaCheck("cudaEventRecord",
                  cudaEventRecordWithFlags(static_cast<cudaEvent_t>(serial_), target,
                                           capture_ == Capture::kOrdered ? cudaEventRecordExternal
                                                                         : cudaEventRecordDefault));
    lastKnown_ = r.ok() && capture_ == Capture::kNone;
  }
  if (r.ok() && capture_ != Capture::kNone) {
    r = cudaCheck("cudaEventRecord (in a graph capture)",
                  cudaEventRecord(static_cast<cudaEvent_t>(capEv_), target));
    capEvCapture_ = r.ok() ? captureId_ : 0;
    lastKnown_ = r.ok();
  }
  return r;
}

Status DeviceEngine::launch() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ready_) return Status::Ok();
  DeviceGuard guard(comm_.cudaDev());
  launches_.fetch_add(1, std::memory_order_acq_rel);  // before: noteAbort compares
  Status st = launchAll();
  Status m = markLaunched();  // also after a failure: it covers what was queued
  if (st.ok()) st = m;
  releaseFollowers();  // queued, or never will be
  return st;
}

Status DeviceEngine::launchAll() {
  auto target = static_cast<cudaStream_t>(target_);
  size_t next = 0;  // copies go in plan order among the launches
  auto copiesBefore = [&](size_t launch) {
    for (; next < plan_.copies.size() && plan_.copies[next].beforeLaunch <= launch; ++next) {
      const devplan::Copy& c = plan_.copies[next];
      TUTTI_TRY(cudaCheck("cudaMemcpyAsync (device to device)",
                          cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, target)));
    }
    return Status::Ok();
  };
  for (size_t i = 0; i < plan_.launches.size(); ++i) {
    TUTTI_TRY(copiesBefore(i));
    TUTTI_TRY(launchOne(i));
  }
  return copiesBefore(plan_.launches.size());
}

Status DeviceEngine::launchOne(size_t i) {
  const devplan::Launch& l = plan_.launches[i];
  auto target = static_cast<cudaStream_t>(target_);
  const dim3 grid(unsigned(l.blocks)), block(unsigned(l.threads));
  // Which operation, and how the launch was shaped: what a failed launch is asked first.
  auto failed = [&](const char* call, int err) {
    const dev::DevOp& first = l.work.ops[0];
    const size_t more = size_t(std::max(l.work.nops, 1) - 1) + l.more.size();
    const std::string what =
        "launching the kernel of nccl" + std::string(collKindName(CollKind(first.kind))) +
        " (opCount " + std::to_string(first.seq) +
        (more > 0 ? ", with " + std::to_string(more) + " more in its group" : std::string()) +
        ") on GPU " + std::to_string(comm_.cudaDev()) + ", " + std::to_string(l.blocks) +
        " blocks of " + std::to_string(l.threads) + " threads: " + call;
    return cudaCheck(what.c_str(), err);
  };
  // The runtime's launch: the whole parameter at `param`, copied at the launch.
  auto runtimeLaunch = [&](void* param) {
    void* args[] = {param};
    return int(cudaLaunchKernel(kernels_[i], grid, block, args, 0, target));
  };
  if (!l.more.empty()) {  // sends and receives past dev::kMaxOps: their kernel's parameter
    const int err = runtimeLaunch(devplan::p2pWork(l).get());
    return err == cudaSuccess ? Status::Ok() : failed("cudaLaunchKernel", err);
  }
  size_t bytes = dev::packArgs(l.work, args_.get());
  auto f = functions_.find(kernels_[i]);
  auto drv = fullParams_ ? nullptr : reinterpret_cast<PFN_cuLaunchKernel_v4000>(driverLaunch_);
  if (drv && f != functions_.end()) {
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args_.get(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &bytes, CU_LAUNCH_PARAM_END};
    const CUresult r = drv(static_cast<CUfunction>(f->second), grid.x, 1, 1, block.x, 1, 1, 0,
                           reinterpret_cast<CUstream>(target), nullptr, extra);
    if (r == CUDA_SUCCESS) return Status::Ok();
    // Refusals that queue nothing: a parameter buffer shorter than the parameter (a driver
    // that wants it whole), or a function, context or call this driver or thread does not
    // take. Those go by the runtime's launch, which has always worked, from now on if it works
    // now. Anything else (out of resources, an earlier kernel's fault) is the launch's error.
    const bool refused = r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_HANDLE ||
                         r == CUDA_ERROR_INVALID_CONTEXT || r == CUDA_ERROR_NOT_SUPPORTED;
    const std::string driverCall = "cuLaunchKernel (CUresult " + std::to_string(int(r)) + ")";
    if (!refused) return failed(driverCall.c_str(), int(r));  // the codes are the runtime's too
    const int err = runtimeLaunch(args_.get());
    if (err != cudaSuccess) {
      return failed(("cudaLaunchKernel, after " + driverCall + " refused the parameter's " +
                     std::to_string(bytes) + " bytes")
                        .c_str(),
                    err);
    }
    fullParams_ = true;
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      TUTTI_WARN(
          "rank %d: cuLaunchKernel with the %zu bytes of its parameter the kernel uses "
          "failed (CUresult %d: %s) where cudaLaunchKernel with all %zu did not: this "
          "communicator's launches pass them all from now on (slower to launch, no "
          "other difference; said once per process)",
          comm_.rank(), bytes, int(r), cudaGetErrorName(static_cast<cudaError_t>(r)),
          sizeof(dev::DevArgs));
    }
    return Status::Ok();
  }
  const int err = runtimeLaunch(args_.get());
  return err == cudaSuccess ? Status::Ok() : failed("cudaLaunchKernel", err);
}

Status DeviceEngine::leave() {
  std::lock_guard<std::mutex> lock(mu_);
  releaseFollowers();  // where launch() never ran (another communicator's failure)
  if (!ready_ || !entered_ || (plan_.launches.empty() && plan_.copies.empty())) {
    following_.clear();
    clearPlan();
    return Status::Ok();
  }
  entered_ = false;
  DeviceGuard guard(comm_.cudaDev());
  auto own = static_cast<cudaStream_t>(stream_);
  Status st;
  // A follower joins the shared stream only behind the kernels its first queued there.
  for (const Entries::Ref& e : following_) {
    Status w = waitFirst(e, /*launch=*/true);
    if (st.ok() && !w.ok()) st = w;
  }
  following_.clear();
  if (onCaller_) {
    // Launched on the caller's stream: stream order is the fence.
    clearPlan();
    return st;
  }
  // The caller's streams wait for the own stream. Outside a capture serial_ marked that point
  // as the kernels were queued; a captured group needs a captured record (not an external
  // one) to join them back, and copies alone (or a launch that never ran) recorded none.
  Status r;
  void* joinEv = serial_;
  if (capture_ != Capture::kNone || plan_.launches.empty() || !launched_ || !lastKnown_) {
    joinEv = done_;
    r = cudaCheck("cudaEventRecord", cudaEventRecord(static_cast<cudaEvent_t>(done_), own));
    doneCaptured_ = capture_ != Capture::kNone;
    if (st.ok()) st = r;
  }
  for (void* s : streams_) {
    if (!r.ok()) break;
    r = cudaCheck(
        "cudaStreamWaitEvent on the caller's stream",
        cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(joinEv), 0));
    if (st.ok()) st = r;
  }
  clearPlan();
  return st;
}

Status DeviceEngine::launchPrepared() {
  Status s = enter();
  if (s.ok()) s = launch();
  Status l = leave();  // clears the plan whatever happened
  return s.ok() ? l : s;
}

#else  // !TUTTI_HAVE_CUDA: no GPU buffers can reach here (validation finds none).

Status DeviceEngine::enter(bool) { return Status::Ok(); }
Status DeviceEngine::launch() { return Status::Ok(); }
Status DeviceEngine::leave() { return Status::Ok(); }
Status DeviceEngine::launchPrepared() { return Status::Ok(); }

#endif

}  // namespace tutti
