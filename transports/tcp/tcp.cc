// tcp: any two ranks that can reach each other over IP. Each side keeps its FIFO in its own
// memory; the communicator's proxy thread moves filled slots from the sender's FIFO onto the
// wire and from the wire into the receiver's FIFO. A connection uses several sockets
// (NCCL_NSOCKS_PERTHREAD, default 2): slot k travels on socket k % nsocks, so consecutive
// slots stream in parallel while each socket stays in order. Every slot is framed by a
// header (magic, step, size) that the receiver checks before it trusts the payload. Here: the
// transport (connection set-up, the acceptor, the proxy thread); the connection itself is in
// tcp_connection.h.
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
#include "transports/tcp/tcp_connection.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

struct TcpDesc {
  wire::Addr addr;
  uint64_t connId;
  uint64_t slotBytes;
  uint32_t nsocks;
};
static_assert(sizeof(TcpDesc) <= sizeof(Descriptor));

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
