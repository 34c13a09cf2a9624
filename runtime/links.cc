#include "runtime/links.h"

#include <algorithm>

#include "kernels/cuda/dev_work.h"
#include "runtime/comm.h"
#include "runtime/env.h"
#include "runtime/log.h"

namespace tutti {
namespace {

// Bootstrap tags for link setup: one per (channel, direction of the link), unique per pair.
constexpr uint32_t kLinkTag = 0x4c000000u;
constexpr uint32_t kDeviceLinkTag = 0x4d000000u;
constexpr uint32_t kReplyTag = 0x00800000u;  // | a link's tag: the sender's answer (reply())

// NCCL_BUFFSIZE is a FIFO's slots (kSlots of them; shm adds cells, transport.h), for every
// transport when it is set. By default shared memory uses 1 MiB, not NCCL's 4 MiB: its slots are
// copied by CPU cores, for which smaller pieces pipeline better. The network's slots hold 2 MiB (16
// MiB in all) but steps carry at most 512 KiB (NCCL's 4 MiB / 8), except a two-rank broadcast's:
// its bytes go straight between sockets and user buffers, and fewer, bigger steps cost fewer system
// calls and wake-ups. Loopback tcp, 1 / 2 / 4 MiB, medians of 8 interleaved runs: 160 / 323 /
// 766 us with 2 MiB steps, 214 / 440 / 863 us with 512 KiB ones (Open MPI: 189 / 372 / 775).
// Bigger steps made the all-reduce slower (2 MiB: about 700 us with 1 MiB steps against 570
// with 512 KiB ones), hence the cap. Untouched slot space costs address space, not memory.
size_t slotBytesOf(int64_t buff) {
  buff = std::clamp<int64_t>(buff, transport::kSlots * 64, int64_t(1) << 32);
  return static_cast<size_t>(buff / transport::kSlots) / 64 * 64;
}

size_t slotBytesFromEnv(int64_t fallback) {
  return slotBytesOf(env::getInt("NCCL_BUFFSIZE", fallback));
}

}  // namespace

// Device FIFOs use NCCL's 4 MiB (the value every GPU rank read at init and compared,
// PeerInfo::device.buffSize): kernels copy whole slots with many threads at once.
Links::Links(Comm& comm, Kind kind)
    : comm_(comm),
      kind_(kind),
      slotBytes_(kind == Kind::kDevice
                     ? slotBytesOf(comm.peers()[size_t(comm.rank())].device.buffSize)
                     : slotBytesFromEnv(1 << 20)),
      netSlotBytes_(slotBytesFromEnv(16 << 20)),
      netStepBytes_(env::getString("NCCL_BUFFSIZE") ? netSlotBytes_
                                                    : std::min<size_t>(netSlotBytes_, 512 << 10)),
      shmDisabled_(env::getBool("NCCL_SHM_DISABLE", false)),
      netName_(env::getString("NCCL_NET").value_or("Socket")) {
  // Every operation asks (a loop over the ranks each time was 4% of 8 crowded ranks' time on
  // 64 B broadcasts); the peer table does not change after init.
  ringSlotBytes_ = ringMin(netSlotBytes_);
  ringStepBytes_ = ringMin(netStepBytes_);
  const int n = comm_.nranks();
  for (int r = 0; r < n && n > 1; ++r) ringUsesNet_ |= netBetween(r, (r + 1) % n);
}

Links::~Links() {
  // After an abort nothing is owed to anyone; otherwise the last sends must reach the wire.
  if (net_ && !comm_.aborted()) net_->flush(30);
  if (net_) net_->shutdown();  // stop the proxy before the connections it drives are freed
  if (shm_) shm_->shutdown();
  conns_.clear();
  p2p_.reset();
}

bool Links::usesNet(int peer) const { return netBetween(comm_.rank(), peer); }

bool Links::netBetween(int a, int b) const {
  if (kind_ == Kind::kDevice) return false;  // device links are all on one host
  return shmDisabled_ || comm_.peers()[static_cast<size_t>(a)].hostHash !=
                             comm_.peers()[static_cast<size_t>(b)].hostHash;
}

size_t Links::slotBytesFor(int peer) const { return usesNet(peer) ? netSlotBytes_ : slotBytes_; }

// The ring's chunk must fit the slots of every hop, and every rank must pick the same: each
// one derives it from the peer table, which all ranks share. `net`: the figure for a hop over
// the network (shared memory hops have slotBytes_).
size_t Links::ringMin(size_t net) const {
  const int n = comm_.nranks();
  size_t s = n > 1 ? SIZE_MAX : slotBytes_;
  for (int r = 0; r < n && n > 1; ++r) {
    s = std::min(s, netBetween(r, (r + 1) % n) ? net : slotBytes_);
  }
  return s;
}

size_t Links::ringSlotBytes() const { return ringSlotBytes_; }
size_t Links::stepBytesFor(int peer) const { return usesNet(peer) ? netStepBytes_ : slotBytes_; }
size_t Links::ringStepBytes() const { return ringStepBytes_; }

bool Links::ringUsesNet() const { return ringUsesNet_; }

Result<transport::Transport*> Links::transportFor(int peer) {
  const PeerInfo& me = comm_.peers()[static_cast<size_t>(comm_.rank())];
  const PeerInfo& p = comm_.peers()[static_cast<size_t>(peer)];
  if (kind_ == Kind::kDevice) {
#ifdef TUTTI_HAVE_CUDA
    if (!p2p_) p2p_ = transport::makeP2pTransport(comm_);
    if (p2p_->canConnect(me, p)) return p2p_.get();
#endif
    return invalidUsage(
        "rank " + std::to_string(comm_.rank()) + " and rank " + std::to_string(peer) +
        (me.hostHash != p.hostHash
             ? " are on different hosts: GPU buffers between hosts need a GPU-capable network "
               "transport, which this tutti build does not have yet (use host buffers)"
             : ": GPU buffers need both ranks on a GPU (one of them is a CPU rank)"));
  }
  if (!shmDisabled_) {
    if (!shm_) shm_ = transport::makeShmTransport(comm_);
    if (shm_->canConnect(me, p)) return shm_.get();
  }
  std::string lower = netName_;
  std::transform(lower.begin(), lower.end(), lower.begin(), ::tolower);
  if (lower != "socket") {
    return invalidUsage("NCCL_NET=" + netName_ +
                        ": no such network transport in this tutti build "
                        "(available: Socket)");
  }
  if (!net_) net_ = transport::makeTcpTransport(comm_);
  return net_.get();
}

// "rank 0 <- rank 3, channel 1 (p2p)": which link a setup failure is about. GPU sends and
// receives have links of their own, past the ring's channels (devplan::kP2pChannel).
std::string Links::linkName(const LinkNeed& n, const transport::Transport* t) const {
  const std::string which = kind_ == Kind::kDevice && n.channel >= dev::kMaxChannels
                                ? "sends and receives"
                                : "channel " + std::to_string(n.channel);
  return "rank " + std::to_string(comm_.rank()) + (n.send ? " -> rank " : " <- rank ") +
         std::to_string(n.peer) + ", " + which +
         (t ? std::string(" (") + t->name() + ")" : std::string());
}

Status Links::ensure(const std::vector<LinkNeed>& needs, std::vector<int>* madePeers) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LinkNeed> todo;
  for (const LinkNeed& n : needs) {
    if (!conns_.count(n) && std::find_if(todo.begin(), todo.end(), [&](const LinkNeed& t) {
                              return !(t < n) && !(n < t);
                            }) == todo.end()) {
      todo.push_back(n);
    }
  }
  if (todo.empty()) return Status::Ok();
  if (madePeers) {
    for (const LinkNeed& n : todo) {
      if (std::find(madePeers->begin(), madePeers->end(), n.peer) == madePeers->end())
        madePeers->push_back(n.peer);
    }
  }
  Bootstrap* b = comm_.bootstrap();
  const uint32_t tagBase = kind_ == Kind::kDevice ? kDeviceLinkTag : kLinkTag;
  auto tagOf = [&](int channel) { return tagBase | static_cast<uint32_t>(channel); };
  std::vector<std::pair<LinkNeed, transport::Transport*>> recvs, sends;
  for (const LinkNeed& n : todo) {
    TUTTI_ASSIGN(t, transportFor(n.peer));
    (n.send ? sends : recvs).push_back({n, t});
  }
  // Receivers create and describe their FIFOs first; sending a descriptor never waits for
  // the peer, so no rank can block another here whatever order the links come in.
  std::vector<std::pair<LinkNeed, transport::Connection*>> made;
  for (auto& [n, t] : recvs) {
    transport::Descriptor d{};
    Result<std::unique_ptr<transport::Connection>> c =
        t->setupRecv({n.peer, n.channel, slotBytesFor(n.peer)}, &d);
    if (!c.ok()) return c.status().withContext(linkName(n, t));
    transport::Connection* raw = c.value().get();
    conns_[n] = c.take();
    made.push_back({n, raw});
    TUTTI_TRY(b->send(n.peer, tagOf(n.channel), &d, sizeof(d)).withContext("link setup"));
  }
  for (auto& [n, t] : sends) {
    transport::Descriptor d{};
    TUTTI_TRY(b->recv(n.peer, tagOf(n.channel), &d, sizeof(d))
                  .withContext("link setup: waiting for rank " + std::to_string(n.peer)));
    Result<std::unique_ptr<transport::Connection>> c =
        t->connectSend({n.peer, n.channel, slotBytesFor(n.peer)}, d);
    if (!c.ok()) return c.status().withContext(linkName(n, t));
    TUTTI_INFO(log::kInit, "rank %d -> rank %d channel %d via %s", comm_.rank(), n.peer, n.channel,
               c.value()->transportName());
    transport::Descriptor answer{};
    if (c.value()->reply(&answer)) {
      TUTTI_TRY(b->send(n.peer, tagOf(n.channel) | kReplyTag, &answer, sizeof(answer))
                    .withContext("link setup"));
    }
    conns_[n] = c.take();
  }
  // Answers come from the peers' loops above, which wait only for descriptors every rank sent
  // before its own: no rank can block another here either.
  for (auto& [n, c] : made) {
    if (!c->awaitsReply()) continue;
    transport::Descriptor answer{};
    TUTTI_TRY(
        b->recv(n.peer, tagOf(n.channel) | kReplyTag, &answer, sizeof(answer))
            .withContext("link setup: waiting for rank " + std::to_string(n.peer) + "'s answer"));
    if (Status s = c->takeReply(answer); !s.ok()) return s.withContext(linkName(n, nullptr));
  }
  for (auto& [n, c] : made) {
    if (Status s = c->finish(); !s.ok())
      return s.withContext(linkName(n, nullptr) + " (" + c->transportName() + ")");
  }
  return Status::Ok();
}

transport::FifoView* Links::send(int peer, int channel) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find({peer, channel, true});
  return it == conns_.end() ? nullptr : &it->second->fifo();
}

transport::FifoView* Links::recv(int peer, int channel) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find({peer, channel, false});
  return it == conns_.end() ? nullptr : &it->second->fifo();
}

void Links::breakAll() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [n, c] : conns_) c->breakLink();
}

std::vector<std::unique_ptr<transport::Connection>> Links::takeConnections() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::unique_ptr<transport::Connection>> taken;
  for (auto& [n, c] : conns_) taken.push_back(std::move(c));
  conns_.clear();
  return taken;
}

size_t Links::abandonAll() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t bytes = 0;
  for (auto& [n, c] : conns_) bytes += c->abandon();
  return bytes;
}

size_t Links::keepIfOtherProcessesWrite() {
  std::lock_guard<std::mutex> lock(mu_);
  size_t bytes = 0;
  for (auto& [n, c] : conns_) bytes += c->keepIfOtherProcessWrites();
  return bytes;
}

bool Links::peerGone(int peer) {
  // Link setup holds the lock while it waits for peers (bootstrap): never wait for it here.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  for (auto& [n, c] : conns_) {
    if (n.peer == peer) c->breakLink();
  }
  return true;
}

}  // namespace tutti
