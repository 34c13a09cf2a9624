// Element loops with instruction sets chosen at run time for the CPU at hand. The library is
// built for baseline x86-64; these few loops are compiled for newer extensions too and used
// only where the CPU has them. And a copy with streaming stores, which baseline x86-64 has.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::cpu::simd {

// fp16 via F16C/AVX: dst = [post]([pre](a) (fn) [pre](b)) (a scaled only with preA too),
// widened to float and rounded once, the same arithmetic as the scalar loop. False when the
// CPU lacks F16C (the caller falls back). fn: 0 sum, 1 prod, 2 max, 3 min.
bool reduceHalf(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n, int fn, bool hasPre,
                float pre, bool hasPost, float divisor, bool preA = false);
// fp16: dst = src * scale, rounded once (a PreMulSum's or Avg's scaling of the input). False
// without F16C.
bool scaleHalf(uint16_t* dst, const uint16_t* src, size_t n, float scale);

// Copies n bytes (no overlap) with non-temporal stores where the CPU has them (x86-64: SSE2,
// which every such CPU has; memcpy elsewhere): the destination's lines are written without
// first being read in, and what the caches hold stays there. For copies far bigger than the
// caches whose destination is not read again soon. Ends with a store fence, so a release store
// after it publishes the bytes.
void streamCopy(void* dst, const void* src, size_t n);

// The smallest copy copyBig streams (TUTTI_STREAM_COPY_MIN, default kStreamCopyMinBytes; 0
// never streams).
size_t streamCopyMinBytes();
constexpr size_t kStreamCopyMinBytes = 4 << 20;

// memcpy below streamCopyMinBytes(), streamCopy from it on. glibc makes the same choice by the
// cache sizes the CPU reports, which a virtual machine may report wrong: this one's vCPUs say
// their shared cache holds 320 MiB, so glibc's memcpy streams only from 240 MiB. Two ranks
// all-gathering over shm here, each copying its own block into the output, medians of 30-190
// interleaved runs, us, memcpy / streamed, fast machine state (slow): 1 MiB blocks 100 / 129
// (135 / 139) and 2 MiB blocks 215 / 249 (292 / 285), streamed from 1 MiB; 4 MiB blocks 675 /
// 545 (713 / 677); 8 MiB blocks 1965 / 1884 (2467 / 2056); 32 MiB blocks, in 8 MiB chunks,
// 9024 / 9189 (12530 / 11035). Hence 4 MiB (docs/host-results.md).
void copyBig(void* dst, const void* src, size_t n);

}  // namespace tutti::cpu::simd
