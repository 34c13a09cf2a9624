// tutti-perf's check of results: see perf_values.h.
#include "bench/perf_values.h"

#include <algorithm>
#include <cmath>

#include "nccl.h"

namespace tutti::perf {
namespace {

uint64_t mix(uint64_t x) {  // a 64-bit finalizer (splitmix64's): every input bit moves all
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Mantissa bits of the floating-point types (0: integers).
int mantissaBits(int dtype) {
  static const int kBits[] = {0, 0, 0, 0, 0, 0, 10, 23, 52, 7, 3, 2};
  return kBits[dtype];
}

// The largest k with +-2^k exact in the type.
int powersOfTwo(int dtype) {
  static const int kMax[] = {6, 7, 30, 31, 62, 63, 15, 127, 1023, 127, 8, 15};
  return kMax[dtype];
}

}  // namespace

size_t exactIntegers(int dtype) {
  switch (dtype) {
    case ncclInt8:
    case ncclUint8:
      return 128;
    case ncclFloat16:
      return 2049;
    case ncclBfloat16:
      return 257;
    case ncclFloat8e4m3:
      return 17;
    case ncclFloat8e5m2:
      return 9;
    default:
      return (size_t(1) << 20) + 1;
  }
}

Inputs::Inputs(int dtype, int op, int nranks) : dtype_(dtype), op_(op), nranks_(nranks) {
  signed_ = dtype != ncclUint8 && dtype != ncclUint32 && dtype != ncclUint64;
  const int64_t top = int64_t(exactIntegers(dtype)) - 1;
  active_ = nranks;
  bound_ = top;
  if (op == ncclSum || op == ncclAvg) {
    active_ = int(std::min<int64_t>(nranks, top));
    bound_ = std::max<int64_t>(1, top / nranks);
  } else if (op == ncclProd) {
    active_ = std::min(nranks, powersOfTwo(dtype));
    bound_ = 2;
  }
}

double Inputs::at(int rank, size_t i) const {
  const uint64_t h = mix(uint64_t(i) + 0x9e3779b97f4a7c15ull * (uint64_t(rank) + 1));
  if (op_ == ncclProd) {
    const double mag = rank < active_ && (h & 3) == 0 ? 2.0 : 1.0;
    return signed_ && (h & 4) ? -mag : mag;
  }
  if (rank >= active_) return 0;
  const uint64_t b = uint64_t(bound_);
  if (signed_ && op_ != ncclAvg) return double(int64_t((h >> 3) % (2 * b + 1)) - bound_);
  return double((h >> 3) % (b + 1));
}

double Inputs::reduced(size_t i, size_t offset) const {
  double acc = at(0, i + offset);
  for (int r = 1; r < nranks_; ++r) {
    const double v = at(r, i + offset);
    if (op_ == ncclSum || op_ == ncclAvg) acc += v;
    if (op_ == ncclProd) acc *= v;
    if (op_ == ncclMax) acc = std::max(acc, v);
    if (op_ == ncclMin) acc = std::min(acc, v);
  }
  if (op_ == ncclAvg) acc = mantissaBits(dtype_) ? acc / nranks_ : std::trunc(acc / nranks_);
  return acc;
}

double Inputs::tolerance(double want) const {
  if (op_ != ncclAvg || !mantissaBits(dtype_)) return 0;
  // Each of nranks inputs scaled by 1/nranks (rounded), the sums rounded: within about
  // 1.5 nranks roundings of the result, every term being of one sign.
  return std::ldexp(std::fabs(want), -mantissaBits(dtype_)) * double(nranks_ + 1) + 1e-300;
}

}  // namespace tutti::perf
