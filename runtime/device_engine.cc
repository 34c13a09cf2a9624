#include "runtime/device_engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "runtime/bootstrap.h"
#include "runtime/comm.h"
#include "runtime/cuda_shim.h"
#include "runtime/dtype.h"
#include "runtime/env.h"
#include "runtime/links.h"
#include "runtime/log.h"
#include "runtime/peer_info.h"
#include "runtime/peer_watch.h"
#include "runtime/stream_entries.h"

#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/kernel_table.h"
#endif

namespace tutti {

#ifdef TUTTI_HAVE_CUDA

namespace {

// Below this many bytes per channel another block costs more than it gains.
constexpr size_t kDefaultChannelBytes = 512 << 10;
// Every rank derives this from the shared peer table, so all agree on channel counts.
int ranksPerDevice(const Comm& comm) {
  int most = 1;
  for (const PeerInfo& p : comm.peers()) {
    int same = 0;
    for (const PeerInfo& q : comm.peers())
      same += q.hostHash == p.hostHash && strcmp(q.busId, p.busId) == 0 && q.cudaDev >= 0;
    most = std::max(most, same);
  }
  return most;
}

// Lets this thread make set-up calls while one of its streams is being captured.
class CaptureModeRelaxed {
 public:
  CaptureModeRelaxed() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~CaptureModeRelaxed() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Makes the communicator's device current and gives the caller back its own afterwards.
// (Four per operation: a call to restore what did not change is one CUDA call less each.)
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) changed_ = cudaSetDevice(device) == cudaSuccess;
  }
  ~DeviceGuard() {
    if (changed_ && saved_ >= 0) cudaSetDevice(saved_);
    cudaGetLastError();
  }

 private:
  int saved_ = -1;
  bool changed_ = false;
};

}  // namespace

DeviceEngine::DeviceEngine(Comm& comm) : comm_(comm) {
  const int shared = ranksPerDevice(comm);
  // Ranks sharing a GPU each hold their blocks for a whole kernel while they wait for the
  // others: keep the total within half of what one GPU runs at once (132 SMs on an H100,
  // one block of 512 threads each). Below that, more channels means more SMs moving bytes.
  const int cap = std::max(1, 64 / shared);
  maxChannels_ = int(std::clamp<int64_t>(env::getInt("NCCL_MAX_NCHANNELS", dev::kMaxChannels), 1,
                                         std::min(cap, dev::kMaxChannels)));
  llMaxBytes_ = size_t(std::max<int64_t>(0, env::getInt("TUTTI_LL_MAX_BYTES", 64 << 10)));
  channelBytes_ =
      size_t(std::max<int64_t>(1, env::getInt("TUTTI_DEV_CHANNEL_BYTES", kDefaultChannelBytes)));
  timeoutS_ = env::getDouble("TUTTI_TIMEOUT", 1800);
  graphMixing_ = env::getBool("NCCL_GRAPH_MIXING_SUPPORT", true);
  const PeerInfo& me = comm.peers()[size_t(comm.rank())];
  for (const PeerInfo& q : comm.peers()) {
    const bool sibling = q.rank != me.rank && q.pid == me.pid && q.pidNs == me.pidNs &&
                         q.hostHash == me.hostHash && strcmp(q.busId, me.busId) == 0 &&
                         q.cudaDev >= 0;
    isSibling_.push_back(sibling);
    siblings_ += sibling;
  }
  if (auto p = env::getString("NCCL_PROTO")) {
    std::string v = *p;
    std::transform(v.begin(), v.end(), v.begin(), ::tolower);
    if (v == "ll") proto_ = dev::kLL;
    if (v == "simple") proto_ = dev::kSimple;
  }
}

DeviceEngine::~DeviceEngine() {
  // Teardown may run while another thread captures a graph in the global mode, which
  // forbids this thread cudaFree and its like (they would fail, and invalidate that capture).
  CaptureModeRelaxed relaxed;
  if (watch_) peerwatch::remove(watch_);  // before the links go: the watch marks them
  if (stream_) {
    // The FIFOs and the mapped words must outlive every kernel that uses them.
    DeviceGuard guard(comm_.cudaDev());
    const bool aborted = comm_.aborted();
    // Kept where noteAbort found work, or a launch came after it (a call already past its
    // checks when the abort began).
    const bool keep = aborted && (busyAtAbort_.load(std::memory_order_acquire) ||
                                  launches_.load(std::memory_order_acquire) != launchesAtAbort_);
    if (aborted) breakLinks();  // peers' kernels stop before anything is freed
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    if (serial_) cudaEventSynchronize(static_cast<cudaEvent_t>(serial_));  // the last launch
    comm_.setDeviceAbortWord(nullptr);
    for (void* ev : {entry_, done_, serial_, capEv_}) {
      if (ev) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
    }
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    // An abort with work in flight frees no memory (see noteAbort): the words, like the links'
    // FIFOs, are left to the process's exit.
    if (keep) {
      const size_t bytes = links_ ? links_->abandonAll() : 0;
      TUTTI_WARN(
          "rank %d: aborted with GPU work in flight or failed: %zu bytes of GPU memory (its "
          "FIFOs) stay allocated until the process exits, since peers' kernels may still use "
          "them",
          comm_.rank(), bytes);
    } else {
      cudaFreeHost(abortHost_);
      cudaFreeHost(errHost_.load());
      cudaFree(errClaim_);
    }
    links_.reset();  // FIFOs and IPC handles: on this GPU too
    cudaGetLastError();
  }
  links_.reset();
}

// As an abort begins, before the abort word stops the kernels: was device work of this
// communicator in flight, or had a kernel failed? Then peers' kernels may still read and write
// this rank's FIFOs (until they see the broken words), and a cudaFree may wait for the whole
// GPU, where another communicator's kernel may wait for the aborting thread (a watchdog that
// aborts one communicator after another). Such an abort frees nothing. The abort of an idle,
// healthy communicator -- a framework's ordinary teardown -- frees everything, as destroy does.
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
      cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
      cudaThreadExchangeStreamCaptureMode(&mode);
      auto pending = [](void* ev) {
        const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(ev));
        if (e != cudaSuccess && e != cudaErrorNotReady) cudaGetLastError();
        return e == cudaErrorNotReady;
      };
      // done_ last recorded in a capture that may still be open: a query would break it.
      busy = !kernelError().ok() || (!doneCaptured_ && pending(done_)) || pending(serial_);
      cudaThreadExchangeStreamCaptureMode(&mode);  // back to the caller's
    }
  }
  busyAtAbort_.store(busy, std::memory_order_release);
}

Status DeviceEngine::cudaCheck(const char* what, int err) const {
  if (err == cudaSuccess) return Status::Ok();
  cudaGetLastError();
  return Status(Code::kCudaError, "rank " + std::to_string(comm_.rank()) + ": " + what + ": " +
                                      cudaGetErrorString(static_cast<cudaError_t>(err)));
}

Status DeviceEngine::init() {
  if (ready_) return Status::Ok();
  // Each resource once: a call after a failed one goes on where that one stopped (the
  // destructor frees what was made).
  if (!stream_) {
    cudaStream_t s;
    TUTTI_TRY(cudaCheck("cudaStreamCreateWithFlags",
                        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)));
    stream_ = s;
  }
  auto s = static_cast<cudaStream_t>(stream_);
  for (void** ev : {&entry_, &done_, &serial_, &capEv_}) {
    if (*ev) continue;
    cudaEvent_t e;
    TUTTI_TRY(cudaCheck("cudaEventCreate", cudaEventCreateWithFlags(&e, cudaEventDisableTiming)));
    *ev = e;
  }
  void* p = nullptr;
  void* d = nullptr;
  if (!abortHost_) {
    TUTTI_TRY(cudaCheck("cudaHostAlloc", cudaHostAlloc(&p, 64, cudaHostAllocMapped)));
    abortHost_ = static_cast<uint32_t*>(p);
    *abortHost_ = 0;
  }
  if (!abortDev_) {
    TUTTI_TRY(cudaCheck("cudaHostGetDevicePointer", cudaHostGetDevicePointer(&d, abortHost_, 0)));
    abortDev_ = static_cast<const uint32_t*>(d);
  }
  if (!errHost_.load()) {
    TUTTI_TRY(
        cudaCheck("cudaHostAlloc", cudaHostAlloc(&p, sizeof(dev::DevError), cudaHostAllocMapped)));
    memset(p, 0, sizeof(dev::DevError));
    errHost_.store(static_cast<dev::DevError*>(p), std::memory_order_release);
  }
  if (!errDev_) {
    TUTTI_TRY(
        cudaCheck("cudaHostGetDevicePointer", cudaHostGetDevicePointer(&d, errHost_.load(), 0)));
    errDev_ = static_cast<dev::DevError*>(d);
  }
  if (!errClaim_) {
    TUTTI_TRY(cudaCheck("cudaMalloc", cudaMalloc(&p, 64)));
    errClaim_ = static_cast<uint32_t*>(p);
  }
  TUTTI_TRY(cudaCheck("cudaMemsetAsync", cudaMemsetAsync(errClaim_, 0, 64, s)));
  TUTTI_TRY(cudaCheck("cudaStreamSynchronize", cudaStreamSynchronize(s)));
  comm_.setDeviceAbortWord(abortHost_);
  if (comm_.aborted()) __atomic_store_n(abortHost_, 1u, __ATOMIC_RELEASE);  // before the above
  // Every kernel loaded now (CUDA loads modules lazily, and loading may wait for the device:
  // for a sibling rank's kernel that waits for this one, say).
  for (const void* k : dev::allKernels()) {
    cudaFuncAttributes attr;
    TUTTI_TRY(cudaCheck("cudaFuncGetAttributes", cudaFuncGetAttributes(&attr, k)));
    if (attr.maxThreadsPerBlock < dev::kThreads) {
      return internalError("rank " + std::to_string(comm_.rank()) + ": a device kernel runs " +
                           std::to_string(attr.maxThreadsPerBlock) +
                           " threads per block at most, " + std::to_string(dev::kThreads) +
                           " needed");
    }
  }
  if (!links_) links_ = std::make_unique<Links>(comm_, Links::Kind::kDevice);
  if (!watch_) watchPeers();
  if (siblings_ > 0) {
    const char* q = getenv("CUDA_DEVICE_MAX_CONNECTIONS");
    const int queues = q ? atoi(q) : 8;
    if (queues < 2 * (siblings_ + 1)) {
      TUTTI_WARN(
          "rank %d: %d ranks of this process share GPU %d but CUDA_DEVICE_MAX_CONNECTIONS "
          "is %d: streams then share hardware queues, and a queue that holds one rank's "
          "join ahead of another rank's kernel deadlocks both (set it to 32 before CUDA "
          "starts)",
          comm_.rank(), siblings_ + 1, comm_.cudaDev(), queues);
    }
  }
  warnSharedGpuProcesses();
  ready_ = true;
  TUTTI_INFO(log::kInit,
             "rank %d: CUDA engine on device %d, %d channels at most, LL up to %zu "
             "bytes per channel, kernels for %s datatypes",
             comm_.rank(), comm_.cudaDev(), maxChannels_, llMaxBytes_,
             dev::builtKernelTypes().c_str());
  return Status::Ok();
}

// Ranks of this communicator in other processes on this rank's GPU: without MPS, kernels of
// separate processes take turns on a GPU (time slices), and ranks that wait for each other
// then pay a slice per step: milliseconds per operation (docs/gpu-results.md). Said once, by
// the lowest rank on the GPU, unless an MPS control daemon answers at its pipe directory.
void DeviceEngine::warnSharedGpuProcesses() const {
  const PeerInfo& me = comm_.peers()[size_t(comm_.rank())];
  int processes = 0, lowest = comm_.rank();
  for (const PeerInfo& q : comm_.peers()) {
    if (q.cudaDev < 0 || q.hostHash != me.hostHash || strcmp(q.busId, me.busId) != 0) continue;
    lowest = std::min(lowest, int(q.rank));
    if (q.pid != me.pid || q.pidNs != me.pidNs) ++processes;
  }
  if (processes == 0 || lowest != comm_.rank()) return;
  const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string control = std::string(dir && *dir ? dir : "/tmp/nvidia-mps") + "/control";
  if (access(control.c_str(), F_OK) == 0) return;  // MPS runs
  TUTTI_WARN(
      "rank %d: %d rank(s) of other processes share GPU %d with this one, and no MPS daemon "
      "was found (%s): their kernels take turns on the GPU, milliseconds per operation; start "
      "nvidia-cuda-mps-control -d before the job, or run the ranks as threads of one process",
      comm_.rank(), processes, comm_.cudaDev(), control.c_str());
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
    case dev::kErrTimeout:
      return timeoutError(where + " waited more than " + std::to_string(int64_t(timeoutS_)) +
                          " s for rank " + std::to_string(e->peer) +
                          " (TUTTI_TIMEOUT): did every rank call the same collectives?");
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

Status DeviceEngine::prepare(const CollArgs* ops, size_t nops) {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(comm_.cudaDev());
  // The first operation makes streams, pinned words and FIFOs (cudaMalloc, IPC, host
  // registration): calls a stream capture in the default (global) mode forbids. They touch
  // no captured stream, so they may run inside one.
  CaptureModeRelaxed relaxed;
  Status s = init();
  if (s.ok()) s = kernelError();
  if (s.ok()) s = plan(ops, nops);
  if (!s.ok()) clearPlan();
  return s;
}

// Makes the links, then waits until the ranks at their other ends have made theirs too.
// Allocating device memory (and opening IPC handles) may wait for the whole GPU; a rank whose
// kernel is already waiting for a sibling rank that still allocates would deadlock both.
// Ring links (all ranks, at the same collective) end with a barrier of all ranks; links of
// sends and receives with a handshake with each new peer.
Status DeviceEngine::connect(const devplan::Config& cfg, const CollArgs* ops, size_t nops) {
  // Every rank makes its ring links at the same collective: the first one. (Not "whether the
  // link to the next rank exists": a send to it may have made that one earlier on one rank.)
  const bool ringNew = devplan::usesRing(cfg, ops, nops) && !ringConnected_;
  std::vector<int> made;
  TUTTI_TRY(links_->ensure(devplan::linkNeeds(cfg, ops, nops), &made));
  Bootstrap* b = comm_.bootstrap();
  if (ringNew) {
    ringConnected_ = true;
    return b->barrier().withContext("after making the ring's GPU links");
  }
  constexpr uint32_t kReadyTag = 0x4d7f0000u;
  uint32_t token = 1;
  for (int peer : made) TUTTI_TRY(b->send(peer, kReadyTag, &token, sizeof(token)));
  for (int peer : made) {
    TUTTI_TRY(b->recv(peer, kReadyTag, &token, sizeof(token))
                  .withContext("waiting for rank " + std::to_string(peer) + "'s GPU links"));
  }
  return Status::Ok();
}

Status DeviceEngine::plan(const CollArgs* ops, size_t nops) {
  const int r = comm_.rank();
  for (size_t i = 0; i < nops; ++i) {
    const CollArgs& op = ops[i];
    void* s = op.stream == cudaStreamLegacy ? nullptr : op.stream;  // one stream, one handle
    if (std::find(streams_.begin(), streams_.end(), s) == streams_.end()) streams_.push_back(s);
    if (op.red.scalarPtr && !cuda::isDevicePointer(op.red.scalarPtr)) {
      return invalidUsage(std::string(op.name) +
                          ": the PreMulSum scalar is ncclScalarDevice but not in GPU memory");
    }
  }
  devplan::Config cfg;
  cfg.rank = r;
  cfg.nranks = comm_.nranks();
  cfg.maxChannels = maxChannels_;
  cfg.llMaxBytes = llMaxBytes_;
  cfg.channelBytes = channelBytes_;
  cfg.proto = proto_;
  cfg.connectAllChannels = true;
  // The context string is built only on failure: this runs for every device operation.
  if (Status st = connect(cfg, ops, nops); !st.ok()) {
    return st.withContext("rank " + std::to_string(r) + ": connecting GPU links");
  }
  // The group's place in the sequence, alike on the siblings that take part (GroupPos), and
  // how many siblings take part: all for a collective, the peers of sends and receives.
  auto p2p = [](const CollArgs& op) {
    return op.kind == CollKind::kSend || op.kind == CollKind::kRecv;
  };
  if (!std::all_of(ops, ops + nops, p2p)) {
    groupPos_ = groups_.collective();
    groupSiblings_ = siblings_;
  } else {
    std::vector<int> ranks{r};  // this rank and its sibling peers, each once
    for (size_t i = 0; i < nops; ++i) {
      const int peer = ops[i].root;
      if (isSibling_[size_t(peer)] && std::find(ranks.begin(), ranks.end(), peer) == ranks.end())
        ranks.push_back(peer);
    }
    groupSiblings_ = int(ranks.size()) - 1;
    groupPos_ = groups_.exchange(std::move(ranks));
  }
  auto link = [this](int peer, int channel, bool send) -> const transport::FifoView* {
    return send ? links_->send(peer, channel) : links_->recv(peer, channel);
  };
  auto seq = [this] { return comm_.nextSeq(); };
  const size_t before = plan_.launches.size();
  TUTTI_TRY(devplan::plan(cfg, ops, nops, link, seq, &plan_));
  for (size_t i = before; i < plan_.launches.size(); ++i) {
    devplan::Launch& l = plan_.launches[i];
    const void* k = dev::kernelFor(l.dtype, l.fn, l.proto);
    if (!k) {
      return invalidUsage(
          "this tutti build has no device kernel for " + std::string(dtypeName(l.dtype)) +
          " (kernels built for: " + dev::builtKernelTypes() + "; see TUTTI_KERNEL_FILTER)");
    }
    kernels_.push_back(k);
    l.work.abortFlag = abortDev_;
    l.work.err = errDev_;
    l.work.errClaim = errClaim_;
    l.work.timeoutNs = timeoutS_ > 0 ? uint64_t(timeoutS_ * 1e9) : 0;
    for (int j = 0; j < l.work.nops; ++j) {
      const dev::DevOp& d = l.work.ops[j];
      TUTTI_INFO(log::kColl,
                 "%s: opCount %llx sendbuff %p recvbuff %p count %llu root %d comm %p "
                 "[nranks=%d] nchannels %d proto %s (GPU %d)",
                 collKindName(static_cast<CollKind>(d.kind)),
                 static_cast<unsigned long long>(d.seq), d.send, d.recv,
                 static_cast<unsigned long long>(d.count), d.root, static_cast<void*>(&comm_),
                 comm_.nranks(), d.nch, l.proto == dev::kLL ? "LL" : "Simple", comm_.cudaDev());
    }
  }
  return Status::Ok();
}

// Ranks of one communicator in this process on one GPU that pass the same stream share one
// entry per operation: the first to enter records it, the others wait for that same point.
// Stream order cannot hold for each of them separately -- the second call would queue behind
// the first call's join, which waits for the second rank's kernel -- so a rank called later
// from another thread waits only for the stream work issued before the first sibling's call.
// Inside one group (runBatches) all entries come before any join, and nothing changes.
// Nothing is queued on a stream under a lock the siblings share (runtime/stream_entries.h).
namespace {
bool isLegacyStream(const void* s) { return s == nullptr || s == cudaStreamLegacy; }

std::mutex gPoolMu;
std::map<int, std::vector<cudaEvent_t>> gFreeEvents;  // used ones, per GPU, for next entries

void releaseEvent(DeviceEvent e) {
  std::lock_guard<std::mutex> lock(gPoolMu);
  std::vector<cudaEvent_t>& pool = gFreeEvents[e.device];
  if (pool.size() < 64) {
    pool.push_back(static_cast<cudaEvent_t>(e.event));
  } else {
    cudaEventDestroy(static_cast<cudaEvent_t>(e.event));
  }
}
// Entries of siblings that use streams of their own are never claimed: they go once every
// sibling has passed their group (StreamEntries::entered); the bound is for the rest.
StreamEntries<DeviceEvent> gShared(8192, releaseEvent);
}  // namespace

// direct: the group may launch on this stream itself (it names no other). A sibling that
// finds another rank's entry for this stream and group is a follower: its own stream waits
// for that entry, and it launches there.
Status DeviceEngine::enterStream(void* s, bool grouped, bool direct, bool* follower) {
  auto own = static_cast<cudaStream_t>(stream_);
  auto stream = static_cast<cudaStream_t>(s);
  if (groupSiblings_ == 0) {  // none takes part: the stream's order is safe
    if (direct) return Status::Ok();
    // The own stream waits for what the caller's stream holds now.
    auto e = static_cast<cudaEvent_t>(entry_);
    Status st = cudaCheck("cudaEventRecord on the caller's stream", cudaEventRecord(e, stream));
    return st.ok() ? cudaCheck("cudaStreamWaitEvent", cudaStreamWaitEvent(own, e, 0)) : st;
  }
  const int dev = comm_.cudaDev();
  // cudaStreamPerThread is another stream on each thread: its key names the thread.
  static thread_local char tPerThread;
  const StreamEntryKey key{comm_.commHash(), dev, s == cudaStreamPerThread ? &tPerThread : s,
                           groupPos_};
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
  const bool direct = streams_.size() == 1 && !isLegacyStream(streams_[0]);
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
    devplan::Launch& l = plan_.launches[i];
    void* args[] = {&l.work};
    TUTTI_TRY(
        cudaCheck("cudaLaunchKernel", cudaLaunchKernel(kernels_[i], dim3(unsigned(l.blocks)),
                                                       dim3(dev::kThreads), args, 0, target)));
  }
  return copiesBefore(plan_.launches.size());
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

DeviceEngine::DeviceEngine(Comm& comm)
    : comm_(comm), maxChannels_(0), llMaxBytes_(0), channelBytes_(0), timeoutS_(0) {}
DeviceEngine::~DeviceEngine() = default;
Status DeviceEngine::plan(const CollArgs*, size_t) { return Status::Ok(); }
Status DeviceEngine::prepare(const CollArgs*, size_t) {
  return invalidUsage("tutti was built without CUDA: no GPU buffers");
}
Status DeviceEngine::enter(bool) { return Status::Ok(); }
Status DeviceEngine::launch() { return Status::Ok(); }
Status DeviceEngine::leave() { return Status::Ok(); }
Status DeviceEngine::launchPrepared() { return Status::Ok(); }
void DeviceEngine::breakLinks() {
  std::lock_guard<std::mutex> lock(mu_);
  if (links_) links_->breakAll();
}

void DeviceEngine::watchPeers() {}
void DeviceEngine::noteAbort() {}
void DeviceEngine::warnSharedGpuProcesses() const {}
Status DeviceEngine::kernelError() const { return Status::Ok(); }

#endif

}  // namespace tutti
