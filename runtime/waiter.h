// How the CPU engine waits on a FIFO counter: spin briefly, then yield, then sleep in short
// naps; and every so often check what could make the wait endless -- ncclCommAbort, a failed
// or vanished peer, another channel of the same operation failing, the deadline. The first
// failure is kept (with the rank, operation and peer in its message) and every later wait of
// the operation returns at once, so an algorithm loop runs to its end without blocking.
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

#include "runtime/coll_args.h"
#include "runtime/status.h"
#include "transports/transport.h"

namespace tutti {

class Comm;

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Shared by the channels of one operation.
class OpState {
 public:
  // op: the collective, or nullptr for a group of `groupSize` send/recv operations.
  OpState(const Comm& comm, const CollArgs* op, uint64_t seq, size_t groupSize, double timeoutS);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  void fail(const Status& s);
  Status status() const;
  const Comm& comm() const { return comm_; }
  // "ncclAllReduce seq 4 (1024 x float, sum)"; built only when a message needs it.
  std::string what() const;
  double timeoutS() const { return timeoutS_; }
  // How long a wait busy-polls before it starts yielding the core.
  int64_t spinNs() const { return spinNs_; }
  void setSpinNs(int64_t ns) { spinNs_ = ns; }

 private:
  const Comm& comm_;
  const CollArgs* op_;
  uint64_t seq_;
  size_t groupSize_;
  int64_t spinNs_ = 0;
  double timeoutS_;
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  Status first_;
};

class Waiter {
 public:
  // tcp waits yield this many times (polling the socket between) before they sleep in
  // poll(2): with more ranks than cores the peer usually answers within a few time slices,
  // and a sleeping rank pays a wake-up on top (8 ranks on 2 cores, 8 B all-reduce: 128-183
  // us against 178-278 us sleeping at once; Open MPI 135-196 us).
  static constexpr uint32_t kYieldsBeforeBlock = 256;

  explicit Waiter(OpState* op) : op_(op) {}

  // What a wait is for: space to send into (the peer moves head), or data (the peer posts a
  // step: tail, or over shm the step's cell word).
  enum class Dir { kSend, kRecv };

  // Records the CPU this rank waits on in f's control block, and says whether the peer ran
  // on the same one when it last moved this FIFO's counter (false when the transport cannot
  // tell). The peer then cannot run while this rank spins: the scheduler can put both ranks
  // on one core (it tends to wake a task where its waker ran), or another job can hold the
  // other core, and every spin costs the step its whole length.
  static bool peerOnMyCpu(const transport::FifoView& f, Dir d) {
    if (!f.conn || !f.conn->sharedCtrl()) return false;
    const int32_t cpu =
        transport::noteCpu(d == Dir::kSend ? f.ctrl->senderCpu : f.ctrl->receiverCpu);
    if (cpu <= 0) return false;
    auto& theirs = d == Dir::kSend ? f.ctrl->receiverCpu : f.ctrl->senderCpu;
    return theirs.load(std::memory_order_relaxed) == cpu;
  }

  // A peer on this machine whose CPU the FIFO cannot show (tcp over loopback or between
  // namespaces) may share this rank's core. Waits for it spin as usual -- a waiting rank that
  // spins 1 ms lets the scheduler move the other one to an idle core, which is how two ranks
  // started on one core get apart -- but once kUnseenMisses spins in a row have run out, the
  // next kUnseenRest waits on that connection do not spin. Never spinning there made the
  // first sizes of a 2-rank loopback run up to 2-3x slower (16 KiB all_reduce 16-46 us
  // against 12-28); always spinning cost 1.2-1.4 ms per small all_reduce with a busy loop on
  // the other core.
  static constexpr uint32_t kUnseenMisses = 2;
  static constexpr uint32_t kUnseenRest = 1000;
  // Whether this wait on f may spin, by the rule above (counts a rest wait).
  static bool unseenMaySpin(const transport::FifoView& f) {
    transport::Connection* c = f.conn;
    if (!c || !c->localPeerUnseen() || c->unseenRest == 0) return true;
    --c->unseenRest;
    return false;
  }
  // A spin for f's peer ran out (expired) or was answered.
  static void unseenSpinEnded(const transport::FifoView& f, bool expired) {
    transport::Connection* c = f.conn;
    if (!c || !c->localPeerUnseen()) return;
    c->unseenMisses = expired ? c->unseenMisses + 1 : 0;
    if (c->unseenMisses >= kUnseenMisses) c->unseenMisses = 0, c->unseenRest = kUnseenRest;
  }

  // Waits until ready() holds; false when the operation failed instead.
  template <class Ready>
  bool until(Ready ready, const transport::FifoView& f, Dir d) {
    if (op_->failed()) return false;
    const char* dir = d == Dir::kSend ? "sending to" : "receiving from";
    Clock::time_point since{};
    const bool drive = f.conn && f.conn->drivesIo();
    // Busy-poll for up to spinNs (the answer is usually well under a microsecond away when
    // the peer has a core), then give the core away: yield, later nap. Bounded in time, not
    // iterations, so that ranks sharing cores (oversubscribed, or another job) hand over soon.
    const int64_t spinNs = op_->spinNs();
    Clock::time_point spinStart{};
    bool spinning = spinNs > 0;
    for (uint32_t i = 0;; ++i) {
      bool done = ready();
      if (!done && drive) {
        f.conn->poll();  // tcp: read / write the socket on this thread
        done = ready();
      }
      if (done) {
        if (spinning && i > 0) unseenSpinEnded(f, false);
        return true;
      }
      if (spinning) {
        cpuRelax();
        // After a few hundred nanoseconds (most answers come sooner): is the peer on this
        // CPU, where spinning only keeps it from running?
        if (i == 15 && (peerOnMyCpu(f, d) || !unseenMaySpin(f))) spinning = false, i = 0;
        if ((i & 255) != 255) continue;
        Clock::time_point now = Clock::now();
        if (spinStart.time_since_epoch().count() == 0) spinStart = now;
        if (now - spinStart >= std::chrono::nanoseconds(spinNs)) {
          spinning = false, i = 0;
          unseenSpinEnded(f, true);
        }
        if ((i & 4095) != 4095) continue;
      } else {
        if (drive && i >= kYieldsBeforeBlock) {
          f.conn->block(1);  // tcp: sleep in the kernel until the socket is ready
        } else if (drive || i < 4096) {
          sched_yield();
        } else {
          nap();
        }
        // Not on the first yield: most waits end within a few (8 ranks on 2 cores, 64 B
        // all-gathers spent 7% of their time reading the clock for checks made there).
        if ((i & 31) != 31) continue;
      }
      {
        Status s = problem(f, dir, &since);
        if (s.ok()) continue;
        // The peer may have delivered and then left (or closed) since ready() was last false:
        // what it delivered still counts.
        if (ready()) return true;
        op_->fail(s);
        return false;
      }
    }
  }
  using Clock = std::chrono::steady_clock;
  // Re-checks the abort flag, the peer and the deadline now; false when it failed. `since`
  // is when this wait began (set on the first check): the deadline is for one wait without
  // progress, not for the whole operation.
  bool check(const transport::FifoView& f, const char* dir, Clock::time_point* since) {
    Status s = problem(f, dir, since);
    if (!s.ok()) op_->fail(s);
    return s.ok();
  }
  // The same, without recording the failure: the caller may still find its data arrived.
  Status problem(const transport::FifoView& f, const char* dir, Clock::time_point* since);
  std::string where(const transport::FifoView& f, const char* dir) const;
  bool failed() const { return op_->failed(); }
  void fail(const Status& s) { op_->fail(s); }
  // Fails the operation with s, prefixed as a failed wait's message is: "rank 1: ncclBroadcast
  // seq 0 (...), receiving from rank 0 (channel 0): ".
  void failAt(const transport::FifoView& f, Dir d, const Status& s);
  OpState* op() const { return op_; }

 private:
  static void nap();
  OpState* op_;
  std::chrono::steady_clock::time_point nextHealth_{};
};

}  // namespace tutti
