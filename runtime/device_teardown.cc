// The device engine's end and its failures: the destructor (what it frees, waits for or leaves
// to the process's exit), abort's look at the work in flight, breaking the links, the watch on
// peer processes, and the kernels' errors as messages. Set-up and planning are in
// runtime/device_engine.cc, the launches in runtime/device_launch.cc.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/comm.h"
#include "runtime/device_engine.h"
#include "runtime/links.h"
#include "runtime/log.h"
#include "runtime/peer_info.h"
#include "runtime/peer_watch.h"

#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_scope.h"
#endif

namespace tutti {

#ifdef TUTTI_HAVE_CUDA

namespace {
// Every engine whose events exist, in this process: an abort asks whether another
// communicator's work is in flight on its GPU. Engines leave before their events go. Never
// freed: an engine may go during the process's static destruction.
struct EngineList {
  std::mutex mu;
  std::vector<const DeviceEngine*> engines;
};
EngineList& engineList() {
  static EngineList* list = new EngineList;
  return *list;
}

// Whether pending() turned false within `limit`, asking every millisecond: no call that blocks.
template <class Pending>
bool endsWithin(std::chrono::milliseconds limit, Pending&& pending) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (pending()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Whether the stream's work and the event's launch finished (or failed) within `limit`.
bool finishedWithin(cudaStream_t stream, cudaEvent_t event, std::chrono::milliseconds limit) {
  return endsWithin(limit, [&] {
    return cudaStreamQuery(stream) == cudaErrorNotReady ||
           (event && cudaEventQuery(event) == cudaErrorNotReady);
  });
}

// Frees on threads of their own, one per job (a job whose cudaFree waits for a kernel that
// does not end soon holds up no other). cudaFree and its like wait for the whole GPU; on a
// thread that is also a rank of another communicator whose ranks share the GPU as threads,
// that wait could meet a sibling's kernel that waits for this very thread's next call (a
// sibling that went on to the next collective at once): until TUTTI_TIMEOUT. At the process's
// exit (an atexit handler, which runs before CUDA's own teardown, registered earlier) the jobs
// under way get 5 s to end; a job posted after that, or whose GPU cannot be made current, is
// left undone, its memory to the process's end (never freed on the posting thread).
class Reaper {
 public:
  static void post(int device, std::function<void()> work) {
    Reaper& r = get();
    auto* job = new std::function<void()>(std::move(work));
    {
      std::lock_guard<std::mutex> lock(r.mu_);
      if (r.exiting_) return;  // (job leaked on purpose, and with it what it would free)
      ++r.running_;
    }
    try {
      std::thread([&r, device, job] {
        {
          CaptureModeRelaxed relaxed;  // frees are forbidden while another thread captures
          if (cudaSetDevice(device) == cudaSuccess) {
            (*job)();
            delete job;
          }
          cudaGetLastError();  // (this thread's own: nobody reads it)
        }
        r.ended();  // after this thread's last CUDA call: the exit's drain may go on
      }).detach();
    } catch (const std::exception&) {  // no thread: the memory stays to the process's end
      r.ended();
    }
  }

 private:
  static Reaper& get() {
    static Reaper* r = new Reaper;  // never destroyed: its threads may outlive static destruction
    return *r;
  }
  Reaper() {
    std::atexit([] { get().drain(); });
  }
  void ended() {
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::seconds(5), [this] { return running_ == 0; });
    exiting_ = true;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  int running_ = 0;
  bool exiting_ = false;
};

// Whether the event's last record has yet to complete (a failed query counts as done; its error
// is cleared).
bool eventPending(void* ev) {
  if (!ev) return false;
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
  if (e != cudaSuccess && e != cudaErrorNotReady) cudaGetLastError();
  return e == cudaErrorNotReady;
}
}  // namespace

void DeviceEngine::listEngine() {
  EngineList& l = engineList();
  std::lock_guard<std::mutex> lock(l.mu);
  if (std::find(l.engines.begin(), l.engines.end(), this) == l.engines.end())
    l.engines.push_back(this);
}

DeviceEngine::~DeviceEngine() {
  // Teardown may run while another thread captures a graph in the global mode, which
  // forbids this thread cudaFree and its like (they would fail, and invalidate that capture).
  CaptureModeRelaxed relaxed;
  {
    EngineList& l = engineList();
    std::lock_guard<std::mutex> lock(l.mu);
    l.engines.erase(std::remove(l.engines.begin(), l.engines.end(), this), l.engines.end());
  }
  if (watch_) peerwatch::remove(watch_);  // before the links go: the watch marks them
  if (stream_) {
    // The FIFOs and the mapped words must outlive every kernel that uses them.
    DeviceGuard guard(comm_.cudaDev());
    const bool aborted = comm_.aborted();
    // Kept where noteAbort found work, or a launch came after it (a call already past its
    // checks when the abort began).
    bool keep = aborted && (busyAtAbort_.load(std::memory_order_acquire) ||
                            launches_.load(std::memory_order_acquire) != launchesAtAbort_);
    // Where ranks of this process share this GPU as threads, the memory is freed on a thread
    // of its own (Reaper): cudaFree waits for the whole GPU, where a sibling's kernel may wait
    // for this thread's next call (a sibling that went on to its next collective while this
    // one destroys or aborts). Elsewhere, nor where another communicator's kernel is in
    // flight on this GPU: that kernel may wait for a peer that this aborting thread was about
    // to abort next (a watchdog ending one communicator after another). In a destroy, only a
    // kernel that may wait for a thread of this process counts (any other kernel ends without
    // this thread, and cudaFree waits for it as NCCL's does). So too where ranks of this
    // communicator are threads on other GPUs: the last end of a link frees the FIFO on its
    // peer's GPU, where a kernel of another communicator may wait for this thread (a peer that
    // aborted its end first and went on to its next collective; threadsOnOtherGpus).
    const bool offThread = threadsShareGpuHere() || threadsOnOtherGpus();
    const bool othersBusy = !keep && !offThread && othersBusyOnGpu(/*siblingsOnly=*/!aborted);
    keep = keep || othersBusy;
    if (aborted) breakLinks();  // peers' kernels stop before anything is freed
    auto stream = static_cast<cudaStream_t>(stream_);
    auto last = static_cast<cudaEvent_t>(serial_);  // the last launch, on whichever stream
    // Memory that peers' or this rank's kernels may still use is left to the process's exit.
    auto leave = [this](const char* why) {
      const size_t bytes = links_ ? links_->abandonAll() : 0;
      TUTTI_WARN(
          "rank %d: %s: %zu bytes of GPU memory (its FIFOs) stay allocated until the "
          "process exits",
          comm_.rank(), why, bytes);
    };
    if (!aborted) {
      cudaStreamSynchronize(stream);
      if (last) cudaEventSynchronize(last);
    } else if (!keep && !finishedWithin(stream, last, std::chrono::seconds(5))) {
      // (Kept memory needs no wait at all: destroying a stream or event with work pending
      // returns at once, and nothing is freed.)
      // Kernels see the abort word within microseconds; this work has not even started: it is
      // queued behind something that does not end (another communicator's stuck kernel on a
      // caller's stream, say). Waiting for it would hang the abort, so the stream, the events
      // and the words (the abort word stays set for a kernel that starts later) stay too.
      comm_.setDeviceAbortWord(nullptr);
      leave(
          "aborted while its GPU work had not finished 5 s later (queued behind another "
          "communicator's kernel?); its stream and events stay too");
      links_.reset();
      return;  // (the guard clears our failures, not an error the application has yet to read)
    }
    comm_.setDeviceAbortWord(nullptr);
    for (void* ev : {entry_, done_, serial_, capEv_}) {
      if (ev) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
    }
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    // An abort with work in flight frees no memory (see noteAbort): the words, like the links'
    // FIFOs, are left to the process's exit.
    if (othersBusy) {
      leave(aborted ? "aborted while another communicator's GPU work was in flight on its GPU, "
                      "which a cudaFree would wait for"
                    : "destroyed while another communicator's kernel was in flight on its GPU "
                      "for more than 2 s, which a cudaFree would wait for (that kernel may wait "
                      "for this thread's next call)");
    } else if (keep) {
      leave("aborted with GPU work in flight or failed, so peers' kernels may still use it");
    } else {
      // Idle here, but a peer process's kernel may still write into this rank's FIFOs: kept.
      const size_t kept = aborted && links_ ? links_->keepIfOtherProcessesWrite() : 0;
      if (kept > 0) {
        TUTTI_WARN(
            "rank %d: aborted: %zu bytes of GPU memory (its FIFOs that ranks in other "
            "processes write into, which their kernels may still do) stay allocated a while: "
            "the process's next communicator on GPUs frees them (TUTTI_ABORT_KEEP_S after the "
            "abort at the earliest), else its exit",
            comm_.rank(), kept);
      }
      void* abortHost = abortHost_;
      void* errHost = errHost_.load();
      void* errClaim = errClaim_;
      auto conns = std::make_shared<std::vector<std::unique_ptr<transport::Connection>>>(
          links_ ? links_->takeConnections()
                 : std::vector<std::unique_ptr<transport::Connection>>{});
      auto free = [abortHost, errHost, errClaim, conns] {
        cudaFreeHost(abortHost);
        cudaFreeHost(errHost);
        cudaFree(errClaim);
        conns->clear();  // FIFOs and IPC handles: on this GPU too
      };
      if (offThread) {
        Reaper::post(comm_.cudaDev(), std::move(free));
      } else {
        free();
      }
    }
    links_.reset();
  }
  links_.reset();
}

// As an abort begins, before the abort word stops the kernels: was device work of this
// communicator in flight, or had a kernel failed? Then peers' kernels may still read and write
// this rank's FIFOs (until they see the broken words), and a cudaFree may wait for the whole
// GPU, where another communicator's kernel may wait for the aborting thread (a watchdog that
// aborts one communicator after another). Such an abort frees nothing. The abort of an idle,
// healthy communicator -- a framework's ordinary teardown -- frees everything, as destroy does,
// but the FIFOs that ranks of other processes write into, which are freed a while later
// (transports/p2p: KeptFifos).
// A replay of a captured launch records serial_ as it ends, so a hung replay counts as work in
// flight too.
void DeviceEngine::noteAbort() {
  launchesAtAbort_ = launches_.load(std::memory_order_acquire);
  bool busy = true;                                          // a launch under way: keep
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);  // never wait for a launch here
  if (lock.owns_lock()) {
    busy = false;
    if (ready_) {
      DeviceGuard guard(comm_.cudaDev());
      // Relaxed: a query from this thread must not disturb another thread's graph capture.
      CaptureModeRelaxed relaxed;
      // done_ last recorded in a capture that may still be open: a query would break it.
      busy =
          !kernelError().ok() || (!doneCaptured_ && eventPending(done_)) || eventPending(serial_);
    }
  }
  busyAtAbort_.store(busy, std::memory_order_release);
}

bool DeviceEngine::threadsShareGpuHere() const {
  if (siblings_ > 0) return true;
  EngineList& l = engineList();
  std::lock_guard<std::mutex> lock(l.mu);
  for (const DeviceEngine* e : l.engines) {
    if (e != this && e->comm_.cudaDev() == comm_.cudaDev() && e->siblings_ > 0) return true;
  }
  return false;
}

bool DeviceEngine::threadsOnOtherGpus() const {
  const std::vector<PeerInfo>& peers = comm_.peers();
  const PeerInfo& me = peers[size_t(comm_.rank())];
  for (const PeerInfo& p : peers) {
    if (p.pid == me.pid && p.pidNs == me.pidNs && p.cudaDev >= 0 && !sameGpu(p, me)) return true;
  }
  return false;
}

bool DeviceEngine::othersBusyOnGpu(bool siblingsOnly) const {
  // Their last launch's end (serial_) alone: it is recorded outside a capture or as an external
  // node, so a query never touches an open capture (done_ may be recorded in one just before
  // its doneCaptured_ says so, and the other engine's lock is not held here). Work that ends
  // within 2 s (another communicator's collective under way) is waited for: only a stuck
  // kernel leaves this engine's memory to the process's exit.
  return !endsWithin(std::chrono::seconds(2), [this, siblingsOnly] {
    EngineList& l = engineList();
    std::lock_guard<std::mutex> lock(l.mu);
    for (const DeviceEngine* e : l.engines) {
      // (Not, in a destroy, this communicator's other ranks here: their kernels wait for this
      // rank's, launched already, never for this thread's next call.)
      if (e != this && e->comm_.cudaDev() == comm_.cudaDev() &&
          (!siblingsOnly || (e->siblings_ > 0 && e->comm_.commHash() != comm_.commHash())) &&
          eventPending(e->serial_))
        return true;
    }
    return false;
  });
}

void DeviceEngine::breakLinks() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!links_) return;
  DeviceGuard guard(comm_.cudaDev());  // abort may come from a thread on another GPU
  links_->breakAll();
}

// A kernel that waits for a peer process cannot see it exit; the process-wide watch can. The
// links to a peer that exited are marked broken, so this rank's kernels waiting on them stop
// at once (kErrPeer) instead of at TUTTI_TIMEOUT; later operations fail the same way. A peer
// that exits after the work it took part in (a job's ordinary end) leaves links marked that
// nothing waits on; they are freed as usual (only an abort with work in flight abandons them).
void DeviceEngine::watchPeers() {
  const PeerInfo& me = comm_.peers()[size_t(comm_.rank())];
  std::vector<peerwatch::Peer> peers;
  for (const PeerInfo& p : comm_.peers()) {
    if (canWatchProcess(me, p)) peers.push_back({p.rank, p.pid});
  }
  if (peers.empty()) return;
  Links* links = links_.get();
  watch_ = peerwatch::add(std::move(peers), [this, links](const peerwatch::Peer& p) {
    {  // first: a kernel stopped by the mark below must find why
      std::lock_guard<std::mutex> lock(exitedMu_);
      exited_[p.rank] = p.pid;
    }
    if (!links->peerGone(p.rank)) return false;  // being made: ask again
    TUTTI_INFO(log::kInit,
               "rank %d: rank %d (pid %lld, this host) exited; GPU links to it are marked broken",
               comm_.rank(), p.rank, static_cast<long long>(p.pid));
    return true;
  });
}

// For a timeout where ranks of this communicator are threads of this process on this GPU: the
// one way they deadlock that no rank's calls show (README, "Ranks of one process on one GPU").
std::string DeviceEngine::heldThreads() const {
  if (siblings_ == 0) return "";
  std::vector<int> ranks;
  for (size_t r = 0; r < isSibling_.size(); ++r)
    if (isSibling_[r] || int(r) == comm_.rank()) ranks.push_back(int(r));
  std::string list;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) list += i + 1 == ranks.size() ? " and " : ", ";
    list += std::to_string(ranks[i]);
  }
  return " Ranks " + list + " are threads of this process on GPU " +
         std::to_string(comm_.cudaDev()) +
         ": a rank whose thread is held in a CUDA call that waits for the GPU -- cudaMemcpy "
         "to or from pageable memory, cudaMalloc, cudaFree, a device synchronize, the first "
         "launch of a kernel CUDA had not loaded yet (lazy loading: CUDA_MODULE_LOADING=EAGER "
         "loads them at start) -- waits for these kernels, which wait for its next call.";
}

Status DeviceEngine::kernelError() const {
  const volatile dev::DevError* e = errHost_.load(std::memory_order_acquire);
  if (!e) return Status::Ok();
  const uint32_t code = e->code;  // published last by the kernel
  if (code == dev::kErrNone) return Status::Ok();
  std::atomic_thread_fence(std::memory_order_acquire);
  const std::string where = "rank " + std::to_string(comm_.rank()) + ": nccl" +
                            collKindName(static_cast<CollKind>(e->kind)) + " (opCount " +
                            std::to_string(e->seq) + ", channel " + std::to_string(e->channel) +
                            ") on GPU " + std::to_string(comm_.cudaDev());
  switch (code) {
    case dev::kErrAborted:
      return remoteError(where + " was aborted (ncclCommAbort) while waiting for rank " +
                         std::to_string(e->peer));
    case dev::kErrTimeout: {
      const std::string waited = where + " waited more than " + std::to_string(int64_t(timeoutS_)) +
                                 " s for rank " + std::to_string(e->peer) + " (TUTTI_TIMEOUT): ";
      if (e->kind != dev::kSend && e->kind != dev::kRecv) {
        return timeoutError(waited + "did every rank call the same collectives?" + heldThreads());
      }
      return timeoutError(
          waited + "did it post the matching " + (e->kind == dev::kSend ? "receive" : "send") +
          ", in a group that matches this one? (A group's sends and receives may share blocks, "
          "past what the GPU holds at once for the ranks sharing it, and then run in an order "
          "that needs each peer's matching operations in the group it runs at the same time.)" +
          heldThreads());
    }
    case dev::kErrSize: {
      auto slot = [](uint64_t w) {
        return std::to_string(w & dev::kSizeMask) + " bytes" +
               ((w & dev::kLastSlot) ? " (its last)" : "");
      };
      return invalidUsage(where + ": rank " + std::to_string(e->peer) + " sent a slot of " +
                          slot(e->got) + " where this rank expected " + slot(e->want) +
                          ": do all ranks call the same operations with the same count, "
                          "datatype and root?");
    }
    case dev::kErrPeer: {
      std::lock_guard<std::mutex> lock(exitedMu_);
      auto gone = exited_.find(int(e->peer));
      if (gone != exited_.end()) {
        return remoteError(where + ": rank " + std::to_string(e->peer) + " (pid " +
                           std::to_string(gone->second) + ", this host) exited");
      }
      return remoteError(where + ": rank " + std::to_string(e->peer) +
                         "'s kernel gave up on their link (it failed or was aborted; its own "
                         "error says why)");
    }
    default:
      return internalError(where + ": unknown kernel error " + std::to_string(code));
  }
}

#else  // !TUTTI_HAVE_CUDA

DeviceEngine::~DeviceEngine() = default;
void DeviceEngine::breakLinks() {
  std::lock_guard<std::mutex> lock(mu_);
  if (links_) links_->breakAll();
}
void DeviceEngine::watchPeers() {}
void DeviceEngine::noteAbort() {}
Status DeviceEngine::kernelError() const { return Status::Ok(); }

#endif

}  // namespace tutti
