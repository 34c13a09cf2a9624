// The CPU engine's entry into the algorithm templates: picks the element type and reduction
// for one operation and runs one channel of its ring algorithm with host primitives.
#pragma once

#include "collectives/ring.h"
#include "runtime/coll_args.h"
#include "runtime/waiter.h"

namespace tutti::cpu {

// Copy-only collectives (AllGather, Broadcast) run on bytes: counts in ra are in bytes.
bool movesBytes(CollKind kind);
enum class Algo { kRing, kPair };
void runRingChannel(const CollArgs& op, Algo algo, const algo::RingArgs& ra,
                    transport::FifoView* sendTo, transport::FifoView* recvFrom, Waiter* w);

}  // namespace tutti::cpu
