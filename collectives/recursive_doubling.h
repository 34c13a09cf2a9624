// Recursive doubling all-reduce: log2(n) exchange steps instead of the ring's 2(n-1), for
// small messages, where the number of dependent steps (each a round trip through another
// rank, which may first have to be scheduled) costs more than the bytes.
//
// With p2 the largest power of two <= n, the rem = n - p2 "extra" ranks first fold their
// input into a partner (rank - p2), the p2 core ranks then swap and combine whole vectors
// with partner rank ^ 2^k in step k, and each folded partner finally sends the result back.
// Every combination is partner-symmetric -- both sides compute x (op) y from the same two
// values, only in swapped order -- so for commutative ops every rank gets the same bits.
//
// The binomial tree over the same partners: in step k a core rank whose bit k is its lowest
// set bit sends its partial result to rank ^ 2^k and leaves the reduction; rank 0 ends with
// the whole result, which then goes back down the same links in reverse step order. That is
// 2(p2-1) messages in 2 log2(p2) dependent steps against recursive doubling's p2 log2(p2) in
// log2(p2): when ranks share cores, the work every message costs (system calls, wake-ups, a
// copy) counts more than the number of steps. Every rank receives rank 0's bits, so any op
// gives all ranks the same result.
//
// Pure index math: the engines supply the data movement.
#pragma once

#include "collectives/ring.h"  // TUTTI_HD

namespace tutti::algo {

struct RdPlan {
  int p2;      // ranks in the doubling core
  int steps;   // log2(p2)
  int fold;    // the partner outside the core (extra ranks: their core partner), or -1
  bool extra;  // this rank only folds in and receives the result
};

TUTTI_HD inline RdPlan rdPlan(int rank, int n) {
  RdPlan p{1, 0, -1, false};
  while (p.p2 * 2 <= n) p.p2 *= 2, ++p.steps;
  if (rank >= p.p2) {
    p.extra = true;
    p.fold = rank - p.p2;
  } else if (rank + p.p2 < n) {
    p.fold = rank + p.p2;
  }
  return p;
}

TUTTI_HD inline int rdPartner(int rank, int step) { return rank ^ (1 << step); }

// The step in which a core rank leaves the tree's reduction (sends up, later receives the
// result from the same partner): its lowest set bit; `steps` for rank 0, which never leaves.
TUTTI_HD inline int treeLevel(int rank, int steps) {
  int k = 0;
  while (k < steps && !(rank & (1 << k))) ++k;
  return k;
}

}  // namespace tutti::algo
