// Device element types and reductions: the GPU twin of kernels/cpu/types.h + reduce.h, with
// the same results bit for bit, NaNs included (the CPU reduce is the tests' oracle). fp16, bf16 and
// fp8 are storage types that accumulate in float per element and round once to nearest even (fp8
// saturating, as __NV_SATFINITE does); integers accumulate in themselves and sums and
// products wrap; floating max/min use the same comparison as the CPU, so NaNs fall the same
// way.
#pragma once

#if !defined(__CUDACC__)
#define TUTTI_DEV_EMULATION 1
#include "kernels/cuda/dev_emu.h"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#include "kernels/cuda/dev_work.h"

#if defined(__CUDACC__)
#define TUTTI_UNROLL _Pragma("unroll")
#else
#define TUTTI_UNROLL
#endif

namespace tutti::dev {

struct Half {
  uint16_t bits;
};
struct Bf16 {
  uint16_t bits;
};
struct E4m3 {
  uint8_t bits;
};
struct E5m2 {
  uint8_t bits;
};

__device__ __forceinline__ uint32_t floatBits(float v) {
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
// The sign bit of v, in bit 31.
__device__ __forceinline__ uint32_t nanSign(float v) { return floatBits(v) & 0x80000000u; }

template <typename T>
struct Elem {
  using Acc = T;
  __device__ static Acc load(T v) { return v; }
  __device__ static T store(Acc v) { return v; }
};
template <>
struct Elem<Half> {
  using Acc = float;
  __device__ static float load(Half v) {
    __half_raw r;
    r.x = v.bits;
    return __half2float(__half(r));
  }
  __device__ static Half store(float v) {
    if (v != v) return {uint16_t(nanSign(v) >> 16 | 0x7e00)};  // the CPU's NaN (types.h)
    __half_raw r = static_cast<__half_raw>(__float2half_rn(v));
    return {r.x};
  }
};
template <>
struct Elem<Bf16> {
  using Acc = float;
  __device__ static float load(Bf16 v) { return __uint_as_float(uint32_t(v.bits) << 16); }
  __device__ static Bf16 store(float v) {
    if (v != v) return {uint16_t((floatBits(v) >> 16) | 0x40)};  // quiet, payload kept
    __nv_bfloat16_raw r = static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(v));
    return {r.x};
  }
};
template <__nv_fp8_interpretation_t kInterp, typename T>
struct Fp8Elem {
  using Acc = float;
  __device__ static float load(T v) {
    __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v.bits), kInterp);
    return __half2float(__half(h));
  }
  __device__ static T store(float v) {
    if (v != v) {  // the CPU's NaN: e4m3 has one (0x7f), e5m2 a quiet one (0x7e); sign kept
      return {uint8_t((nanSign(v) >> 24) | (kInterp == __NV_E4M3 ? 0x7f : 0x7e))};
    }
    return {static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kInterp))};
  }
};
template <>
struct Elem<E4m3> : Fp8Elem<__NV_E4M3, E4m3> {};
template <>
struct Elem<E5m2> : Fp8Elem<__NV_E5M2, E5m2> {};

// One reduction: the binary function F plus NCCL's implied scalings (PreMulSum's scalar on
// each rank's input, Avg's division of the finished sum).
template <typename T, int F>
struct Red {
  using E = Elem<T>;
  using Acc = typename E::Acc;
  bool hasPre = false;
  bool hasPost = false;
  Acc preScalar{};
  // Avg's nranks, in a type that holds it (an int8 Acc would make 128 ranks -128).
  using Div = std::conditional_t<std::is_integral_v<Acc>,
                                 std::conditional_t<std::is_signed_v<Acc>, int64_t, uint64_t>, Acc>;
  Div postDivisor{};

  __device__ static Acc combine(Acc a, Acc b) {
    if constexpr (F == kFnSum) return add(a, b);
    if constexpr (F == kFnProd) return mul(a, b);
    // NaN dropped unless both are (fmax / fmin, as NCCL): kernels/cpu/reduce.h's rule.
    if constexpr (F == kFnMax) return (a < b || a != a) ? b : a;
    if constexpr (F == kFnMin) return (b < a || a != a) ? b : a;
  }
  __device__ Acc pre(Acc v) const { return hasPre ? mul(v, preScalar) : v; }
  __device__ Acc post(Acc v) const { return hasPost ? Acc(Div(v) / postDivisor) : v; }

 private:
  __device__ static Acc add(Acc a, Acc b) {
    if constexpr (std::is_integral_v<Acc>) {
      using U = std::make_unsigned_t<Acc>;
      return Acc(U(a) + U(b));
    } else {
      return a + b;
    }
  }
  __device__ static Acc mul(Acc a, Acc b) {
    if constexpr (std::is_integral_v<Acc>) {
      using U = std::make_unsigned_t<Acc>;
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
      return Acc(U(W(U(a)) * W(U(b))));
    } else {
      return a * b;
    }
  }
};

// What one element of output is made of. a: received data (or the input when nothing is
// received); b: this rank's input when it is combined with a.
enum Mode : int {
  kOpCopy,        // a
  kOpPre,         // pre(a)
  kOpPrePost,     // post(pre(a))
  kOpReduce,      // a op pre(b)
  kOpReducePost,  // post(a op pre(b))
};

template <int M, typename T, int F>
__device__ __forceinline__ T compute(const Red<T, F>& r, T a, T b) {
  using E = Elem<T>;
  if constexpr (M == kOpCopy) {
    return a;
  } else if constexpr (M == kOpPre) {
    return r.hasPre ? E::store(r.pre(E::load(a))) : a;
  } else if constexpr (M == kOpPrePost) {
    return E::store(r.post(r.pre(E::load(a))));
  } else {
    auto v = Red<T, F>::combine(E::load(a), r.pre(E::load(b)));
    if constexpr (M == kOpReducePost) v = r.post(v);
    return E::store(v);
  }
}

// The same on a pack of whole elements held in W (8 or 16 bytes).
template <int M, typename T, int F, typename W>
__device__ __forceinline__ W computePack(const Red<T, F>& r, W a, W b) {
  if constexpr (M == kOpCopy) return a;
  constexpr int kN = sizeof(W) / sizeof(T);
  union U {
    W w;
    T e[kN];
  };
  U ua, ub, out;
  ua.w = a;
  ub.w = b;
  TUTTI_UNROLL
  for (int i = 0; i < kN; ++i) out.e[i] = compute<M>(r, ua.e[i], ub.e[i]);
  return out.w;
}

}  // namespace tutti::dev
