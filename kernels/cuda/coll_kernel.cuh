// The kernel: one instantiation per (element type, reduction function, protocol); the
// operations of a launch (which collective, buffers, sizes, root) are data in DevArgs. Block c
// runs channel c of every collective, a point-to-point operation runs on the block the host
// gave it. The algorithms are collectives/ring.h, the same code the CPU engine runs.
#pragma once

#include "collectives/ring.h"
#include "kernels/cuda/dev_prims.cuh"

#if defined(__CUDACC__)
#define TUTTI_BLOCK_SHARED(type, name) __shared__ type name
#endif

namespace tutti::dev {

template <typename T, int F, class P>
__device__ void setUp(P& p, const DevHeader& w, const DevOp& op, const DevConn* sc,
                      const DevConn* rc, int channel, BlockState* sh) {
  using E = Elem<T>;
  p.sc = sc;
  p.rc = rc;
  p.in = static_cast<const T*>(op.send);
  p.out = static_cast<T*>(op.recv);
  p.red.hasPre = op.hasPre != 0;
  if (op.hasPre) {
    T s;
    memcpy(&s, op.preScalarPtr ? op.preScalarPtr : op.preScalar, sizeof(T));
    p.red.preScalar = E::load(s);
  }
  p.red.hasPost = op.hasPost != 0;
  if (op.hasPost) p.red.postDivisor = static_cast<decltype(p.red.postDivisor)>(w.nranks);
  p.ctx = WaitCtx{&w, sh, sc, rc, channel, op.kind, op.seq};
  p.failed_ = false;
  // Each end's step is a counter only it writes (see DevConn). Two threads read the two at
  // once (each read is a trip to L2 or further); the one that frees received slots reads head.
  if (sc && threadIdx.x == 0) sh->sendStep = ldVolatile(sc->step);
  if (rc && P::releaser()) sh->recvStep = ldVolatile(rc->head);
  __syncthreads();
  // Written again only at the next operation, after the kernel's barrier between operations.
  p.sendStep_ = sc ? sh->sendStep : 0;
  p.recvStep_ = rc ? sh->recvStep : 0;
  p.headSeen_ = 0;
}

// Both return whether the block gave up (the same in all its threads).
// ch: the block's ring channel (null for a communicator of one rank).
template <typename T, int F, class P>
__device__ bool runCollective(const DevHeader& w, const DevChannel* ch, const DevOp& op, int c,
                              BlockState* sh) {
  P p;
  setUp<T, F>(p, w, op, ch ? &ch->send : nullptr, ch ? &ch->recv : nullptr, c, sh);
  const uint64_t base = op.per * uint64_t(c) < op.count ? op.per * uint64_t(c) : op.count;
  const uint64_t mine = op.count - base < op.per ? op.count - base : op.per;
  const algo::RingArgs ra{w.rank, w.nranks, op.root, base, mine, op.stride, op.chunk};
  switch (op.kind) {
    case kAllReduce:
      // The planner gives kAlgoGather to LL launches alone.
      if constexpr (P::kIsLL) {
        if (op.algo == kAlgoGather) {
          p.gatherAllReduce(base, int(mine), w.rank, w.nranks);
          break;
        }
      }
      algo::ringAllReduce(p, ra);
      break;
    case kReduceScatter:
      algo::ringReduceScatter(p, ra);
      break;
    case kReduce:
      algo::ringReduce(p, ra);
      break;
    case kAllGather:
      if constexpr (sizeof(T) == 1 && F == kFnSum) algo::ringAllGather(p, ra);
      break;
    case kBroadcast:
      if constexpr (sizeof(T) == 1 && F == kFnSum) algo::ringBroadcast(p, ra);
      break;
    default:
      break;
  }
  return p.failed();
}

// A send or a receive of op.count bytes in slot-sized steps (one empty step for 0 bytes), the
// last step flagged: both ends cut the message the same way, so any mismatch of sizes shows.
template <typename T, int F>
__device__ bool runP2p(const DevHeader& w, const DevOp& op, BlockState* sh) {
  SimplePrims<T, F> p;
  const bool sending = op.kind == kSend;
  setUp<T, F>(p, w, op, sending ? &op.conn : nullptr, sending ? nullptr : &op.conn, 0, sh);
  uint64_t off = 0;
  do {
    const uint64_t left = op.count - off;
    const int len = int(left < op.chunk ? left : op.chunk);
    const bool last = off + uint64_t(len) >= op.count;
    if (sending) {
      p.sendStep(off, len, last);
    } else {
      p.recvStep(off, len, last);
    }
    off += uint64_t(len);
  } while (off < op.count && !p.failed());
  return p.failed();
}

template <typename T, int F, int kProto>
__global__ void __launch_bounds__(kThreads, 1) collKernel(const __grid_constant__ DevArgs w) {
  using P = std::conditional_t<kProto == kLL, LLPrims<T, F>, SimplePrims<T, F>>;
  TUTTI_BLOCK_SHARED(BlockState, sh);
  if (threadIdx.x == 0) sh.failed = 0;
  __syncthreads();
  for (int i = 0; i < w.nops; ++i) {
    const DevOp& op = w.op(i);
    bool failed = false;
    if (op.kind == kSend || op.kind == kRecv) {
      if constexpr (sizeof(T) == 1 && F == kFnSum && kProto == kSimple) {
        if (op.block == int(blockIdx.x)) failed = runP2p<T, F>(w, op, &sh);
      }
    } else if (int(blockIdx.x) < op.nch) {
      // The planner gives a launch's collectives at most w.nch channels (w holds those).
      const DevChannel* ch = w.nranks > 1 ? &w.channel(int(blockIdx.x)) : nullptr;
      failed = runCollective<T, F, P>(w, ch, op, int(blockIdx.x), &sh);
    }
    if (__syncthreads_or(failed ? 1 : 0)) return;
  }
}

// Sends and receives past kMaxOps (DevP2pWork): every operation in order, each on its block,
// as collKernel runs them. A template only so that each translation unit may hold it.
template <int kUnused = 0>
__global__ void __launch_bounds__(kThreads, 1) p2pManyKernel(const __grid_constant__ DevP2pWork w) {
  TUTTI_BLOCK_SHARED(BlockState, sh);
  if (threadIdx.x == 0) sh.failed = 0;
  __syncthreads();
  const int n = w.base.nops + w.nmore;
  for (int i = 0; i < n; ++i) {
    const DevOp& op = i < w.base.nops ? w.base.ops[i] : w.more[i - w.base.nops];
    bool failed = false;
    if (op.block == int(blockIdx.x)) failed = runP2p<uint8_t, kFnSum>(w.base, op, &sh);
    if (__syncthreads_or(failed ? 1 : 0)) return;
  }
}

}  // namespace tutti::dev

// The uint8 translation unit (always built) also holds p2pManyKernel.
#define TUTTI_DEFINE_P2P_MANY_KERNEL(NAME) \
  void* tuttiP2pManyKernel_##NAME() { return (void*)tutti::dev::p2pManyKernel<0>; }

// One translation unit per element type (kernels_<name>.cu, generated): its eight kernels into
// the table at [fn][proto].
#define TUTTI_DEFINE_KERNELS(NAME, TYPE)                                               \
  void tuttiRegisterKernels_##NAME(void** table) {                                     \
    using namespace tutti::dev;                                                        \
    table[kFnSum * kNumProtos + kSimple] = (void*)collKernel<TYPE, kFnSum, kSimple>;   \
    table[kFnSum * kNumProtos + kLL] = (void*)collKernel<TYPE, kFnSum, kLL>;           \
    table[kFnProd * kNumProtos + kSimple] = (void*)collKernel<TYPE, kFnProd, kSimple>; \
    table[kFnProd * kNumProtos + kLL] = (void*)collKernel<TYPE, kFnProd, kLL>;         \
    table[kFnMax * kNumProtos + kSimple] = (void*)collKernel<TYPE, kFnMax, kSimple>;   \
    table[kFnMax * kNumProtos + kLL] = (void*)collKernel<TYPE, kFnMax, kLL>;           \
    table[kFnMin * kNumProtos + kSimple] = (void*)collKernel<TYPE, kFnMin, kSimple>;   \
    table[kFnMin * kNumProtos + kLL] = (void*)collKernel<TYPE, kFnMin, kLL>;           \
  }
