#include "collectives/matrix.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "collectives/oracle.h"
#include "kernels/cpu/elem_value.h"
#include "runtime/dtype.h"

namespace tutti::test {
namespace oracle {

static bool isFloat(int t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
         t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}
static bool isSigned(int t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }
size_t sizeOf(int t) { return tutti::dtypeSize(t); }
// Relative spacing of the format: the tolerance of one final rounding.
static double epsOf(int t) {
  switch (t) {
    case ncclFloat16:
      return std::ldexp(1.0, -10);
    case ncclBfloat16:
      return std::ldexp(1.0, -7);
    case ncclFloat8e4m3:
      return std::ldexp(1.0, -3);
    case ncclFloat8e5m2:
      return std::ldexp(1.0, -2);
    case ncclFloat32:
      return std::ldexp(1.0, -23);
    default:
      return std::ldexp(1.0, -52);
  }
}
// Largest |input| per type, so that every sum / product in the matrix is exact in it.
static int rangeOf(int t) {
  switch (t) {
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 4;
    case ncclInt8:
    case ncclUint8:
      return 3;
    default:
      return 100;
  }
}

bool isReduction(TestColl c) {
  return c == TestColl::kAllReduce || c == TestColl::kReduceScatter || c == TestColl::kReduce;
}
bool hasRoot(TestColl c) {
  return c == TestColl::kBroadcast || c == TestColl::kReduce || c == TestColl::kGather ||
         c == TestColl::kScatter;
}
bool hasInPlace(TestColl c) {
  return c == TestColl::kAllReduce || c == TestColl::kAllGather || c == TestColl::kReduceScatter ||
         c == TestColl::kBroadcast || c == TestColl::kReduce;
}

static uint64_t loadBits(int t, const void* src) {
  uint64_t x = 0;
  memcpy(&x, src, sizeOf(t));
  return x;
}

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// Rank r's input element j for a case.
double inputValue(const Case& c, int r, size_t j) {
  uint64_t h = mix(uint64_t(r) * 1000003u + j * 7919u + uint64_t(c.dtype) * 131u + uint64_t(c.op) +
                   uint64_t(c.salt) * 0x9e3779b97f4a7c15ull);
  if (isReduction(c.coll) && c.op == ncclProd) {
    static const int kSigned[] = {-1, 1, 2}, kUnsigned[] = {1, 2, 3};
    return (isSigned(c.dtype) || isFloat(c.dtype)) ? kSigned[h % 3] : kUnsigned[h % 3];
  }
  int range = rangeOf(c.dtype);
  if (!isSigned(c.dtype) && !isFloat(c.dtype)) return double(h % uint64_t(range + 1));
  return double(int64_t(h % uint64_t(2 * range + 1)) - range);
}

double preScalar(const Case& c) {
  if (c.op == kPreMulHost) return isFloat(c.dtype) ? 0.5 : 3;
  return 2;  // kPreMulDevice
}

Expect reduceOracle(const Case& c, int nranks, size_t j) {
  Expect e{!isFloat(c.dtype), 0, 0, 0};
  bool pre = c.op == kPreMulHost || c.op == kPreMulDevice;
  int fn = pre ? ncclSum : (c.op == ncclAvg ? ncclSum : c.op);
  if (e.exactBits) {
    // Modular arithmetic in 64 bits, truncated to the type: what wrapping hardware does.
    const size_t bits = sizeOf(c.dtype) * 8;
    auto trunc = [&](uint64_t x) -> int64_t {
      if (bits == 64) return int64_t(x);
      uint64_t m = x & ((uint64_t(1) << bits) - 1);
      if (isSigned(c.dtype) && (m >> (bits - 1))) m |= ~((uint64_t(1) << bits) - 1);
      return int64_t(m);
    };
    uint64_t acc = 0;
    double best = 0;
    for (int r = 0; r < nranks; ++r) {
      int64_t v = int64_t(inputValue(c, r, j));
      if (pre) v = trunc(uint64_t(v) * uint64_t(int64_t(preScalar(c))));
      if (r == 0) {
        acc = uint64_t(v);
        best = double(v);
        continue;
      }
      if (fn == ncclSum) acc = uint64_t(trunc(acc + uint64_t(v)));
      if (fn == ncclProd) acc = uint64_t(trunc(acc * uint64_t(v)));
      if (fn == ncclMax && double(v) > best) best = double(v);
      if (fn == ncclMin && double(v) < best) best = double(v);
    }
    if (fn == ncclMax || fn == ncclMin) acc = uint64_t(int64_t(best));
    int64_t result = trunc(acc);
    if (c.op == ncclAvg) {
      // Integer average: the wrapped sum divided by nranks, truncating, in the type.
      result =
          c.dtype == ncclUint64 ? int64_t(uint64_t(result) / uint64_t(nranks)) : result / nranks;
    }
    uint8_t buf[8];
    cpu::storeElem(c.dtype, 0, buf);
    memcpy(buf, &result, sizeOf(c.dtype));
    e.bits = loadBits(c.dtype, buf);
    return e;
  }
  // ncclAvg on fp16, bf16, float and double, as NCCL: each input times 1/nranks rounded to the
  // type, then the sum (tutti::averageSpec); a rounding per partial sum.
  const bool avgFirst =
      c.op == ncclAvg && nranks > 1 && c.dtype != ncclFloat8e4m3 && c.dtype != ncclFloat8e5m2;
  double inv = 1;
  if (avgFirst) {
    uint8_t buf[8];
    cpu::storeElem(c.dtype, 1.0 / nranks, buf);
    inv = cpu::loadElem(c.dtype, buf);
  }
  double acc = 0, magnitude = 0;
  for (int r = 0; r < nranks; ++r) {
    double v = inputValue(c, r, j) * (pre ? preScalar(c) : 1) * inv;
    magnitude += std::fabs(v);
    if (r == 0) {
      acc = v;
    } else if (fn == ncclSum) {
      acc += v;
    } else if (fn == ncclProd) {
      acc *= v;
    } else if (fn == ncclMax) {
      acc = std::max(acc, v);
    } else {
      acc = std::min(acc, v);
    }
  }
  if (avgFirst) {
    e.tol = nranks * epsOf(c.dtype) * magnitude + 1e-300;
  } else if (c.op == ncclAvg) {
    acc /= nranks;
    e.tol = epsOf(c.dtype) * std::fabs(acc) + 1e-300;
  }
  e.value = acc;
  return e;
}

Expect copied(const Case& c, int r, size_t j) {
  Expect e{!isFloat(c.dtype), 0, 0, 0};
  uint8_t buf[8] = {};
  cpu::storeElem(c.dtype, inputValue(c, r, j), buf);
  if (e.exactBits) {
    e.bits = loadBits(c.dtype, buf);
  } else {
    e.value = cpu::loadElem(c.dtype, buf);
  }
  return e;
}

std::string describeMismatch(const Case& c, const char* what, size_t i, const void* got,
                             const Expect& e) {
  std::ostringstream os;
  os << c.name() << ": " << what << "[" << i << "] = ";
  if (e.exactBits) {
    os << "bits 0x" << std::hex << loadBits(c.dtype, got) << ", expected 0x" << e.bits;
  } else {
    os << cpu::loadElem(c.dtype, got) << ", expected " << e.value << " (tolerance " << e.tol << ")";
  }
  return os.str();
}

bool matches(int dtype, const void* got, const Expect& e) {
  if (e.exactBits) return loadBits(dtype, got) == e.bits;
  double v = cpu::loadElem(dtype, got);
  return std::fabs(v - e.value) <= e.tol;
}

}  // namespace oracle

using namespace oracle;

const char* collName(TestColl c) {
  static const char* kNames[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce",
                                 "AlltoAll",  "Gather",    "Scatter",       "SendRecv"};
  return kNames[static_cast<int>(c)];
}

std::string Case::name() const {
  std::ostringstream os;
  static const char* kTypes[] = {"int8", "uint8", "int32",  "uint32", "int64", "uint64",
                                 "half", "float", "double", "bf16",   "e4m3",  "e5m2"};
  static const char* kOps[] = {"sum", "prod", "max", "min", "avg"};
  os << collName(coll) << " " << kTypes[dtype] << " count " << count;
  if (isReduction(coll)) {
    os << " "
       << (op < ncclNumOps     ? kOps[op]
           : op == kPreMulHost ? "premulsum(host)"
                               : "premulsum(device)");
  }
  if (hasRoot(coll)) os << " root " << root;
  os << (inPlace ? " in-place" : " out-of-place");
  return os.str();
}

std::vector<size_t> matrixCounts(size_t fifoBytes) {
  // 0, 1, odd, more than a whole FIFO even of int8, and 1001 (odd, and not divisible by any
  // of 2..8 ranks except 7).
  return {0, 1, 37, fifoBytes + 1003, 1001};
}

std::vector<Case> matrixCases(int nranks, size_t fifoBytes) {
  std::vector<Case> cases;
  std::vector<size_t> counts = matrixCounts(fifoBytes);
  const int ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg, kPreMulHost, kPreMulDevice};
  size_t k = 0;
  // Every reduction x dtype x op, cycling counts, in-place mode and root alongside.
  for (TestColl coll : {TestColl::kAllReduce, TestColl::kReduceScatter, TestColl::kReduce}) {
    for (int t = 0; t < ncclNumTypes; ++t) {
      for (int op : ops) {
        ++k;
        cases.push_back(
            {coll, t, op, counts[k % counts.size()], (k / 2) % 2 == 1, int(k % size_t(nranks))});
      }
    }
  }
  // Every collective x count x in-place mode, cycling dtypes.
  for (int ci = 0; ci < kNumTestColls; ++ci) {
    auto coll = static_cast<TestColl>(ci);
    for (size_t count : counts) {
      for (bool inPlace : {false, true}) {
        if (inPlace && !hasInPlace(coll)) continue;
        ++k;
        cases.push_back(
            {coll, int(k % ncclNumTypes), ncclSum, count, inPlace, int(k % size_t(nranks))});
      }
    }
  }
  // Every root of every rooted collective, with a count that crosses several slots.
  for (TestColl coll :
       {TestColl::kBroadcast, TestColl::kReduce, TestColl::kGather, TestColl::kScatter}) {
    for (int root = 0; root < nranks; ++root) {
      ++k;
      cases.push_back({coll, int(k % ncclNumTypes), ncclMax, counts[3], root % 2 == 1, root});
    }
  }
  // TUTTI_MATRIX_FILTER=text keeps the cases whose name contains text (to chase one failure).
  if (const char* f = getenv("TUTTI_MATRIX_FILTER"); f && *f) {
    std::vector<Case> kept;
    for (const Case& c : cases)
      if (c.name().find(f) != std::string::npos) kept.push_back(c);
    cases.swap(kept);
  }
  return cases;
}

}  // namespace tutti::test
