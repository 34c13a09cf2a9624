// Host-side element types for the 12 NCCL datatypes. fp16, bf16 and both fp8 formats are
// storage types: every reduction widens them to float, combines, and rounds once on the way
// back (round to nearest even; fp8 saturates to the largest finite value, as CUDA's
// __NV_SATFINITE conversions do).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace tutti::cpu {

// A binary floating-point format narrower than float: expBits/manBits/bias, and whether the
// all-ones exponent encodes inf/NaN (IEEE) or, as in fp8 e4m3 ("fn"), only NaN with an
// all-ones mantissa.
template <int kExpBits, int kManBits, bool kIeeeSpecials, bool kSatFinite>
struct SmallFloat {
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kMaxExpField = (1 << kExpBits) - 1;
  static constexpr uint32_t kSignBit = 1u << (kExpBits + kManBits);
  static constexpr uint32_t kManMask = (1u << kManBits) - 1;

  static double maxFinite() {
    // IEEE: the exponent below all-ones, full mantissa. fn: all-ones exponent, mantissa - 1.
    return kIeeeSpecials
               ? std::ldexp(2.0 - std::ldexp(1.0, -kManBits), kMaxExpField - 1 - kBias)
               : std::ldexp(1.0 + (kManMask - 1) / double(1 << kManBits), kMaxExpField - kBias);
  }

  // The definitions, written for clarity; the fast versions below are checked against them.
  static float decodeReference(uint32_t bits) {
    bool neg = bits & kSignBit;
    uint32_t e = (bits >> kManBits) & kMaxExpField, m = bits & kManMask;
    double v;
    if (kIeeeSpecials && e == uint32_t(kMaxExpField)) {
      v = m ? NAN : INFINITY;
    } else if (!kIeeeSpecials && e == uint32_t(kMaxExpField) && m == kManMask) {
      v = NAN;
    } else if (e == 0) {
      v = std::ldexp(double(m), 1 - kBias - kManBits);
    } else {
      v = std::ldexp(double(m | (1u << kManBits)), int(e) - kBias - kManBits);
    }
    return float(neg ? -v : v);
  }

  static uint32_t encodeReference(float f) {
    uint32_t sign = std::signbit(f) ? kSignBit : 0;
    if (std::isnan(f))
      return sign | (kIeeeSpecials ? (uint32_t(kMaxExpField) << kManBits) | 1u << (kManBits - 1)
                                   : (uint32_t(kMaxExpField) << kManBits) | kManMask);
    double a = std::fabs(double(f));
    if (std::isinf(a)) return kSatFinite ? sign | encodeFinite(maxFinite()) : sign | infBits();
    // Quantise to the format's spacing at a's magnitude (subnormal spacing below the normals);
    // nearbyint rounds half to even in the default rounding mode.
    int e = a == 0 ? 1 - kBias : std::ilogb(a);
    if (e < 1 - kBias) e = 1 - kBias;
    double q = std::ldexp(std::nearbyint(std::ldexp(a, kManBits - e)), e - kManBits);
    if (q > maxFinite()) return sign | (kSatFinite ? encodeFinite(maxFinite()) : infBits());
    return sign | encodeFinite(q);
  }

  // Fast paths on the float's bits: the element loops call these.
  static float decode(uint32_t bits) {
    const uint32_t sign = (bits & kSignBit) << (31 - kExpBits - kManBits);
    const uint32_t e = (bits >> kManBits) & kMaxExpField, m = bits & kManMask;
    uint32_t u;
    if (e == 0) {
      float v = float(m) * kSubnormalScale;  // exact: m < 2^kManBits
      memcpy(&u, &v, 4);
      u |= sign;
    } else if ((kIeeeSpecials && e == uint32_t(kMaxExpField)) ||
               (!kIeeeSpecials && e == uint32_t(kMaxExpField) && m == kManMask)) {
      u = sign | 0x7f800000u | (m ? 0x400000u : 0);  // inf, or a quiet NaN
    } else {
      u = sign | ((e + 127 - kBias) << 23) | (m << (23 - kManBits));
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
  }

  static uint32_t encode(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 31) ? kSignBit : 0;
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) {  // NaN
      return sign | (kIeeeSpecials ? (uint32_t(kMaxExpField) << kManBits) | (1u << (kManBits - 1))
                                   : (uint32_t(kMaxExpField) << kManBits) | kManMask);
    }
    if (a >= (uint32_t(127 + 1 - kBias) << 23)) {  // normal in the target format
      // Round to nearest even on exponent and mantissa together (a carry bumps the exponent).
      constexpr uint32_t shift = 23 - kManBits;
      uint32_t r = (a + (1u << (shift - 1)) - 1 + ((a >> shift) & 1)) >> shift;
      uint32_t out = r - (uint32_t(127 - kBias) << kManBits);
      if (a >= 0x7f800000u || out > kMaxFiniteBits)
        return sign | (kSatFinite ? kMaxFiniteBits : infBits());
      return sign | out;
    }
    // Subnormal (or zero) in the target: scale to units of its spacing, round to even.
    float scaled = std::fabs(f) * kSubnormalInvScale;
    return sign | uint32_t(std::nearbyint(scaled));
  }

 private:
  static constexpr float kSubnormalScale = 1.0f / float(1u << (kBias - 1 + kManBits));
  static constexpr float kSubnormalInvScale = float(1u << (kBias - 1 + kManBits));
  // Largest finite encoding without the sign: IEEE: exponent below all-ones, full mantissa;
  // fn: all-ones exponent with the mantissa one below all-ones.
  static constexpr uint32_t kMaxFiniteBits =
      kIeeeSpecials ? ((uint32_t(kMaxExpField - 1) << kManBits) | kManMask)
                    : ((uint32_t(kMaxExpField) << kManBits) | (kManMask - 1));

 public:
 private:
  static uint32_t infBits() { return uint32_t(kMaxExpField) << kManBits; }
  static uint32_t encodeFinite(double q) {  // q exactly representable, >= 0
    if (q < std::ldexp(1.0, 1 - kBias)) return uint32_t(std::ldexp(q, kBias - 1 + kManBits));
    int e = std::ilogb(q);
    uint32_t m = uint32_t(std::ldexp(q, kManBits - e)) & kManMask;
    return (uint32_t(e + kBias) << kManBits) | m;
  }
};

using HalfFormat = SmallFloat<5, 10, true, false>;
using E4m3Format = SmallFloat<4, 3, false, true>;
using E5m2Format = SmallFloat<5, 2, true, true>;

struct half_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};
struct fp8e4m3_t {
  uint8_t bits;
};
struct fp8e5m2_t {
  uint8_t bits;
};

inline float bf16ToFloat(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline uint16_t floatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                         // nearest even
  return uint16_t(u >> 16);
}

// Accumulation type and the conversions to and from it. Integers accumulate in themselves
// (sums wrap, as on the GPU); floats in float or double; narrow floats in float.
template <typename T>
struct Elem {
  using Acc = T;
  static Acc load(T v) { return v; }
  static T store(Acc v) { return v; }
};
template <>
struct Elem<half_t> {
  using Acc = float;
  static float load(half_t v) { return HalfFormat::decode(v.bits); }
  static half_t store(float v) { return {uint16_t(HalfFormat::encode(v))}; }
};
template <>
struct Elem<bf16_t> {
  using Acc = float;
  static float load(bf16_t v) { return bf16ToFloat(v.bits); }
  static bf16_t store(float v) { return {floatToBf16(v)}; }
};
template <>
struct Elem<fp8e4m3_t> {
  using Acc = float;
  static float load(fp8e4m3_t v) { return E4m3Format::decode(v.bits); }
  static fp8e4m3_t store(float v) { return {uint8_t(E4m3Format::encode(v))}; }
};
template <>
struct Elem<fp8e5m2_t> {
  using Acc = float;
  static float load(fp8e5m2_t v) { return E5m2Format::decode(v.bits); }
  static fp8e5m2_t store(float v) { return {uint8_t(E5m2Format::encode(v))}; }
};

}  // namespace tutti::cpu
