// Device primitives: the CUDA engine's implementation of the vocabulary collectives/ring.h is
// written in (see kernels/cpu/host_prims.h for the CPU twin). One thread block runs one
// channel; its threads share every slot's work. Two protocols:
//   Simple -- the block fills a slot with wide stores, thread 0 fences (system scope: the
//             peer may be another process, or the slot mapped host memory) and publishes tail;
//             the receiver's thread 0 waits for tail, the block reads the slot, thread 0
//             publishes head. For bandwidth.
//   LL     -- 16-byte lines of {4 data bytes, flag, 4 data bytes, flag} written with one
//             16-byte store; the receiver polls its lines until both flags carry the step.
//             No fence and no tail round trip, half the payload per byte moved. For latency.
// After a failure (abort, deadline, size mismatch) every primitive returns at once, so the
// algorithm code needs no error handling -- as on the CPU.
#pragma once

#include "kernels/cuda/dev_memory.cuh"
#include "kernels/cuda/dev_reduce.cuh"

namespace tutti::dev {

// Per-block state shared by the threads of one channel: words one thread hands the others
// through a barrier.
struct BlockState {
  uint64_t sendStep;  // where the FIFOs stand when an operation starts (setUp): thread 0
  uint64_t recvStep;  // and the releaser (PrimsBase::releaser) read them
  uint64_t head;      // the send FIFO's head as thread 0 last read it
  int failed;         // a hint for spinning threads to stop early; decisions use barrier votes
};

constexpr int kSpinsPerCheck = 1 << 10;

// What a wait needs to give up: the launch's abort flag, error record and deadline, and the
// FIFOs to mark broken so that the peers' kernels stop too.
struct WaitCtx {
  const DevHeader* w;
  BlockState* sh;
  const DevConn* sc;
  const DevConn* rc;
  int channel;
  int kind;
  uint64_t seq;

  // Called every kSpinsPerCheck spins by a waiting thread; true when the wait must end.
  // *since: when this wait started (0 before the first call): the deadline is for one wait
  // without progress, not for the whole kernel.
  __device__ bool mustStop(const DevConn* c, uint64_t* since) const {
    if (ldFlag(w->abortFlag)) return fail(kErrAborted, c->peer, 0, 0);
    // This block gave up already (another of its threads): its failure is the one recorded,
    // and the links it marked broken are not a peer's doing.
    if (ldShared(&sh->failed)) return true;
    if (c->broken && ldFlag(c->broken)) return fail(kErrPeer, c->peer, 0, 0);
    if (ldFlag(&w->err->code)) return fail(kErrNone, c->peer, 0, 0);  // another block failed
    const uint64_t now = globalTimer();
    if (*since == 0) *since = now;
    if (w->timeoutNs && now - *since > w->timeoutNs) return fail(kErrTimeout, c->peer, 0, 0);
    return false;
  }
  // Tells the block's other threads, records the first failure of the launch (code kErrNone:
  // only stop), then marks this block's FIFOs broken -- in that order, so that a thread of
  // this block that finds them broken before it sees `failed` cannot claim the launch's error
  // as a peer's first (seen in emulation: a timeout reported as kErrPeer).
  __device__ bool fail(uint32_t code, int peer, uint64_t got, uint64_t want) const {
    stShared(&sh->failed, 1);
    if (code != kErrNone && atomicCAS(w->errClaim, 0u, 1u) == 0u) {
      DevError* e = w->err;
      e->peer = peer;
      e->channel = channel;
      e->kind = kind;
      e->seq = seq;
      e->got = got;
      e->want = want;
      __threadfence_system();  // the claim and the fields before the code and the links
      stFlag(&e->code, code);
    }
    if (sc && sc->broken) stFlag(sc->broken, 1);
    if (rc && rc->broken) stFlag(rc->broken, 1);
    return true;
  }
};

// Copies / combines n elements with the block's threads: 16-byte packs where every pointer
// allows, element by element for the rest. d1 may be null (one destination).
template <int M, typename T, int F>
__device__ void blockApply(const Red<T, F>& r, T* d0, T* d1, const T* a, const T* b, size_t n) {
  constexpr int kPer = 16 / sizeof(T);
  const uintptr_t mis = (reinterpret_cast<uintptr_t>(d0) | reinterpret_cast<uintptr_t>(d1) |
                         reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b)) &
                        15;
  size_t done = 0;
  if (mis == 0) {
    const size_t packs = n / kPer;
    constexpr bool kTwo = M == kOpReduce || M == kOpReducePost;
    const uint4* pa = reinterpret_cast<const uint4*>(a);
    const uint4* pb = reinterpret_cast<const uint4*>(b);
    uint4* p0 = reinterpret_cast<uint4*>(d0);
    uint4* p1 = reinterpret_cast<uint4*>(d1);
    // kUnroll packs per thread in flight before the first is used: one load at a time
    // leaves most of a block's memory bandwidth idle.
    constexpr int kUnroll = sizeof(T) == 1 && M != kOpCopy ? 2 : 4;  // fp8: 16 conversions a pack
    const size_t stride = blockDim.x;
    size_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * stride < packs; i += kUnroll * stride) {
      uint4 va[kUnroll], vb[kUnroll];
      TUTTI_UNROLL
      for (int u = 0; u < kUnroll; ++u) va[u] = pa[i + u * stride];
      TUTTI_UNROLL
      for (int u = 0; u < kUnroll; ++u) vb[u] = kTwo ? pb[i + u * stride] : va[u];
      TUTTI_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        const uint4 v = computePack<M>(r, va[u], vb[u]);
        p0[i + u * stride] = v;
        if (p1) p1[i + u * stride] = v;
      }
    }
    for (; i < packs; i += stride) {
      const uint4 va = pa[i];
      const uint4 v = computePack<M>(r, va, kTwo ? pb[i] : va);
      p0[i] = v;
      if (p1) p1[i] = v;
    }
    done = packs * kPer;
  }
  for (size_t i = done + threadIdx.x; i < n; i += blockDim.x) {
    T vb = (M == kOpReduce || M == kOpReducePost) ? b[i] : a[i];
    T v = compute<M>(r, a[i], vb);
    d0[i] = v;
    if (d1) d1[i] = v;
  }
}

// The part of the primitives both protocols share: the two links, the buffers, the waits.
// failed_ is the same in every thread of the block: it only changes through barrier votes
// (__syncthreads_or), so all threads skip the same primitives and meet at the same barriers.
template <typename T, int F>
struct PrimsBase {
  const DevConn* sc;  // send to (null: this block never sends)
  const DevConn* rc;  // receive from
  const T* in;
  T* out;
  Red<T, F> red;
  WaitCtx ctx;
  bool failed_ = false;
  // Every thread keeps the steps and the last head seen itself, all alike (every thread runs
  // the same primitives): no barrier is needed to hand them on, only to agree on waits.
  uint64_t sendStep_ = 0, recvStep_ = 0;
  uint64_t headSeen_ = 0;  // 0: unknown, the first wait for a slot reads it

  __device__ bool failed() const { return failed_; }
  // Every thread's verdict, combined at a barrier.
  __device__ bool vote(bool stop) {
    failed_ = __syncthreads_or(stop ? 1 : 0) != 0;
    return !failed_;
  }

  // Whether the send slot is free; every thread learns whether to go on. A slot that the
  // head seen last already frees takes no load and no barrier, so one read of head serves up
  // to kSteps steps: the acquire that saw it, and the barrier after, order this step's writes
  // after the receiver's reads of the slot.
  __device__ bool waitSendSlot() {
    if (headSeen_ + kSteps > sendStep_) return true;  // alike in every thread
    bool stop = false;
    if (threadIdx.x == 0) {
      uint64_t since = 0;
      int spins = 0;
      uint64_t head;
      while ((head = ldAcquire(sc->head, sc->gpuScope)) + kSteps <= sendStep_) {
        spinPause();
        if (++spins == kSpinsPerCheck) {
          spins = 0;
          if ((stop = ctx.mustStop(sc, &since))) break;
        }
      }
      // Read by the others after the barrier below; thread 0 writes it again only in a later
      // wait, after at least one more barrier (every primitive that sends has one).
      ctx.sh->head = head;
    }
    if (!vote(stop)) return false;
    headSeen_ = ctx.sh->head;
    return true;
  }
  __device__ char* sendSlot(bool ll) const {
    const uint64_t k = sendStep_ % kSteps;
    return ll ? sc->ll + k * sc->llSlotBytes : sc->slots + k * sc->slotBytes;
  }
  __device__ char* recvSlot(bool ll) const {
    const uint64_t k = recvStep_ % kSteps;
    return ll ? rc->ll + k * rc->llSlotBytes : rc->slots + k * rc->slotBytes;
  }
  // The thread that frees received slots: the block's last. Thread 0 waits for the next step
  // (and holds a small LL step's only line), so it goes on at once while another warp pays
  // for the release's fence.
  __device__ static bool releaser() { return threadIdx.x == blockDim.x - 1; }
  // After every thread is done with the received slot (stop: this thread gave up on it):
  // free it for the sender.
  __device__ void releaseRecv(bool stop) {
    if (vote(stop)) freeRecv();
  }
  // Once the block agreed it is done with the received slot: free it, move to the next step.
  __device__ void freeRecv() {
    if (releaser()) stRelease(rc->head, recvStep_ + 1, rc->gpuScope);
    recvStep_ += 1;
  }
  // Thread 0 records the send step in the sender's own word (see DevConn::step).
  __device__ void advanceSend() {
    sendStep_ += 1;
    if (threadIdx.x == 0) stVolatile(sc->step, sendStep_);
  }
};

template <typename T, int F>
struct SimplePrims : PrimsBase<T, F> {
  static constexpr bool kIsLL = false;
  using B = PrimsBase<T, F>;
  using B::ctx;
  using B::in;
  using B::out;
  using B::rc;
  using B::red;
  using B::sc;

  // last: whether the sender must have marked this step as its message's last (point-to-
  // point: 0 or 1); collectives pass kAnyLast and compare sizes only.
  static constexpr int kAnyLast = -1;
  __device__ bool waitRecv(size_t n, int last = kAnyLast) {
    bool stop = false;
    if (threadIdx.x == 0) {
      const uint64_t step = B::recvStep_;
      uint64_t since = 0;
      int spins = 0;
      while (ldAcquire(rc->tail, rc->gpuScope) <= step) {
        spinPause();
        if (++spins == kSpinsPerCheck) {
          spins = 0;
          if ((stop = ctx.mustStop(rc, &since))) break;
        }
      }
      if (!stop) {
        const uint64_t word = ldVolatile(rc->sizes + step % kSteps);
        const uint64_t got = word & kSizeMask;
        const bool lastBit = (word & kLastSlot) != 0;
        if (got != n * sizeof(T) || (last != kAnyLast && lastBit != (last != 0))) {
          stop = ctx.fail(kErrSize, rc->peer, word, n * sizeof(T) | (last == 1 ? kLastSlot : 0));
        }
      }
    }
    return B::vote(stop);
  }
  __device__ void postSend(size_t n, bool last = false) {
    __syncthreads();
    if (threadIdx.x == 0) {
      fenceBefore(sc->gpuScope);  // the block's slot writes before the counter
      const uint64_t step = B::sendStep_;
      stVolatile(sc->sizes + step % kSteps, n * sizeof(T) | (last ? kLastSlot : 0));
      stRelease(sc->tail, step + 1, sc->gpuScope);
    }
    B::advanceSend();
  }

  // Point-to-point: one step of a message, the last one flagged, so that a receiver expecting
  // another size or another number of steps fails instead of taking the wrong bytes.
  __device__ void sendStep(size_t inOff, int n, bool last) {
    if (B::failed() || !B::waitSendSlot()) return;
    T* s = reinterpret_cast<T*>(B::sendSlot(false));
    blockApply<kOpCopy>(red, s, (T*)nullptr, in + inOff, (const T*)nullptr, size_t(n));
    postSend(size_t(n), last);
  }
  __device__ void recvStep(size_t outOff, int n, bool last) {
    if (B::failed() || !waitRecv(size_t(n), last ? 1 : 0)) return;
    const T* r = reinterpret_cast<const T*>(B::recvSlot(false));
    blockApply<kOpCopy>(red, out + outOff, (T*)nullptr, r, (const T*)nullptr, size_t(n));
    B::releaseRecv(false);
  }

  // The vocabulary of collectives/ring.h.
  __device__ void send(size_t inOff, int n) {
    if (B::failed() || !B::waitSendSlot()) return;
    T* s = reinterpret_cast<T*>(B::sendSlot(false));
    blockApply<kOpPre>(red, s, (T*)nullptr, in + inOff, (const T*)nullptr, size_t(n));
    postSend(size_t(n));
  }
  __device__ void recv(size_t outOff, int n) {
    if (B::failed() || !waitRecv(size_t(n))) return;
    const T* r = reinterpret_cast<const T*>(B::recvSlot(false));
    blockApply<kOpCopy>(red, out + outOff, (T*)nullptr, r, (const T*)nullptr, size_t(n));
    B::releaseRecv(false);
  }
  __device__ void recvReduceSend(size_t inOff, int n) {
    if (B::failed() || !waitRecv(size_t(n)) || !B::waitSendSlot()) return;
    const T* r = reinterpret_cast<const T*>(B::recvSlot(false));
    T* s = reinterpret_cast<T*>(B::sendSlot(false));
    blockApply<kOpReduce>(red, s, (T*)nullptr, r, in + inOff, size_t(n));
    postSend(size_t(n));
    B::releaseRecv(false);
  }
  __device__ void recvCopySend(size_t outOff, int n) {
    if (B::failed() || !waitRecv(size_t(n)) || !B::waitSendSlot()) return;
    const T* r = reinterpret_cast<const T*>(B::recvSlot(false));
    T* s = reinterpret_cast<T*>(B::sendSlot(false));
    blockApply<kOpCopy>(red, out + outOff, s, r, (const T*)nullptr, size_t(n));
    postSend(size_t(n));
    B::releaseRecv(false);
  }
  __device__ void recvReduceCopySend(size_t inOff, size_t outOff, int n) {
    if (B::failed() || !waitRecv(size_t(n)) || !B::waitSendSlot()) return;
    const T* r = reinterpret_cast<const T*>(B::recvSlot(false));
    T* s = reinterpret_cast<T*>(B::sendSlot(false));
    blockApply<kOpReducePost>(red, out + outOff, s, r, in + inOff, size_t(n));
    postSend(size_t(n));
    B::releaseRecv(false);
  }
  __device__ void copySend(size_t inOff, size_t outOff, int n) {
    if (B::failed() || !B::waitSendSlot()) return;
    T* s = reinterpret_cast<T*>(B::sendSlot(false));
    T* o = out + outOff == in + inOff ? nullptr : out + outOff;
    blockApply<kOpCopy>(red, s, o, in + inOff, (const T*)nullptr, size_t(n));
    postSend(size_t(n));
  }
  __device__ void recvReduceCopy(size_t inOff, size_t outOff, int n) {
    if (B::failed() || !waitRecv(size_t(n))) return;
    const T* r = reinterpret_cast<const T*>(B::recvSlot(false));
    blockApply<kOpReducePost>(red, out + outOff, (T*)nullptr, r, in + inOff, size_t(n));
    B::releaseRecv(false);
  }
  __device__ void copy(size_t inOff, size_t outOff, int n) {
    if (B::failed()) return;
    blockApply<kOpPrePost>(red, out + outOff, (T*)nullptr, in + inOff, (const T*)nullptr,
                           size_t(n));
    __syncthreads();
  }
};

// 8 payload bytes at p (valid of them; the rest zero), aligned or not.
__device__ __forceinline__ uint64_t load8(const char* p, int valid) {
  if (valid == 8 && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    return *reinterpret_cast<const uint64_t*>(p);
  }
  uint64_t v = 0;
  for (int i = 0; i < valid; ++i) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}
__device__ __forceinline__ void store8(char* p, uint64_t v, int valid) {
  if (valid == 8 && (reinterpret_cast<uintptr_t>(p) & 7) == 0) {
    *reinterpret_cast<uint64_t*>(p) = v;
    return;
  }
  for (int i = 0; i < valid; ++i) p[i] = char(v >> (8 * i));
}

// The flag of an LL step: never 0, the value of a cleared line.
__device__ __forceinline__ uint32_t llFlag(uint64_t step) {
  const uint32_t f = uint32_t(step + 1);
  return f == 0 ? 1 : f;
}

template <typename T, int F>
struct LLPrims : PrimsBase<T, F> {
  static constexpr bool kIsLL = true;
  using B = PrimsBase<T, F>;
  using B::ctx;
  using B::in;
  using B::out;
  using B::rc;
  using B::red;
  using B::sc;

  // One step: optionally receive a slot, combine it (mode M) with this rank's input at
  // inOff, write the result to the output at outOff and / or send it on. Each thread owns
  // whole lines, so a line's value never crosses threads.
  template <int M, bool kRecv, bool kSend>
  __device__ void step(const T* inp, T* outp, int n) {
    if (B::failed()) return;
    if (kSend && !B::waitSendSlot()) return;
    const size_t bytes = size_t(n) * sizeof(T);
    const int lines = int((bytes + 7) / 8);
    char* sline = kSend ? B::sendSlot(true) : nullptr;
    char* rline = kRecv ? B::recvSlot(true) : nullptr;
    const uint32_t sflag = kSend ? llFlag(B::sendStep_) : 0;
    const uint32_t rflag = kRecv ? llFlag(B::recvStep_) : 0;
    bool stop = false;
    for (int i = threadIdx.x; i < lines; i += blockDim.x) {
      const int valid = validAt(bytes, i);
      uint64_t a = 0, mine = 0;
      if (inp) mine = load8(reinterpret_cast<const char*>(inp) + size_t(i) * 8, valid);
      if (kRecv) {
        if (!waitLine(rline + size_t(i) * 16, rflag, &a)) {
          stop = true;
          break;
        }
        // Cleared once read (it is this rank's own memory): a line keeps no flag that a step
        // 2^32 later could mistake for its own.
        storeLine(rline + size_t(i) * 16, 0, 0);
      } else {
        a = mine;
      }
      const uint64_t v = computePack<M>(red, a, mine);
      if (outp) store8(reinterpret_cast<char*>(outp) + size_t(i) * 8, v, valid);
      if (kSend) storeLine(sline + size_t(i) * 16, v, sflag);
    }
    // Every thread has written and read its lines: agree on the outcome, then move on (the
    // next step needs no barrier first: each thread has the steps itself).
    if (!B::vote(stop)) return;
    if (kSend) B::advanceSend();  // bookkeeping only: receivers poll the lines
    if (kRecv) B::freeRecv();
  }

  __device__ void send(size_t inOff, int n) { step<kOpPre, false, true>(in + inOff, nullptr, n); }
  __device__ void recv(size_t outOff, int n) {
    step<kOpCopy, true, false>(nullptr, out + outOff, n);
  }
  __device__ void recvReduceSend(size_t inOff, int n) {
    step<kOpReduce, true, true>(in + inOff, nullptr, n);
  }
  __device__ void recvCopySend(size_t outOff, int n) {
    step<kOpCopy, true, true>(nullptr, out + outOff, n);
  }
  __device__ void recvReduceCopySend(size_t inOff, size_t outOff, int n) {
    step<kOpReducePost, true, true>(in + inOff, out + outOff, n);
  }
  __device__ void copySend(size_t inOff, size_t outOff, int n) {
    step<kOpCopy, false, true>(in + inOff, out + outOff == in + inOff ? nullptr : out + outOff, n);
  }
  __device__ void recvReduceCopy(size_t inOff, size_t outOff, int n) {
    step<kOpReducePost, true, false>(in + inOff, out + outOff, n);
  }
  __device__ void copy(size_t inOff, size_t outOff, int n) {
    if (B::failed()) return;
    blockApply<kOpPrePost>(red, out + outOff, (T*)nullptr, in + inOff, (const T*)nullptr,
                           size_t(n));
    __syncthreads();
  }

  // dev::kAlgoGather (dev_work.h): an AllReduce of the n elements at off, which fit one LL
  // step. Steps 0 .. nranks-2 send pre(input), then each value the step before brought in;
  // received slot j (from recvStep_ on) ends holding rank (rank - 1 - j)'s pre(input). The
  // slots are read again, in rank order, for the reduction, and only then cleared and freed
  // (head moves nranks - 1 steps at once). Each thread owns whole lines throughout.
  __device__ void gatherAllReduce(size_t off, int n, int rank, int nranks) {
    if (B::failed()) return;
    const size_t bytes = size_t(n) * sizeof(T);
    const int lines = int((bytes + 7) / 8);
    const char* inp = reinterpret_cast<const char*>(in + off);
    char* outp = reinterpret_cast<char*>(out + off);
    const uint64_t first = B::recvStep_;
    for (int k = 0; k + 1 < nranks; ++k) {
      if (!B::waitSendSlot()) return;
      char* sline = B::sendSlot(true);
      const uint32_t sflag = llFlag(B::sendStep_);
      bool stop = false;
      for (int i = threadIdx.x; i < lines; i += blockDim.x) {
        uint64_t v;
        if (k == 0) {
          const uint64_t mine = load8(inp + size_t(i) * 8, validAt(bytes, i));
          v = computePack<kOpPre>(red, mine, mine);
        } else if (!waitLine(slotAt(first, k - 1) + size_t(i) * 16, llFlag(first + k - 1), &v)) {
          stop = true;
          break;
        }
        storeLine(sline + size_t(i) * 16, v, sflag);
      }
      if (!B::vote(stop)) return;
      B::advanceSend();  // bookkeeping only: receivers poll the lines
    }
    using E = Elem<T>;
    using Acc = typename Red<T, F>::Acc;
    constexpr int kPer = 8 / sizeof(T);
    union Line {
      uint64_t w;
      T e[kPer];
    };
    bool stop = false;
    for (int i = threadIdx.x; i < lines && !stop; i += blockDim.x) {
      const int valid = validAt(bytes, i);
      Acc acc[kPer] = {};
      for (int q = 0; q < nranks; ++q) {
        Line u;
        if (q == rank) {
          const uint64_t mine = load8(inp + size_t(i) * 8, valid);
          u.w = computePack<kOpPre>(red, mine, mine);  // the bits this rank sent
        } else {
          const int j = (rank - 1 - q + nranks) % nranks;
          char* line = slotAt(first, j) + size_t(i) * 16;
          if (!waitLine(line, llFlag(first + uint64_t(j)), &u.w)) {
            stop = true;
            break;
          }
          storeLine(line, 0, 0);  // as step() does: no stale flag left behind
        }
        TUTTI_UNROLL
        for (int e = 0; e < kPer; ++e)
          acc[e] = q == 0 ? E::load(u.e[e]) : Red<T, F>::combine(acc[e], E::load(u.e[e]));
      }
      if (stop) break;
      Line o;
      TUTTI_UNROLL
      for (int e = 0; e < kPer; ++e) o.e[e] = E::store(red.post(acc[e]));
      store8(outp + size_t(i) * 8, o.w, valid);
    }
    if (!B::vote(stop)) return;
    if (B::releaser()) stRelease(rc->head, first + uint64_t(nranks - 1), rc->gpuScope);
    B::recvStep_ = first + uint64_t(nranks - 1);
  }

 private:
  __device__ static int validAt(size_t bytes, int line) {
    return int(bytes - size_t(line) * 8 < 8 ? bytes - size_t(line) * 8 : 8);
  }
  // Received LL slot j of this operation, whose first is `first`.
  __device__ char* slotAt(uint64_t first, int j) const {
    return rc->ll + ((first + uint64_t(j)) % kSteps) * rc->llSlotBytes;
  }
  // Waits for a received line to carry flag; false when the wait must end (B::ctx says why).
  __device__ bool waitLine(const char* line, uint32_t flag, uint64_t* v) const {
    uint64_t since = 0;
    int spins = 0;
    while (!loadLine(line, flag, v)) {
      spinPause();
      if (++spins == kSpinsPerCheck) {
        spins = 0;
        if (ctx.mustStop(rc, &since)) return false;
      }
    }
    return true;
  }
};

}  // namespace tutti::dev
