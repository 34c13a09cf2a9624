// tcp: any two ranks that can reach each other over IP. Each side keeps its FIFO in its own
// memory; the communicator's proxy thread moves filled slots from the sender's FIFO onto the
// wire and from the wire into the receiver's FIFO. A connection uses several sockets
// (NCCL_NSOCKS_PERTHREAD, default 2): slot k travels on socket k % nsocks, so consecutive
// slots stream in parallel while each socket stays in order. Every slot is framed by a
// header (magic, step, size) that the receiver checks before it trusts the payload.
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "runtime/acceptor.h"
#include "runtime/comm.h"
#include "runtime/env.h"
#include "runtime/log.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

constexpr uint32_t kSlotMagic = 0x544c5354;  // "TSLT"

struct TcpDesc {
  wire::Addr addr;
  uint64_t connId;
  uint64_t slotBytes;
  uint32_t nsocks;
};
static_assert(sizeof(TcpDesc) <= sizeof(Descriptor));

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

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(Comm& comm) : comm_(comm) {
    nsocks_ = static_cast<int>(std::clamp<int64_t>(env::getInt("NCCL_NSOCKS_PERTHREAD", 2), 1, 16));
  }
  ~TcpTransport() override { shutdown(); }

  const char* name() const override { return "tcp"; }
  bool canConnect(const PeerInfo&, const PeerInfo&) const override { return true; }

  Result<std::unique_ptr<Connection>> setupRecv(const ConnSpec& spec, Descriptor* out) override {
    TUTTI_TRY(ensureListener());
    TcpDesc d{};
    d.addr = wire::fromSockAddr(listenAddr_);
    d.connId = nextConnId_++;
    d.slotBytes = spec.slotBytes;
    d.nsocks = static_cast<uint32_t>(nsocks_);
    memcpy(out->bytes, &d, sizeof(d));
    auto conn = std::make_unique<TcpConnection>(
        spec, false, [this] { ring(); }, peerName(spec.peer), onThisMachine(spec.peer));
    pendingRecv_.push_back({conn.get(), d.connId, spec.peer});
    TcpConnection* c = conn.get();
    conn->setFinisher([this, c] { return finishRecv(c); });
    return std::unique_ptr<Connection>(std::move(conn));
  }

  // Receiver: accept the sender's sockets for each connection set up since the last call.
  Status finishRecv(TcpConnection* conn) {
    auto it = std::find_if(pendingRecv_.begin(), pendingRecv_.end(),
                           [&](const PendingRecv& p) { return p.conn == conn; });
    if (it == pendingRecv_.end()) return Status::Ok();
    PendingRecv want = *it;
    pendingRecv_.erase(it);
    std::vector<net::Socket> socks(static_cast<size_t>(nsocks_));
    int have = 0;
    net::Deadline deadline = net::deadlineAfter(comm_.bootstrap()->timeoutSeconds());
    while (have < nsocks_) {
      for (auto a = accepted_.begin(); a != accepted_.end();) {
        const wire::Hello& h = a->hello;
        if (h.size == want.connId && h.rank == want.peer && h.tag < uint32_t(nsocks_) &&
            !socks[h.tag].valid()) {
          socks[h.tag] = std::move(a->socket);
          ++have;
          a = accepted_.erase(a);
        } else {
          ++a;
        }
      }
      if (have == nsocks_) break;
      Bootstrap* b = comm_.bootstrap();
      Result<Acceptor::Accepted> a =
          acceptor_->next(b->sliceOf(want.peer, deadline), comm_.abortFlag());
      if (!a.ok()) {
        Status st = b->checkPeer(want.peer, deadline, a.status());
        if (st.ok()) continue;
        return st.withContext("tcp: waiting for " + peerName(want.peer) + " to connect (channel " +
                              std::to_string(conn->fifo().channel) + ")");
      }
      if (a.value().hello.kind != static_cast<uint32_t>(wire::HelloKind::kData)) {
        TUTTI_WARN("rank %d: tcp listener dropped a connection of kind %u from rank %d",
                   comm_.rank(), a.value().hello.kind, a.value().hello.rank);
        continue;
      }
      accepted_.push_back(std::move(a.value()));
    }
    conn->adopt(std::move(socks));
    addToProxy(conn);
    return Status::Ok();
  }

  Result<std::unique_ptr<Connection>> connectSend(const ConnSpec& spec,
                                                  const Descriptor& in) override {
    TcpDesc d;
    memcpy(&d, in.bytes, sizeof(d));
    if (d.slotBytes != spec.slotBytes) {
      return invalidUsage("tcp: rank " + std::to_string(spec.peer) + " uses a slot size of " +
                          std::to_string(d.slotBytes) + " bytes, this rank " +
                          std::to_string(spec.slotBytes) + " (NCCL_BUFFSIZE must match)");
    }
    if (d.nsocks < 1 || d.nsocks > 16) return internalError("tcp: bad socket count from peer");
    net::SockAddr addr = wire::toSockAddr(d.addr);
    net::Deadline deadline = net::deadlineAfter(comm_.bootstrap()->timeoutSeconds());
    std::vector<net::Socket> socks;
    for (uint32_t i = 0; i < d.nsocks; ++i) {
      Result<net::Socket> s =
          comm_.bootstrap()->connectTo(spec.peer, addr, deadline, comm_.abortFlag());
      if (!s.ok()) {
        return s.status().withContext("tcp: connecting to " + peerName(spec.peer) + " at " +
                                      addr.toString());
      }
      wire::Hello h{};
      h.magic = wire::kHelloMagic;
      h.secret = comm_.bootstrap()->secret();
      h.kind = static_cast<uint32_t>(wire::HelloKind::kData);
      h.rank = comm_.rank();
      h.nranks = static_cast<int32_t>(d.nsocks);
      h.tag = i;
      h.size = d.connId;
      TUTTI_TRY(s.value().sendAll(&h, sizeof(h), deadline, comm_.abortFlag()));
      socks.push_back(s.take());
    }
    auto conn = std::make_unique<TcpConnection>(
        spec, true, [this] { ring(); }, peerName(spec.peer), onThisMachine(spec.peer));
    conn->adopt(std::move(socks));
    addToProxy(conn.get());
    TUTTI_INFO(log::kNet, "rank %d -> rank %d channel %d: tcp via %s, %u sockets", comm_.rank(),
               spec.peer, spec.channel, addr.toString().c_str(), d.nsocks);
    return std::unique_ptr<Connection>(std::move(conn));
  }

  void flush(double seconds) override {
    if (!proxy_.joinable()) return;
    net::Deadline deadline = net::deadlineAfter(seconds);
    while (true) {
      bool drained = true;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (TcpConnection* c : conns_) drained &= c->drained();
      }
      if (drained) return;
      if (net::Clock::now() >= deadline) {
        TUTTI_WARN(
            "rank %d: tcp: data for a peer was still unsent after %.0f s at "
            "communicator destruction; dropping it",
            comm_.rank(), seconds);
        return;
      }
      ring();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  void shutdown() override {
    if (!proxy_.joinable()) return;
    stop_.store(true);
    ring();
    proxy_.join();
    close(efd_);
  }

  void ring() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (sleeping_.load(std::memory_order_relaxed)) {
      uint64_t one = 1;
      ssize_t rc = write(efd_, &one, sizeof(one));
      (void)rc;
    }
  }

 private:
  struct PendingRecv {
    TcpConnection* conn;
    uint64_t connId;
    int peer;
  };

  // The same running kernel: the peer competes for this rank's CPUs.
  bool onThisMachine(int peer) const {
    return comm_.peers()[static_cast<size_t>(peer)].machineHash ==
           comm_.peers()[static_cast<size_t>(comm_.rank())].machineHash;
  }

  std::string peerName(int peer) const {
    const PeerInfo& p = comm_.peers()[static_cast<size_t>(peer)];
    return "rank " + std::to_string(peer) + " (" + p.hostname + " pid " + std::to_string(p.pid) +
           ")";
  }

  Status ensureListener() {
    if (listener_.valid()) return Status::Ok();
    net::SockAddr bind = comm_.bootstrap()->listenAddr();
    bind.setPort(0);
    TUTTI_ASSIGN(l, net::Socket::listen(bind));
    listener_ = std::move(l);
    TUTTI_ASSIGN(local, listener_.localAddr());
    listenAddr_ = local;
    acceptor_ = std::make_unique<Acceptor>(&listener_, comm_.bootstrap()->secret(),
                                           "rank " + std::to_string(comm_.rank()) + " tcp");
    TUTTI_INFO(log::kNet, "rank %d: tcp transport listening on %s", comm_.rank(),
               listenAddr_.toString().c_str());
    return Status::Ok();
  }

  void addToProxy(TcpConnection* conn) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      conns_.push_back(conn);
    }
    if (!proxy_.joinable()) {
      efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      proxy_ = std::thread([this] { proxyLoop(); });
    }
    ring();
  }

  // The proxy: progress every connection; when nothing moves for a while, sleep in poll()
  // until a socket is ready or the engine rings the doorbell.
  void proxyLoop() {
    log::setThreadDevice(comm_.cudaDev());
    int idle = 0;
    std::vector<pollfd> fds;
    while (!stop_.load(std::memory_order_acquire)) {
      bool moved = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (TcpConnection* c : conns_) moved |= c->proxyPass();
      }
      if (moved) {
        idle = 0;
        continue;
      }
      // The engines do most I/O themselves: sleep soon rather than compete for the cores.
      if (++idle < 8) {
        sched_yield();
        continue;
      }
      sleeping_.store(true, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      fds.clear();
      fds.push_back({efd_, POLLIN, 0});
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (TcpConnection* c : conns_) c->pollEvents(&fds);
      }
      poll(fds.data(), fds.size(), 100);
      sleeping_.store(false, std::memory_order_relaxed);
      uint64_t drain;
      ssize_t rc = read(efd_, &drain, sizeof(drain));
      (void)rc;
      idle = 0;
    }
  }

  Comm& comm_;
  int nsocks_;
  net::Socket listener_;
  net::SockAddr listenAddr_;
  std::unique_ptr<Acceptor> acceptor_;
  uint64_t nextConnId_ = 1;
  std::vector<PendingRecv> pendingRecv_;
  std::list<Acceptor::Accepted> accepted_;

  std::mutex mu_;
  std::vector<TcpConnection*> conns_;
  std::thread proxy_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  int efd_ = -1;
};

}  // namespace

std::unique_ptr<Transport> makeTcpTransport(Comm& comm) {
  return std::make_unique<TcpTransport>(comm);
}

}  // namespace tutti::transport
