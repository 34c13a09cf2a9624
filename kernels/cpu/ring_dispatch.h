// The CPU engine's entry into the algorithm templates: picks the element type and reduction
// for one operation and runs one channel of its ring algorithm with host primitives.
#pragma once

#include <vector>

#include "collectives/ring.h"
#include "runtime/coll_args.h"
#include "runtime/waiter.h"

namespace tutti::transport {
class ShmArea;
}

namespace tutti::cpu {

// Copy-only collectives (AllGather, Broadcast) run on bytes: counts in ra are in bytes.
bool movesBytes(CollKind kind);
// kPair: two ranks over the network, small all-reduces (collectives/ring.h pairAllReduce).
// kExchange: two ranks over shm, big all-reduces while copies between their CPUs run slow
// (exchangeAllReduce in ring_dispatch.cc).
enum class Algo { kRing, kPair, kExchange };
// Two ranks' byte-moving collectives over shm (runPairByAddress), as a send and a receive of
// each block: kByAddress sends by address wherever the transport can, in chunks bigger than a
// slot and few pieces (SendHow::kTwoRanks); kThroughSlots sends slot-sized chunks through
// the slots (SendHow::kSlot). The receiver takes either, whatever it sends itself. kNo: the
// ring.
enum class Pair { kNo, kByAddress, kThroughSlots };
void runRingChannel(const CollArgs& op, Algo algo, const algo::RingArgs& ra, Pair pair,
                    transport::FifoView* sendTo, transport::FifoView* recvFrom, Waiter* w);

}  // namespace tutti::cpu

namespace tutti::cpu {

// The links of one recursive-doubling all-reduce (collectives/recursive_doubling.h): to and
// from the fold partner (or null), and to and from the partner of each doubling step.
struct RdLinks {
  transport::FifoView *foldSend = nullptr, *foldRecv = nullptr;
  transport::FifoView* send[32] = {};
  transport::FifoView* recv[32] = {};
  // All-gathers send every block by address where the transport can (shm single copy),
  // whatever the adaptive choice says, in chunks bigger than a slot and few pieces
  // (SendHow::kTwoRanks: each stage is an exchange); with gatherTimed and not gatherByAddress,
  // through the slots (SendHow::kSlot). gatherTimed: where ranks share cores, the engine picks
  // per operation by timing (TwoWayTuner); then every rank takes chunks of either size.
  bool gatherByAddress = false;
  bool gatherTimed = false;
};
// The all-reduce over recursive doubling's links: kDoubling swaps and combines whole vectors;
// kTree, the binomial tree's reduce and broadcast; kHalving, reduce-scatter by recursive
// halving then all-gather by recursive doubling (Rabenseifner's): log2(n) steps each way, and
// each rank sends 2(n-1)/n of the vector in all, as much as the ring's 2(n-1) steps. All-gathers
// take doubling or (kTree) the tree.
enum class RdShape { kDoubling, kTree, kHalving };
void runRecursiveDoubling(const CollArgs& op, int rank, int nranks, const RdLinks& links,
                          RdShape shape, Waiter* w);
// The flat all-reduce's links: to and from every other rank (null for this one).
struct FlatLinks {
  std::vector<transport::FifoView*> send, recv;
  size_t chunkBytes = 0;  // per message on every link (Links::minSlotBytes)
};
void runFlatAllReduce(const CollArgs& op, int rank, int nranks, const FlatLinks& links, Waiter* w);
// The flat all-gather over the same links: bytes per rank.
void runFlatAllGather(const CollArgs& op, size_t bytes, int rank, int nranks,
                      const FlatLinks& links, Waiter* w);
// The flat broadcast: the root sends every chunk to every other rank, by address where the
// transport can (shm single copy: each receiver reads straight from the root's buffer, and
// the root, waiting, copies pieces into theirs); bytes in all.
void runFlatBroadcast(const CollArgs& op, size_t bytes, int rank, int nranks,
                      const FlatLinks& links, Waiter* w);
// The broadcast through the host's shared area (transports/shm/area.h): chunks first,
// first + 1, ... of the area's count; opNumber: the call's place among the communicator's
// broadcasts and all-gathers (readers check it, and the root and size); the flat links name
// the peer a wait is for.
void runAreaBroadcast(const CollArgs& op, size_t bytes, int rank, int nranks,
                      transport::ShmArea& area, uint64_t first, uint64_t opNumber,
                      const FlatLinks& links, Waiter* w);
// The way an operation goes, as `root` chose it (`way`, 0 or 1; ignored elsewhere), passed
// down the ring chain: the root sends a marker (transport::kWaySlot) with its byte count and
// the way to the next rank, each rank passes it on before it starts. A rank expecting another
// size fails naming both; one that finds data instead of a marker fails too. prev / next: the
// ring's links (channel 0). Returns the way, -1 when the wait failed (the Waiter holds why).
int passWay(int root, size_t bytes, int rank, int nranks, transport::FifoView* prev,
            transport::FifoView* next, int way, Waiter* w);
// The way a broadcast goes, flat (runFlatBroadcast) or by the ring chain, as the root chose
// (rootFlat): only the flat way is announced (passWay); for the chain nothing is sent -- the
// chain's first payload tells the others. So the chain costs nothing more, and a rank takes
// whichever way comes whatever its own count -- except a rank whose count is 0, which takes
// no part (as in the plain chain): it cannot wait for a first payload that may never come.
// Returns the way; false also when the wait failed.
bool broadcastWay(const CollArgs& op, size_t bytes, int rank, int nranks, transport::FifoView* prev,
                  transport::FifoView* next, bool rootFlat, Waiter* w);
// Whether recursive doubling gives every rank the same bits for this operation: the op must
// be commutative bit for bit (floating max/min are not, with NaNs).
bool rdSymmetric(const CollArgs& op);
// Whether a rank may scale its peer's raw input itself (Reducer::preOnReceive: the pair, the
// exchange, a two-rank ring): no scaling, or Avg's 1/nranks, the same on both ranks -- never a
// PreMulSum, whose scalar is each rank's own.
bool scalesAlike(const CollArgs& op);

}  // namespace tutti::cpu
