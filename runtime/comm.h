// The communicator: identity, bootstrap, peers, lifecycle state and the abort flag that every
// wait polls. Data-path state (connections, channels, engines) joins it in later layers.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/bootstrap.h"
#include "runtime/bootstrap_root.h"
#include "runtime/coll_args.h"
#include "runtime/peer_info.h"
#include "runtime/status.h"

namespace tutti {

class DeviceEngine;
class Engine;
class Links;

// ncclConfig_t after the ABI rule has been applied (bindings/c/config.cc); -1 / "" = unset.
struct CommConfig {
  bool blocking = true;
  int cgaClusterSize = -1;
  int minCTAs = -1;
  int maxCTAs = -1;
  std::string netName;
  bool splitShare = false;
  int trafficClass = -1;
  std::string commName;
};

class Comm {
 public:
  enum class State : int { kInitializing, kReady, kFailed, kFinalized };

  Comm(int rank, int nranks, int cudaDev, CommConfig config);
  ~Comm();  // joins background work; call abort() first to make that prompt
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  // Forms the communicator from a unique id: bootstrap ring and peer-info exchange.
  Status init(const wire::UniqueId& id);
  // Runs `work` (init or split) on a background thread; state() tells when it is done.
  std::shared_future<Status> startAsync(std::function<Status()> work);
  // Waits for background work and returns its outcome.
  Status wait();
  // Records the outcome of init (or split) done on the caller's thread.
  void finish(const Status& s);
  // Background work started on this comm's behalf that must end before it is freed
  // (a NOCOLOR rank still takes part in its parent's split exchange, for instance). It joins
  // the family's too (waitFamilyHelpersFor).
  void adoptHelper(std::shared_future<Status> work);
  // Waits until the background work adopted so far has ended (its result is reported where it
  // belongs, not here). One atomic load when none.
  void waitHelpers();
  // The same for the work this rank's communicators of this one's family adopted (the one it
  // was split from, and every split of theirs, down the tree; each rank has its own), for at
  // most `limit`: whether it all ended. A device operation of a communicator whose ranks share
  // a GPU as threads calls it first: a split's new communicators make their GPU links
  // (DeviceEngine::connectAtCreation), which may wait for the whole GPU, and this operation's
  // kernel could wait for ranks whose threads wait for those links -- a rank of no colour in a
  // non-blocking split that goes on to a sibling communicator, say, whose kernel waits for a
  // member still waiting for its new child. The caller may give up (DeviceEngine::prepare):
  // a kernel that waits for this rank, queued before the split makes its links (by a rank
  // outside it, on another communicator), holds the GPU those links wait for until this
  // operation's kernel joins it (a blocking split cannot survive that one).
  bool waitFamilyHelpersFor(std::chrono::milliseconds limit);
  // A split's child, before init: its family is its parent's, and it shares a GPU where its
  // parent does (threadsShareGpu).
  void inheritFrom(const Comm& parent) {
    family_ = parent.family_;
    parentThreadsShareGpu_ = parent.threadsShareGpu_;
  }
  // Background work's use of the bootstrap ring (a non-blocking split's exchange: two
  // all-gathers from its helper thread): `done` is ready once it no longer uses the ring. The
  // first GPU collective, whose ring links end with a barrier on that ring, waits for it first
  // (waitRingUsers): all-gathers of one ring that two ranks run in different orders read each
  // other's bytes (a split's ids came out shifted by the barrier's). One atomic load when none.
  void adoptRingUser(std::shared_future<void> done);
  void waitRingUsers();

  State state() const { return state_.load(std::memory_order_acquire); }
  void markFinalized() { state_.store(State::kFinalized, std::memory_order_release); }
  // ncclSuccess, ncclInProgress while initializing, or the first error.
  Code asyncCode() const { return asyncCode_.load(std::memory_order_acquire); }
  std::string asyncMessage() const;
  void setAsyncError(const Status& s);
  // Ok, or the refusal of an operation on a communicator that failed earlier (its error).
  Status failedEarlier() const;

  // Makes every wait of this comm return; safe from any thread, returns at once.
  void requestAbort() {
    abort_.store(true, std::memory_order_release);
    // Kernels of this comm poll this word (mapped host memory) instead.
    if (uint32_t* w = deviceAbortWord_.load(std::memory_order_acquire))
      __atomic_store_n(w, 1u, __ATOMIC_RELEASE);
  }
  void setDeviceAbortWord(uint32_t* w) { deviceAbortWord_.store(w, std::memory_order_release); }
  bool aborted() const { return abort_.load(std::memory_order_acquire); }
  const std::atomic<bool>* abortFlag() const { return &abort_; }

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int cudaDev() const { return cudaDev_; }
  uint64_t commHash() const { return commHash_; }
  const CommConfig& config() const { return config_; }
  Bootstrap* bootstrap() { return bootstrap_.get(); }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  // Every rank is a GPU rank of this host (what GPU buffers in a collective need), as the
  // peer exchange at init found.
  bool peersOnLocalGpus() const { return peersOnLocalGpus_; }
  // Two ranks of this communicator, or of the one it was split from, are threads of one
  // process on one GPU (and every rank is on a GPU of this host): their kernels wait for each
  // other, so the communicator makes its GPU links at creation (DeviceEngine::connectAtCreation),
  // and its splits end with a barrier of it (runSplit). A split's child on GPUs none of its
  // own ranks share still does: the parent's kernel on one of them may wait for a thread that
  // would otherwise allocate the child's links at its first collective. Alike on every rank.
  bool threadsShareGpu() const { return threadsShareGpu_; }
  // Split re-seats the identity before init (rank and size are learned from the parent).
  void setIdentity(int rank, int nranks) { rank_ = rank, nranks_ = nranks; }

  // Splits of this comm run their bootstrap exchanges in the order they were called, which
  // every rank shares, even when several run in the background at once.
  uint64_t takeSplitTicket() { return nextSplitTicket_.fetch_add(1); }
  // Waits for the ticket's turn; fails if this comm or `alsoAbort` is aborted meanwhile. Where
  // this comm was, the turn is given up (skipped when it comes); where only `alsoAbort` was,
  // *alsoAborted says so and the turn is still the caller's to take (runSplit).
  Status waitSplitTurn(uint64_t ticket, const std::atomic<bool>* alsoAbort, bool* alsoAborted);
  void endSplitTurn();
  // Gives the ticket's turn up (ended now if it is the current one, else skipped when it comes).
  void abandonSplitTurn(uint64_t ticket);

  // The root this comm's rank 0 hosts (NCCL_COMM_ID style); stopped when the comm ends.
  void setRoot(std::shared_ptr<RootControl> root) { root_ = std::move(root); }

  // Data path (made by init): connections to peers and the CPU engine.
  Links& links() { return *links_; }
  Engine& engine() { return *engine_; }
  // The CUDA engine, made the first time an operation on GPU buffers needs it.
  DeviceEngine& deviceEngine();
  // Turns what a kernel reported (abort, deadline) into this comm's async error.
  void pollDeviceErrors();
  // Tells every connected peer this rank has gone (abort); no-op before init finished.
  void breakLinks();
  // As ncclCommAbort begins (DeviceEngine::noteAbort).
  void noteAbort();
  uint64_t nextSeq() { return seq_.fetch_add(1); }

  // API calls in progress on this comm: it is freed only once they have all returned.
  void pin() { calls_.fetch_add(1); }
  void unpin() { calls_.fetch_sub(1); }
  void waitUnpinned() const;

  // ncclRedOpCreatePreMulSum / ncclRedOpDestroy: ops numbered from ncclNumOps.
  Result<int> createPreMulSum(const void* scalar, int dtype, bool deviceResident);
  Status destroyOp(int op);
  // Resolves an op for an operation on dtype (user ops must match their datatype).
  Result<RedOpSpec> resolveOp(int op, int dtype) const;

 private:
  void logLayout() const;
  // The device engine if one was made (nullptr otherwise); makes none.
  DeviceEngine* madeDeviceEngine();

  std::atomic<int> rank_, nranks_;
  int cudaDev_;
  uint64_t commHash_ = 0;
  CommConfig config_;
  std::atomic<State> state_{State::kInitializing};
  std::atomic<Code> asyncCode_{Code::kOk};
  mutable std::mutex mu_;
  std::string asyncMessage_;
  std::atomic<bool> abort_{false};
  std::atomic<uint32_t*> deviceAbortWord_{nullptr};
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<PeerInfo> peers_;
  bool peersOnLocalGpus_ = false;
  bool threadsShareGpu_ = false;
  bool parentThreadsShareGpu_ = false;
  std::thread worker_;
  std::vector<std::shared_future<Status>> helpers_;  // guarded by mu_
  std::atomic<bool> helpersPending_{false};          // helpers_ may hold unfinished work
  struct Family;                                     // the helpers of the split tree's comms
  std::shared_ptr<Family> family_;
  std::vector<std::shared_future<void>> ringUsers_;  // guarded by mu_
  std::atomic<bool> ringUsersPending_{false};        // ringUsers_ may hold unfinished ones
  std::atomic<uint64_t> nextSplitTicket_{0};
  uint64_t splitTurn_ = 0;             // guarded by mu_
  std::set<uint64_t> abandonedTurns_;  // guarded by mu_: aborted before their turn came
  std::condition_variable splitCv_;
  std::shared_ptr<RootControl> root_;
  std::atomic<uint64_t> seq_{0};
  std::atomic<int> calls_{0};
  struct UserOp {
    bool live = false;
    int dtype = 0;
    bool device = false;
    uint8_t scalar[8]{};
    const void* ptr = nullptr;
  };
  std::vector<UserOp> userOps_;  // guarded by mu_
  // Declared last: freed first, while bootstrap and peers are still there.
  std::unique_ptr<Links> links_;
  std::unique_ptr<Engine> engine_;
  std::mutex deviceMu_;
  std::unique_ptr<DeviceEngine> deviceEngine_;  // freed before the host engine and links
};

// Live communicators, so a destroyed or never-created handle is refused instead of followed.
namespace registry {
void add(Comm* comm);
// True for the one caller that removed it (two threads may race to destroy a comm).
bool remove(Comm* comm);
bool contains(const void* comm);
// The comm, pinned (see Comm::pin), or nullptr when the handle is not a live comm.
Comm* pin(const void* comm);
}  // namespace registry

}  // namespace tutti
