// Ring algorithms, written once over a primitives type P and run by both engines: the CPU
// engine instantiates them with host primitives (kernels/cpu/host_prims.h), the CUDA engine
// with device primitives. Keep this file free of host-only constructs: no std::, no
// exceptions, no allocation -- index math and primitive calls only.
//
// P provides, for element offsets into the caller's input / output buffers and n <= the
// elements of one slot:
//   send(in, n)                    next <- pre(input)
//   recv(out, n)                   output <- prev
//   recvReduceSend(in, n)          next <- prev (op) pre(input)
//   recvCopySend(out, n)           output <- prev, next <- prev
//   recvReduceCopySend(in, out, n) output <- post(prev (op) pre(input)), next <- that value
//   copySend(in, out, n)           output <- input, next <- input
//   recvReduceCopy(in, out, n)     output <- post(prev (op) pre(input))
//   copy(in, out, n)               output <- post(pre(input)) (a communicator of one rank)
// Every rank of the ring calls the same sequence with the same sizes, so a slot's size is
// known to both of its ends; zero-sized calls still move a (zero-sized) slot.
#pragma once

#include <stddef.h>

#ifdef __CUDACC__
#define TUTTI_HD __host__ __device__
#else
#define TUTTI_HD
#endif

namespace tutti::algo {

// One channel's share of a collective. Offsets and counts are in elements.
struct RingArgs {
  int rank;  // position in the ring; ring order is rank order
  int nranks;
  int root;       // Broadcast / Reduce
  size_t base;    // first element of this channel's share (of the per-rank count)
  size_t count;   // elements in this channel's share
  size_t stride;  // per-rank block size in the big buffer (AllGather / ReduceScatter)
  size_t chunk;   // most elements one slot holds
};

TUTTI_HD inline int ringMod(int a, int n) { return ((a % n) + n) % n; }
TUTTI_HD inline size_t minSize(size_t a, size_t b) { return a < b ? a : b; }

// Units one step moves: a slot's worth for big messages; for mid-sized ones about `steps`
// steps per channel share, so a message still crosses pipelined; never below minUnits (a step
// costs a counter round trip) nor above the slot. A multiple of 64 where it is cut.
TUTTI_HD inline size_t pipelinedChunk(size_t slotUnits, size_t share, int nch, size_t steps,
                                      size_t minUnits) {
  const size_t want = (share / static_cast<size_t>(nch) / steps + 63) / 64 * 64;
  return minSize(slotUnits, want > minUnits ? want : minUnits);
}
// Each channel's contiguous share of count units: a multiple of 64, so shares stay aligned.
TUTTI_HD inline size_t channelShare(size_t count, int nch) {
  return ((count + static_cast<size_t>(nch) - 1) / static_cast<size_t>(nch) + 63) / 64 * 64;
}

// The part of `left` elements that block j of n gets when split as evenly as possible.
struct Split {
  size_t per, left;
  TUTTI_HD size_t offset(int j) const { return minSize(per * static_cast<size_t>(j), left); }
  TUTTI_HD int size(int j) const {
    return static_cast<int>(minSize(per * static_cast<size_t>(j + 1), left) - offset(j));
  }
};

// Reduce-scatter then all-gather around the ring: each loop moves nranks slots' worth of data,
// one block per rank; block j is finished by rank j and then passed all the way round.
template <class P>
TUTTI_HD void ringAllReduce(P& p, const RingArgs& a) {
  const int n = a.nranks, r = a.rank;
  const size_t loop = a.chunk * static_cast<size_t>(n);
  for (size_t done = 0; done < a.count; done += loop) {
    const size_t left = minSize(loop, a.count - done);
    const Split s{(left + n - 1) / n, left};
    const size_t at = a.base + done;
    if (n == 1) {
      p.copy(at, at, static_cast<int>(left));
      continue;
    }
    int j = ringMod(r - 1, n);
    p.send(at + s.offset(j), s.size(j));
    for (int k = 2; k < n; ++k) {
      j = ringMod(r - k, n);
      p.recvReduceSend(at + s.offset(j), s.size(j));
    }
    p.recvReduceCopySend(at + s.offset(r), at + s.offset(r), s.size(r));
    for (int k = 1; k < n - 1; ++k) {
      j = ringMod(r - k, n);
      p.recvCopySend(at + s.offset(j), s.size(j));
    }
    j = ringMod(r + 1, n);
    p.recv(at + s.offset(j), s.size(j));
  }
}

// Two ranks: each sends its whole input and reduces the other's into its output, one step
// per slot instead of the ring's two. Both ranks compute post(pre(a) op pre(b)) with the
// operands swapped, which gives identical bits only when the op is commutative and no
// pre-scaling rounds one side: the selector uses it for that case and small messages.
template <class P>
TUTTI_HD void pairAllReduce(P& p, const RingArgs& a) {
  for (size_t done = 0; done < a.count; done += a.chunk) {
    const int len = static_cast<int>(minSize(a.chunk, a.count - done));
    const size_t at = a.base + done;
    p.send(at, len);
    p.recvReduceCopy(at, at, len);
  }
}

// Input: nranks blocks of `stride`; block j ends, fully reduced, in rank j's output.
template <class P>
TUTTI_HD void ringReduceScatter(P& p, const RingArgs& a) {
  const int n = a.nranks, r = a.rank;
  for (size_t done = 0; done < a.count; done += a.chunk) {
    const int len = static_cast<int>(minSize(a.chunk, a.count - done));
    const size_t at = a.base + done;
    if (n == 1) {
      p.copy(at, at, len);
      continue;
    }
    int j = ringMod(r - 1, n);
    p.send(static_cast<size_t>(j) * a.stride + at, len);
    for (int k = 2; k < n; ++k) {
      j = ringMod(r - k, n);
      p.recvReduceSend(static_cast<size_t>(j) * a.stride + at, len);
    }
    p.recvReduceCopy(static_cast<size_t>(r) * a.stride + at, at, len);
  }
}

// Output: nranks blocks of `stride`; rank j's input lands in block j everywhere.
template <class P>
TUTTI_HD void ringAllGather(P& p, const RingArgs& a) {
  const int n = a.nranks, r = a.rank;
  for (size_t done = 0; done < a.count; done += a.chunk) {
    const int len = static_cast<int>(minSize(a.chunk, a.count - done));
    const size_t at = a.base + done;
    const size_t mine = static_cast<size_t>(r) * a.stride + at;
    if (n == 1) {
      p.copy(at, mine, len);
      continue;
    }
    p.copySend(at, mine, len);
    for (int k = 1; k < n - 1; ++k) {
      p.recvCopySend(static_cast<size_t>(ringMod(r - k, n)) * a.stride + at, len);
    }
    p.recv(static_cast<size_t>(ringMod(r + 1, n)) * a.stride + at, len);
  }
}

// A chain from the root round the ring; the rank before the root only receives.
template <class P>
TUTTI_HD void ringBroadcast(P& p, const RingArgs& a) {
  const int n = a.nranks, pos = ringMod(a.rank - a.root, n);
  for (size_t done = 0; done < a.count; done += a.chunk) {
    const int len = static_cast<int>(minSize(a.chunk, a.count - done));
    const size_t at = a.base + done;
    if (n == 1) {
      p.copy(at, at, len);
    } else if (pos == 0) {
      p.copySend(at, at, len);
    } else if (pos < n - 1) {
      p.recvCopySend(at, len);
    } else {
      p.recv(at, len);
    }
  }
}

// A chain that starts after the root and ends at it, reducing on the way.
template <class P>
TUTTI_HD void ringReduce(P& p, const RingArgs& a) {
  const int n = a.nranks, pos = ringMod(a.rank - a.root - 1, n);
  for (size_t done = 0; done < a.count; done += a.chunk) {
    const int len = static_cast<int>(minSize(a.chunk, a.count - done));
    const size_t at = a.base + done;
    if (n == 1) {
      p.copy(at, at, len);
    } else if (pos == 0) {
      p.send(at, len);
    } else if (pos < n - 1) {
      p.recvReduceSend(at, len);
    } else {
      p.recvReduceCopy(at, at, len);
    }
  }
}

}  // namespace tutti::algo
