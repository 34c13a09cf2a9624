// The streaming copy against memcpy: destinations at every fifth byte across a cache line,
// sources aligned and not, lengths around the head / whole lines / tail boundaries, and that
// no byte outside the destination changes; copyBig on both sides of its threshold.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "kernels/cpu/simd.h"

using namespace tutti::cpu;

namespace {

// Fills with a pattern no shift of itself matches, so a copy off by one byte shows.
void fill(std::vector<unsigned char>& v, unsigned seed) {
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<unsigned char>((i * 131 + seed) % 251);
}

}  // namespace

TEST(StreamCopy, AlignmentsAndLengthsAroundEachBoundaryMatchMemcpy) {
  const size_t lengths[] = {0, 1, 15, 63, 64, 65, 127, 128, 129, 191, 1000, 4096 + 17, 70000};
  std::vector<unsigned char> src(70000 + 256), dst(70000 + 256), want(dst.size());
  fill(src, 7);
  for (size_t len : lengths) {
    for (size_t dOff = 0; dOff < 64; dOff += 5) {
      for (size_t sOff : {size_t(0), size_t(3), size_t(32)}) {
        fill(dst, 99);
        want = dst;
        memcpy(want.data() + dOff, src.data() + sOff, len);
        simd::streamCopy(dst.data() + dOff, src.data() + sOff, len);
        ASSERT_EQ(dst, want) << "length " << len << ", destination offset " << dOff
                             << ", source offset " << sOff;
      }
    }
  }
}

TEST(StreamCopy, CopyBigMatchesMemcpyBelowAndAboveItsThreshold) {
  const size_t min = simd::streamCopyMinBytes();
  std::vector<size_t> lengths{4096};
  // Not where TUTTI_STREAM_COPY_MIN is set very high, or to 0 (never).
  if (min <= (size_t(64) << 20)) lengths.push_back(min + 33);
  for (size_t len : lengths) {
    std::vector<unsigned char> src(len + 1), dst(len + 2, 0xee);
    fill(src, 3);
    simd::copyBig(dst.data() + 1, src.data() + 1, len);
    EXPECT_EQ(memcmp(dst.data() + 1, src.data() + 1, len), 0) << len << " bytes";
    EXPECT_EQ(dst[0], 0xee) << len << " bytes";
    EXPECT_EQ(dst[len + 1], 0xee) << len << " bytes";
  }
}
