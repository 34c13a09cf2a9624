// A rank's side of the bootstrap: check in with the root, join the ring, then all-gather,
// barrier and point-to-point messages among the ranks of one communicator. Used at init and
// by later setup steps (transport handshakes); never on a data path.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/acceptor.h"
#include "runtime/socket.h"
#include "runtime/wire.h"

namespace tutti {

class Bootstrap {
 public:
  // Blocks until the ring is formed, the deadline passes (an error naming the ranks that did
  // not arrive) or *abort becomes true.
  static Result<std::unique_ptr<Bootstrap>> create(const wire::UniqueId& id, int rank, int nranks,
                                                   const std::atomic<bool>* abort, double timeoutS);

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  // The job's secret: transports put it in their handshakes too.
  uint64_t secret() const { return secret_; }
  double timeoutSeconds() const { return timeoutS_; }
  // Where this rank's listener is (and so which interface was chosen).
  const net::SockAddr& listenAddr() const { return listenAddr_; }
  net::SockAddr peerAddr(int rank) const { return wire::toSockAddr(peers_[rank]); }

  // data holds nranks slices of bytesPerRank; slice rank() is ours, the rest are filled in.
  Status allGather(void* data, size_t bytesPerRank);
  Status barrier();
  // Point-to-point messages, matched by (peer, tag); messages may arrive in any order.
  Status send(int peer, uint32_t tag, const void* data, size_t size);
  Status recv(int peer, uint32_t tag, void* data, size_t size);
  // Asked every kPeerCheckSeconds while send or recv waits for a peer it watches: a failed
  // Status ends the wait with it (the communicator knows which peers' processes it can see;
  // the bootstrap alone would wait out its deadline for a peer that exited). Peers it does
  // not watch are waited for in one piece, as before.
  struct PeerCheck {
    std::function<bool(int peer)> watches;
    std::function<Status(int peer)> check;
  };
  void setPeerCheck(PeerCheck check) { peerCheck_ = std::move(check); }
  static constexpr double kPeerCheckSeconds = 0.2;
  // For any wait on one peer (transports' handshakes too): wait until sliceOf(peer, deadline),
  // and when that fails go on only while checkPeer gives Ok. sliceOf: at most
  // kPeerCheckSeconds on for a watched peer, the whole deadline otherwise. checkPeer: `waited`
  // itself unless it is a slice's timeout with more than a slice of the deadline left; then
  // the peer check's verdict.
  net::Deadline sliceOf(int peer, net::Deadline deadline) const;
  Status checkPeer(int peer, net::Deadline deadline, const Status& waited) const;
  // Connects to addr (peer's listener), in slices as above.
  Result<net::Socket> connectTo(int peer, const net::SockAddr& addr, net::Deadline deadline,
                                const std::atomic<bool>* abort) const;

 private:
  Bootstrap(int rank, int nranks, uint64_t secret, const std::atomic<bool>* abort, double timeoutS);
  Status checkInAndFormRing(const wire::UniqueId& id);
  // Accepts until a connection of `kind` from `fromRank` arrives; queues P2P messages.
  Result<net::Socket> acceptFrom(wire::HelloKind kind, int fromRank, net::Deadline deadline);
  Status queueMessage(net::Socket& s, const wire::Hello& h, net::Deadline deadline);
  wire::Hello hello(wire::HelloKind kind) const;

  int rank_, nranks_;
  uint64_t secret_;
  const std::atomic<bool>* abort_;
  double timeoutS_;
  net::Socket listener_;
  net::SockAddr listenAddr_;
  std::unique_ptr<Acceptor> acceptor_;
  net::Socket next_, prev_;
  std::vector<wire::Addr> peers_;
  PeerCheck peerCheck_;

  struct Message {
    int from;
    uint32_t tag;
    std::vector<char> data;
  };
  std::mutex recvMu_;  // one receiver drives the acceptor at a time
  std::list<Message> unexpected_;
  std::mutex ringMu_;
  // After a failed all-gather the ring's byte streams are out of step: refuse further use.
  std::string broken_;  // guarded by ringMu_
};

}  // namespace tutti
