// Host reduction functions: the element-wise work of the host primitives. An op is a binary
// function (sum, prod, max, min) plus two optional scalings that NCCL's ops imply:
//   pre  -- ncclRedOpCreatePreMulSum multiplies each rank's input by a scalar before summing;
//   post -- ncclAvg divides the finished sum by the number of ranks.
// Each element is widened to its accumulation type, combined, and rounded once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/simd.h"
#include "kernels/cpu/types.h"

namespace tutti::cpu {

enum class RedFn : int { kSum, kProd, kMax, kMin };

template <typename T, RedFn F>
struct Reducer {
  using E = Elem<T>;
  using Acc = typename E::Acc;

  bool hasPre = false;
  Acc preScalar{};
  // The receiver scales both operands: senders send their input as it is (the pair and
  // exchange algorithms, where each rank combines its own input with its peer's: pre(a) op
  // pre(b) on both, the same bits whichever rank forms it).
  bool preOnReceive = false;
  bool hasPost = false;
  // Avg's nranks, in a type that holds it (an int8 Acc would make 128 ranks -128).
  using Div = std::conditional_t<std::is_integral_v<Acc>,
                                 std::conditional_t<std::is_signed_v<Acc>, int64_t, uint64_t>, Acc>;
  Div postDivisor{};

  static Acc combine(Acc a, Acc b) {
    if constexpr (F == RedFn::kSum) return add(a, b);
    if constexpr (F == RedFn::kProd) return mul(a, b);
    // Max and Min drop a NaN unless both are NaN (fmax / fmin, as NCCL's kernels): the same
    // result whichever operand holds it, so wherever a rank sits in the ring.
    if constexpr (F == RedFn::kMax) return (a < b || a != a) ? b : a;
    if constexpr (F == RedFn::kMin) return (b < a || a != a) ? b : a;
  }
  Acc pre(Acc v) const { return hasPre ? mul(v, preScalar) : v; }
  bool preIsIdentity() const { return !hasPre || preOnReceive; }
  Acc post(Acc v) const { return hasPost ? Acc(Div(v) / postDivisor) : v; }

  // dst[i] = pre(src[i])
  void preCopy(T* dst, const T* src, size_t n) const {
    if (preIsIdentity()) {
      if (dst != src) memmove(dst, src, n * sizeof(T));
      return;
    }
    if constexpr (std::is_same_v<T, half_t>) {
      if (simd::scaleHalf(reinterpret_cast<uint16_t*>(dst), reinterpret_cast<const uint16_t*>(src),
                          n, preScalar)) {
        return;
      }
    }
    for (size_t i = 0; i < n; ++i) dst[i] = E::store(pre(E::load(src[i])));
  }
  // dst[i] = [post](recvd[i] (op) pre(mine[i])), or pre(recvd[i]) where preOnReceive; dst may
  // alias either input.
  void reduce(T* dst, const T* recvd, const T* mine, size_t n, bool withPost) const {
    const bool preA = hasPre && preOnReceive;
    if constexpr (std::is_same_v<T, half_t>) {
      if (simd::reduceHalf(reinterpret_cast<uint16_t*>(dst),
                           reinterpret_cast<const uint16_t*>(recvd),
                           reinterpret_cast<const uint16_t*>(mine), n, static_cast<int>(F), hasPre,
                           preScalar, withPost && hasPost, postDivisor, preA)) {
        return;
      }
    }
    if (!hasPre && !(withPost && hasPost)) {
      for (size_t i = 0; i < n; ++i)
        dst[i] = E::store(combine(E::load(recvd[i]), E::load(mine[i])));
      return;
    }
    for (size_t i = 0; i < n; ++i) {
      const Acc a = preA ? pre(E::load(recvd[i])) : E::load(recvd[i]);
      Acc v = combine(a, pre(E::load(mine[i])));
      dst[i] = E::store(withPost ? post(v) : v);
    }
  }
  // A single rank's result: dst[i] = post(pre(src[i])).
  void preCopyPost(T* dst, const T* src, size_t n) const {
    for (size_t i = 0; i < n; ++i) dst[i] = E::store(post(pre(E::load(src[i]))));
  }

 private:
  // Integer sums and products wrap modulo 2^bits (unsigned arithmetic, no signed overflow).
  static Acc add(Acc a, Acc b) {
    if constexpr (std::is_integral_v<Acc>) {
      using U = std::make_unsigned_t<Acc>;
      return Acc(U(a) + U(b));
    } else {
      return a + b;
    }
  }
  static Acc mul(Acc a, Acc b) {
    if constexpr (std::is_integral_v<Acc>) {
      using U = std::make_unsigned_t<Acc>;
      using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
      return Acc(U(W(U(a)) * W(U(b))));
    } else {
      return a * b;
    }
  }
};

// Copy-only collectives (AllGather, Broadcast, send/recv) move bytes and never reduce.
struct CopyOnly {
  bool preIsIdentity() const { return true; }
  void preCopy(uint8_t* dst, const uint8_t* src, size_t n) const {
    if (dst != src) memmove(dst, src, n);
  }
  void preCopyPost(uint8_t* dst, const uint8_t* src, size_t n) const { preCopy(dst, src, n); }
  void reduce(uint8_t*, const uint8_t*, const uint8_t*, size_t, bool) const {}
};

}  // namespace tutti::cpu
