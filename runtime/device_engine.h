// The CUDA engine: operations on GPU buffers run as device kernels (kernels/cuda) over FIFOs
// of the p2p transport, enqueued on the caller's stream and returning at once. Set-up and
// planning: device_engine.cc; launches: device_launch.cc; teardown, abort and the kernels'
// errors: device_teardown.cc.
//
// A group that names one stream launches its kernels on that stream directly: nothing but
// the launches (and an event for the destructor to wait on) is added to it. Otherwise the
// group runs on the communicator's own stream, fenced to the caller's streams by events: the
// own stream waits for every caller stream's work issued so far (enter), the kernels are
// launched (launch), and the caller streams wait for them (leave). Ranks that share a GPU
// spin on each other's FIFOs, so their kernels must run at the same time: when siblings (ranks
// of this communicator in this process on this GPU) pass one stream, the first to enter
// launches on it and the others on their own streams, fenced to the point the first one
// recorded (see enterStream); a follower joins the shared stream back only once the first's
// kernels are queued there (runtime/stream_entries.h). The three phases let one thread drive
// several communicators in one group (the ncclCommInitAll pattern) with all its entries recorded
// before any kernel can block a stream, and caps on blocks per launch keep every rank's kernels
// resident together. Works under CUDA graph capture: every step is stream-ordered and the kernels
// find their FIFO positions in the FIFO counters, not in launch arguments.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/dev_work.h"
#include "runtime/coll_args.h"
#include "runtime/device_plan.h"
#include "runtime/status.h"
#include "runtime/stream_entries.h"

namespace tutti {

class Comm;
class Links;

// An entry event ranks sharing a GPU leave each other (a cudaEvent_t of that GPU).
struct DeviceEvent {
  void* event = nullptr;
  int device = -1;
};

class DeviceEngine {
 public:
  explicit DeviceEngine(Comm& comm);
  ~DeviceEngine();  // waits for this communicator's kernels (abort first to make it prompt)
  DeviceEngine(const DeviceEngine&) = delete;
  DeviceEngine& operator=(const DeviceEngine&) = delete;

  // Plans one group's device operations and makes their links (every rank must take part,
  // as in Links::ensure); nothing is launched yet.
  Status prepare(const CollArgs* ops, size_t n);
  // grouped: every communicator of the caller's group enters before any launches (runBatches).
  Status enter(bool grouped = false);
  Status launch();
  Status leave();
  // All three, for one communicator.
  Status launchPrepared();
  // As an abort begins: notes whether device work was in flight or failed (then the
  // destructor leaves the FIFOs and words to the process's exit instead of freeing them).
  void noteAbort();
  // What a kernel reported (abort, deadline, a size mismatch), as a Status; Ok if nothing.
  Status kernelError() const;
  // Marks every device FIFO broken, so that the peers' kernels stop waiting (abort).
  void breakLinks();

  // Up to this many ranks, connectAtCreation also makes the links of sends and receives to
  // every other rank (a FIFO each way and pair: NCCL_BUFFSIZE and the LL slots, 4.1 MiB by
  // default); more, and a pair's first send or receive makes them.
  static constexpr int kP2pLinksAtCreationMaxRanks = 16;
  // Makes the engine and the ring's GPU links on every channel, as the first collective would
  // (and the links of sends and receives: kP2pLinksAtCreationMaxRanks), collectively over the
  // communicator. Called from its creation, every rank inside it, where
  // Comm::threadsShareGpu: making them at the first collective instead allocates device memory
  // (which may wait for the whole GPU) while another communicator's kernel may wait for this
  // very thread's next call -- a deadlock of ranks that share a GPU as threads.
  Status connectAtCreation();

  // Channels (blocks) per collective at most.
  int maxChannels() const { return maxChannels_; }
  // Whether launches pass a kernel's whole parameter (TUTTI_LAUNCH_FULL_PARAMS=1, or after the
  // driver refused the bytes used: launchOne), not only the bytes it uses.
  bool launchesWholeParams() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fullParams_;
  }
  // Whether the GPU ranks agree on the planner's settings (checkDeviceSettingsAgree): group.cc
  // refuses device operations before anything runs where they do not.
  const Status& settingsAgree() const { return settingsAgree_; }

  // Whether ranks of this process share this GPU as threads (this communicator's, or another
  // engine's here): then the destructor frees on a thread of its own (Reaper), and
  // link set-up leaves what it could free to the links' destructors (p2p).
  bool threadsShareGpuHere() const;

 private:
  Status init();
  Status plan(const CollArgs* ops, size_t n);  // prepare() under mu_
  using Entries = StreamEntries<DeviceEvent>;
  Status enterStream(void* stream, bool grouped, bool direct, bool* follower);
  Status waitFirst(const Entries::Ref& e, bool launch);
  void releaseFollowers();
  Status launchAll();  // launch() under mu_
  // Launches plan_.launches[i] on target_; its kernel gets the bytes of its dev::DevArgs it
  // uses (the driver's cuLaunchKernel), or all of them (TUTTI_LAUNCH_FULL_PARAMS=1, or once
  // the driver refused a launch that cudaLaunchKernel then made).
  Status launchOne(size_t i);
  Status connect(const devplan::Config& cfg, const CollArgs* ops, size_t n);
  devplan::Config planConfig() const;  // the planner's settings for this rank
  void clearPlan() {  // keeping the vectors' room: a plan is made at every operation
    plan_.launches.clear();
    plan_.copies.clear();
    kernels_.clear();
    streams_.clear();
  }
  Status cudaCheck(const char* what, int err) const;
  // Registers the peer processes of this host with runtime/peer_watch.h.
  void watchPeers();
  // This communicator's ranks on this rank's GPU: how many, how many of them in other
  // processes, and the lowest (who says what concerns them all).
  struct GpuShare {
    int ranks = 0, otherProcesses = 0, lowest = 0;
  };
  GpuShare gpuShare() const;
  // Other processes' ranks on this GPU and no MPS: says so.
  void warnSharedGpuProcesses() const;
  // Makes the target stream wait for this communicator's last launch where needed (serial_).
  Status orderAfterLast();
  // After the prepared group's kernels are queued: serial_ (and capEv_ in a capture).
  Status markLaunched();
  // The own stream is in the capture (or none) of the caller's streams; else a clear refusal.
  Status checkOwnCapture() const;
  // Sets p2pCap_ once.
  void findP2pBlockCap();
  // The ranks on this GPU need more blocks resident at once than it holds: says so.
  void warnTooFewResidentBlocks(int resident) const;
  // Whether another communicator's engine in this process (siblingsOnly: one with ranks on
  // threads sharing this GPU, not this communicator's) has a launch on this GPU that has not
  // ended 2 s later: a cudaFree would wait for it.
  bool othersBusyOnGpu(bool siblingsOnly) const;
  // Whether a rank of this communicator is a thread of this process on another GPU: a link to
  // it frees that rank's FIFO (on its GPU) where this end goes last, and cudaFree waits for
  // that whole GPU, whose kernel of another communicator may wait for this thread's next call.
  // Then the destructor frees on a thread of its own too.
  bool threadsOnOtherGpus() const;
  // Joins the process's list of engines othersBusyOnGpu looks through (the destructor leaves).
  void listEngine();
  // What a timeout adds where ranks of this communicator share this GPU as threads: "" if none.
  std::string heldThreads() const;

  Comm& comm_;
  std::unique_ptr<Links> links_;
  mutable std::mutex mu_;
  bool ready_ = false;
  void* stream_ = nullptr;  // cudaStream_t
  void* entry_ = nullptr;   // cudaEvent_t
  void* done_ = nullptr;
  uint32_t* abortHost_ = nullptr;
  const uint32_t* abortDev_ = nullptr;
  std::atomic<dev::DevError*> errHost_{nullptr};  // read by ncclCommGetAsyncError's thread
  dev::DevError* errDev_ = nullptr;
  uint32_t* errClaim_ = nullptr;  // device memory
  int maxChannels_;
  Status settingsAgree_;  // checkDeviceSettingsAgree over the peers: prepare() refuses if not
  int shared_ = 1;  // the most ranks of this communicator on any one GPU (alike on every rank)
  // Blocks a group of sends and receives may take on this rank (one per peer and direction, or
  // fewer, each running several pairs: devplan::plan): the ranks sharing a GPU may each run such
  // a kernel at once, and their blocks wait for each other, so all must be resident together.
  // Half of what the GPU holds at once (SMs x blocks per SM of the send/receive kernels), as
  // for the collectives, shared among them; TUTTI_P2P_MAX_BLOCKS overrides it (2 at least). Found
  // by init() (findP2pBlockCap).
  std::atomic<int> p2pCap_{0};
  size_t llMaxBytes_;
  size_t gatherMaxBytes_;  // TUTTI_LL_GATHER_MAX_BYTES (devplan::Config::gatherMaxBytes)
  size_t channelBytes_;
  double timeoutS_;
  int proto_ = -1;    // NCCL_PROTO: -1 automatic
  int siblings_ = 0;  // other ranks of this comm in this process on this GPU
  // The first collective made (or found) every channel's ring links; atomic: prepare reads it
  // before taking mu_.
  std::atomic<bool> ringConnected_{false};
  std::vector<bool> isSibling_;  // by rank
  GroupCounter groups_;
  GroupPos groupPos_;      // the prepared group's place, alike on the siblings in it
  int groupSiblings_ = 0;  // the siblings that take part in it
  bool entered_ = false;   // enter() made the prepared group's entries
  bool warnedShared_ = false;
  bool warnedSharedP2p_ = false;           // sends and receives on a sibling's stream: said once
  bool warnedLegacy_ = false;              // stream 0 outside a group with siblings: said once
  bool ownJoinedCapture_ = false;          // the own stream waited for a capturing stream once
  std::atomic<bool> doneCaptured_{false};  // done_'s last record was in a capture
  devplan::Plan plan_;                     // the prepared group
  std::vector<const void*> kernels_;       // one per plan_.launches
  std::unique_ptr<dev::DevArgs> args_;     // the packed parameter of the launch being made
  std::unordered_map<const void*, void*> functions_;  // kernel -> CUfunction, made by init()
  bool fullParams_ = false;    // launches pass the whole dev::DevArgs, by the runtime's launch
  bool llFullBlocks_ = false;  // TUTTI_LL_FULL_BLOCKS: no devplan::Config::llFitThreads
  // The driver's cuLaunchKernel, which takes a kernel's parameter as a buffer of a given size
  // (the runtime's cudaLaunchKernel copies it whole): null where the driver has none.
  void* driverLaunch_ = nullptr;
  std::vector<void*> streams_;  // the distinct caller streams of the prepared group
  void* target_ = nullptr;      // where the prepared group launches: a caller's (onCaller_) or own
  std::vector<Entries::Ref> leading_;    // entries this rank leads, on the stream it launches on
  std::vector<Entries::Ref> following_;  // whose first launches where this rank joins back
  // Every launch of this communicator runs after the one before, wherever each was issued:
  // a kernel reads its FIFO positions from GPU memory as it starts, so two in flight at once
  // would claim the same steps. serial_ is recorded after each launch (under capture as an
  // external node, so each replay of the graph records it too); a launch waits for it where
  // stream order does not already give that: on another stream than the last launch's, in a
  // capture, and after any capture (a replay may run between any two calls). The destructor
  // and noteAbort wait for or query it: it marks the end of all this engine's kernels.
  void* serial_ = nullptr;            // cudaEvent_t
  void* capEv_ = nullptr;             // recorded in a capture after each launch into it (an edge)
  void* lastTarget_ = nullptr;        // the stream of the last launch, where lastKnown_
  bool lastKnown_ = false;            // the last launch recorded serial_ (else the next one waits)
  bool capturedEver_ = false;         // a launch of this communicator went into a graph
  unsigned long long captureId_ = 0;  // the capture the prepared group launches into
  unsigned long long capEvCapture_ = 0;  // the capture capEv_ was last recorded in; 0: none
  // Where the prepared group launches: no capture; a capture, serial_ in the graph; a capture
  // without it (NCCL_GRAPH_MIXING_SUPPORT=0).
  enum class Capture { kNone, kOrdered, kUnordered } capture_ = Capture::kNone;
  unsigned long long lastCapture_ = 0;  // the capture the last launch went into; 0: none
  bool onCaller_ = false;               // the prepared group launches on the caller's stream
  bool launched_ = false;               // launch() ran for the prepared group
  bool graphMixing_ = true;             // NCCL_GRAPH_MIXING_SUPPORT
  // The watch on the peer processes of this host (runtime/peer_watch.h; 0: none), and the
  // peers it found gone, by rank (their pids), for the kernels' error messages.
  uint64_t watch_ = 0;
  std::atomic<bool> busyAtAbort_{false};  // noteAbort found work in flight
  std::atomic<uint64_t> launches_{0};     // launch() calls
  uint64_t launchesAtAbort_ = 0;          // launches_ when noteAbort ran
  mutable std::mutex exitedMu_;
  std::map<int, int64_t> exited_;
};

}  // namespace tutti
