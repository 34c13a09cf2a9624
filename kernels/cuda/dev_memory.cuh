// The memory operations the device primitives (dev_prims.cuh) are written with: loads and
// stores with their ordering (acquire, release, volatile), fences, the LL line of {data, flag}
// words, the shared words of a block, the clock and the spin. On the GPU as PTX-level
// operations; in the CPU emulation (kernels/cuda/dev_emu.h, TUTTI_DEV_EMULATION) the same
// orderings with compiler atomics.
#pragma once

#include <cstdint>

#include "kernels/cuda/dev_reduce.cuh"  // (where no CUDA compiler runs: the CPU emulation)

#if !defined(__CUDACC__)
#include <sched.h>

#include <chrono>
#endif

namespace tutti::dev {

#if defined(TUTTI_DEV_EMULATION)
// CPU emulation (kernels/cuda/dev_emu.h): the same orderings with compiler atomics.
inline uint64_t ldAcquire(const uint64_t* p, bool) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
inline void stRelease(uint64_t* p, uint64_t v, bool) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline void fenceBefore(bool) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline uint64_t ldVolatile(const uint64_t* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void stVolatile(uint64_t* p, uint64_t v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline uint32_t ldFlag(const volatile uint32_t* p) {
  return __atomic_load_n(const_cast<const uint32_t*>(p), __ATOMIC_ACQUIRE);
}
inline void stFlag(uint32_t* p, uint32_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
inline int ldShared(const int* p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
inline void stShared(int* p, int v) { __atomic_store_n(p, v, __ATOMIC_RELAXED); }
inline uint64_t globalTimer() {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}
// Each 8-byte half of a line is one word {data, flag}: a reader sees a half whole or not at
// all, as the GPU's single 16-byte store gives.
inline void storeLine(char* line, uint64_t v, uint32_t flag) {
  auto* w = reinterpret_cast<uint64_t*>(line);
  __atomic_store_n(w, uint64_t(uint32_t(v)) | uint64_t(flag) << 32, __ATOMIC_RELAXED);
  __atomic_store_n(w + 1, (v >> 32) | uint64_t(flag) << 32, __ATOMIC_RELAXED);
}
inline bool loadLine(const char* line, uint32_t flag, uint64_t* v) {
  auto* w = reinterpret_cast<const uint64_t*>(line);
  const uint64_t a = __atomic_load_n(w, __ATOMIC_RELAXED);
  const uint64_t b = __atomic_load_n(w + 1, __ATOMIC_RELAXED);
  *v = (a & 0xffffffffull) | (b << 32);
  return uint32_t(a >> 32) == flag && uint32_t(b >> 32) == flag;
}
// Spinning threads outnumber the cores here: let the one being waited for run.
inline void spinPause() { sched_yield(); }
#else
// gpu: both ends run on this GPU in this process (DevConn::gpuScope), so device scope orders
// enough; otherwise system scope (another GPU, another process, or mapped host memory).
__device__ __forceinline__ uint64_t ldAcquire(const uint64_t* p, bool gpu) {
  uint64_t v;
  if (gpu) {
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  } else {
    asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  }
  return v;
}
__device__ __forceinline__ void stRelease(uint64_t* p, uint64_t v, bool gpu) {
  if (gpu) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  } else {
    asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
  }
}
// Orders this thread's (and, after a barrier, its block's) earlier writes before what follows.
__device__ __forceinline__ void fenceBefore(bool gpu) {
  if (gpu) {
    __threadfence();
  } else {
    __threadfence_system();
  }
}
__device__ __forceinline__ uint64_t ldVolatile(const uint64_t* p) {
  return *reinterpret_cast<const volatile uint64_t*>(p);
}
__device__ __forceinline__ void stVolatile(uint64_t* p, uint64_t v) {
  *reinterpret_cast<volatile uint64_t*>(p) = v;
}
__device__ __forceinline__ uint32_t ldFlag(const volatile uint32_t* p) { return *p; }
__device__ __forceinline__ void stFlag(uint32_t* p, uint32_t v) {
  *reinterpret_cast<volatile uint32_t*>(p) = v;
}
__device__ __forceinline__ int ldShared(const int* p) {
  return *reinterpret_cast<const volatile int*>(p);
}
__device__ __forceinline__ void stShared(int* p, int v) { *reinterpret_cast<volatile int*>(p) = v; }
__device__ __forceinline__ uint64_t globalTimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ __forceinline__ void storeLine(char* line, uint64_t v, uint32_t flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(line), "r"(uint32_t(v)),
               "r"(flag), "r"(uint32_t(v >> 32)), "r"(flag)
               : "memory");
}
// True (and the payload in *v) once both halves of the line carry flag.
__device__ __forceinline__ bool loadLine(const char* line, uint32_t flag, uint64_t* v) {
  uint32_t d0, f0, d1, f1;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
               : "l"(line)
               : "memory");
  *v = uint64_t(d0) | (uint64_t(d1) << 32);
  return f0 == flag && f1 == flag;
}
__device__ __forceinline__ void spinPause() {}
#endif

}  // namespace tutti::dev
