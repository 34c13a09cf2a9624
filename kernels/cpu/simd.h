// Element loops with instruction sets chosen at run time for the CPU at hand. The library is
// built for baseline x86-64; these few loops are compiled for newer extensions too and used
// only where the CPU has them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::cpu::simd {

// fp16 via F16C/AVX: dst = [post](a (fn) [pre](b)), widened to float and rounded once, the
// same arithmetic as the scalar loop. False when the CPU lacks F16C (the caller falls back).
// fn: 0 sum, 1 prod, 2 max, 3 min.
bool reduceHalf(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n, int fn, bool hasPre,
                float pre, bool hasPost, float divisor);

}  // namespace tutti::cpu::simd
