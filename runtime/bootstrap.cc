#include "runtime/bootstrap.h"

#include <unistd.h>

#include <algorithm>

#include "runtime/bootstrap_root.h"
#include "runtime/log.h"

namespace tutti {

namespace {
// A bootstrap p2p message larger than this is refused: the bootstrap carries setup data only.
constexpr uint64_t kMaxMessageBytes = 1ull << 30;
}  // namespace

Bootstrap::Bootstrap(int rank, int nranks, uint64_t secret, const std::atomic<bool>* abort,
                     double timeoutS)
    : rank_(rank), nranks_(nranks), secret_(secret), abort_(abort), timeoutS_(timeoutS) {}

wire::Hello Bootstrap::hello(wire::HelloKind kind) const {
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.secret = secret_;
  h.kind = static_cast<uint32_t>(kind);
  h.rank = rank_;
  h.nranks = nranks_;
  h.addr = wire::fromSockAddr(listenAddr_);
  return h;
}

Result<std::unique_ptr<Bootstrap>> Bootstrap::create(const wire::UniqueId& id, int rank, int nranks,
                                                     const std::atomic<bool>* abort,
                                                     double timeoutS) {
  if (id.magic != wire::kIdMagic) {
    return invalidArgument(
        "the ncclUniqueId was not made by tutti's ncclGetUniqueId (bad magic; was it copied "
        "whole to every rank?)");
  }
  std::unique_ptr<Bootstrap> b(new Bootstrap(rank, nranks, id.secret, abort, timeoutS));
  TUTTI_TRY(b->checkInAndFormRing(id));
  return b;
}

Status Bootstrap::checkInAndFormRing(const wire::UniqueId& id) {
  net::SockAddr root = wire::toSockAddr(id.root);
  // Ranks of a job whose root is on loopback are all on this host (stay on loopback), unless
  // the launcher says they are not (wire.h: kJobSpansHosts).
  TUTTI_ASSIGN(local, net::localAddressToward(root, (id.flags & wire::kJobSpansHosts) != 0));
  TUTTI_ASSIGN(listener, net::Socket::listen(local));
  listener_ = std::move(listener);
  TUTTI_ASSIGN(bound, listener_.localAddr());
  listenAddr_ = bound;
  acceptor_ =
      std::make_unique<Acceptor>(&listener_, secret_, "bootstrap rank " + std::to_string(rank_));
  TUTTI_INFO(log::kBootstrap, "rank %d/%d: bootstrap listening on %s, root at %s", rank_, nranks_,
             listenAddr_.toString().c_str(), root.toString().c_str());

  // The root answers once every rank has checked in, so this wait covers the whole job's
  // arrival; give the root a moment past its own deadline so its answer (which names the
  // missing ranks) arrives before ours expires.
  net::Deadline deadline = net::deadlineAfter(timeoutS_ + 5.0);
  Result<net::Socket> conn = net::Socket::connect(root, deadline, abort_);
  if (!conn.ok()) {
    return Status(conn.status().code(), "rank " + std::to_string(rank_) +
                                            " could not reach the bootstrap root at " +
                                            root.toString() + ": " + conn.status().message());
  }
  net::Socket rootSock = conn.take();
  wire::Hello h = hello(wire::HelloKind::kCheckIn);
  h.size = processToken();  // lets the root answer its own process last
  h.tag = wire::buildFingerprint();
  wire::RootReply reply{};
  Status st = rootSock.sendAll(&h, sizeof(h), deadline, abort_).withContext("check-in");
  if (st.ok()) st = rootSock.recvAll(&reply, sizeof(reply), deadline, abort_);
  if (!st.ok()) {
    if (st.code() == Code::kTimeout) {
      return timeoutError("rank " + std::to_string(rank_) +
                          ": no answer from the bootstrap root at " + root.toString() +
                          " within the deadline: not all " + std::to_string(nranks_) +
                          " ranks checked in (TUTTI_BOOTSTRAP_TIMEOUT)");
    }
    const std::string waiting =
        "rank " + std::to_string(rank_) + " waiting for the bootstrap root at " + root.toString();
    if (st.code() != Code::kRemoteError) return st.withContext(waiting);  // an abort, a poll
    // A closed or reset connection: the root's process ended, another job's root refused this
    // rank's secret, or another program listens there.
    return st.withContext(waiting +
                          " (did rank 0's process end, or is another job's tutti root or another "
                          "program listening there?)");
  }
  if (reply.magic != wire::kReplyMagic) {
    return remoteError("rank " + std::to_string(rank_) + ": what answers at " + root.toString() +
                       " is not a tutti bootstrap root (another program listening there?)");
  }
  reply.message[sizeof(reply.message) - 1] = '\0';
  if (reply.code != 0) {
    return Status(static_cast<Code>(reply.code),
                  "rank " + std::to_string(rank_) + ": " + reply.message);
  }
  rootSock.close();

  peers_.assign(static_cast<size_t>(nranks_), wire::Addr{});
  peers_[static_cast<size_t>(rank_)] = wire::fromSockAddr(listenAddr_);
  if (nranks_ == 1) return Status::Ok();

  // Join the ring: connect to the next rank, accept the previous one.
  deadline = net::deadlineAfter(timeoutS_);
  int nextRank = (rank_ + 1) % nranks_, prevRank = (rank_ + nranks_ - 1) % nranks_;
  Result<net::Socket> next = net::Socket::connect(wire::toSockAddr(reply.next), deadline, abort_);
  if (!next.ok()) {
    return next.status().withContext("rank " + std::to_string(rank_) +
                                     " connecting to ring neighbour rank " +
                                     std::to_string(nextRank));
  }
  next_ = next.take();
  wire::Hello rh = hello(wire::HelloKind::kRing);
  TUTTI_TRY(next_.sendAll(&rh, sizeof(rh), deadline, abort_));
  Result<net::Socket> prev = acceptFrom(wire::HelloKind::kRing, prevRank, deadline);
  if (!prev.ok()) {
    return prev.status().withContext("rank " + std::to_string(rank_) +
                                     " waiting for ring neighbour rank " +
                                     std::to_string(prevRank));
  }
  prev_ = prev.take();
  // Everyone learns everyone's listener, for point-to-point messages later.
  return allGather(peers_.data(), sizeof(wire::Addr)).withContext("exchanging addresses");
}

Status Bootstrap::queueMessage(net::Socket& s, const wire::Hello& h, net::Deadline deadline) {
  if (h.size > kMaxMessageBytes || h.rank < 0 || h.rank >= nranks_) {
    TUTTI_WARN("rank %d: dropped a bootstrap message from rank %d of %llu bytes", rank_, h.rank,
               static_cast<unsigned long long>(h.size));
    return Status::Ok();
  }
  Message m{h.rank, h.tag, std::vector<char>(h.size)};
  TUTTI_TRY(s.recvAll(m.data.data(), m.data.size(), deadline, abort_)
                .withContext("bootstrap message from rank " + std::to_string(h.rank)));
  unexpected_.push_back(std::move(m));
  return Status::Ok();
}

Result<net::Socket> Bootstrap::acceptFrom(wire::HelloKind kind, int fromRank,
                                          net::Deadline deadline) {
  while (true) {
    TUTTI_ASSIGN(a, acceptor_->next(deadline, abort_));
    if (a.hello.kind == static_cast<uint32_t>(kind) && a.hello.rank == fromRank) {
      return std::move(a.socket);
    }
    if (a.hello.kind == static_cast<uint32_t>(wire::HelloKind::kP2p)) {
      TUTTI_TRY(queueMessage(a.socket, a.hello, deadline));
      continue;
    }
    TUTTI_WARN("rank %d: dropped an unexpected bootstrap connection (kind %u from rank %d)", rank_,
               a.hello.kind, a.hello.rank);
  }
}

Status Bootstrap::allGather(void* data, size_t bytesPerRank) {
  if (nranks_ == 1) return Status::Ok();
  std::lock_guard<std::mutex> lock(ringMu_);
  if (!broken_.empty()) {
    return internalError("rank " + std::to_string(rank_) +
                         ": the bootstrap ring is unusable after an earlier failure (" + broken_ +
                         ")");
  }
  auto* bytes = static_cast<char*>(data);
  net::Deadline deadline = net::deadlineAfter(timeoutS_);
  // Step s forwards the slice that originated s ranks back and receives the one before it.
  for (int s = 0; s < nranks_ - 1; ++s) {
    int sendSlice = (rank_ - s + nranks_) % nranks_;
    int recvSlice = (rank_ - s - 1 + nranks_) % nranks_;
    Status st = net::sendRecv(next_, bytes + sendSlice * bytesPerRank, bytesPerRank, prev_,
                              bytes + recvSlice * bytesPerRank, bytesPerRank, deadline, abort_);
    if (!st.ok()) {
      broken_ = st.message();
      return Status(st.code(), "rank " + std::to_string(rank_) + ": bootstrap all-gather step " +
                                   std::to_string(s) + " with ring neighbours rank " +
                                   std::to_string((rank_ + nranks_ - 1) % nranks_) + " and rank " +
                                   std::to_string((rank_ + 1) % nranks_) + ": " + st.message());
    }
  }
  return Status::Ok();
}

Status Bootstrap::barrier() {
  std::vector<char> bytes(static_cast<size_t>(nranks_), 1);
  return allGather(bytes.data(), 1).withContext("barrier");
}

Status Bootstrap::send(int peer, uint32_t tag, const void* data, size_t size) {
  if (peer < 0 || peer >= nranks_) return invalidArgument("bootstrap send to bad peer");
  net::Deadline deadline = net::deadlineAfter(timeoutS_);
  Result<net::Socket> s = connectTo(peer, peerAddr(peer), deadline, abort_);
  if (!s.ok()) {
    return s.status().withContext("rank " + std::to_string(rank_) + ": bootstrap send to rank " +
                                  std::to_string(peer));
  }
  wire::Hello h = hello(wire::HelloKind::kP2p);
  h.tag = tag;
  h.size = size;
  TUTTI_TRY(s.value().sendAll(&h, sizeof(h), deadline, abort_));
  return s.value().sendAll(data, size, deadline, abort_);
}

Status Bootstrap::recv(int peer, uint32_t tag, void* data, size_t size) {
  if (peer < 0 || peer >= nranks_) return invalidArgument("bootstrap recv from bad peer");
  std::lock_guard<std::mutex> lock(recvMu_);
  net::Deadline deadline = net::deadlineAfter(timeoutS_);
  Status gone;  // the peer check's verdict, once it said the peer exited
  while (true) {
    for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
      if (it->from != peer || it->tag != tag) continue;
      if (it->data.size() != size) {
        return internalError("rank " + std::to_string(rank_) + ": bootstrap message from rank " +
                             std::to_string(peer) + " tag " + std::to_string(tag) + " has " +
                             std::to_string(it->data.size()) + " bytes, expected " +
                             std::to_string(size));
      }
      memcpy(data, it->data.data(), size);
      unexpected_.erase(it);
      return Status::Ok();
    }
    Result<Acceptor::Accepted> a = acceptor_->next(sliceOf(peer, deadline), abort_);
    if (!a.ok()) {
      Status st = checkPeer(peer, deadline, a.status());
      if (st.ok()) continue;
      // A peer that sent and then exited: its message may still wait in the listener. One
      // more slice to take it; the exit is the answer if nothing comes.
      if (gone.ok() && st.code() != a.status().code()) {
        gone = st;
        deadline = std::min(deadline, net::deadlineAfter(kPeerCheckSeconds));
        continue;
      }
      if (!gone.ok() && st.code() == Code::kTimeout) st = gone;
      return Status(st.code(), "rank " + std::to_string(rank_) +
                                   ": no bootstrap message from rank " + std::to_string(peer) +
                                   " (tag " + std::to_string(tag) + "): " + st.message());
    }
    if (a.value().hello.kind != static_cast<uint32_t>(wire::HelloKind::kP2p)) {
      TUTTI_WARN("rank %d: dropped an unexpected bootstrap connection (kind %u from rank %d)",
                 rank_, a.value().hello.kind, a.value().hello.rank);
      continue;
    }
    TUTTI_TRY(queueMessage(a.value().socket, a.value().hello, deadline));
  }
}

net::Deadline Bootstrap::sliceOf(int peer, net::Deadline deadline) const {
  if (!peerCheck_.watches || !peerCheck_.watches(peer)) return deadline;
  return std::min(deadline, net::deadlineAfter(kPeerCheckSeconds));
}

Result<net::Socket> Bootstrap::connectTo(int peer, const net::SockAddr& addr,
                                         net::Deadline deadline,
                                         const std::atomic<bool>* abort) const {
  while (true) {
    Result<net::Socket> s = net::Socket::connect(addr, sliceOf(peer, deadline), abort);
    if (s.ok()) return s;
    Status st = checkPeer(peer, deadline, s.status());
    if (!st.ok()) return st;
  }
}

Status Bootstrap::checkPeer(int peer, net::Deadline deadline, const Status& waited) const {
  // Only a slice that ran out goes on; any other failure is the answer, and so is a timeout
  // in the deadline's last slice (connect gives up up to a retry's delay early: no spinning
  // on refused connects there).
  if (waited.code() != Code::kTimeout || net::secondsLeft(deadline) <= kPeerCheckSeconds ||
      !peerCheck_.check) {
    return waited;
  }
  return peerCheck_.check(peer);
}

}  // namespace tutti
