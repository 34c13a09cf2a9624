// shm's connection: one link's FIFO in a POSIX shared-memory segment (transport.h's layout,
// then ShmHelp), and single copy between the two ranks' own buffers (see shm.cc). Set up by
// the transport (shm.cc).
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <new>
#include <optional>
#include <string>

#include "kernels/cpu/simd.h"
#include "runtime/comm.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "transports/transport.h"

// ThreadSanitizer cannot see the ordering that the FIFO counters give: each side maps the
// segment itself, so a counter's release and acquire happen at two addresses. Data that only
// ever moves through slots never shows it, but a single copy between threads of one process
// reads (or, helping, writes) the other thread's own buffer. Under TSAN that copy goes through
// process_vm_readv / process_vm_writev on our own pid, which TSAN does not watch (the
// sanitizer build still runs the whole path).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kCopyThroughKernel = true;
#else
inline constexpr bool kCopyThroughKernel = false;
#endif

namespace tutti::transport {

inline constexpr uint32_t kShmMagic =
    0x73686d33;  // "shm3": 64 size words, cells that open with a word

// FifoCtrl::broken here: the reason in the low byte, an errno above it.
inline constexpr uint32_t kBrokenLeft = 1;  // the peer's communicator failed or was aborted
inline constexpr uint32_t kBrokenWrite =
    2;  // the sender's process_vm_writev into the receiver failed
inline constexpr uint32_t kBrokenRead =
    3;  // the receiver's process_vm_readv from the sender failed

// Single copy, shared by both sides after FifoCtrl: a big payload sent by address is copied in
// pieces that either side may take. The receiver copies (process_vm_readv) from the first piece on;
// a sender that would otherwise wait for a free slot or for the end of the operation takes pieces
// too and writes them into the receiver's destination (process_vm_writev), so that both CPUs copy
// instead of one while the other waits. Per step (modulo kSteps, as the size words): where the
// receiver wants the payload (`dst`, in its address space), and `claim`: (step + 1) << 8 | pieces
// taken so far, 0xff once closed. The receiver posts them, and the payload size it expects
// (`bytes`: a sender whose payload differs never writes), when it starts waiting for the step
// (recvInto); a side takes a piece with a compare-and-swap on claim, so a stale step never matches.
// `done` counts the pieces copied; the receiver frees the slot only once all are, and a receiver
// that leaves a step unfinished (a failed operation) closes the claim and waits for the pieces in
// flight, so that no sender writes into its memory after it returned.
struct alignas(64) ShmHelp {
  std::atomic<uint64_t> dst[kSteps];
  std::atomic<uint64_t> bytes[kSteps];
  std::atomic<uint64_t> claim[kSteps];
  std::atomic<uint32_t> done[kSteps];
  // The smallest payload the sender sends by address (UINT64_MAX: none), published when it
  // connects (0 until then: any may be). The receiver takes the plain path below it without
  // posting a claim (4 stores to these lines) or looking for an address, whatever its own
  // TUTTI_SHM_SINGLE_COPY_MIN says.
  alignas(64) std::atomic<uint64_t> senderMin;
  // The piece size of each payload sent by address, written by the sender with src and
  // published with the step (tail and the cell word; pieceBytes).
  alignas(64) std::atomic<uint32_t> piece[kSteps];
};
inline constexpr size_t kHeader = sizeof(FifoCtrl) + sizeof(ShmHelp);

// The pieces a payload of n bytes is copied in: at least 64 KiB each, at most 64 of them.
// Between processes, 2 ranks, broadcast by address in 128 KiB steps (4 interleaved runs,
// in place): 64 MiB 8.0-10.0 ms with 64 KiB pieces, 9.8-11.1 with 32 KiB, 13.5-14.3 with
// whole steps (the receiver alone copies); 8 MiB 0.57-0.88, 0.68-0.99, 1.05-1.86 ms.
// Where the sender has one receiver to help at most (SendHow::kTwoRanks) each piece costs a
// system call and a claim and buys little balance: pieces of half the payload or more (64 KiB
// at least), up to 1 MiB, all of one size.
// 2 ranks, all-gather exchange in one chunk, 5 interleaved runs, medians, us (64 KiB pieces /
// up to 1 MiB / Open MPI): 1 MiB 82 / 69 / 66; 4 MiB 337 / 237 / 266; 16 MiB 2536 / 2460 /
// 2721. Not for the crowded flat broadcast's 8 MiB chunks (one root helping 7 receivers): 8
// ranks, 16 MiB, 6 runs, 11.5 ms with 128 KiB pieces, 12.3 with 256 KiB.
inline constexpr size_t kPieceMin = 64 << 10;
inline constexpr size_t kTwoRankPieceMax = 1 << 20;
inline size_t pieceBytes(size_t n, bool twoRanks) {
  size_t p = std::max(kPieceMin, (n + 63) / 64);
  if (twoRanks) {
    const size_t pieces = std::max<size_t>(2, (n + kTwoRankPieceMax - 1) / kTwoRankPieceMax);
    p = std::max(p, (n + pieces - 1) / pieces);
  }
  return (p + 4095) / 4096 * 4096;
}
inline uint32_t pieceCount(size_t n, size_t piece) { return uint32_t((n + piece - 1) / piece); }

inline size_t segmentBytes(size_t slotBytes) {
  return kHeader + kSlots * slotBytes + kSteps * cellStrideFor(cellBytesFor(slotBytes));
}

class ShmConnection : public Connection {
 public:
  ShmConnection(const ConnSpec& spec, int self, void* base, size_t bytes, std::string name,
                bool owner, int64_t peerPid, bool checkPid)
      : base_(base),
        bytes_(bytes),
        name_(std::move(name)),
        owner_(owner),
        peerPid_(peerPid),
        checkPid_(checkPid),
        peer_(spec.peer),
        self_(self) {
    fifo_.ctrl = static_cast<FifoCtrl*>(base);
    help_ = reinterpret_cast<ShmHelp*>(static_cast<char*>(base) + sizeof(FifoCtrl));
    fifo_.slots = static_cast<char*>(base) + kHeader;
    fifo_.slotBytes = spec.slotBytes;
    fifo_.cellBytes = cellBytesFor(spec.slotBytes);
    if (fifo_.cellBytes) fifo_.cells = fifo_.slots + kSlots * spec.slotBytes;
    fifo_.peer = spec.peer;
    fifo_.channel = spec.channel;
    fifo_.conn = this;
    sharedCtrl_ = true;
    prefaultSlots(fifo_);  // each side, before the receiver's descriptor goes out / it connects
  }
  ~ShmConnection() override {
    if (owner_) shm_unlink(name_.c_str());  // ENOENT once the sender unlinked it: fine
    munmap(base_, bytes_);
  }
  Status health() const override {
    if (const uint32_t why = fifo_.ctrl->broken.load(std::memory_order_acquire)) {
      if ((why & 0xff) == kBrokenLeft) {
        return remoteError("rank " + std::to_string(peer_) +
                           " left the operation (its communicator failed or was aborted)");
      }
      // A single copy failed: both sides say which rank copied and why.
      const bool wrote = (why & 0xff) == kBrokenWrite;
      const int sender = owner_ ? peer_ : self_, receiver = owner_ ? self_ : peer_;
      return remoteError(
          "shm: rank " + std::to_string(wrote ? sender : receiver) + " could not copy a payload " +
          (wrote ? "into rank " + std::to_string(receiver) + "'s buffer (process_vm_writev"
                 : "from rank " + std::to_string(sender) + "'s buffer (process_vm_readv") +
          ": " + strerror(int(why >> 8)) +
          "; is a buffer unmapped or read-only?) (TUTTI_SHM_SINGLE_COPY=0 turns single copy off)");
    }
    // A peer process that died cannot say so: check that it still exists (and is not a
    // zombie its parent has yet to reap). Only meaningful inside one pid namespace.
    if (checkPid_ && !processAlive(peerPid_)) {
      return remoteError("rank " + std::to_string(peer_) + " (pid " + std::to_string(peerPid_) +
                         ", same host, shm) exited");
    }
    return Status::Ok();
  }

  const char* transportName() const override { return "shm"; }
  void breakLink() override { markBroken(kBrokenLeft, 0); }

  // minBytes: the smallest payload sent by single copy; 0 on the receiving side, which
  // learns the sender's from ShmHelp::senderMin (directMinBytes) and takes the plain paths
  // below it.
  // adaptive: payloads of minBytes or more still go through the slots while copying into a
  // slot runs fast, and by single copy for the next kDirectSteps steps once the median of
  // kWindow copies ran slower than slowGBps.
  void enableSingleCopy(bool sameProcess, size_t minBytes, bool adaptive, double slowGBps) {
    sameProcess_ = sameProcess;
    minBytes_ = minBytes;
    adaptive_ = adaptive;
    slowBytesPerNs_ = slowGBps;
    direct_ = true;
  }
  bool sendsByAddress(size_t bytes) const override { return minBytes_ != 0 && bytes >= minBytes_; }
  size_t directMinBytes() const override {
    if (!owner_) return minBytes_;
    if (senderMin_ != 0) return senderMin_;
    // Receiver: the sender's figure, kept here once published (its line, touched by no one
    // after setup, still drops out of cache between operations when ranks share a core).
    senderMin_ = size_t(help_->senderMin.load(std::memory_order_acquire));
    return senderMin_;
  }
  // Sender: tells the receiver the smallest payload this side may send by address.
  void publishSenderMin(uint64_t bytes) {
    help_->senderMin.store(bytes, std::memory_order_release);
  }
  bool directPaysIntoSlot() const override { return false; }
  // Whether payloads of minBytes or more go by single copy now (sender side).
  bool bigByAddress() const override { return minBytes_ != 0 && (!adaptive_ || directLeft_ > 0); }
  bool copiesRunSlow() const override { return minBytes_ != 0 && adaptive_ && directLeft_ > 0; }
  // The first copy into each slot after a pause does not count: the slot's lines may have
  // left the other CPU's cache meanwhile, and then it runs fast whatever the state (as the
  // first copies back into slots after kDirectSteps do).
  void forgetSlowCopies() override {
    directLeft_ = 0;
    nRates_ = 0;
    std::fill(std::begin(touched_), std::end(touched_), size_t(0));
  }
  // TUTTI_SHM_SLOW_GBPS, 5 by default: a median copy into a slot below it counts as slow. On
  // this project's 2-vCPU VM, copying 64 KiB+ steps into slots ran at 20-35 GB/s while the two
  // vCPUs shared a die (a cache line's round trip 54-88 ns) and at 2.1-3.5 GB/s while they
  // did not (330-360 ns): the slot's lines, last read on the other die, must be taken back
  // line by line, and the receiver fetches them again. Single copy reads the sender's buffer,
  // which is not freshly written: in that state 1 MiB broadcast 58-107 us adaptive against
  // 182-615 us through slots (Open MPI 83-105), while in the good one single copy alone was
  // slower (94-119 against 59-109). The verdict is the median of kWindow copies, not a run of
  // slow ones: from a source out of cache (64 MiB broadcast) copies in the good state spread
  // over 0-28 GB/s (most 10-20; a preempted or page-faulting one near 0), and two under 8 in a
  // row switched 64 MiB broadcasts to single copy, which took 12.6-14.9 ms there against
  // 6.4-7.3 through slots. 512 of the ring's steps by address (SendHow::kAdaptive) before
  // trying the slots again, because the first copies back into slots run fast (their lines
  // have left the other cache) and a verdict takes kWindow of them.
  static constexpr uint32_t kDirectSteps = 512;
  static constexpr uint32_t kWindow = 8;
  bool sendFrom(uint64_t step, const void* src, size_t bytes, SendHow how) override {
    const size_t k = step % kSteps;
    const bool big = sendsByAddress(bytes);
    if (!big || how == SendHow::kSlot ||
        (adaptive_ && directLeft_ == 0 && how == SendHow::kAdaptive)) {
      if (big && how == SendHow::kAdaptive) {  // time the copy: it says the machine's state
        timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        memcpy(fifo_.payload(step, bytes), src, bytes);
        clock_gettime(CLOCK_MONOTONIC, &b);
        const double ns = double(b.tv_sec - a.tv_sec) * 1e9 + double(b.tv_nsec - a.tv_nsec);
        // A slot's pages fault on their first touch: only a copy over pages this slot has
        // held before says anything about the machine.
        size_t& touched = touched_[step % kSlots];
        const bool seen = bytes <= touched;
        touched = std::max(touched, bytes);
        if (seen) {
          rates_[nRates_++] = double(bytes) / std::max(ns, 1.0);
          if (nRates_ == kWindow) {
            nRates_ = 0;
            std::nth_element(rates_, rates_ + kWindow / 2, rates_ + kWindow);
            if (rates_[kWindow / 2] < slowBytesPerNs_) directLeft_ = kDirectSteps;
          }
        }
      } else {
        memcpy(fifo_.payload(step, bytes), src, bytes);
      }
      fifo_.ctrl->src[k].store(0, std::memory_order_relaxed);
      return false;
    }
    // Only the adaptive sends count the verdict down; the engine forgets it itself after so
    // many calls that send by address another way (Engine::flatBroadcastNow, exchangeNow).
    if (adaptive_ && directLeft_ > 0 && how == SendHow::kAdaptive) --directLeft_;
    const size_t piece = pieceBytes(bytes, how == SendHow::kTwoRanks);
    help_->piece[k].store(uint32_t(piece), std::memory_order_relaxed);
    fifo_.ctrl->src[k].store(reinterpret_cast<uint64_t>(src), std::memory_order_relaxed);
    sent_[k] = Sent{step + 1, static_cast<const char*>(src), bytes, piece, false};
    return true;
  }

  // Sender, while it waits: copies one piece of a payload it sent by address that the
  // receiver is waiting for. True when it copied something.
  bool help() override {
    const uint64_t head = fifo_.ctrl->head.load(std::memory_order_acquire);
    Sent* best = nullptr;
    for (Sent& e : sent_) {
      if (e.tag == 0 || e.finished || e.tag <= head) continue;  // none, taken, or consumed
      if (!best || e.tag < best->tag) best = &e;
    }
    if (!best) return false;
    const size_t k = (best->tag - 1) % kSteps;
    const uint32_t pieces = pieceCount(best->bytes, best->piece);
    uint64_t word = help_->claim[k].load(std::memory_order_acquire);
    if ((word >> 8) != best->tag) return false;  // the receiver has not reached this step yet
    // A receiver expecting another size (ranks disagree on count, datatype or root) gets no
    // byte from here: it fails on the size, with nothing of its memory overwritten.
    if (help_->bytes[k].load(std::memory_order_relaxed) != best->bytes ||
        fifo_.ctrl->broken.load(std::memory_order_relaxed)) {
      best->finished = true;
      return false;
    }
    const uint64_t to = help_->dst[k].load(std::memory_order_relaxed);
    const int c = takePiece(k, best->tag, pieces);
    if (c < 0) {  // every piece taken (or the receiver has moved on)
      best->finished = true;
      return false;
    }
    const size_t off = size_t(c) * best->piece;
    const size_t n = std::min(best->piece, best->bytes - off);
    if (!copyPiece(reinterpret_cast<char*>(to) + off, best->src + off, n, true)) {
      // The piece is lost: the receiver must not wait for it. The same permission let the
      // probe at setup read this peer, so only a receiver that is exiting, or one whose
      // buffer cannot be written (unmapped, read-only), gets here.
      TUTTI_WARN("shm: writing %zu bytes to rank %d (pid %lld) failed: %s", n, peer_,
                 static_cast<long long>(peerPid_), strerror(errno));
      markBroken(kBrokenWrite, errno);
      best->finished = true;
      return false;
    }
    help_->done[k].fetch_add(1, std::memory_order_release);
    return true;
  }

  void recvInto(uint64_t step, void* dst, size_t bytes) override {
    dst_ = static_cast<char*>(dst);
    if (!direct_) return;
    if (step == UINT64_MAX) return closeClaim();
    if (posted_ == step + 1) return;  // posted already (a failed operation's later calls)
    const size_t k = step % kSteps;
    help_->done[k].store(0, std::memory_order_relaxed);
    help_->dst[k].store(reinterpret_cast<uint64_t>(dst_ ? dst_ : fifo_.payload(step, bytes)),
                        std::memory_order_relaxed);
    help_->bytes[k].store(bytes, std::memory_order_relaxed);
    help_->claim[k].store((step + 1) << 8, std::memory_order_release);
    posted_ = step + 1;
    ownFailed_ = 0;
  }
  // Receiver, after land: whether the pieces the sender took have all arrived.
  bool landed(uint64_t step) override {
    return help_->done[step % kSteps].load(std::memory_order_acquire) >= landPieces_;
  }
  Status land(uint64_t step, bool* inDst) override {
    *inDst = false;
    landPieces_ = 0;
    const uint64_t src = fifo_.ctrl->src[step % kSteps].load(std::memory_order_relaxed);
    if (src == 0) return Status::Ok();
    // Back to "payload in the slot" before head frees the slot: a sender that fills it the
    // ordinary way later (another primitive, send/recv) never touches src.
    fifo_.ctrl->src[step % kSteps].store(0, std::memory_order_relaxed);
    const size_t n = fifo_.ctrl->sizes[step % kSteps].load(std::memory_order_relaxed) & kSizeMask;
    char* to = dst_ ? dst_ : fifo_.payload(step, n);
    *inDst = dst_ != nullptr;
    const size_t k = step % kSteps;
    if ((help_->claim[k].load(std::memory_order_acquire) >> 8) != step + 1) {
      // Not posted by recvInto: nobody helps, copy it all.
      if (!copyPiece(to, reinterpret_cast<const char*>(src), n, false)) return readFailed(n);
      return Status::Ok();
    }
    const size_t piece = std::max<size_t>(1, help_->piece[k].load(std::memory_order_relaxed));
    landPieces_ = pieceCount(n, piece);
    for (int c; (c = takePiece(k, step + 1, landPieces_)) >= 0;) {
      const size_t off = size_t(c) * piece;
      const size_t len = std::min(piece, n - off);
      if (!copyPiece(to + off, reinterpret_cast<const char*>(src) + off, len, false)) {
        ownFailed_ = 1;
        return readFailed(len);
      }
      help_->done[k].fetch_add(1, std::memory_order_release);
    }
    return Status::Ok();
  }

 private:
  // Takes the next of the `pieces` pieces of step tag - 1 in slot k: its index, or -1 when none
  // is left (all taken, the claim closed, or the slot on another step).
  int takePiece(size_t k, uint64_t tag, uint32_t pieces) {
    uint64_t word = help_->claim[k].load(std::memory_order_acquire);
    for (;;) {
      const uint32_t c = uint32_t(word & 0xff);
      if ((word >> 8) != tag || c >= pieces) return -1;
      if (help_->claim[k].compare_exchange_weak(word, word + 1, std::memory_order_acq_rel)) {
        return int(c);
      }
    }
  }
  // Receiver, at the end of an operation: no piece of the last posted step may be taken from
  // now on, and those the sender took must have arrived before this rank's buffers are the
  // caller's again. After a completed step every piece is in already; after a failure, the
  // sender's pieces in flight take microseconds (bounded here in case it was stopped).
  void closeClaim() {
    if (posted_ == 0) return;
    const uint64_t tag = posted_;
    posted_ = 0;
    const size_t k = (tag - 1) % kSteps;
    uint64_t word = help_->claim[k].load(std::memory_order_acquire);
    uint32_t taken = 0;
    for (;;) {
      if ((word >> 8) != tag || (word & 0xff) == 0xff) return;
      taken = uint32_t(word & 0xff);
      if (help_->claim[k].compare_exchange_weak(word, (word | 0xff), std::memory_order_acq_rel)) {
        break;
      }
    }
    const uint32_t want = taken - std::min(taken, ownFailed_);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (help_->done[k].load(std::memory_order_acquire) < want) {
      // A sender whose copy failed never finishes that piece, and takes no other.
      if ((fifo_.ctrl->broken.load(std::memory_order_acquire) & 0xff) == kBrokenWrite) return;
      if (std::chrono::steady_clock::now() > until || (checkPid_ && !processAlive(peerPid_))) {
        TUTTI_WARN("shm: rank %d (pid %lld) still had pieces of a payload to copy here", peer_,
                   static_cast<long long>(peerPid_));
        return;
      }
      sched_yield();
    }
  }
  // The peer learns why: health() there reports the failed copy, not only that this rank left.
  Status readFailed(size_t n) {
    const int err = errno;
    markBroken(kBrokenRead, err);
    return remoteError("shm: reading " + std::to_string(n) + " bytes from rank " +
                       std::to_string(peer_) + " (pid " + std::to_string(peerPid_) +
                       ") with process_vm_readv failed: " + strerror(err) +
                       " (TUTTI_SHM_SINGLE_COPY=0 turns single copy off)");
  }
  // Copies n bytes between this process and the peer: the receiver reads from the peer's
  // memory (toPeer false), the sender writes into it (toPeer true). False, errno set, when
  // the kernel refused.
  bool copyPiece(char* to, const char* from, size_t n, bool toPeer) {
    if (sameProcess_ && !kCopyThroughKernel) {
      cpu::simd::copyBig(to, from, n);
      return true;
    }
    const pid_t pid = sameProcess_ ? getpid() : static_cast<pid_t>(peerPid_);
    size_t done = 0;
    while (done < n) {
      iovec local{const_cast<char*>(toPeer ? from : to) + done, n - done};
      iovec remote{const_cast<char*>(toPeer ? to : from) + done, n - done};
      ssize_t got = toPeer ? process_vm_writev(pid, &local, 1, &remote, 1, 0)
                           : process_vm_readv(pid, &local, 1, &remote, 1, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        if (got == 0) errno = EIO;
        return false;
      }
      done += size_t(got);
    }
    return true;
  }

  // The first reason recorded wins: a failed copy, then the communicator's failure
  // (breakLink) that follows it, must leave the copy's errno for the peer to report.
  void markBroken(uint32_t kind, int err) {
    uint32_t none = 0;
    fifo_.ctrl->broken.compare_exchange_strong(none, kind | (uint32_t(err) << 8),
                                               std::memory_order_acq_rel);
  }

  // Sender: a payload sent by address, until the receiver has taken every piece.
  struct Sent {
    uint64_t tag = 0;  // step + 1; 0: none
    const char* src = nullptr;
    size_t bytes = 0;
    size_t piece = 0;       // the size of its pieces (pieceBytes)
    bool finished = false;  // every piece taken
  };
  Sent sent_[kSteps];
  ShmHelp* help_ = nullptr;
  uint32_t landPieces_ = 0;  // receiver: the pieces of the payload land() last took apart
  uint64_t posted_ = 0;      // receiver: step + 1 of the claim recvInto last opened, 0: none
  uint32_t ownFailed_ = 0;   // receiver: its pieces whose copy failed here (never done)
  bool sameProcess_ = false;
  bool adaptive_ = false;
  uint32_t directLeft_ = 0;
  mutable size_t senderMin_ = 0;  // receiver: ShmHelp::senderMin once published
  double slowBytesPerNs_ = 5.0;
  double rates_[kWindow] = {};  // the last copies' rates, bytes per ns (adaptive)
  uint32_t nRates_ = 0;
  size_t touched_[kSlots] = {};  // the most bytes each slot has held (adaptive)
  size_t minBytes_ = 0;
  char* dst_ = nullptr;
  void* base_;
  size_t bytes_;
  std::string name_;
  bool owner_;
  int64_t peerPid_;
  bool checkPid_;  // another process in our pid namespace
  int peer_;
  int self_;
};

}  // namespace tutti::transport
