// The device engine's set-up (streams, events, mapped words, the kernels loaded, links) and
// its planning of each group; launches are in runtime/device_launch.cc, teardown and the
// kernels' errors in runtime/device_teardown.cc.
#include "runtime/device_engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "nccl.h"
#include "runtime/bootstrap.h"
#include "runtime/comm.h"
#include "runtime/cuda_shim.h"
#include "runtime/dtype.h"
#include "runtime/env.h"
#include "runtime/links.h"
#include "runtime/log.h"
#include "runtime/peer_info.h"
#include "runtime/stream_entries.h"

#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/kernel_table.h"
#include "runtime/cuda_scope.h"
#endif

namespace tutti {

#ifdef TUTTI_HAVE_CUDA

DeviceEngine::DeviceEngine(Comm& comm) : comm_(comm) {
  // Ranks sharing a GPU each hold their blocks for a whole kernel while they wait for the
  // others: keep the total within half of what the GPU runs at once (deviceChannelCap; a MIG
  // slice or a small GPU runs fewer). Below that, more channels means more SMs moving bytes.
  // The same pass counts the most ranks on one GPU (shared_); every rank derives both from
  // the shared peer table, so all agree on channel counts.
  const int cap = deviceChannelCap(comm.peers().data(), comm.peers().size(), &shared_);
  // The planner's settings as this rank told the others at init (they must agree: prepare()
  // refuses every operation where they do not).
  const DeviceSettings& d = comm.peers()[size_t(comm.rank())].device;
  settingsAgree_ = checkDeviceSettingsAgree(comm.peers().data(), comm.peers().size());
  maxChannels_ = int(std::clamp<int64_t>(d.maxChannels, 1, std::min(cap, dev::kMaxChannels)));
  llMaxBytes_ = size_t(d.llMaxBytes);
  gatherMaxBytes_ = size_t(d.gatherMaxBytes);
  channelBytes_ = size_t(d.channelBytes);
  proto_ = int(d.proto);
  timeoutS_ = env::getDouble("TUTTI_TIMEOUT", 1800);
  graphMixing_ = env::getBool("NCCL_GRAPH_MIXING_SUPPORT", true);
  fullParams_ = env::getBool("TUTTI_LAUNCH_FULL_PARAMS", false);
  llFullBlocks_ = env::getBool("TUTTI_LL_FULL_BLOCKS", false);
  const PeerInfo& me = comm.peers()[size_t(comm.rank())];
  for (const PeerInfo& q : comm.peers()) {
    const bool sibling =
        q.rank != me.rank && q.pid == me.pid && q.pidNs == me.pidNs && sameGpu(q, me);
    isSibling_.push_back(sibling);
    siblings_ += sibling;
  }
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
  listEngine();  // (runtime/device_teardown.cc)
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
    // Its handle in this GPU's context, for the driver's launch (DeviceEngine::launchOne):
    // none (the runtime's launch) where CUDA gives none.
    cudaFunction_t f = nullptr;
    if (k != dev::p2pManyKernel() && cudaGetFuncBySymbol(&f, k) == cudaSuccess && f)
      functions_[k] = f;
  }
  if (!args_) args_ = std::make_unique<dev::DevArgs>();
  if (!driverLaunch_) driverLaunch_ = cuda::driverFunction("cuLaunchKernel");  // or the runtime's
  // Found now, with the kernels loaded: every group of sends and receives is planned within it.
  findP2pBlockCap();
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
             "bytes per channel (AllReduce by gathering up to %zu bytes), kernels for %s "
             "datatypes",
             comm_.rank(), comm_.cudaDev(), maxChannels_, llMaxBytes_, gatherMaxBytes_,
             dev::builtKernelTypes().c_str());
  return Status::Ok();
}

// Ranks of this communicator in other processes on this rank's GPU: without MPS, kernels of
// separate processes take turns on a GPU (time slices), and ranks that wait for each other
// then pay a slice per step: milliseconds per operation (docs/gpu-results.md). Said once, by
// the lowest rank on the GPU, unless an MPS control daemon answers at its pipe directory.
DeviceEngine::GpuShare DeviceEngine::gpuShare() const {
  const PeerInfo& me = comm_.peers()[size_t(comm_.rank())];
  GpuShare g;
  g.lowest = comm_.rank();
  for (const PeerInfo& q : comm_.peers()) {
    if (!sameGpu(q, me)) continue;
    ++g.ranks;
    g.lowest = std::min(g.lowest, int(q.rank));
    if (q.pid != me.pid || q.pidNs != me.pidNs) ++g.otherProcesses;
  }
  return g;
}

void DeviceEngine::warnSharedGpuProcesses() const {
  const GpuShare g = gpuShare();
  const int processes = g.otherProcesses;
  if (processes == 0 || g.lowest != comm_.rank()) return;
  const char* dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
  const std::string control = std::string(dir && *dir ? dir : "/tmp/nvidia-mps") + "/control";
  if (access(control.c_str(), F_OK) == 0) return;  // MPS runs
  TUTTI_WARN(
      "rank %d: %d rank(s) of other processes share GPU %d with this one, and no MPS daemon "
      "was found (%s): their kernels take turns on the GPU, milliseconds per operation; start "
      "nvidia-cuda-mps-control -d before the job, or run the ranks as threads of one process",
      comm_.rank(), processes, comm_.cudaDev(), control.c_str());
}

void DeviceEngine::findP2pBlockCap() {
  if (p2pCap_.load(std::memory_order_acquire) > 0) return;
  int cap = 0;
  std::string why;
  if (const int64_t forced = env::getInt("TUTTI_P2P_MAX_BLOCKS", 0); forced > 0) {
    // At least 2: a group that sends and receives needs a block for each direction.
    cap = int(std::clamp<int64_t>(forced, 2, dev::kMaxP2pOps));
    why = "TUTTI_P2P_MAX_BLOCKS";
  } else {
    DeviceGuard guard(comm_.cudaDev());  // it also clears CUDA's last error of a failed query
    // In init(), which may run inside a stream capture: the query may load the module.
    CaptureModeRelaxed relaxed;
    int sms = 0, perSm = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, comm_.cudaDev());
    for (const void* k :
         {dev::kernelFor(1 /* ncclUint8 */, dev::kFnSum, dev::kSimple), dev::p2pManyKernel()}) {
      if (!k || e != cudaSuccess) continue;
      int b = 0;
      e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, k, dev::kThreads, 0);
      perSm = perSm == 0 ? b : std::min(perSm, b);
    }
    if (e == cudaSuccess) {
      // Half of it, as the collectives take (deviceChannelCap): the other half is left to
      // other kernels, such as another communicator's, which may wait for these ranks too.
      cap = std::max(2, std::max(sms, 1) * std::max(perSm, 1) / 2 / shared_);
      why = "half of " + std::to_string(sms) + " SMs x " + std::to_string(perSm) +
            " blocks each, " + std::to_string(shared_) + " rank(s) on GPU " +
            std::to_string(comm_.cudaDev());
      warnTooFewResidentBlocks(std::max(sms, 1) * std::max(perSm, 1));
    } else {
      // Not worth failing every GPU operation for: the collectives' own share of the GPU.
      cap = std::max(2, kSharedGpuBlocks / shared_);
      TUTTI_WARN(
          "rank %d: finding how many blocks GPU %d holds at once failed (%s): sends and "
          "receives of one group take at most %d",
          comm_.rank(), comm_.cudaDev(), cudaGetErrorString(e), cap);
      why = "a guess";
    }
  }
  p2pCap_.store(cap, std::memory_order_release);
  TUTTI_INFO(log::kInit, "rank %d: sends and receives of one group take at most %d blocks (%s)",
             comm_.rank(), cap, why.c_str());
}

// The kernels of the ranks sharing a GPU wait for each other, so all of theirs must be resident
// at once: a block each for a collective, and for a group of sends and receives one for each
// direction. On a GPU (or MIG slice) that holds fewer, such a group of all of them hangs until
// TUTTI_TIMEOUT: said once (NCCL_DEBUG=WARN), when its engine starts, by the lowest rank on the
// GPU. Not where TUTTI_P2P_MAX_BLOCKS forces the cap, nor where the occupancy query failed.
void DeviceEngine::warnTooFewResidentBlocks(int resident) const {
  const GpuShare g = gpuShare();
  const int here = g.ranks;
  if (2 * here <= resident || g.lowest != comm_.rank()) return;
  TUTTI_WARN(
      "rank %d: %d ranks of this communicator share GPU %d, which runs %d blocks of tutti's "
      "kernels at once: %s, and a group in which each of them sends and receives needs %d. "
      "Those that cannot all be resident wait for each other until TUTTI_TIMEOUT; use fewer "
      "ranks per GPU",
      comm_.rank(), here, comm_.cudaDev(), resident,
      here > resident ? "a collective needs one per rank" : "collectives fit (one per rank)",
      2 * here);
}

Status DeviceEngine::prepare(const CollArgs* ops, size_t nops) {
  // Where ranks share a GPU as threads, every GPU operation waits for the splits adopted in
  // the communicator's family (Comm::waitFamilyHelpersFor says why) -- but not where another
  // communicator's kernel on this GPU has not ended 2 s later (othersBusyOnGpu): it may wait
  // for this rank, and it holds the GPU those splits' links wait for. Elsewhere the collective
  // whose links end with the ring's first barrier (connect) waits for their exchanges on the
  // ring (Comm::waitRingUsers).
  if (comm_.threadsShareGpu()) {
    while (!comm_.waitFamilyHelpersFor(std::chrono::milliseconds(100))) {
      if (othersBusyOnGpu(/*siblingsOnly=*/false)) {
        TUTTI_INFO(log::kInit,
                   "rank %d: a split of this communicator's family still makes its links, "
                   "and a kernel on this GPU has not ended 2 s later (it may wait for this "
                   "rank): this operation goes on",
                   comm_.rank());
        break;
      }
    }
  } else if (!ringConnected_.load(std::memory_order_relaxed) &&
             devplan::usesRing(comm_.nranks(), ops, nops)) {
    comm_.waitRingUsers();
  }
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(comm_.cudaDev());
  // The first operation makes streams, pinned words and FIFOs (cudaMalloc, IPC, host
  // registration): calls a stream capture in the default (global) mode forbids. They touch
  // no captured stream, so they may run inside one.
  CaptureModeRelaxed relaxed;
  if (!settingsAgree_.ok()) {
    return settingsAgree_.withContext("rank " + std::to_string(comm_.rank()) +
                                      ": refusing GPU operations");
  }
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
  // Every rank makes its ring links at the same collective: the first one (or, where ranks
  // share a GPU as threads, at creation: connectAtCreation, after which the first collective
  // finds them made and only waits for every rank). Once the ring's links exist (on every channel:
  // connectAllChannels), collectives need no other: no link to look up (2 x 16 lookups under the
  // links' lock per call; a helper estimated 1 us, never measured).
  if (ringConnected_) {
    bool sendsOrReceives = false;
    for (size_t i = 0; i < nops && !sendsOrReceives; ++i)
      sendsOrReceives = ops[i].kind == CollKind::kSend || ops[i].kind == CollKind::kRecv;
    if (!sendsOrReceives && cfg.connectAllChannels) return Status::Ok();
  }
  const bool ringNew = devplan::usesRing(cfg.nranks, ops, nops) && !ringConnected_;
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

devplan::Config DeviceEngine::planConfig() const {
  devplan::Config cfg;
  cfg.rank = comm_.rank();
  cfg.nranks = comm_.nranks();
  cfg.maxChannels = maxChannels_;
  cfg.llMaxBytes = llMaxBytes_;
  cfg.gatherMaxBytes = gatherMaxBytes_;
  cfg.llFitThreads = !llFullBlocks_;
  cfg.maxP2pBlocks = p2pCap_.load(std::memory_order_acquire);  // init() found it
  cfg.channelBytes = channelBytes_;
  cfg.proto = proto_;
  cfg.connectAllChannels = true;
  return cfg;
}

Status DeviceEngine::connectAtCreation() {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceGuard guard(comm_.cudaDev());
  CaptureModeRelaxed relaxed;
  // Ranks whose settings differ refuse GPU operations (prepare): the same on every rank, as
  // the peer table is; nothing to make then.
  if (!settingsAgree_.ok()) return Status::Ok();
  TUTTI_TRY(init());
  // Operations that need the links, as connect sees them (kind and peer, nothing else).
  auto op = [](CollKind kind, int root) {
    return CollArgs{kind, "ncclCommInitRank", nullptr, nullptr, 1, ncclFloat32,
                    0,    RedOpSpec{},        root};
  };
  // The links a collective makes first: the ring's, on every channel (connectAllChannels).
  const CollArgs any = op(CollKind::kAllReduce, 0);
  TUTTI_TRY(connect(planConfig(), &any, 1));
  // The links of sends and receives to every other rank too, where there are few enough of
  // them: a pair's first send or receive would make them otherwise, while a third rank's
  // kernel may already wait for one of the pair. Each end waits for the other (connect).
  const int n = comm_.nranks(), r = comm_.rank();
  if (n <= kP2pLinksAtCreationMaxRanks) {
    std::vector<CollArgs> p2p;
    for (int peer = 0; peer < n; ++peer) {
      if (peer == r) continue;
      for (CollKind kind : {CollKind::kSend, CollKind::kRecv}) p2p.push_back(op(kind, peer));
    }
    TUTTI_TRY(connect(planConfig(), p2p.data(), p2p.size()));
  }
  // The first collective still waits for every rank, as when it made the links (connect finds
  // them made and only waits): no rank's kernel runs before all have reached it, so threads
  // that allocate their own buffers before their first collective (cudaMalloc may wait for
  // the whole GPU) cannot be caught by a sibling's kernel.
  ringConnected_ = false;
  return Status::Ok();
}

Status DeviceEngine::plan(const CollArgs* ops, size_t nops) {
  const int r = comm_.rank();
  for (size_t i = 0; i < nops; ++i) {
    const CollArgs& op = ops[i];
    void* s = op.stream == cudaStreamLegacy ? nullptr : op.stream;  // one stream, one handle
    if (std::find(streams_.begin(), streams_.end(), s) == streams_.end()) streams_.push_back(s);
  }
  const devplan::Config cfg = planConfig();
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
    const void* k = l.more.empty() ? dev::kernelFor(l.dtype, l.fn, l.proto) : dev::p2pManyKernel();
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
    if (!log::enabled(log::Level::kInfo, log::kColl)) continue;
    // In call order (opCount): a launch of sends and receives lists them by round.
    std::vector<const dev::DevOp*> byCall;
    for (int j = 0; j < l.work.nops; ++j) byCall.push_back(&l.work.ops[j]);
    for (const dev::DevOp& d : l.more) byCall.push_back(&d);
    std::sort(byCall.begin(), byCall.end(),
              [](const dev::DevOp* a, const dev::DevOp* b) { return a->seq < b->seq; });
    for (const dev::DevOp* d : byCall) {
      TUTTI_INFO(log::kColl,
                 "%s: opCount %llx sendbuff %p recvbuff %p count %llu root %d comm %p "
                 "[nranks=%d] nchannels %d proto %s%s (GPU %d)",
                 collKindName(static_cast<CollKind>(d->kind)),
                 static_cast<unsigned long long>(d->seq), d->send, d->recv,
                 static_cast<unsigned long long>(d->count), d->root, static_cast<void*>(&comm_),
                 comm_.nranks(), d->nch, l.proto == dev::kLL ? "LL" : "Simple",
                 d->algo == dev::kAlgoGather ? " algo gather" : "", comm_.cudaDev());
    }
  }
  return Status::Ok();
}

#else  // !TUTTI_HAVE_CUDA: no GPU buffers can reach here (validation finds none).

Status DeviceEngine::connectAtCreation() { return Status::Ok(); }

DeviceEngine::DeviceEngine(Comm& comm)
    : comm_(comm),
      maxChannels_(0),
      llMaxBytes_(0),
      gatherMaxBytes_(0),
      channelBytes_(0),
      timeoutS_(0) {}
Status DeviceEngine::plan(const CollArgs*, size_t) { return Status::Ok(); }
Status DeviceEngine::prepare(const CollArgs*, size_t) {
  return invalidUsage("tutti was built without CUDA: no GPU buffers");
}
void DeviceEngine::warnSharedGpuProcesses() const {}

#endif

}  // namespace tutti
