// Recursive doubling all-reduce: log2(n) exchange steps instead of the ring's 2(n-1), for
// small messages, where the number of dependent steps (each a round trip through another
// rank, which may first have to be scheduled) costs more than the bytes.
//
// With p2 the largest power of two <= n, the rem = n - p2 "extra" ranks first fold their
// input into a partner (rank - p2), the p2 core ranks then swap and combine whole vectors
// with partner rank ^ 2^k in step k, and each folded partner finally sends the result back.
// Every combination is partner-symmetric -- both sides compute x (op) y from the same two
// values, only in swapped order -- so for commutative ops every rank gets the same bits.
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

}  // namespace tutti::algo
