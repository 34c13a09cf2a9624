// The narrow float formats against their definitions: known bit patterns, every pattern
// round-tripping, round-to-nearest-even ties and fp8 saturation; and wrapping integer ops.
#include "kernels/cpu/types.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/cpu/reduce.h"

using namespace tutti::cpu;

TEST(Types, HalfKnownValuesAndEveryPatternRoundTrips) {
  EXPECT_EQ(HalfFormat::decode(0x3c00), 1.0f);
  EXPECT_EQ(HalfFormat::decode(0xc000), -2.0f);
  EXPECT_EQ(HalfFormat::decode(0x7bff), 65504.0f);
  EXPECT_EQ(HalfFormat::decode(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(HalfFormat::decode(0x7c00)));
  EXPECT_TRUE(std::isnan(HalfFormat::decode(0x7e00)));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if ((b & 0x7c00) == 0x7c00 && (b & 0x3ff)) continue;  // NaNs
    ASSERT_EQ(HalfFormat::encode(HalfFormat::decode(b)), b) << std::hex << b;
  }
  EXPECT_EQ(HalfFormat::encode(1.0f + std::ldexp(1.0f, -11)), 0x3c00u);      // tie -> even
  EXPECT_EQ(HalfFormat::encode(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02u);  // tie -> even
  EXPECT_EQ(HalfFormat::encode(65520.0f), 0x7c00u);                          // overflow -> inf
  EXPECT_EQ(HalfFormat::encode(65519.0f), 0x7bffu);
}

TEST(Types, Bf16EveryPatternRoundTrips) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    if ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) continue;
    ASSERT_EQ(floatToBf16(bf16ToFloat(uint16_t(b))), b) << std::hex << b;
  }
  EXPECT_EQ(floatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80u);  // tie -> even
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(NAN))));
}

TEST(Types, Fp8FormatsKnownValuesSaturationAndRoundTrip) {
  EXPECT_EQ(E4m3Format::decode(0x7e), 448.0f);
  EXPECT_TRUE(std::isnan(E4m3Format::decode(0x7f)));
  EXPECT_EQ(E4m3Format::decode(0x38), 1.0f);
  EXPECT_EQ(E4m3Format::decode(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(E4m3Format::encode(1000.0f), 0x7eu);  // saturates to the largest finite value
  EXPECT_EQ(E4m3Format::encode(-INFINITY), 0xfeu);
  EXPECT_EQ(E5m2Format::decode(0x7b), 57344.0f);
  EXPECT_TRUE(std::isinf(E5m2Format::decode(0x7c)));
  EXPECT_EQ(E5m2Format::decode(0x3c), 1.0f);
  EXPECT_EQ(E5m2Format::encode(1e6f), 0x7bu);
  for (uint32_t b = 0; b < 256; ++b) {
    if ((b & 0x7f) != 0x7f) EXPECT_EQ(E4m3Format::encode(E4m3Format::decode(b)), b) << b;
    if ((b & 0x7c) != 0x7c) EXPECT_EQ(E5m2Format::encode(E5m2Format::decode(b)), b) << b;
  }
}

TEST(Types, ReductionsWidenWrapAndScale) {
  Reducer<int8_t, RedFn::kSum> sum;
  int8_t a[2] = {100, -128}, b[2] = {100, -1}, out[2];
  sum.reduce(out, a, b, 2, false);
  EXPECT_EQ(out[0], int8_t(-56));  // wraps like the hardware
  EXPECT_EQ(out[1], int8_t(127));
  Reducer<half_t, RedFn::kSum> avg;
  avg.hasPost = true;
  avg.postDivisor = 3;
  half_t x[1] = {Elem<half_t>::store(1.0f)}, y[1] = {Elem<half_t>::store(1.0f)}, r[1];
  avg.reduce(r, x, y, 1, true);
  EXPECT_EQ(Elem<half_t>::load(r[0]), HalfFormat::decode(HalfFormat::encode(2.0f / 3)));
  Reducer<float, RedFn::kSum> pre;
  pre.hasPre = true;
  pre.preScalar = 0.5f;
  float p[1] = {4}, q[1] = {6}, o[1];
  pre.reduce(o, p, q, 1, false);  // received partial + 0.5 * own input
  EXPECT_EQ(o[0], 7.0f);
  Reducer<uint32_t, RedFn::kMin> mn;
  uint32_t u[1] = {7}, v[1] = {3}, w[1];
  mn.reduce(w, u, v, 1, false);
  EXPECT_EQ(w[0], 3u);
}

// The fast conversions the element loops use agree with the reference definitions: every
// bit pattern decodes the same, and encoding agrees over every half value, midpoints between
// neighbours (ties), subnormals, overflow and specials.
template <class F>
void expectFastMatchesReference(int bits) {
  for (uint32_t b = 0; b < (1u << bits); ++b) {
    float fast = F::decode(b), ref = F::decodeReference(b);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(fast)) << b;
      continue;
    }
    ASSERT_EQ(fast, ref) << std::hex << b;
    ASSERT_EQ(F::encode(ref), F::encodeReference(ref)) << ref;
  }
  uint32_t x = 12345;
  for (int i = 0; i < 2000000; ++i) {  // random floats of every exponent
    x = x * 1664525u + 1013904223u;
    float f;
    memcpy(&f, &x, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(F::encode(f), F::encodeReference(f)) << f << " bits " << std::hex << x;
  }
  for (uint32_t b = 0; b + 1 < (1u << (bits - 1)); ++b) {  // exact midpoints: ties to even
    float mid = (F::decodeReference(b) + F::decodeReference(b + 1)) / 2;
    if (std::isnan(mid) || std::isinf(mid)) continue;
    ASSERT_EQ(F::encode(mid), F::encodeReference(mid)) << mid;
    ASSERT_EQ(F::encode(-mid), F::encodeReference(-mid)) << -mid;
  }
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-30f, 65520.0f, 448.0f, 464.0f,
                  480.0f, 57344.0f, 61440.0f}) {
    ASSERT_EQ(F::encode(f), F::encodeReference(f)) << f;
  }
}

TEST(Types, FastConversionsMatchTheReference) {
  expectFastMatchesReference<HalfFormat>(16);
  expectFastMatchesReference<E4m3Format>(8);
  expectFastMatchesReference<E5m2Format>(8);
}

// The fp16 scaling (a PreMulSum's or Avg's, before the sum) and the receiver-scaled reduce of
// the two-rank algorithms: the vector loops give the scalar arithmetic's bits, for every
// finite pattern (1001 elements: whole vectors and a tail).
TEST(Types, HalfScalingsGiveTheScalarBits) {
  const float s = Elem<half_t>::load(Elem<half_t>::store(1.0f / 3));
  Reducer<half_t, RedFn::kSum> fn;
  fn.hasPre = true;
  fn.preScalar = s;
  std::vector<half_t> in(1001), out(1001), peer(1001), sum(1001);
  for (uint32_t base = 0; base < 0x10000; base += 1001) {
    for (size_t i = 0; i < in.size(); ++i) {
      uint32_t bits = (base + uint32_t(i)) & 0xffff;
      if ((bits & 0x7c00) == 0x7c00) bits &= 0x83ff;  // inf / NaN: a finite pattern instead
      in[i] = half_t{uint16_t(bits)};
      peer[i] = half_t{uint16_t(bits ^ 0x8123)};
      if ((peer[i].bits & 0x7c00) == 0x7c00) peer[i].bits &= 0x83ff;
    }
    fn.preCopy(out.data(), in.data(), in.size());
    fn.preOnReceive = true;
    fn.reduce(sum.data(), peer.data(), in.data(), in.size(), false);
    fn.preOnReceive = false;
    for (size_t i = 0; i < in.size(); ++i) {
      const float x = HalfFormat::decode(in[i].bits), y = HalfFormat::decode(peer[i].bits);
      ASSERT_EQ(out[i].bits, HalfFormat::encode(x * s)) << "pattern " << in[i].bits;
      ASSERT_EQ(sum[i].bits, HalfFormat::encode(y * s + x * s))
          << "patterns " << peer[i].bits << ", " << in[i].bits;
    }
  }
}
