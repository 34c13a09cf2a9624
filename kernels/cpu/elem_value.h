// The element type of an NCCL datatype (withElemType: the CPU engine's one dispatch), and one
// element of any datatype written from or read as a double: how tests and tutti-perf fill inputs
// and check results in every type (never the data path, which works in the types).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/types.h"
#include "nccl.h"

namespace tutti::cpu {

// Calls body(T{}) with the element type of datatype t (fp8 e5m2 for anything unknown: callers
// check first).
template <class Body>
decltype(auto) withElemType(int t, Body&& body) {
  switch (t) {
    case ncclInt8:
      return body(int8_t{});
    case ncclUint8:
      return body(uint8_t{});
    case ncclInt32:
      return body(int32_t{});
    case ncclUint32:
      return body(uint32_t{});
    case ncclInt64:
      return body(int64_t{});
    case ncclUint64:
      return body(uint64_t{});
    case ncclFloat16:
      return body(half_t{});
    case ncclFloat32:
      return body(float{});
    case ncclFloat64:
      return body(double{});
    case ncclBfloat16:
      return body(bf16_t{});
    case ncclFloat8e4m3:
      return body(fp8e4m3_t{});
    default:
      return body(fp8e5m2_t{});
  }
}

// v as datatype t at dst (unaligned is fine). Integers truncate toward zero; a negative value
// stored as an unsigned type wraps, as the signed value's bits; narrow floats round as the
// kernels' conversions do.
inline void storeElem(int t, double v, void* dst) {
  withElemType(t, [&](auto zero) {
    using T = decltype(zero);
    T x;
    if constexpr (std::is_integral_v<T>) {
      x = std::is_unsigned_v<T> && v >= 0 ? T(uint64_t(v)) : T(int64_t(v));
    } else if constexpr (std::is_floating_point_v<T>) {
      x = T(v);
    } else {
      x = Elem<T>::store(float(v));
    }
    memcpy(dst, &x, sizeof(T));
  });
}

// The element of datatype t at src as a double (64-bit integers past 2^53 rounded).
inline double loadElem(int t, const void* src) {
  return withElemType(t, [&](auto zero) -> double {
    using T = decltype(zero);
    T x;
    memcpy(&x, src, sizeof(T));
    if constexpr (std::is_arithmetic_v<T>) {
      return double(x);
    } else {
      return double(Elem<T>::load(x));
    }
  });
}

}  // namespace tutti::cpu
