#include "kernels/cpu/ring_dispatch.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/recursive_doubling.h"
#include "kernels/cpu/elem_value.h"
#include "kernels/cpu/host_prims.h"
#include "kernels/cpu/reduce.h"
#include "nccl.h"
#include "runtime/dtype.h"

namespace tutti::cpu {
namespace {

// ncclRedOpCreatePreMulSum's scalar (host-immediate copy, or read from its pointer now).
template <typename T, RedFn F>
void setPre(const CollArgs& op, Reducer<T, F>* fn) {
  if (!op.red.pre) return;
  T s;
  memcpy(&s, op.red.scalarPtr ? op.red.scalarPtr : op.red.scalar, sizeof(T));
  fn->hasPre = true;
  fn->preScalar = Elem<T>::load(s);
}

// A chunk sent by address need not fit a slot: bigger ones cost fewer steps and system
// calls. The flat broadcast, 8 ranks on 2 cores, 16 MiB, 3 interleaved runs, medians: 128 KiB
// chunks (the slot) 14.4 ms, 2 MiB 10.7, 8 MiB 10.1; Open MPI 10.5.
constexpr size_t kAddressChunkBytes = 8 << 20;

// The next chunk of `left` units to send: up to `big` where the link sends it by address for
// certain, up to a slot otherwise (big == slot: a slot, nothing to ask).
template <class P>
size_t chunkToSend(const P& p, size_t left, size_t slot, size_t big) {
  const size_t most = std::min(big, left);
  return big > slot && p.sendsByAddress(static_cast<int>(most)) ? most : std::min(slot, left);
}
// The next chunk of `left` units to receive: as its sender chose (chunkToSend), told by the
// payload where one may come by address.
template <class P>
size_t chunkToRecv(P& p, size_t left, size_t slot, size_t big) {
  return std::min(big > slot && p.nextByAddress() ? big : slot, left);
}

// Sends sendLen units and receives recvLen, a piece at a time in turn, so that two partners
// never both wait to send: send(at) and recv(at) move the piece that starts `at` units in and
// return its length.
template <class Send, class Recv>
void inTurn(size_t sendLen, size_t recvLen, Waiter* w, Send&& send, Recv&& recv) {
  for (size_t sent = 0, got = 0; (sent < sendLen || got < recvLen) && !w->failed();) {
    if (sent < sendLen) sent += send(sent);
    if (got < recvLen) got += recv(got);
  }
}

// Algo::kExchange (two ranks over shm, both calls out of place): each rank sends its whole
// input by address, in chunks of kExchangeChunkBytes, which land straight in the other's
// output to be reduced there in place with its own input; a chunk that cannot go by address
// (a sender without single copy, a tail under its minimum) goes through a slot. Each rank reads
// from the other only input, which a benchmark's loop never writes, where the ring's
// all-gather half reads the output the peer has just written: those lines come from the other
// CPU's cache, slow while the two CPUs sit on different dies. The sender leaves every piece to
// the receiver. The result is op(peer's, own) on both ranks (Avg's scaling applied to both by
// the receiver, Reducer::preOnReceive; never a PreMulSum, whose scalar is each rank's own):
// the engine takes this only for ops whose two operands commute bit for bit (rdSymmetric; two
// NaNs may keep either payload, as in recursive doubling).
// Chunk size, 2 ranks, slow state (surveys of 2026-11-24, medians, us; 256 KiB / 512 KiB /
// 1 MiB / 2 MiB / a 128 KiB slot, through the slot): 8 MiB - / 2158 / 2042 / 1872 / -, and in
// another survey 2465 / - / 2075 / - / 2825; 64 MiB - / 20455 / 19106 / 18514 / -, and
// 21878 / - / 18304 / - / 24161.
constexpr size_t kExchangeChunkBytes = 2 << 20;

template <typename T, RedFn F>
void exchangeAllReduce(const CollArgs& op, const algo::RingArgs& a, const Reducer<T, F>& fn,
                       transport::FifoView* sendTo, transport::FifoView* recvFrom, Waiter* w) {
  HostPrims<T, Reducer<T, F>> p(sendTo, recvFrom, static_cast<const T*>(op.send),
                                static_cast<T*>(op.recv), fn, w, /*directSend=*/true);
  p.preferAddress(transport::SendHow::kTwoRanks);
  p.leaveCopiesToReceiver();
  const size_t big = std::max(a.chunk, kExchangeChunkBytes / sizeof(T));
  inTurn(
      a.count, a.count, w,
      [&](size_t at) {
        const size_t len = chunkToSend(p, a.count - at, a.chunk, big);
        p.send(a.base + at, int(len));
        return len;
      },
      [&](size_t at) {
        const size_t len = chunkToRecv(p, a.count - at, a.chunk, big);
        p.recvReduceInOutput(a.base + at, int(len));
        return len;
      });
  p.finish();
}

template <typename T, RedFn F>
void runReduction(const CollArgs& op, Algo algo, const algo::RingArgs& ra,
                  transport::FifoView* sendTo, transport::FifoView* recvFrom, Waiter* w) {
  Reducer<T, F> fn;
  setPre(op, &fn);
  if (op.red.post) {
    fn.hasPost = true;
    fn.postDivisor = static_cast<decltype(fn.postDivisor)>(ra.nranks);
  }
  // The input goes to a peer that reduces it from its slot: straight from the input where
  // that saves a copy (tcp), and over shm while copies into the peer's slots run slow (the
  // two CPUs on different dies: the receiver pulling the input into its own slot beats the
  // sender pushing it across). Over shm, 2 ranks, 8 MiB all_reduce with every big payload by
  // address in the fast state: 1.6-2.2 ms against 0.95-1.03 through slots. In the slow state
  // (a survey of 2 ranks, each run between two line round trips over 250 ns, 12-26 runs each,
  // medians, us, inputs by address / through slots / Open MPI): 4 MiB 1595 / 2081 / 4340;
  // 16 MiB 7892 / 8690 / 8130; 64 MiB 30546 / 32842 / 77498.
  // The pair exchange (tcp) too, out of place: it reduces each received chunk into the output
  // at the offset it just sent from the input, so in place a chunk could still be on its way
  // out while it is overwritten.
  const bool inputDirect = sendTo && sendTo->conn &&
                           ((algo == Algo::kRing && (sendTo->conn->directPaysIntoSlot() ||
                                                     sendTo->conn->copiesRunSlow())) ||
                            (algo == Algo::kPair && sendTo->conn->directPaysIntoSlot() &&
                             op.outOfPlace(op.count * sizeof(T))));
  // The pair and exchange (which the engine takes only where scalesAlike), and over two ranks
  // the ring, combine a peer's raw input with this rank's own, so the input may leave as it
  // is (by address where that pays): 2 ranks, 2 MiB float avg, 183-187 us scaled by the
  // sender against a sum's 82-183.
  if (scalesAlike(op) && (algo == Algo::kPair || algo == Algo::kExchange || ra.nranks == 2))
    fn.preOnReceive = true;
  HostPrims<T, Reducer<T, F>> p(sendTo, recvFrom, static_cast<const T*>(op.send),
                                static_cast<T*>(op.recv), fn, w, inputDirect);
  switch (op.kind) {
    case CollKind::kAllReduce:
      if (algo == Algo::kExchange) return exchangeAllReduce(op, ra, fn, sendTo, recvFrom, w);
      if (algo == Algo::kPair) {
        algo::pairAllReduce(p, ra);
      } else {
        algo::ringAllReduce(p, ra);
      }
      break;
    case CollKind::kReduceScatter:
      algo::ringReduceScatter(p, ra);
      break;
    case CollKind::kReduce:
      algo::ringReduce(p, ra);
      break;
    default:
      break;
  }
  p.finish();
}

// Recursive doubling (or, by `shape`, the binomial tree or halving and doubling over the same
// links) on the output buffer. Each rank first writes pre(input), rounded to T, into its
// output, so that every later combination takes two values of the same precision from the two
// partners and gives both the same bits. Doubling's and the tree's sends copy through slots
// (never straight from the output, which the step's own reduction overwrites in place);
// halving's may go straight from it (swap, below).
template <typename T, RedFn F>
void runRd(const CollArgs& op, int rank, int n, const RdLinks& links, RdShape shape, Waiter* w) {
  const algo::RdPlan plan = algo::rdPlan(rank, n);
  Reducer<T, F> first;  // pre only: the local pass
  setPre(op, &first);
  T* out = static_cast<T*>(op.recv);
  first.preCopy(out, static_cast<const T*>(op.send), op.count);
  Reducer<T, F> mid, last;  // plain combination; the last adds Avg's division
  if (op.red.post) {
    last.hasPost = true;
    last.postDivisor = static_cast<decltype(last.postDivisor)>(n);
  }
  // One stage with one partner, in slot-sized pieces (both ends share the link's slot size).
  auto stage = [&](transport::FifoView* to, transport::FifoView* from, const Reducer<T, F>& fn,
                   bool send, bool combine, bool receive) {
    HostPrims<T, Reducer<T, F>> p(to, from, out, out, fn, w, /*directSend=*/false);
    const size_t chunk = std::max<size_t>(1, (to ? to : from)->slotBytes / sizeof(T));
    for (size_t at = 0; at < op.count; at += chunk) {
      const int len = static_cast<int>(std::min(chunk, op.count - at));
      if (send) p.send(at, len);
      if (combine) p.recvReduceCopy(at, at, len);
      if (receive) p.recv(at, len);
    }
    p.finish();
  };
  // One halving or doubling step: [sendAt, +sendLen) of the output to the partner, and
  // [recvAt, +recvLen) from it, combined into the output or copied there; slot-sized pieces,
  // a send and a receive in turn (the two ranges differ by an element at most). Sends may go
  // straight from the output: no later step writes a range before finish() has seen it off
  // (tcp: onto the wire; shm: read by the partner).
  auto swap = [&](transport::FifoView* to, transport::FifoView* from, const Reducer<T, F>& fn,
                  size_t sendAt, size_t sendLen, size_t recvAt, size_t recvLen, bool combine) {
    HostPrims<T, Reducer<T, F>> p(to, from, out, out, fn, w, /*directSend=*/true);
    const size_t chunk = std::max<size_t>(1, to->slotBytes / sizeof(T));
    inTurn(
        sendLen, recvLen, w,
        [&](size_t at) {
          const size_t len = std::min(chunk, sendLen - at);
          p.send(sendAt + at, int(len));
          return len;
        },
        [&](size_t at) {
          const size_t len = std::min(chunk, recvLen - at);
          if (combine) {
            p.recvReduceCopy(recvAt + at, recvAt + at, int(len));
          } else {
            p.recv(recvAt + at, int(len));
          }
          return len;
        });
    p.finish();
  };
  if (plan.extra) {
    stage(links.foldSend, nullptr, mid, true, false, false);
    stage(nullptr, links.foldRecv, mid, false, false, true);
    return;
  }
  if (plan.fold >= 0) stage(nullptr, links.foldRecv, mid, false, true, false);
  if (shape == RdShape::kHalving) {
    // Reduce-scatter by recursive halving, the farthest partner first: in step k the range
    // this rank holds splits in two; it keeps the half its bit k names, sends the other to
    // rank ^ 2^k and combines that rank's copy of the half it keeps. Each element is
    // combined by one rank at the end (with Avg's division), so every rank gets the same bits.
    // Then the all-gather by recursive doubling over the same partners, nearest first.
    size_t lo = 0, hi = op.count;
    size_t los[32], his[32];  // the range held before step k
    for (int k = plan.steps - 1; k >= 0 && !w->failed(); --k) {
      los[k] = lo, his[k] = hi;
      const size_t half = lo + (hi - lo) / 2;
      const bool upper = (rank >> k) & 1;
      const size_t keepLo = upper ? half : lo, keepHi = upper ? hi : half;
      const size_t giveLo = upper ? lo : half, giveHi = upper ? half : hi;
      swap(links.send[k], links.recv[k], k == 0 ? last : mid, giveLo, giveHi - giveLo, keepLo,
           keepHi - keepLo, true);
      lo = keepLo, hi = keepHi;
    }
    for (int k = 0; k < plan.steps && !w->failed(); ++k) {
      const bool upper = (rank >> k) & 1;
      const size_t otherLo = upper ? los[k] : hi, otherHi = upper ? lo : his[k];
      swap(links.send[k], links.recv[k], mid, lo, hi - lo, otherLo, otherHi - otherLo, false);
      lo = los[k], hi = his[k];
    }
  } else if (shape == RdShape::kTree) {
    const int level = algo::treeLevel(rank, plan.steps);
    for (int k = 0; k < level; ++k) {  // gather the partial results of the ranks below
      stage(nullptr, links.recv[k], k + 1 == plan.steps ? last : mid, false, true, false);
    }
    if (level < plan.steps) {  // hand the partial result up, get the whole one back
      stage(links.send[level], nullptr, mid, true, false, false);
      stage(nullptr, links.recv[level], mid, false, false, true);
    }
    for (int k = level - 1; k >= 0; --k) stage(links.send[k], nullptr, mid, true, false, false);
  } else {
    for (int k = 0; k < plan.steps; ++k) {
      stage(links.send[k], links.recv[k], k + 1 == plan.steps ? last : mid, true, true, false);
    }
  }
  if (plan.fold >= 0) stage(links.foldSend, nullptr, mid, true, false, false);
}

// The flat all-reduce: every rank sends its pre(input) to every other and combines the n
// contributions itself, all ranks in the same order (rank 0's first), so all get the same
// bits. One dependent step, n(n-1) messages: for tiny messages between ranks that share
// cores over shared memory, where a message costs little and each step waits for ranks to
// be scheduled.
template <typename T, RedFn F>
void runFlat(const CollArgs& op, int rank, int n, const FlatLinks& links, Waiter* w) {
  Reducer<T, F> first, mid, last;
  setPre(op, &first);
  if (op.red.post) {
    last.hasPost = true;
    last.postDivisor = static_cast<decltype(last.postDivisor)>(n);
  }
  thread_local std::vector<unsigned char> scratch;
  scratch.resize(op.count * sizeof(T));
  T* mine = reinterpret_cast<T*>(scratch.data());
  T* out = static_cast<T*>(op.recv);
  first.preCopy(mine, static_cast<const T*>(op.send), op.count);
  const size_t chunk = std::max<size_t>(1, links.chunkBytes / sizeof(T));
  for (size_t at = 0; at < op.count && !w->failed(); at += chunk) {
    const int len = static_cast<int>(std::min(chunk, op.count - at));
    for (int d = 1; d < n; ++d) {
      HostPrims<T, Reducer<T, F>> p(links.send[(rank + d) % n], nullptr, mine, nullptr, mid, w,
                                    /*directSend=*/false);
      p.send(at, len);
      p.finish();
    }
    for (int q = 0; q < n; ++q) {
      const Reducer<T, F>& fn = q + 1 == n ? last : mid;
      if (q == rank) {
        if (q == 0) {
          memcpy(out + at, mine + at, size_t(len) * sizeof(T));
        } else {
          fn.reduce(out + at, mine + at, out + at, size_t(len), true);
        }
        continue;
      }
      HostPrims<T, Reducer<T, F>> p(nullptr, links.recv[q], out, out, fn, w, false);
      if (q == 0) {
        p.recv(at, len);
      } else {
        p.recvReduceCopy(at, at, len);
      }
      p.finish();
    }
  }
}

// Calls body(FnTag<F>{}) for the operation's reduction function.
template <RedFn F>
struct FnTag {
  static constexpr RedFn kFn = F;
};
template <class Body>
void byFn(const CollArgs& op, Body&& body) {
  switch (static_cast<RedFn>(op.red.fn)) {
    case RedFn::kSum:
      return body(FnTag<RedFn::kSum>{});
    case RedFn::kProd:
      return body(FnTag<RedFn::kProd>{});
    case RedFn::kMax:
      return body(FnTag<RedFn::kMax>{});
    case RedFn::kMin:
      return body(FnTag<RedFn::kMin>{});
  }
}

// Calls body(T{}) with the element type of the operation's datatype.
template <class Body>
void byType(const CollArgs& op, Waiter* w, Body&& body) {
  if (dtypeSize(op.dtype) == 0) {
    w->fail(internalError("unknown datatype " + std::to_string(op.dtype)));
    return;
  }
  withElemType(op.dtype, body);
}

// The reduction collectives, instantiated per element type and function.
template <class Body>
void byTypeAndFn(const CollArgs& op, Waiter* w, Body&& body) {
  byType(op, w, [&](auto t) { byFn(op, [&](auto f) { body(t, f); }); });
}

// Sends [sendIn, +sendLen) of p's input (copied to [sendOut, ...) of its output unless that is
// the same memory) and receives [recvAt, +recvLen) of its output, a send and a receive in
// turn so that two partners never both wait to send. Sends go in chunks of up to `big` where
// the link sends them by address for certain, of `slot` otherwise; the receiver tells which
// from each payload where one may come by address (Connection::sharedCtrl: shm;
// elsewhere, and where big == slot, every chunk is a slot, nothing to tell).
void exchangeChunks(HostPrims<uint8_t, CopyOnly>& p, size_t sendIn, size_t sendOut, size_t sendLen,
                    size_t recvAt, size_t recvLen, size_t slot, size_t big, Waiter* w) {
  // Each block's last chunk says so: with slot-sized chunks, blocks of different lengths would
  // otherwise match chunk for chunk, and the longer one's sender wait for ever.
  inTurn(
      sendLen, recvLen, w,
      [&](size_t at) {
        const size_t len = chunkToSend(p, sendLen - at, slot, big);
        p.markLast(at + len == sendLen);
        p.copySend(sendIn + at, sendOut + at, static_cast<int>(len));
        return len;
      },
      [&](size_t at) {
        const size_t len = chunkToRecv(p, recvLen - at, slot, big);
        p.expectLast(at + len == recvLen ? 1 : 0);
        p.recv(recvAt + at, static_cast<int>(len));
        return len;
      });
  p.markLast(false);
  p.expectLast(-1);
}

}  // namespace

bool scalesAlike(const CollArgs& op) { return !op.red.pre || op.op == ncclAvg; }

bool rdSymmetric(const CollArgs& op) {
  const bool floating = op.dtype == ncclFloat16 || op.dtype == ncclFloat32 ||
                        op.dtype == ncclFloat64 || op.dtype == ncclBfloat16 ||
                        op.dtype == ncclFloat8e4m3 || op.dtype == ncclFloat8e5m2;
  const auto fn = static_cast<RedFn>(op.red.fn);
  return !(floating && (fn == RedFn::kMax || fn == RedFn::kMin));
}

// All-gather over recursive doubling's links, n a power of two, `bytes` per rank.
// Doubling: in step k, the 2^k blocks this rank holds (aligned at a multiple of 2^k) go to
// the partner, whose 2^k come back; log2(n) steps, n log2(n) messages.
// Tree: a rank whose lowest set bit is L gathers its subtree's blocks [rank, rank + 2^L) from
// its children rank + 2^k (k < L, each bringing the contiguous 2^k blocks of its own
// subtree), hands them to its parent rank - 2^L, gets the whole back and passes it down:
// 2 log2(n) steps, 2(n-1) messages.
void runRdAllGather(const CollArgs& op, size_t bytes, int rank, int n, const RdLinks& links,
                    bool tree, Waiter* w) {
  const algo::RdPlan plan = algo::rdPlan(rank, n);
  const uint8_t* in = static_cast<const uint8_t*>(op.send);
  uint8_t* out = static_cast<uint8_t*>(op.recv);
  if (in != out + size_t(rank) * bytes) simd::copyBig(out + size_t(rank) * bytes, in, bytes);
  // Moves [sendAt, +len) to `to` and [recvAt, +len) from `from` (either may be null),
  // sends and receives interleaved so that two partners never both wait to send. Sends may
  // go by address: every block of the output is written once, before it is sent, and
  // finish() waits until what was sent has left.
  auto stage = [&](transport::FifoView* to, size_t sendAt, transport::FifoView* from, size_t recvAt,
                   size_t len) {
    HostPrims<uint8_t, CopyOnly> p(to, from, out, out, CopyOnly{}, w);
    const size_t slot = std::max<size_t>(1, (to ? to : from)->slotBytes);
    // By address (crowded ranks over shm): chunks bigger than a slot, in few pieces -- each
    // stage is an exchange, both partners busy. 8 ranks on 2 cores, 5 interleaved runs,
    // medians, us (slot-sized chunks of 64 KiB pieces / big chunks of big pieces / Open MPI):
    // 256 KiB 213 / 204 / 212; 2 MiB 2181 / 1368 / 1668; 16 MiB 18380 / 15053 / 16438.
    if (links.gatherByAddress) {
      p.preferAddress(transport::SendHow::kTwoRanks);
    } else if (links.gatherTimed) {
      p.preferAddress(transport::SendHow::kSlot);
    }
    const size_t big =
        links.gatherByAddress || links.gatherTimed ? std::max(slot, kAddressChunkBytes) : slot;
    exchangeChunks(p, sendAt, sendAt, to ? len : 0, recvAt, from ? len : 0, slot, big, w);
    p.finish();
  };
  if (!tree) {
    for (int k = 0; k < plan.steps; ++k) {
      const size_t mine = size_t((rank >> k) << k), theirs = mine ^ (size_t(1) << k);
      stage(links.send[k], mine * bytes, links.recv[k], theirs * bytes, (size_t(1) << k) * bytes);
    }
    return;
  }
  const int level = algo::treeLevel(rank, plan.steps);
  for (int k = 0; k < level; ++k) {
    stage(nullptr, 0, links.recv[k], size_t(rank + (1 << k)) * bytes, (size_t(1) << k) * bytes);
  }
  const size_t all = size_t(n) * bytes;
  if (level < plan.steps) {
    stage(links.send[level], size_t(rank) * bytes, nullptr, 0, (size_t(1) << level) * bytes);
    stage(nullptr, 0, links.recv[level], 0, all);
  }
  for (int k = level - 1; k >= 0; --k) stage(links.send[k], 0, nullptr, 0, all);
}

void runRecursiveDoubling(const CollArgs& op, int rank, int nranks, const RdLinks& links,
                          RdShape shape, Waiter* w) {
  if (op.kind == CollKind::kAllGather) {
    return runRdAllGather(op, op.count * dtypeSize(op.dtype), rank, nranks, links,
                          shape == RdShape::kTree, w);
  }
  byTypeAndFn(op, w, [&](auto t, auto f) {
    runRd<decltype(t), decltype(f)::kFn>(op, rank, nranks, links, shape, w);
  });
}

void runFlatAllReduce(const CollArgs& op, int rank, int nranks, const FlatLinks& links, Waiter* w) {
  byTypeAndFn(op, w, [&](auto t, auto f) {
    runFlat<decltype(t), decltype(f)::kFn>(op, rank, nranks, links, w);
  });
}

// The flat all-gather: every rank sends its block to every other and places the n-1 it gets,
// one dependent step where the ring takes n-1. Sends copy through slots: a send straight from
// the input would wait for its receiver before the next one could start.
void runFlatAllGather(const CollArgs& op, size_t bytes, int rank, int n, const FlatLinks& links,
                      Waiter* w) {
  const uint8_t* in = static_cast<const uint8_t*>(op.send);
  uint8_t* out = static_cast<uint8_t*>(op.recv);
  if (in != out + size_t(rank) * bytes) simd::copyBig(out + size_t(rank) * bytes, in, bytes);
  const size_t chunk = std::max<size_t>(1, links.chunkBytes);
  for (size_t at = 0; at < bytes && !w->failed(); at += chunk) {
    const int len = static_cast<int>(std::min(chunk, bytes - at));
    for (int d = 1; d < n; ++d) {
      HostPrims<uint8_t, CopyOnly> p(links.send[size_t((rank + d) % n)], nullptr, in, nullptr,
                                     CopyOnly{}, w, /*directSend=*/false);
      p.send(at, len);
      p.finish();
    }
    for (int d = 1; d < n; ++d) {  // the next ranks first: they are the likeliest done
      const int q = (rank + n - d) % n;
      uint8_t* block = out + size_t(q) * bytes;
      HostPrims<uint8_t, CopyOnly> p(nullptr, links.recv[size_t(q)], block, block, CopyOnly{}, w,
                                     false);
      p.recv(at, len);
      p.finish();
    }
  }
}

void runFlatBroadcast(const CollArgs& op, size_t bytes, int rank, int n, const FlatLinks& links,
                      Waiter* w) {
  uint8_t* out = static_cast<uint8_t*>(op.recv);
  const size_t slot = std::max<size_t>(1, links.chunkBytes);
  const size_t big = std::max(slot, kAddressChunkBytes);
  // Each payload is as big as a slot, or (sent by address, shm) up to `big`: the receiver
  // tells which from the payload itself and expects exactly that size, so ranks that disagree
  // on the count still fail on the size.
  if (rank != op.root) {
    HostPrims<uint8_t, CopyOnly> p(nullptr, links.recv[size_t(op.root)], out, out, CopyOnly{}, w);
    exchangeChunks(p, 0, 0, 0, 0, bytes, slot, big, w);
    p.finish();
    return;
  }
  const uint8_t* in = static_cast<const uint8_t*>(op.send);
  std::vector<HostPrims<uint8_t, CopyOnly>> to;
  std::vector<size_t> at(size_t(n - 1), 0);
  to.reserve(size_t(n - 1));
  for (int d = 1; d < n; ++d) {
    to.emplace_back(links.send[size_t((rank + d) % n)], nullptr, in, nullptr, CopyOnly{}, w);
    to.back().preferAddress();
  }
  // A chunk at a time to every rank: each receiver starts on its first at once, and the root
  // blocks (helping) only once a receiver has a FIFO window of chunks outstanding.
  for (bool more = bytes > 0; more && !w->failed();) {
    more = false;
    for (size_t d = 0; d < to.size(); ++d) {
      if (at[d] >= bytes) continue;
      const size_t len = chunkToSend(to[d], bytes - at[d], slot, big);
      to[d].markLast(at[d] + len == bytes);  // as exchangeChunks, whose receivers check it
      to[d].send(at[d], static_cast<int>(len));
      at[d] += len;
      more |= at[d] < bytes;
    }
  }
  if (in != out && !w->failed()) memcpy(out, in, bytes);  // while the receivers copy
  for (auto& p : to) p.finish();
}

int passWay(int root, size_t bytes, int rank, int n, transport::FifoView* prev,
            transport::FifoView* next, int way, Waiter* w) {
  struct Marker {
    uint64_t bytes;
    uint64_t way;
  } m{bytes, uint64_t(way)};
  auto* raw = reinterpret_cast<uint8_t*>(&m);
  const bool passOn = (rank + 1) % n != root;
  HostPrims<uint8_t, CopyOnly> p(rank == root || passOn ? next : nullptr,
                                 rank == root ? nullptr : prev, raw, raw, CopyOnly{}, w,
                                 /*directSend=*/false);
  auto usage = [&](const std::string& what) {
    failMismatch(w, "rank " + std::to_string(rank) + ": " + what);
  };
  if (rank != root) {
    const uint64_t word = p.peekWord();
    if (w->failed()) return -1;
    if (!(word & transport::kWaySlot)) {
      usage("rank " + std::to_string(prev->peer) + " sent " +
            std::to_string(word & transport::kSizeMask) +
            " bytes of data where this rank expected the way rank " + std::to_string(root) +
            " chose");
      return -1;
    }
    p.expectWay(true);
    p.recv(0, int(sizeof(m)));
    if (!w->failed() && m.bytes != bytes) {
      usage("rank " + std::to_string(root) + " runs this operation on " + std::to_string(m.bytes) +
            " bytes where this rank has " + std::to_string(bytes));
    }
  }
  if (passOn && !w->failed()) {
    p.flagSends(transport::kWaySlot);
    p.send(0, int(sizeof(m)));
  }
  p.finish();
  return w->failed() ? -1 : int(m.way);
}

bool broadcastWay(const CollArgs& op, size_t bytes, int rank, int n, transport::FifoView* prev,
                  transport::FifoView* next, bool rootFlat, Waiter* w) {
  if (rank == op.root) {
    if (!rootFlat) return false;
  } else {
    HostPrims<uint8_t, CopyOnly> peek(nullptr, prev, nullptr, nullptr, CopyOnly{}, w);
    if (!(peek.peekWord() & transport::kWaySlot)) return false;  // the chain, or a failed wait
  }
  return passWay(op.root, bytes, rank, n, prev, next, 1, w) == 1;
}

bool movesBytes(CollKind kind) {
  return kind == CollKind::kAllGather || kind == CollKind::kBroadcast;
}

// Two ranks over shm, an all-gather or a broadcast (Engine::runCollective): with byAddress a
// block goes in chunks of up to kAddressChunkBytes where the link sends it by address, in
// ra.chunk pieces through the slots otherwise (and always without byAddress); the receiver
// tells which from each payload.
// All-gather: each rank sends its block and takes the peer's, a send and a receive in turn.
void runPairByAddress(const CollArgs& op, const algo::RingArgs& ra, bool byAddress,
                      transport::FifoView* s, transport::FifoView* r, Waiter* w) {
  HostPrims<uint8_t, CopyOnly> p(s, r, static_cast<const uint8_t*>(op.send),
                                 static_cast<uint8_t*>(op.recv), CopyOnly{}, w);
  p.preferAddress(byAddress ? transport::SendHow::kTwoRanks : transport::SendHow::kSlot);
  const size_t slot = std::max<size_t>(1, ra.chunk), big = std::max(slot, kAddressChunkBytes);
  const bool gather = op.kind == CollKind::kAllGather;
  // What this rank sends (from the input at ra.base, to the output at `mine`) and receives
  // (into the output at `theirs`).
  const size_t mine = (gather ? size_t(ra.rank) * ra.stride : 0) + ra.base;
  const size_t theirs = (gather ? size_t(1 - ra.rank) * ra.stride : 0) + ra.base;
  const bool sends = gather || ra.rank == ra.root, receives = gather || ra.rank != ra.root;
  exchangeChunks(p, ra.base, mine, sends ? ra.count : 0, theirs, receives ? ra.count : 0, slot, big,
                 w);
  p.finish();
}

void runRingChannel(const CollArgs& op, Algo algo, const algo::RingArgs& ra, Pair pair,
                    transport::FifoView* s, transport::FifoView* r, Waiter* w) {
  if (pair != Pair::kNo && ra.nranks == 2 && movesBytes(op.kind)) {
    return runPairByAddress(op, ra, pair == Pair::kByAddress, s, r, w);
  }
  if (movesBytes(op.kind)) {
    HostPrims<uint8_t, CopyOnly> p(s, r, static_cast<const uint8_t*>(op.send),
                                   static_cast<uint8_t*>(op.recv), CopyOnly{}, w);
    if (op.kind == CollKind::kAllGather) {
      algo::ringAllGather(p, ra);
    } else {
      algo::ringBroadcast(p, ra);
    }
    p.finish();
    return;
  }
  byTypeAndFn(op, w, [&](auto t, auto f) {
    runReduction<decltype(t), decltype(f)::kFn>(op, algo, ra, s, r, w);
  });
}

}  // namespace tutti::cpu
