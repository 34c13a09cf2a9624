// tcp's connection: one link's FIFO in this rank's memory and the sockets that carry its slots
// (slot k on socket k % nsocks), each slot framed by a header (magic, step, size) that the
// receiver checks before it trusts the payload. The engine's thread moves the bytes when it
// can; the transport's proxy thread (tcp.cc) carries on with what is left.
#pragma once

#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "runtime/env.h"
#include "runtime/log.h"
#include "runtime/socket.h"
#include "transports/transport.h"

namespace tutti::transport {

inline constexpr uint32_t kSlotMagic = 0x544c5354;  // "TSLT"

struct SlotHeader {
  uint32_t magic;
  uint32_t step;  // low 32 bits of the step
  uint64_t sizeWord;
};

struct SockState {
  net::Socket sock;
  uint64_t next;    // the next step this socket carries (steps congruent to its index)
  size_t done = 0;  // bytes of header + payload moved for `next`
  SlotHeader hdr{};
  char* user = nullptr;  // the payload of `next` goes here instead of its slot
  bool closed = false;
};

class TcpConnection : public Connection {
 public:
  TcpConnection(const ConnSpec& spec, bool sending, std::function<void()> wakeProxy,
                std::string peerName, bool peerOnThisMachine)
      : sending_(sending), peerName_(std::move(peerName)), wakeProxy_(std::move(wakeProxy)) {
    localPeerUnseen_ = peerOnThisMachine;
    bytes_ = (sizeof(FifoCtrl) + kSlots * spec.slotBytes + 63) / 64 * 64;
    mem_ = static_cast<char*>(aligned_alloc(64, bytes_));
    auto* ctrl = new (mem_) FifoCtrl();
    ctrl->tail.store(0);
    ctrl->head.store(0);
    for (auto& s : ctrl->sizes) s.store(0);
    for (auto& s : ctrl->src) s.store(0);
    ctrl->broken.store(0);
    fifo_.ctrl = ctrl;
    fifo_.slots = mem_ + sizeof(FifoCtrl);
    fifo_.slotBytes = spec.slotBytes;
    prefaultSlots(fifo_);
    fifo_.peer = spec.peer;
    fifo_.channel = spec.channel;
    fifo_.conn = this;
    drivesIo_ = true;
    direct_ = env::getInt("TUTTI_TCP_DIRECT", 1) != 0;
    for (auto& p : src_) p = nullptr;
  }
  ~TcpConnection() override { free(mem_); }

  void adopt(std::vector<net::Socket> socks) {
    eof_.reset(new std::atomic<bool>[socks.size()]);
    for (size_t i = 0; i < socks.size(); ++i) eof_[i].store(false);
    for (size_t i = 0; i < socks.size(); ++i) {
      SockState st;
      st.sock = std::move(socks[i]);
      st.next = i;
      socks_.push_back(std::move(st));
    }
  }

  Status health() const override {
    if (failed_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(mu_);
      return remoteError(failure_);
    }
    // A peer that finished and left closes its sockets: only an error if the step we wait
    // for would have come on a socket that has already ended.
    if (!sending_ && !socks_.empty()) {
      uint64_t want = fifo_.ctrl->tail.load(std::memory_order_acquire);
      if (eof_[want % socks_.size()].load(std::memory_order_acquire)) {
        return remoteError("tcp: " + peerName_ + " closed the connection");
      }
    }
    return Status::Ok();
  }
  void breakLink() override {
    Connection::breakLink();
    for (auto& s : socks_) shutdown(s.sock.fd(), SHUT_RDWR);  // the peer sees EOF at once
  }
  const char* transportName() const override { return "tcp"; }
  int rawSocket() const override { return socks_.empty() ? -1 : socks_[0].sock.fd(); }
  Status finish() override { return finisher_ ? finisher_() : Status::Ok(); }
  void setFinisher(std::function<Status()> f) { finisher_ = std::move(f); }

  // The engine's thread does the socket I/O itself when it can (no hand-off, as an MPI rank
  // would); the proxy only carries on with what is left.
  void poll() override {
    std::unique_lock<std::mutex> lock(ioMu_, std::try_to_lock);
    if (lock.owns_lock()) progress();
  }
  void block(int ms) override {
    pollfd fds[16];
    nfds_t n = 0;
    for (size_t i = 0; i < socks_.size(); ++i) {
      const SockState& s = socks_[i];
      // A receiver needs the socket of the next step only (see progress()).
      if (!sending_ && i != nextStep() % socks_.size()) continue;
      if (n < 16 && !s.closed) fds[n++] = {s.sock.fd(), short(sending_ ? POLLOUT : POLLIN), 0};
    }
    if (n) ::poll(fds, n, ms);
  }
  bool sendFrom(uint64_t step, const void* src, size_t, SendHow) override {
    src_[step % kSteps] = static_cast<const char*>(src);
    return true;
  }
  void recvInto(uint64_t step, void* dst, size_t bytes) override {
    std::lock_guard<std::mutex> lock(ioMu_);
    dst_ = static_cast<char*>(dst);
    expStep_ = step;
    expBytes_ = bytes;
  }
  Status land(uint64_t step, bool* inDst) override {
    *inDst = landed_ == step;  // progressRecv put it there, if the engine asked in time
    return Status::Ok();
  }
  void kick() override {
    if (sending_) poll();
    if (!drained()) wakeProxy_();
  }
  // The proxy's pass: true when any byte moved. Only the sending side: receiving sockets are
  // read by the engine that waits on them (which may sleep in poll(2) on them; a proxy that
  // emptied them behind its back would leave it sleeping with its data already delivered).
  bool proxyPass() {
    if (!sending_) return false;
    std::unique_lock<std::mutex> lock(ioMu_, std::try_to_lock);
    return lock.owns_lock() && progress();
  }

 private:
  // The lowest step not yet received (receiver) or sent (sender).
  uint64_t nextStep() const {
    uint64_t low = UINT64_MAX;
    for (const auto& s : socks_) low = std::min(low, s.next);
    return low;
  }
  // One non-blocking pass; true when any byte moved. Caller holds ioMu_.
  bool progress() {
    if (failed_.load(std::memory_order_relaxed)) return false;
    bool moved = false;
    if (sending_) {
      for (auto& s : socks_) moved |= progressSend(s);
    } else {
      // Only the step the engine needs next, from the socket that carries it: trying other
      // sockets, or the step after, would mostly find nothing at a system call each (the
      // engine's next wait asks again). Later steps wait in the kernel's socket buffer.
      size_t i = nextStep() % socks_.size();
      moved = progressRecv(socks_[i], i);
    }
    const uint64_t low = nextStep();
    if (sending_) {
      if (low > fifo_.ctrl->head.load(std::memory_order_relaxed))
        fifo_.ctrl->head.store(low, std::memory_order_release);
    } else if (low > fifo_.ctrl->tail.load(std::memory_order_relaxed)) {
      fifo_.ctrl->tail.store(low, std::memory_order_release);
    }
    return moved;
  }

 public:
  // Everything the engine posted has been written to the sockets (or the link failed).
  bool drained() const {
    return !sending_ || failed_.load(std::memory_order_acquire) ||
           fifo_.ctrl->head.load(std::memory_order_acquire) >=
               fifo_.ctrl->tail.load(std::memory_order_acquire);
  }

  // The events each socket waits for now (0: nothing to do until the engine moves).
  void pollEvents(std::vector<pollfd>* fds) {
    if (failed_.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lock(ioMu_);
    for (auto& s : socks_) {
      if (s.closed) continue;
      if (sending_ && s.next < fifo_.ctrl->tail.load(std::memory_order_acquire)) {
        fds->push_back({s.sock.fd(), POLLOUT, 0});
      }
      // Receiving sockets are read by the engine while it waits for them; the proxy sleeping
      // on them too would only wake up to fight it for the core.
    }
  }

 private:
  bool progressSend(SockState& s) {
    bool moved = false;
    while (s.next < fifo_.ctrl->tail.load(std::memory_order_acquire)) {
      if (s.done == 0) {
        s.hdr = {kSlotMagic, static_cast<uint32_t>(s.next),
                 fifo_.ctrl->sizes[s.next % kSteps].load(std::memory_order_relaxed)};
      }
      size_t payload = s.hdr.sizeWord & kSizeMask;
      size_t total = sizeof(SlotHeader) + payload;
      const char* src = src_[s.next % kSteps];
      char* body = src ? const_cast<char*>(src) : fifo_.slot(s.next);
      iovec iov[2];
      int n = 0;
      if (s.done < sizeof(SlotHeader)) {
        iov[n++] = {reinterpret_cast<char*>(&s.hdr) + s.done, sizeof(SlotHeader) - s.done};
        if (payload) iov[n++] = {body, payload};
      } else {
        iov[n++] = {body + (s.done - sizeof(SlotHeader)), total - s.done};
      }
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<size_t>(n);
      ssize_t w = sendmsg(s.sock.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
        fail(std::string("sending to ") + peerName_ + " failed: " + strerror(errno));
        return moved;
      }
      moved = true;
      s.done += static_cast<size_t>(w);
      if (s.done == total) {
        src_[s.next % kSteps] = nullptr;
        s.done = 0;
        s.next += socks_.size();
      }
    }
    return moved;
  }

  // Reads at most one step from s; true when any byte moved. When the engine said how long
  // the step it waits for is (recvInto), header and payload come in one recvmsg.
  bool progressRecv(SockState& s, size_t index) {
    bool moved = false;
    while (!s.closed && s.next < fifo_.ctrl->head.load(std::memory_order_acquire) + kSlots) {
      const bool expected = s.next == expStep_;
      iovec iov[2];
      int niov = 1;
      if (s.done < sizeof(SlotHeader)) {
        iov[0] = {reinterpret_cast<char*>(&s.hdr) + s.done, sizeof(SlotHeader) - s.done};
        if (expected && expBytes_ > 0) {
          iov[niov++] = {dst_ ? dst_ : fifo_.slot(s.next), std::min(expBytes_, fifo_.slotBytes)};
        }
      } else {
        iov[0] = {(s.user ? s.user : fifo_.slot(s.next)) + (s.done - sizeof(SlotHeader)),
                  sizeof(SlotHeader) + (s.hdr.sizeWord & kSizeMask) - s.done};
      }
      ssize_t r = 0;
      if (iov[0].iov_len > 0) {
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<size_t>(niov);
        r = recvmsg(s.sock.fd(), &msg, MSG_DONTWAIT);
        if (r < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return moved;
          fail(std::string("receiving from ") + peerName_ + " failed: " + strerror(errno));
          return moved;
        }
        if (r == 0) {
          // The peer closed. Not an error by itself (it may have finished and left), but a
          // wait for more data from this socket now fails instead of hanging (health()).
          s.closed = true;
          eof_[index].store(true, std::memory_order_release);
          TUTTI_INFO(log::kNet, "tcp: %s closed a connection", peerName_.c_str());
          return moved;
        }
      }
      moved = true;
      const bool hadHeader = s.done >= sizeof(SlotHeader);
      s.done += static_cast<size_t>(r);
      if (!hadHeader && s.done >= sizeof(SlotHeader)) {
        if (!headerOk(s, niov == 2)) return moved;
        // Where the payload goes: the engine's buffer when it asked for this step in time.
        s.user = expected && dst_ && (s.hdr.sizeWord & kSizeMask) == expBytes_ ? dst_ : nullptr;
      }
      if (s.done >= sizeof(SlotHeader) &&
          s.done == sizeof(SlotHeader) + (s.hdr.sizeWord & kSizeMask)) {
        fifo_.ctrl->sizes[s.next % kSteps].store(s.hdr.sizeWord, std::memory_order_relaxed);
        if (s.user) landed_ = s.next;
        s.user = nullptr;
        s.done = 0;
        s.next += socks_.size();
        return true;  // one step per call (see progress())
      }
    }
    return moved;
  }

  // Checks a slot header before anything trusts it. combined: the payload was read with it,
  // into a buffer sized for the length the engine expected, so any other length is fatal (a
  // shorter one would have swallowed the start of the next step).
  bool headerOk(SockState& s, bool combined) {
    const size_t size = s.hdr.sizeWord & kSizeMask;
    char buf[200];
    if (s.hdr.magic != kSlotMagic || s.hdr.step != static_cast<uint32_t>(s.next) ||
        size > fifo_.slotBytes || (s.hdr.sizeWord & ~(kSizeMask | kLastSlot))) {
      snprintf(buf, sizeof(buf),
               " sent malformed data (slot header magic 0x%08x step %u size word 0x%llx, "
               "expected step %u)",
               s.hdr.magic, s.hdr.step, static_cast<unsigned long long>(s.hdr.sizeWord),
               static_cast<uint32_t>(s.next));
    } else if (combined && size != expBytes_) {
      snprintf(buf, sizeof(buf),
               " sent a slot of %zu bytes where this rank expected %zu: do all ranks call the "
               "same collectives with the same count, datatype and root?",
               size, expBytes_);
    } else {
      return true;
    }
    fail(peerName_ + buf);
    shutdown(s.sock.fd(), SHUT_RDWR);
    return false;
  }

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.load()) return;
    failure_ = "tcp: " + why;
    failed_.store(true, std::memory_order_release);
    TUTTI_INFO(log::kNet, "%s", failure_.c_str());
  }

  bool sending_;
  std::string peerName_;
  char* mem_ = nullptr;
  size_t bytes_ = 0;
  std::vector<SockState> socks_;
  std::unique_ptr<std::atomic<bool>[]> eof_;
  std::atomic<bool> failed_{false};
  mutable std::mutex mu_;
  std::string failure_;
  std::function<Status()> finisher_;
  std::function<void()> wakeProxy_;
  std::mutex ioMu_;  // engine thread or proxy: one of them moves this connection's bytes
  // Direct transfers. Sender: per step (modulo kSteps), the caller's buffer to send from (or
  // null: the slot).
  // Receiver: the step the engine waits for, its length, where its payload should go (null:
  // the slot), and the last step that went to such a destination.
  const char* src_[kSteps];
  char* dst_ = nullptr;
  uint64_t expStep_ = UINT64_MAX;
  size_t expBytes_ = 0;
  uint64_t landed_ = UINT64_MAX;
};

}  // namespace tutti::transport
