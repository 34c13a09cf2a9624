#include "kernels/cpu/simd.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <cstring>

#include "kernels/cpu/types.h"
#include "runtime/env.h"

namespace tutti::cpu::simd {

#if defined(__x86_64__)
namespace {

// As the scalar loop (reduce.h): max and min give b where a is NaN, else a where b is.
template <int Fn>
__attribute__((target("avx,f16c"))) inline __m256 combine(__m256 a, __m256 b) {
  if constexpr (Fn == 0) return _mm256_add_ps(a, b);
  if constexpr (Fn == 1) return _mm256_mul_ps(a, b);
  // max_ps(b, a) is (b > a) ? b : a: a where either is NaN.
  const __m256 r = Fn == 2 ? _mm256_max_ps(b, a) : _mm256_min_ps(b, a);
  return _mm256_blendv_ps(r, b, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
}

template <int Fn>
__attribute__((target("avx,f16c"))) void loop(uint16_t* dst, const uint16_t* a, const uint16_t* b,
                                              size_t n, bool hasPre, float pre, bool hasPost,
                                              float divisor, bool preA) {
  const __m256 vpre = _mm256_set1_ps(pre), vdiv = _mm256_set1_ps(divisor);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    if (hasPre) y = _mm256_mul_ps(y, vpre);
    if (hasPre && preA) x = _mm256_mul_ps(x, vpre);
    __m256 r = combine<Fn>(x, y);
    if (hasPost) r = _mm256_div_ps(r, vdiv);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) {  // the tail, as the scalar loop does it
    float x = HalfFormat::decode(a[i]), y = HalfFormat::decode(b[i]);
    if (hasPre) y *= pre;
    if (hasPre && preA) x *= pre;
    float r = Fn == 0   ? x + y
              : Fn == 1 ? x * y
              : Fn == 2 ? ((x < y || x != x) ? y : x)
                        : ((y < x || x != x) ? y : x);
    if (hasPost) r /= divisor;
    dst[i] = uint16_t(HalfFormat::encode(r));
  }
}

bool haveF16c() {
  static const bool have = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return have;
}

__attribute__((target("avx,f16c"))) void scaleLoop(uint16_t* dst, const uint16_t* src, size_t n,
                                                   float scale) {
  const __m256 vs = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_mul_ps(x, vs), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) dst[i] = uint16_t(HalfFormat::encode(HalfFormat::decode(src[i]) * scale));
}

}  // namespace

bool reduceHalf(uint16_t* dst, const uint16_t* a, const uint16_t* b, size_t n, int fn, bool hasPre,
                float pre, bool hasPost, float divisor, bool preA) {
  if (!haveF16c()) return false;
  switch (fn) {
    case 0:
      loop<0>(dst, a, b, n, hasPre, pre, hasPost, divisor, preA);
      break;
    case 1:
      loop<1>(dst, a, b, n, hasPre, pre, hasPost, divisor, preA);
      break;
    case 2:
      loop<2>(dst, a, b, n, hasPre, pre, hasPost, divisor, preA);
      break;
    default:
      loop<3>(dst, a, b, n, hasPre, pre, hasPost, divisor, preA);
      break;
  }
  return true;
}

bool scaleHalf(uint16_t* dst, const uint16_t* src, size_t n, float scale) {
  if (!haveF16c()) return false;
  scaleLoop(dst, src, n, scale);
  return true;
}
#else
bool reduceHalf(uint16_t*, const uint16_t*, const uint16_t*, size_t, int, bool, float, bool, float,
                bool) {
  return false;
}
bool scaleHalf(uint16_t*, const uint16_t*, size_t, float) { return false; }
#endif

void streamCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Up to the destination's first cache line boundary, then whole lines, then the tail.
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (n < head + 64) {
    memcpy(d, s, n);
    return;
  }
  memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t body = n & ~size_t(63);
  for (size_t i = 0; i < body; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  // Non-temporal stores are not ordered with later stores: without the fence a flag set after
  // the copy could be seen before the bytes.
  _mm_sfence();
  memcpy(d + body, s + body, n - body);
#else
  memcpy(dst, src, n);
#endif
}

size_t streamCopyMinBytes() {
  static const size_t min = [] {
    const int64_t v = env::getInt("TUTTI_STREAM_COPY_MIN", int64_t(kStreamCopyMinBytes));
    return v <= 0 ? SIZE_MAX : size_t(v);
  }();
  return min;
}

void copyBig(void* dst, const void* src, size_t n) {
  if (n >= streamCopyMinBytes()) {
    streamCopy(dst, src, n);
  } else {
    memcpy(dst, src, n);
  }
}

}  // namespace tutti::cpu::simd
