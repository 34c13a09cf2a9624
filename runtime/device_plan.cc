#include "runtime/device_plan.h"

#include <algorithm>
#include <cstring>

#include "collectives/ring.h"
#include "runtime/dtype.h"

namespace tutti::devplan {
namespace {

static_assert(dev::kSteps == transport::kSlots && dev::kLastSlot == transport::kLastSlot &&
                  dev::kSizeMask == transport::kSizeMask,
              "kernels and transports must agree on the FIFO");

// Simple steps of a mid-sized message: at least this many bytes each (a step costs a fence
// and a counter round trip), about kPipelineSteps per channel.
constexpr size_t kMinChunkBytes = 32 << 10;
constexpr size_t kPipelineSteps = 4;

bool copyOnly(CollKind k) { return k == CollKind::kAllGather || k == CollKind::kBroadcast; }
bool p2p(CollKind k) { return k == CollKind::kSend || k == CollKind::kRecv; }

// Channels and protocol of one collective.
struct Shape {
  int nch;
  int proto;
};
Shape shapeOf(const Config& cfg, const CollArgs& op) {
  size_t total = op.count * dtypeSize(op.dtype);
  if (op.kind == CollKind::kAllGather || op.kind == CollKind::kReduceScatter)
    total *= size_t(cfg.nranks);
  const int nch =
      cfg.nranks == 1
          ? 1
          : int(std::clamp<size_t>(total / cfg.channelBytes, 1, size_t(cfg.maxChannels)));
  const int proto = cfg.proto >= 0
                        ? cfg.proto
                        : (total / size_t(nch) <= cfg.llMaxBytes ? dev::kLL : dev::kSimple);
  return {nch, proto};
}

uint64_t* ctrlWord(transport::FifoCtrl* ctrl, size_t offset) {
  return reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(ctrl) + offset);
}

void fillChannels(const Config& cfg, const LinkFn& link, dev::DevWork* w, int nch) {
  const int n = cfg.nranks, r = cfg.rank;
  w->rank = r;
  w->nranks = n;
  // What a launch passes of w.ch (dev::DevArgs): nch is the launch's blocks, the most
  // channels any of its collectives uses, so every channel a kernel reads is passed.
  w->nch = n > 1 ? nch : 0;
  for (int c = 0; c < nch && n > 1; ++c) {
    w->ch[c].send = devConn(link((r + 1) % n, c, true));
    w->ch[c].recv = devConn(link((r + n - 1) % n, c, false));
  }
}

}  // namespace

int llThreadsFor(size_t bytes) {
  constexpr int kWarp = 32, kLeast = 2 * kWarp;
  const size_t lines = (bytes + 7) / 8;  // 8 payload bytes a line
  const size_t warps = (lines + kWarp - 1) / kWarp;
  return int(std::clamp<size_t>(warps * kWarp, kLeast, dev::kThreads));
}

std::unique_ptr<dev::DevP2pWork> p2pWork(const Launch& l) {
  auto w = std::make_unique<dev::DevP2pWork>();
  w->base = l.work;
  std::copy(l.more.begin(), l.more.end(), w->more);
  w->nmore = int32_t(l.more.size());
  return w;
}

dev::DevConn devConn(const transport::FifoView* f) {
  dev::DevConn c;
  if (!f) return c;
  c.tail = ctrlWord(f->ctrl, offsetof(transport::FifoCtrl, tail));
  c.head = ctrlWord(f->ctrl, offsetof(transport::FifoCtrl, head));
  c.step = f->ownStep;
  c.broken =
      f->broken
          ? f->broken
          : reinterpret_cast<uint32_t*>(ctrlWord(f->ctrl, offsetof(transport::FifoCtrl, broken)));
  c.sizes = ctrlWord(f->ctrl, offsetof(transport::FifoCtrl, sizes));
  c.slots = f->slots;
  c.slotBytes = f->slotBytes;
  c.ll = f->ll;
  c.llSlotBytes = f->llSlotBytes;
  c.peer = f->peer;
  c.gpuScope = f->gpuScope ? 1 : 0;
  return c;
}

std::vector<LinkNeed> linkNeeds(const Config& cfg, const CollArgs* ops, size_t nops) {
  const int n = cfg.nranks, r = cfg.rank;
  std::vector<LinkNeed> needs;
  int ring = 0;
  for (size_t i = 0; i < nops; ++i) {
    const CollArgs& op = ops[i];
    if (p2p(op.kind)) {
      if (op.root != r) needs.push_back({op.root, kP2pChannel, op.kind == CollKind::kSend});
    } else if (n > 1) {
      ring = std::max(ring, shapeOf(cfg, op).nch);
    }
  }
  if (ring > 0 && cfg.connectAllChannels) ring = cfg.maxChannels;
  for (int c = 0; c < ring; ++c) {
    needs.push_back({(r + 1) % n, c, true});
    needs.push_back({(r + n - 1) % n, c, false});
  }
  return needs;
}

bool usesRing(int nranks, const CollArgs* ops, size_t nops) {
  for (size_t i = 0; i < nops; ++i)
    if (!p2p(ops[i].kind) && nranks > 1) return true;
  return false;
}

Status checkP2pRounds(int rank, int nranks, const CollArgs* ops, size_t nops) {
  size_t total = 0;
  for (size_t i = 0; i < nops; ++i) total += p2p(ops[i].kind) && ops[i].root != rank;
  if (total <= size_t(dev::kMaxP2pOps)) return Status::Ok();  // the common case: no counting
  std::vector<int> sends(size_t(nranks), 0), recvs(size_t(nranks), 0);
  for (size_t i = 0; i < nops; ++i) {
    const CollArgs& op = ops[i];
    if (!p2p(op.kind) || op.root == rank) continue;
    if (op.kind == CollKind::kSend) {
      ++sends[size_t((op.root - rank + nranks) % nranks)];
    } else {
      ++recvs[size_t((rank - op.root + nranks) % nranks)];
    }
  }
  for (int d = 1; d < nranks; ++d) {
    const int s = sends[size_t(d)], v = recvs[size_t(d)];
    if (s + v <= dev::kMaxP2pOps) continue;
    return invalidUsage(
        "rank " + std::to_string(rank) + ": " + std::to_string(s) + " sends to rank " +
        std::to_string((rank + d) % nranks) + " and " + std::to_string(v) + " receives from rank " +
        std::to_string((rank - d + nranks) % nranks) + " in one group on GPU buffers (the peers " +
        std::to_string(d) + " apart round the ranks, whose operations run together): at most " +
        std::to_string(dev::kMaxP2pOps) + " are supported yet");
  }
  return Status::Ok();
}

Status plan(const Config& cfg, const CollArgs* ops, size_t nops, const LinkFn& link,
            const std::function<uint64_t()>& nextSeq, Plan* out) {
  const int n = cfg.nranks, r = cfg.rank;
  const transport::FifoView* ring = n > 1 ? link((r + 1) % n, 0, true) : nullptr;
  // Collectives: consecutive ones with the same kernel share a launch.
  for (size_t i = 0; i < nops; ++i) {
    const CollArgs& op = ops[i];
    if (p2p(op.kind)) continue;
    // One rank: the result is the input (Avg divides by 1, exactly), so a copy, or nothing
    // in place. Only a PreMulSum scalar needs the kernel.
    if (n == 1 && !op.red.pre) {
      nextSeq();
      size_t bytes = op.count * dtypeSize(op.dtype);
      if (bytes > 0 && op.send != op.recv)
        out->copies.push_back({op.send, op.recv, bytes, out->launches.size()});
      continue;
    }
    const Shape sh = shapeOf(cfg, op);
    const size_t elem = dtypeSize(op.dtype);
    const bool bytes = copyOnly(op.kind);
    const size_t unit = bytes ? 1 : elem;
    const size_t count = op.count * (bytes ? elem : 1);
    if (n > 1 && !ring) return internalError("device plan: no ring link to the next rank");
    // A slot's worth of units (LL: half of each line is flags).
    const size_t slotBytes = n == 1                 ? cfg.oneRankChunkBytes
                             : sh.proto == dev::kLL ? ring->llSlotBytes / 2
                                                    : ring->slotBytes;
    const size_t slotUnits = std::max<size_t>(1, slotBytes / unit);
    const size_t perRankShare = op.kind == CollKind::kAllReduce ? count / size_t(n) : count;
    size_t chunk = slotUnits;
    if (sh.proto == dev::kSimple && n > 1) {
      chunk = algo::pipelinedChunk(slotUnits, perRankShare, sh.nch, kPipelineSteps,
                                   std::max<size_t>(kMinChunkBytes / unit, 1));
    }
    dev::DevOp d;
    d.kind = static_cast<int32_t>(op.kind);
    d.root = op.root;
    d.send = op.send;
    d.recv = op.recv;
    d.count = count;
    d.stride = count;
    d.per = algo::channelShare(count, sh.nch);
    d.chunk = chunk;
    d.nch = sh.nch;
    d.proto = sh.proto;
    d.hasPre = op.red.pre;
    memcpy(d.preScalar, op.red.scalar, sizeof(d.preScalar));
    d.preScalarPtr = op.red.scalarPtr;
    d.hasPost = op.red.post;
    // A small AllReduce: every input round the ring once, then a reduction on each rank.
    if (op.kind == CollKind::kAllReduce && sh.proto == dev::kLL && sh.nch == 1 && n >= 2 &&
        n <= dev::kSteps + 1 && count <= slotUnits && count * unit <= cfg.gatherMaxBytes) {
      d.algo = dev::kAlgoGather;
      d.chunk = count;
    }
    d.seq = nextSeq();
    const int dtype = bytes ? 1 /* ncclUint8 */ : op.dtype;
    const int fn = bytes ? int(dev::kFnSum) : op.red.fn;
    // A step holds at most a slot (chunk units) of the channel's share (per units).
    const int threads = sh.proto == dev::kLL && cfg.llFitThreads
                            ? llThreadsFor(size_t(std::min<uint64_t>(d.chunk, d.per)) * unit)
                            : dev::kThreads;
    std::vector<Launch>& ls = out->launches;
    if (ls.empty() || ls.back().dtype != dtype || ls.back().fn != fn ||
        ls.back().proto != sh.proto || ls.back().work.nops == dev::kMaxOps) {
      Launch& fresh = ls.emplace_back();  // made in place: a Launch is 5.5 KB
      fresh.dtype = dtype;
      fresh.fn = fn;
      fresh.proto = sh.proto;
      fresh.threads = threads;
    }
    Launch& l = ls.back();
    l.threads = std::max(l.threads, threads);  // (one protocol a launch)
    l.work.ops[l.work.nops++] = d;
    l.blocks = std::max(l.blocks, sh.nch);
  }
  for (Launch& l : out->launches) fillChannels(cfg, link, &l.work, l.blocks);

  // Sends and receives: launches of their own; sends to itself meet receives from itself as
  // copies, made before them.
  TUTTI_TRY(checkP2pRounds(r, n, ops, nops));
  std::vector<Launch> p2pLaunches;
  std::vector<dev::DevOp> p2ps;
  std::vector<std::pair<int, int>> pairs;  // (peer, kind): ops on one FIFO, in call order
  std::vector<size_t> pairOf;              // each of p2ps's pair
  std::vector<const CollArgs*> selfSends, selfRecvs;
  for (size_t i = 0; i < nops; ++i) {
    const CollArgs& op = ops[i];
    if (!p2p(op.kind)) continue;
    if (op.root == r) {
      (op.kind == CollKind::kSend ? selfSends : selfRecvs).push_back(&op);
      continue;
    }
    const std::pair<int, int> key{op.root, static_cast<int>(op.kind)};
    auto it = std::find(pairs.begin(), pairs.end(), key);
    if (it == pairs.end()) it = pairs.insert(pairs.end(), key);
    pairOf.push_back(size_t(it - pairs.begin()));
    const transport::FifoView* f = link(op.root, kP2pChannel, op.kind == CollKind::kSend);
    if (!f) return internalError("device plan: no link to rank " + std::to_string(op.root));
    dev::DevOp d;
    d.kind = static_cast<int32_t>(op.kind);
    d.root = op.root;
    d.send = op.send;
    d.recv = op.recv;
    d.count = op.count * dtypeSize(op.dtype);
    d.conn = devConn(f);
    d.chunk = f->slotBytes;
    d.seq = nextSeq();
    p2ps.push_back(d);
  }
  // Blocks. Each (peer, direction) is one block's, which runs that FIFO's operations in call
  // order. Where there are more pairs than cfg.maxP2pBlocks (what can be resident at once for
  // each rank sharing the GPU: their blocks wait for each other), a block runs several pairs one
  // after another, and that cannot deadlock if every block (1) only sends or only receives and
  // (2) takes its pairs in the order of their round d, the distance from sender to receiver
  // round the ranks ((peer - rank) mod n for a send, (rank - peer) mod n for a receive): both
  // ends of a pair see the same d. A block waiting at round d waits for its partner, at round d
  // on the peer; if that peer's block is not there yet, it is at a smaller round (a block that
  // only sends, or only receives, holds one pair per round), and so on down: the blocked
  // operation of the smallest round always has its partner running. (A block that sent and
  // received could wait in a cycle of sends at one round, every FIFO full; the call order of
  // each rank's own could hold any cycle.) Every rank decides alone, from its own ops.
  // That holds where each operation's partner is in the peer's launch that runs at the same
  // time: ranks group matching sends and receives alike. A rank whose partner sits in a later
  // group of the peer's (which waits for the peer's current one) adds a wait the rounds do not
  // order, and a folded block may then wait in a cycle until TUTTI_TIMEOUT where a block per
  // pair would not (NCCL leaves such groupings undefined too; its own schedule goes by the
  // same distance). The timeout's message says so (DeviceEngine::kernelError).
  // Launches of whole rounds, at most dev::kMaxP2pOps operations each, in the order of their
  // rounds: a launch's operations wait only for partners of their own rounds, which sit in the
  // peer's launch of those rounds, and every earlier round is done everywhere before the
  // smallest one left runs, so the reasoning above holds launch by launch. (A round split
  // between two launches could have its sends in one and its receives in the next, on every
  // rank: each waits for the other.) A round of more than kMaxP2pOps is refused.
  std::vector<int> roundOf(pairs.size());
  for (size_t p = 0; p < pairs.size(); ++p) {
    const int peer = pairs[p].first;
    roundOf[p] = pairs[p].second == int(CollKind::kSend) ? (peer - r + n) % n : (r - peer + n) % n;
  }
  // By round, call order kept within each pair (the kernel runs a block's operations in list
  // order).
  std::vector<size_t> order(p2ps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return roundOf[pairOf[a]] < roundOf[pairOf[b]]; });
  for (size_t begin = 0; begin < order.size();) {
    // This launch: whole rounds while they fit.
    size_t end = begin;
    while (end < order.size()) {
      size_t next = end;
      const int round = roundOf[pairOf[order[end]]];
      while (next < order.size() && roundOf[pairOf[order[next]]] == round) ++next;
      if (next - end > size_t(dev::kMaxP2pOps)) {  // checkP2pRounds, above, refused it
        return internalError("device plan: a round of more than kMaxP2pOps sends and receives");
      }
      if (next - begin > size_t(dev::kMaxP2pOps)) break;
      end = next;
    }
    // Its pairs, each direction by round (the order of `order`).
    std::vector<size_t> sendPairs, recvPairs;
    std::vector<int> blockOf(pairs.size(), -1);
    for (size_t k = begin; k < end; ++k) {
      const size_t p = pairOf[order[k]];
      if (blockOf[p] >= 0) continue;
      blockOf[p] = 0;
      (pairs[p].second == int(CollKind::kSend) ? sendPairs : recvPairs).push_back(p);
    }
    const int ns = int(sendPairs.size()), nr = int(recvPairs.size());
    int sendBlocks = ns, recvBlocks = nr;
    if (cfg.maxP2pBlocks > 0 && ns + nr > cfg.maxP2pBlocks) {
      const int cap = std::max(cfg.maxP2pBlocks, int(ns > 0) + int(nr > 0));  // a direction each
      sendBlocks = ns == 0   ? 0
                   : nr == 0 ? cap
                             : std::clamp((cap * ns + (ns + nr) / 2) / (ns + nr), 1, cap - 1);
      recvBlocks = std::min(nr, cap - sendBlocks);
      sendBlocks = std::min(ns, sendBlocks);
    }
    for (int i = 0; i < ns; ++i) blockOf[sendPairs[size_t(i)]] = i % std::max(sendBlocks, 1);
    for (int i = 0; i < nr; ++i)
      blockOf[recvPairs[size_t(i)]] = sendBlocks + i % std::max(recvBlocks, 1);
    Launch l{1, dev::kFnSum, dev::kSimple, sendBlocks + recvBlocks, dev::DevWork{}, {}};
    for (size_t k = begin; k < end; ++k) {
      dev::DevOp& d = p2ps[order[k]];
      d.block = blockOf[pairOf[order[k]]];
      if (l.work.nops < dev::kMaxOps) {
        l.work.ops[l.work.nops++] = d;
      } else {
        l.more.push_back(d);
      }
    }
    fillChannels(cfg, link, &l.work, 0);
    p2pLaunches.push_back(std::move(l));
    begin = end;
  }
  if (selfSends.size() != selfRecvs.size()) {
    return invalidUsage("rank " + std::to_string(r) + ": " + std::to_string(selfSends.size()) +
                        " sends to itself but " + std::to_string(selfRecvs.size()) +
                        " receives from itself in one group");
  }
  for (size_t i = 0; i < selfSends.size(); ++i) {
    const size_t s = selfSends[i]->count * dtypeSize(selfSends[i]->dtype);
    const size_t d = selfRecvs[i]->count * dtypeSize(selfRecvs[i]->dtype);
    if (s != d) {
      return invalidUsage("rank " + std::to_string(r) + " sends " + std::to_string(s) +
                          " bytes to itself where it receives " + std::to_string(d));
    }
    out->copies.push_back({selfSends[i]->send, selfRecvs[i]->recv, s, out->launches.size()});
  }
  for (Launch& pl : p2pLaunches) out->launches.push_back(std::move(pl));
  return Status::Ok();
}

}  // namespace tutti::devplan
