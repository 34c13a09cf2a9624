// tutti-perf's check of results: see perf_values.h.
#include "bench/perf_values.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "nccl.h"

namespace tutti::perf {

InputValues gInputs;

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

double inputValue(int rank, size_t i, int op) {
  if (gInputs.moved) return double((size_t(rank) * 31 + i) % gInputs.modulus);
  // A product of {0, 1, 2} over 3 or more ranks is 0 everywhere, as a buffer of zeros would be:
  // 2 where (r + i) % 3 == 0, else 1 (exact in int8 up to 18 ranks, 2^6).
  if (op == ncclProd) return (size_t(rank) + i) % 3 == 0 ? 2.0 : 1.0;
  return double((size_t(rank) + i) % 3);
}

double reduced(int op, int dtype, int nranks, size_t i, size_t rankOffset) {
  double acc = inputValue(0, i + rankOffset, op);
  for (int r = 1; r < nranks; ++r) {
    double v = inputValue(r, i + rankOffset, op);
    if (op == ncclSum || op == ncclAvg) acc += v;
    if (op == ncclProd) acc *= v;
    if (op == ncclMax) acc = std::max(acc, v);
    if (op == ncclMin) acc = std::min(acc, v);
  }
  if (op == ncclAvg) {
    bool isInt = dtype <= ncclUint64;
    acc = isInt ? std::trunc(acc / nranks) : acc / nranks;
  }
  return acc;
}

double tolerance(int dtype, double expect) {
  static const int kBits[] = {0, 0, 0, 0, 0, 0, 10, 23, 52, 7, 3, 2};
  return kBits[dtype] ? std::ldexp(std::fabs(expect), -kBits[dtype]) + 1e-30 : 0;
}

}  // namespace tutti::perf
