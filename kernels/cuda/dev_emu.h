// CPU emulation of the few CUDA built-ins the device primitives use, so that the kernels'
// source (coll_kernel.cuh and what it includes) also compiles with the host compiler and runs
// on CPU threads: one std::thread per CUDA thread, a barrier per block. Tests use it
// (tests/emu) to run the kernels' protocol, index and reduction code in CI, where there is no
// GPU. It models the GPU's memory only as far as the primitives rely on it: acquire/release
// counters, and LL lines whose halves are each written and read as one 8-byte word.
// Never part of the library.
#pragma once

#if defined(__CUDACC__)
#error "dev_emu.h is for the host compiler only"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

// The CUDA headers define these as attributes for nvcc; plain C++ here.
#undef __device__
#undef __global__
#undef __shared__
#undef __forceinline__
#undef __grid_constant__
#undef __launch_bounds__
#define __device__
#define __global__
#define __forceinline__ inline
#define __grid_constant__
#define __launch_bounds__(...)

namespace tutti::dev::emu {

struct Dim {
  unsigned x;
};

// One emulated block: its threads' barrier and its shared memory.
struct Block {
  pthread_barrier_t barrier;
  std::atomic<int> vote[2];  // __syncthreads_or, alternating so one call never meets the next
  alignas(64) unsigned char shared[256];
};

struct ThreadCtx {
  Dim threadIdx{0}, blockIdx{0}, blockDim{1};
  Block* block = nullptr;
  int parity = 0;
  Dim gridDim{1};
};
inline thread_local ThreadCtx tCtx;

inline void syncthreads() { pthread_barrier_wait(&tCtx.block->barrier); }
inline int syncthreadsOr(int v) {
  Block* b = tCtx.block;
  const int k = tCtx.parity ^= 1;
  if (v) b->vote[k].store(1, std::memory_order_relaxed);
  pthread_barrier_wait(&b->barrier);
  const int r = b->vote[k].load(std::memory_order_relaxed);
  pthread_barrier_wait(&b->barrier);
  if (tCtx.threadIdx.x == 0) b->vote[k].store(0, std::memory_order_relaxed);
  return r;
}

// Runs kernel(args) on `blocks` blocks of `threads` threads each and waits for all of them.
inline void launch(unsigned blocks, unsigned threads, const std::function<void()>& kernel) {
  std::vector<std::unique_ptr<Block>> bs;
  for (unsigned b = 0; b < blocks; ++b) {
    bs.push_back(std::make_unique<Block>());
    bs.back()->vote[0] = 0;
    bs.back()->vote[1] = 0;
    pthread_barrier_init(&bs.back()->barrier, nullptr, threads);
  }
  std::vector<std::thread> ts;
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < threads; ++t) {
      ts.emplace_back([&, b, t] {
        tCtx = ThreadCtx{{t}, {b}, {threads}, bs[b].get(), 0, {blocks}};
        kernel();
      });
    }
  }
  for (auto& t : ts) t.join();
  for (auto& b : bs) pthread_barrier_destroy(&b->barrier);
}

}  // namespace tutti::dev::emu

#define threadIdx (::tutti::dev::emu::tCtx.threadIdx)
#define blockIdx (::tutti::dev::emu::tCtx.blockIdx)
#define blockDim (::tutti::dev::emu::tCtx.blockDim)
#define gridDim (::tutti::dev::emu::tCtx.gridDim)
#define __syncthreads() ::tutti::dev::emu::syncthreads()
#define __syncthreads_or(v) ::tutti::dev::emu::syncthreadsOr(v)
// A block's __shared__ variable: the block's shared bytes, one variable per kernel.
#define TUTTI_BLOCK_SHARED(type, name)                                               \
  static_assert(sizeof(type) <= sizeof(::tutti::dev::emu::Block::shared), "shared"); \
  type& name = *reinterpret_cast<type*>(::tutti::dev::emu::tCtx.block->shared)

inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline unsigned atomicCAS(uint32_t* p, uint32_t expect, uint32_t value) {
  __atomic_compare_exchange_n(p, &expect, value, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expect;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
inline double atomicAdd(double* p, double v) {
  double old, sum;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  do {
    sum = old + v;
  } while (!__atomic_compare_exchange(p, &old, &sum, true, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  return old;
}
