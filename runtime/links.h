// A communicator's connections: for each (peer, channel, direction) at most one, made the
// first time an operation needs it (the way NCCL connects at run time) over the transport
// the pair of ranks can use first: shm on one host, tcp otherwise. NCCL_SHM_DISABLE=1 makes
// local pairs use tcp; NCCL_NET picks the network transport (Socket is the one built in).
#pragma once

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/status.h"
#include "transports/transport.h"

namespace tutti {

class Comm;

struct LinkNeed {
  int peer;
  int channel;
  bool send;  // false: receive from peer
  bool operator<(const LinkNeed& o) const {
    return std::tie(peer, channel, send) < std::tie(o.peer, o.channel, o.send);
  }
};

class Links {
 public:
  // kHost: FIFOs the CPU engine uses (shm, tcp). kDevice: FIFOs device kernels use (p2p:
  // GPU memory or mapped host memory), for operations on GPU buffers.
  enum class Kind { kHost, kDevice };
  explicit Links(Comm& comm, Kind kind = Kind::kHost);
  ~Links();

  // Makes every link in `needs` that does not exist yet. Every rank at the other end of a
  // new link must be inside a matching ensure() at the same time (the same collective, or
  // the matching send/recv).
  // madePeers: gets the peers of the links this call made (each once).
  Status ensure(const std::vector<LinkNeed>& needs, std::vector<int>* madePeers = nullptr);
  transport::FifoView* send(int peer, int channel);
  transport::FifoView* recv(int peer, int channel);
  // Tells every peer that this rank has left (after a failure or an abort).
  void breakAll();
  // Marks the links to peer broken, its process having exited (Connection::breakLink). false if
  // the links were busy (being made): ask again later.
  bool peerGone(int peer);
  // Every link's memory is left to the process's exit (Connection::abandon): the bytes.
  size_t abandonAll();
  // Hands every link over (the caller frees them, on any thread: a connection needs nothing
  // of the communicator to be freed); none is left.
  std::vector<std::unique_ptr<transport::Connection>> takeConnections();
  // Memory that peers in other processes write into is kept a while, not freed with the links
  // (an abort; Connection::keepIfOtherProcessWrites): the bytes.
  size_t keepIfOtherProcessesWrite();
  // Slot sizes: of the links to peer, and the largest that fits every hop of the ring.
  size_t slotBytesFor(int peer) const;
  size_t ringSlotBytes() const;
  // The smallest slot of any link, the same on every rank (flat exchanges chunk every link
  // alike by it, whatever the links' transports).
  size_t minSlotBytes() const { return std::min(slotBytes_, netSlotBytes_); }
  // The most one step carries: over the network by default less than a slot holds (see
  // links.cc), else a slot. stepBytesFor: to peer; ringStepBytes: on every hop of the ring.
  size_t stepBytesFor(int peer) const;
  size_t ringStepBytes() const;
  // Whether any hop of the ring (rank r to r + 1) goes over the network; the same on every rank.
  bool ringUsesNet() const;
  // Whether the link to peer goes over the network transport (not shared memory).
  bool usesNet(int peer) const;
  bool netBetween(int a, int b) const;
  // The transport that reaches peer, or an error naming what is missing.
  Result<transport::Transport*> transportFor(int peer);

 private:
  std::string linkName(const LinkNeed& n, const transport::Transport* t) const;
  size_t ringMin(size_t net) const;

  Comm& comm_;
  Kind kind_;
  size_t slotBytes_, netSlotBytes_, netStepBytes_;
  bool shmDisabled_;
  size_t ringSlotBytes_ = 0, ringStepBytes_ = 0;  // ringMin of the net figures, set at once
  bool ringUsesNet_ = false;
  std::string netName_;
  std::unique_ptr<transport::Transport> shm_, net_, p2p_;
  std::mutex mu_;
  std::map<LinkNeed, std::unique_ptr<transport::Connection>> conns_;
};

}  // namespace tutti
