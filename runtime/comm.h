// The communicator: identity, bootstrap, peers, lifecycle state and the abort flag that every
// wait polls. Data-path state (connections, channels, engines) joins it in later layers.
#pragma once

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/bootstrap.h"
#include "runtime/peer_info.h"
#include "runtime/status.h"

namespace tutti {

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
  // (a NOCOLOR rank still takes part in its parent's split exchange, for instance).
  void adoptHelper(std::shared_future<Status> work);

  State state() const { return state_.load(std::memory_order_acquire); }
  void markFinalized() { state_.store(State::kFinalized, std::memory_order_release); }
  // ncclSuccess, ncclInProgress while initializing, or the first error.
  Code asyncCode() const { return asyncCode_.load(std::memory_order_acquire); }
  std::string asyncMessage() const;
  void setAsyncError(const Status& s);

  // Makes every wait of this comm return; safe from any thread, returns at once.
  void requestAbort() { abort_.store(true, std::memory_order_release); }
  bool aborted() const { return abort_.load(std::memory_order_acquire); }
  const std::atomic<bool>* abortFlag() const { return &abort_; }

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  int cudaDev() const { return cudaDev_; }
  uint64_t commHash() const { return commHash_; }
  const CommConfig& config() const { return config_; }
  Bootstrap* bootstrap() { return bootstrap_.get(); }
  const std::vector<PeerInfo>& peers() const { return peers_; }
  // Split re-seats the identity before init (rank and size are learned from the parent).
  void setIdentity(int rank, int nranks) { rank_ = rank, nranks_ = nranks; }

 private:
  void logLayout() const;

  int rank_, nranks_, cudaDev_;
  uint64_t commHash_ = 0;
  CommConfig config_;
  std::atomic<State> state_{State::kInitializing};
  std::atomic<Code> asyncCode_{Code::kOk};
  mutable std::mutex mu_;
  std::string asyncMessage_;
  std::atomic<bool> abort_{false};
  std::unique_ptr<Bootstrap> bootstrap_;
  std::vector<PeerInfo> peers_;
  std::thread worker_;
  std::vector<std::shared_future<Status>> helpers_;
};

// Live communicators, so a destroyed or never-created handle is refused instead of followed.
namespace registry {
void add(Comm* comm);
void remove(Comm* comm);
bool contains(const void* comm);
}  // namespace registry

}  // namespace tutti
