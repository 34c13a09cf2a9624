// Host primitives: the CPU engine's implementation of the vocabulary collectives/ring.h is
// written in. One instance per channel of one operation, used by one thread. Each call
// waits for its slot(s), moves one slot's worth of elements and publishes the counters.
// After a failure every call returns at once (the Waiter remembers why), so algorithm code
// needs no error handling -- as on the GPU.
#pragma once

#include <cstring>
#include <string>

#include "kernels/cpu/simd.h"
#include "runtime/waiter.h"
#include "transports/transport.h"

namespace tutti::cpu {

// Fails the operation for ranks that disagree on it: what this rank found, the operation, and
// what to check.
inline void failMismatch(Waiter* w, const std::string& what) {
  w->fail(invalidUsage(what + " (" + w->op()->what() +
                       "): do all ranks call the same collectives with the same count, "
                       "datatype and root?"));
}

template <typename T, typename Fn>
class HostPrims {
 public:
  // directSend: whether send() may transmit straight from the input buffer. Safe when no
  // later step of the algorithm writes that memory before the data has left -- the ring
  // algorithms guarantee it (what overwrites a sent block was computed from it, downstream);
  // a two-rank exchange reducing in place does not.
  HostPrims(transport::FifoView* sendTo, transport::FifoView* recvFrom, const T* in, T* out,
            const Fn& fn, Waiter* w, bool directSend = true)
      : sendTo_(sendTo), recvFrom_(recvFrom), in_(in), out_(out), fn_(fn), w_(w) {
    sendDirect_ = sendTo && sendTo->conn && sendTo->conn->direct();
    sendInputDirect_ = sendDirect_ && directSend && fn_.preIsIdentity();
    recvDirect_ = recvFrom && recvFrom->conn && recvFrom->conn->direct();
    if (sendDirect_) sendMin_ = sendTo->conn->directMinBytes();
    if (recvDirect_) recvMin_ = recvFrom->conn->directMinBytes();
  }

  // Chunked blocks (exchangeChunks): the next sends carry the last-chunk flag in their size
  // word or not, and the next receives check it (-1: no check), so that ranks that disagree
  // on a block's length fail even where their chunks match in size.
  void markLast(bool last) { sendFlag_ = last ? transport::kLastSlot : 0; }
  // The next sends carry these flags in their size word (transport::kWaySlot), and the next
  // receives expect a way marker (cpu::passWay) or data: ranks that disagree on the
  // operation's size, one expecting a marker, must not take one for the other.
  void flagSends(uint64_t flags) { sendFlag_ = flags; }
  void expectWay(bool way) { expectWay_ = way; }
  void expectLast(int last) { expectLast_ = last; }
  // Sends that go by address go so whenever the transport can (Connection::sendFrom).
  void preferAddress(transport::SendHow how = transport::SendHow::kByAddress) { how_ = how; }
  // A sender waiting on a payload it sent by address leaves the copy to the receiver (an
  // exchange, where the receiver copies the whole payload into its output and reduces it
  // there: a piece written from here would cross to the receiver's CPU once more).
  void leaveCopiesToReceiver() { helps_ = false; }
  // Whether a send of n elements goes by address for certain (preferAddress set): it may then
  // be bigger than a slot.
  bool sendsByAddress(int n) const {
    return how_ != transport::SendHow::kAdaptive && how_ != transport::SendHow::kSlot &&
           sendInputDirect_ && sendTo_->conn->sendsByAddress(size_t(n) * sizeof(T));
  }
  // Receiver: waits for the next payload and says whether it came by address. False also when
  // the operation failed (the next call fails too), and at once where no payload can come by
  // address: only a shared FifoCtrl carries the sender's src (shm). Over tcp, waiting here
  // before recvInto would have the socket's bytes land in the slot, to be copied out again.
  bool nextByAddress() {
    transport::FifoView& f = *recvFrom_;
    if (!f.conn || !f.conn->sharedCtrl()) return false;
    return untilPosted() &&
           f.ctrl->src[f.step % transport::kSteps].load(std::memory_order_relaxed) != 0;
  }

  // Receiver: waits for the next payload and returns its size word, leaving the payload
  // where it is for the next receive; 0 when the operation failed.
  uint64_t peekWord() {
    transport::FifoView& f = *recvFrom_;
    return untilPosted() ? transport::postedWord(f) : 0;
  }

  void send(size_t inOff, int n) {
    if (sendInputDirect_ && big(n, sendMin_)) return postDirect(in_ + inOff, n);
    T* s = acquireSend(n);
    if (!s) return;
    fn_.preCopy(s, in_ + inOff, size_t(n));
    postSend(n);
  }
  void recv(size_t outOff, int n) {
    const T* r = acquireRecv(n, out_ + outOff);
    if (!r) return;
    if (!landed_) memcpy(out_ + outOff, r, size_t(n) * sizeof(T));
    releaseRecv();
  }
  void recvReduceSend(size_t inOff, int n) {
    const T* r = acquireRecv(n);
    T* s = r ? acquireSend(n) : nullptr;
    if (!s) return;
    fn_.reduce(s, r, in_ + inOff, size_t(n), false);
    postSend(n);
    releaseRecv();
  }
  void recvCopySend(size_t outOff, int n) {
    const bool sendDirect = sendDirect_ && big(n, sendMin_);
    if ((recvDirect_ && big(n, recvMin_)) || sendDirect) {
      // Into the output (straight from the socket where possible), then on from there.
      recv(outOff, n);
      if (sendDirect) return postDirect(out_ + outOff, n);
      T* s = acquireSend(n);
      if (!s) return;
      memcpy(s, out_ + outOff, size_t(n) * sizeof(T));
      postSend(n);
      return;
    }
    const T* r = acquireRecv(n);
    T* s = r ? acquireSend(n) : nullptr;
    if (!s) return;
    memcpy(out_ + outOff, r, size_t(n) * sizeof(T));
    memcpy(s, r, size_t(n) * sizeof(T));
    postSend(n);
    releaseRecv();
  }
  void recvReduceCopySend(size_t inOff, size_t outOff, int n) {
    if (sendDirect_ && big(n, sendMin_)) {
      recvReduceCopy(inOff, outOff, n);
      return postDirect(out_ + outOff, n);
    }
    const T* r = acquireRecv(n);
    T* s = r ? acquireSend(n) : nullptr;
    if (!s) return;
    fn_.reduce(out_ + outOff, r, in_ + inOff, size_t(n), true);
    memcpy(s, out_ + outOff, size_t(n) * sizeof(T));
    postSend(n);
    releaseRecv();
  }
  void copySend(size_t inOff, size_t outOff, int n) {
    if (sendDirect_ && big(n, sendMin_)) {
      // Send first: the local copy then overlaps the peer reading the socket.
      postDirect(in_ + inOff, n);
      if (!w_->failed() && out_ + outOff != in_ + inOff) {
        simd::copyBig(out_ + outOff, in_ + inOff, size_t(n) * sizeof(T));
      }
      return;
    }
    T* s = acquireSend(n);
    if (!s) return;
    memcpy(s, in_ + inOff, size_t(n) * sizeof(T));
    if (out_ + outOff != in_ + inOff) {
      simd::copyBig(out_ + outOff, in_ + inOff, size_t(n) * sizeof(T));
    }
    postSend(n);
  }
  void recvReduceCopy(size_t inOff, size_t outOff, int n) {
    const T* r = acquireRecv(n);
    if (!r) return;
    fn_.reduce(out_ + outOff, r, in_ + inOff, size_t(n), true);
    releaseRecv();
  }
  // Receives n elements into the output where the transport can put them there (else into
  // the slot) and reduces them with the input at the same offset into the output.
  void recvReduceInOutput(size_t off, int n) {
    const T* r = acquireRecv(n, out_ + off);
    if (!r) return;
    fn_.reduce(out_ + off, landed_ ? out_ + off : r, in_ + off, size_t(n), true);
    releaseRecv();
  }
  void copy(size_t inOff, size_t outOff, int n) {
    if (w_->failed()) return;
    fn_.preCopyPost(out_ + outOff, in_ + inOff, size_t(n));
  }

  // The end of the operation: the caller's buffers are its own again once every byte sent
  // straight from them has left, and a receive destination must not outlive the operation.
  void finish() {
    if (recvDirect_) recvFrom_->conn->recvInto(UINT64_MAX, nullptr, 0);
    if (!sentDirect_) return;
    transport::FifoView& f = *sendTo_;
    untilSent([&] { return f.ctrl->head.load(std::memory_order_acquire) >= f.step; });
  }

 private:
  // Whether n elements reach a connection's direct-transfer minimum (0 for tcp, which sends
  // every size from and into the caller's buffers; shm's single copy only from
  // TUTTI_SHM_SINGLE_COPY_MIN): smaller ones take the plain slot paths.
  static bool big(int n, size_t minBytes) { return size_t(n) * sizeof(T) >= minBytes; }

  void postDirect(const T* src, int n) {
    if (!acquireSend(n)) return;
    sentDirect_ |= sendTo_->conn->sendFrom(sendTo_->step, src, size_t(n) * sizeof(T), how_);
    postSend(n);
  }

  // Waits on the send side until ready(). Meanwhile, once this operation has sent from its
  // buffers by address, copies a share of what the receiver copies from them (shm).
  template <class Ready>
  bool untilSent(Ready ready) {
    transport::FifoView& f = *sendTo_;
    return w_->until(
        [&] {
          if (ready()) return true;
          if (sentDirect_ && helps_) f.conn->help();
          return ready();
        },
        f, Waiter::Dir::kSend);
  }

  // Receiver: waits until the sender has posted the next step; false when the operation failed.
  bool untilPosted() {
    transport::FifoView& f = *recvFrom_;
    return w_->until([&] { return transport::posted(f); }, f, Waiter::Dir::kRecv);
  }

  // Sender: waits for room for a payload of n elements and returns where to write it.
  T* acquireSend(int n) {
    transport::FifoView& f = *sendTo_;
    const size_t bytes = size_t(n) * sizeof(T);
    const uint64_t window = f.window(bytes);
    // Free while the head last read says so: head's line then stays with the receiver, which
    // writes it every step, instead of crossing to this CPU and back each time.
    if (f.headSeen + window > f.step && !w_->failed()) {
      return reinterpret_cast<T*>(f.payload(f.step, bytes));
    }
    bool ok = untilSent([&] {
      f.headSeen = f.ctrl->head.load(std::memory_order_acquire);
      return f.headSeen + window > f.step;
    });
    return ok ? reinterpret_cast<T*>(f.payload(f.step, bytes)) : nullptr;
  }
  void postSend(int n) {
    transport::FifoView& f = *sendTo_;
    f.ctrl->sizes[f.step % transport::kSteps].store(uint64_t(n) * sizeof(T) | sendFlag_,
                                                    std::memory_order_relaxed);
    transport::postTail(f);
  }
  // dst: where the payload should go if the transport can put it there (landed_ says).
  const T* acquireRecv(int n, T* dst = nullptr) {
    transport::FifoView& f = *recvFrom_;
    // Below the sender's direct minimum the payload is in the slot: nothing to post or land.
    const bool direct = recvDirect_ && big(n, recvMin_);
    if (direct) f.conn->recvInto(f.step, dst, size_t(n) * sizeof(T));
    if (!untilPosted()) return nullptr;
    const uint64_t word = transport::postedWord(f);
    const uint64_t got = word & transport::kSizeMask;
    if (got == uint64_t(n) * sizeof(T) && expectLast_ >= 0 &&
        ((word & transport::kLastSlot) != 0) != (expectLast_ == 1)) {
      failMismatch(w_, "rank " + std::to_string(f.peer) + (expectLast_ ? " sent more" : " ended") +
                           " where this rank expected " +
                           (expectLast_ ? "the last chunk" : "more"));
      return nullptr;
    }
    if (((word & transport::kWaySlot) != 0) != expectWay_) {
      failMismatch(w_, "rank " + std::to_string(f.peer) + " sent " +
                           (expectWay_ ? "data" : "the way of an operation") +
                           " where this rank expected " + (expectWay_ ? "the way" : "data"));
      return nullptr;
    }
    if (got != uint64_t(n) * sizeof(T)) {
      failMismatch(w_, "rank " + std::to_string(f.peer) + " sent a slot of " + std::to_string(got) +
                           " bytes where this rank expected " +
                           std::to_string(uint64_t(n) * sizeof(T)));
      return nullptr;
    }
    landed_ = false;
    if (direct) {
      Status s = f.conn->land(f.step, &landed_);
      if (!s.ok()) {
        w_->failAt(f, Waiter::Dir::kRecv, s);
        return nullptr;
      }
      if (dst && !landed_) ++f.conn->landedInSlot;
      // Pieces the sender took are still on their way.
      if (!f.conn->landed(f.step) &&
          !w_->until([&] { return f.conn->landed(f.step); }, f, Waiter::Dir::kRecv)) {
        return nullptr;
      }
    }
    return reinterpret_cast<const T*>(f.payload(f.step, got));
  }
  void releaseRecv() {
    transport::FifoView& f = *recvFrom_;
    transport::postHead(f);
  }

  transport::FifoView* sendTo_;
  transport::FifoView* recvFrom_;
  const T* in_;
  T* out_;
  Fn fn_;
  Waiter* w_;
  bool sendDirect_ = false, sendInputDirect_ = false, recvDirect_ = false;
  size_t sendMin_ = 0, recvMin_ = 0;
  bool sentDirect_ = false;
  bool helps_ = true;  // copies pieces of its payloads while it waits (untilSent)
  transport::SendHow how_ = transport::SendHow::kAdaptive;
  bool landed_ = false;  // the last acquireRecv's payload is already in its dst
  uint64_t sendFlag_ = 0;
  int expectLast_ = -1;
  bool expectWay_ = false;
};

}  // namespace tutti::cpu
