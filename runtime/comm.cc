#include "runtime/comm.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>
#include <unordered_set>

#include "nccl.h"
#include "runtime/cuda_shim.h"
#include "runtime/device_engine.h"
#include "runtime/dtype.h"
#include "runtime/engine.h"
#include "runtime/env.h"
#include "runtime/links.h"
#include "runtime/log.h"

namespace tutti {

struct Comm::Family {
  std::mutex mu;
  std::vector<std::shared_future<Status>> helpers;  // guarded by mu
  std::atomic<bool> pending{false};
};

Comm::Comm(int rank, int nranks, int cudaDev, CommConfig config)
    : rank_(rank),
      nranks_(nranks),
      cudaDev_(cudaDev),
      config_(std::move(config)),
      family_(std::make_shared<Family>()) {
  asyncCode_.store(Code::kInProgress);
}

Comm::~Comm() {
  if (worker_.joinable()) worker_.join();
  if (root_) root_->stopAndWait();
  // (A helper may adopt another meanwhile: a split's stand-in, runSplit.)
  do {
    waitHelpers();
  } while (helpersPending_.load(std::memory_order_acquire));
  deviceEngine_.reset();  // waits for this comm's kernels: they use its FIFOs
  engine_.reset();
  links_.reset();
}

DeviceEngine& Comm::deviceEngine() {
  std::lock_guard<std::mutex> lock(deviceMu_);
  if (!deviceEngine_) deviceEngine_ = std::make_unique<DeviceEngine>(*this);
  return *deviceEngine_;
}

DeviceEngine* Comm::madeDeviceEngine() {
  std::lock_guard<std::mutex> lock(deviceMu_);
  return deviceEngine_.get();
}

void Comm::pollDeviceErrors() {
  DeviceEngine* d = madeDeviceEngine();
  if (!d) return;
  if (Status s = d->kernelError(); !s.ok() && asyncCode() == Code::kOk) setAsyncError(s);
}

void Comm::breakLinks() {
  // The state first: links_ is made by init, perhaps on another thread (a non-blocking
  // creation being aborted), and is only read once the state says init is over.
  State st = state();
  if ((st == State::kReady || st == State::kFinalized) && links_) links_->breakAll();
  DeviceEngine* d = madeDeviceEngine();
  if (d) d->breakLinks();
}

void Comm::noteAbort() {
  DeviceEngine* d = madeDeviceEngine();
  if (d) d->noteAbort();
}

void Comm::waitUnpinned() const {
  while (calls_.load(std::memory_order_acquire) > 0) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Result<int> Comm::createPreMulSum(const void* scalar, int dtype, bool deviceResident) {
  std::lock_guard<std::mutex> lock(mu_);
  UserOp op;
  op.live = true;
  op.dtype = dtype;
  op.device = deviceResident;
  if (deviceResident) {
    op.ptr = scalar;
  } else {
    memcpy(op.scalar, scalar, dtypeSize(dtype));
  }
  for (size_t i = 0; i < userOps_.size(); ++i) {
    if (!userOps_[i].live) {
      userOps_[i] = op;
      return ncclNumOps + static_cast<int>(i);
    }
  }
  if (userOps_.size() >= 1u << 20)
    return invalidUsage("too many live ncclRedOpCreatePreMulSum ops");
  userOps_.push_back(op);
  return ncclNumOps + static_cast<int>(userOps_.size() - 1);
}

Status Comm::destroyOp(int op) {
  std::lock_guard<std::mutex> lock(mu_);
  if (op < ncclNumOps) {
    return invalidArgument("op " + std::to_string(op) +
                           " is a built-in op, not one made by "
                           "ncclRedOpCreatePreMulSum");
  }
  size_t i = static_cast<size_t>(op - ncclNumOps);
  if (i >= userOps_.size() || !userOps_[i].live) {
    return invalidArgument("op " + std::to_string(op) + " is not a live op of this communicator");
  }
  userOps_[i].live = false;
  return Status::Ok();
}

Result<RedOpSpec> Comm::resolveOp(int op, int dtype) const {
  RedOpSpec spec;
  if (op == ncclAvg) return averageSpec(dtype, nranks_);
  if (op >= 0 && op < ncclNumOps) {
    spec.fn = op;
    return spec;
  }
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = static_cast<size_t>(op - ncclNumOps);
  if (op < 0 || i >= userOps_.size() || !userOps_[i].live) {
    return invalidArgument("reduction op " + std::to_string(op) +
                           " is not a valid ncclRedOp_t (no live ncclRedOpCreatePreMulSum op "
                           "of this communicator has that value)");
  }
  const UserOp& u = userOps_[i];
  if (u.dtype != dtype) {
    return invalidArgument(std::string("reduction op ") + std::to_string(op) + " was made for " +
                           dtypeName(u.dtype) + ", not " + dtypeName(dtype));
  }
  spec.fn = ncclSum;
  spec.pre = true;
  memcpy(spec.scalar, u.scalar, sizeof(spec.scalar));
  spec.scalarPtr = u.device ? u.ptr : nullptr;
  return spec;
}

Status Comm::waitSplitTurn(uint64_t ticket, const std::atomic<bool>* alsoAbort, bool* alsoAborted) {
  *alsoAborted = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (splitTurn_ != ticket) {
    if (aborted()) {
      // Give the turn up, so the splits queued behind this one are not left waiting for it.
      abandonedTurns_.insert(ticket);
      return net::abortedStatus();
    }
    if (alsoAbort && alsoAbort->load()) {
      *alsoAborted = true;
      return net::abortedStatus();
    }
    splitCv_.wait_for(lock, std::chrono::milliseconds(100));
  }
  return Status::Ok();
}

void Comm::abandonSplitTurn(uint64_t ticket) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (splitTurn_ != ticket) {
      abandonedTurns_.insert(ticket);
      return;
    }
  }
  endSplitTurn();
}

void Comm::endSplitTurn() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++splitTurn_;
    while (abandonedTurns_.erase(splitTurn_)) ++splitTurn_;
  }
  splitCv_.notify_all();
}

Status Comm::failedEarlier() const {
  const Code c = asyncCode();
  if (c == Code::kOk || c == Code::kInProgress) return Status::Ok();
  return Status(c, "rank " + std::to_string(rank()) +
                       ": the communicator failed earlier and cannot run more operations (abort "
                       "it and make a new one): " +
                       asyncMessage());
}

std::string Comm::asyncMessage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return asyncMessage_;
}

void Comm::setAsyncError(const Status& s) {
  if (s.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  Code current = asyncCode_.load();
  if (current != Code::kOk && current != Code::kInProgress) return;  // keep the first error
  asyncMessage_ = s.message();
  asyncCode_.store(s.code(), std::memory_order_release);
}

Status Comm::init(const wire::UniqueId& id) {
  log::setThreadDevice(cudaDev_);
  commHash_ = fnv1a(&id, sizeof(id));
  TUTTI_INFO(log::kInit, "comm %p rank %d nranks %d cudaDev %d busId %s commId 0x%llx - Init START",
             static_cast<void*>(this), rank(), nranks(), cudaDev_,
             cudaDev_ >= 0 ? cuda::busId(cudaDev_).c_str() : "none",
             static_cast<unsigned long long>(commHash_));
  Result<std::unique_ptr<Bootstrap>> b =
      Bootstrap::create(id, rank(), nranks(), &abort_, env::bootstrapTimeoutSeconds());
  if (!b.ok()) return b.status();
  bootstrap_ = b.take();

  peers_.assign(static_cast<size_t>(nranks()), PeerInfo{});
  peers_[static_cast<size_t>(rank())] = localPeerInfo(rank(), cudaDev_, bootstrap_->listenAddr());
  TUTTI_TRY(bootstrap_->allGather(peers_.data(), sizeof(PeerInfo)).withContext("peer info"));
  for (int r = 0; r < nranks(); ++r) {
    if (peers_[static_cast<size_t>(r)].rank != r) {
      return internalError("peer info exchange: slot " + std::to_string(r) + " holds rank " +
                           std::to_string(peers_[static_cast<size_t>(r)].rank));
    }
  }
  peersOnLocalGpus_ = true;
  for (const PeerInfo& p : peers_) {
    peersOnLocalGpus_ &= p.cudaDev >= 0 && p.hostHash == peers_[size_t(rank())].hostHash;
  }
  threadsShareGpu_ = peersOnLocalGpus_ && parentThreadsShareGpu_;
  for (size_t a = 0; a < peers_.size() && peersOnLocalGpus_ && !threadsShareGpu_; ++a) {
    for (size_t b = a + 1; b < peers_.size() && !threadsShareGpu_; ++b) {
      const PeerInfo &p = peers_[a], &q = peers_[b];
      threadsShareGpu_ = p.pid == q.pid && p.pidNs == q.pidNs && sameGpu(p, q);
    }
  }
  // Link setup waits on single peers through the bootstrap: a peer process that exited
  // (killed, crashed, or failed before its links) ends the wait at once, by name, instead of
  // after TUTTI_BOOTSTRAP_TIMEOUT.
  auto watches = [this](int peer) {
    return canWatchProcess(peers_[static_cast<size_t>(rank())], peers_[static_cast<size_t>(peer)]);
  };
  auto check = [this, watches](int peer) {
    const PeerInfo& p = peers_[static_cast<size_t>(peer)];
    if (!watches(peer) || processAlive(p.pid)) return Status::Ok();
    return remoteError("rank " + std::to_string(peer) + " (pid " + std::to_string(p.pid) +
                       ", same machine) exited");
  };
  bootstrap_->setPeerCheck({watches, check});
  logLayout();
  links_ = std::make_unique<Links>(*this);
  engine_ = std::make_unique<Engine>(*this);
  // Ranks sharing a GPU as threads: the GPU links now, every rank inside its creation, not at
  // the first collective (DeviceEngine::connectAtCreation says why).
  if (threadsShareGpu_) {
    TUTTI_TRY(deviceEngine().connectAtCreation().withContext(
        "rank " + std::to_string(rank()) + ": making the GPU links of ranks that share a GPU"));
  }
  TUTTI_INFO(log::kInit, "comm %p rank %d nranks %d cudaDev %d - Init COMPLETE",
             static_cast<void*>(this), rank(), nranks(), cudaDev_);
  return Status::Ok();
}

void Comm::logLayout() const {
  if (!log::enabled(log::Level::kInfo, log::kInit)) return;
  const PeerInfo& me = peers_[static_cast<size_t>(rank())];
  int local = 0;
  for (const PeerInfo& p : peers_) local += p.hostHash == me.hostHash;
  TUTTI_INFO(log::kInit, "rank %d: host %s pid %lld %s%s, %d of %d ranks on this host%s%s", rank(),
             me.hostname, static_cast<long long>(me.pid), cudaDev_ >= 0 ? "cudaDev " : "CPU rank",
             cudaDev_ >= 0 ? std::to_string(cudaDev_).c_str() : "", local, nranks(),
             config_.commName.empty() ? "" : ", commName ", config_.commName.c_str());
  if (rank() != 0) return;
  for (const PeerInfo& p : peers_) {
    TUTTI_INFO(log::kInit, "  rank %d -> host %s pid %lld dev %d%s%s bootstrap %s", p.rank,
               p.hostname, static_cast<long long>(p.pid), p.cudaDev, p.busId[0] ? " bus " : "",
               p.busId, wire::toSockAddr(p.bootstrapAddr).toString().c_str());
  }
}

std::shared_future<Status> Comm::startAsync(std::function<Status()> work) {
  std::packaged_task<Status()> task([this, work = std::move(work)] {
    log::setThreadDevice(cudaDev_);
    if (cudaDev_ >= 0) (void)cuda::setDevice(cudaDev_);
    Status s;
    try {
      s = work();
    } catch (const std::exception& e) {  // e.g. bad_alloc: must still end in a state
      s = internalError(std::string("initialization failed: ") + e.what());
    }
    finish(s);
    return s;
  });
  std::shared_future<Status> done = task.get_future().share();
  worker_ = std::thread(std::move(task));
  return done;
}

void Comm::finish(const Status& s) {
  if (s.ok()) {
    asyncCode_.store(Code::kOk, std::memory_order_release);
    state_.store(State::kReady, std::memory_order_release);
  } else {
    setAsyncError(s);
    state_.store(State::kFailed, std::memory_order_release);
  }
}

Status Comm::wait() {
  if (worker_.joinable()) worker_.join();
  Code c = asyncCode();
  if (c == Code::kOk) return Status::Ok();
  return Status(c, asyncMessage());
}

namespace {

// Drops the ended futures of *list (under the communicator's mu_).
template <typename T>
void dropEnded(std::vector<std::shared_future<T>>* list) {
  list->erase(std::remove_if(list->begin(), list->end(),
                             [](const std::shared_future<T>& f) {
                               return f.wait_for(std::chrono::seconds(0)) ==
                                      std::future_status::ready;
                             }),
              list->end());
}

// Adds f to *list, dropping the ended ones (a communicator split thousands of times, that
// never waits for them, keeps few).
template <typename T>
void adopt(std::mutex& mu, std::vector<std::shared_future<T>>* list, std::atomic<bool>* pending,
           std::shared_future<T> f) {
  std::lock_guard<std::mutex> lock(mu);
  dropEnded(list);
  list->push_back(std::move(f));
  pending->store(true, std::memory_order_release);
}

// Waits for the futures in *list (copied under mu, waited for without it: the work may report
// through the communicator), until `deadline` at the latest, then drops the ended ones; one
// added meanwhile stays, and keeps *pending up. Whether all that were there ended.
template <typename T>
bool waitAdopted(
    std::mutex& mu, std::vector<std::shared_future<T>>* list, std::atomic<bool>* pending,
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
  if (!pending->load(std::memory_order_acquire)) return true;
  std::vector<std::shared_future<T>> copy;
  {
    std::lock_guard<std::mutex> lock(mu);
    copy = *list;
  }
  bool all = true;
  for (auto& f : copy) {
    if (deadline == std::chrono::steady_clock::time_point::max()) {
      f.wait();
    } else {
      all = all && f.wait_until(deadline) == std::future_status::ready;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  dropEnded(list);
  pending->store(!list->empty(), std::memory_order_release);
  return all;
}

}  // namespace

void Comm::adoptHelper(std::shared_future<Status> work) {
  adopt(family_->mu, &family_->helpers, &family_->pending, work);
  adopt(mu_, &helpers_, &helpersPending_, std::move(work));
}

void Comm::waitHelpers() { waitAdopted(mu_, &helpers_, &helpersPending_); }

bool Comm::waitFamilyHelpersFor(std::chrono::milliseconds limit) {
  return waitAdopted(family_->mu, &family_->helpers, &family_->pending,
                     std::chrono::steady_clock::now() + limit);
}

void Comm::adoptRingUser(std::shared_future<void> done) {
  adopt(mu_, &ringUsers_, &ringUsersPending_, std::move(done));
}

void Comm::waitRingUsers() { waitAdopted(mu_, &ringUsers_, &ringUsersPending_); }

namespace registry {
namespace {
std::mutex& mu() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::unordered_set<const void*>& live() {
  static auto* s = new std::unordered_set<const void*>();
  return *s;
}
}  // namespace

void add(Comm* comm) {
  std::lock_guard<std::mutex> lock(mu());
  live().insert(comm);
}
bool remove(Comm* comm) {
  std::lock_guard<std::mutex> lock(mu());
  return live().erase(comm) != 0;
}
bool contains(const void* comm) {
  std::lock_guard<std::mutex> lock(mu());
  return live().count(comm) != 0;
}
Comm* pin(const void* comm) {
  std::lock_guard<std::mutex> lock(mu());
  if (!live().count(comm)) return nullptr;
  Comm* c = static_cast<Comm*>(const_cast<void*>(comm));
  c->pin();
  return c;
}
}  // namespace registry

}  // namespace tutti
