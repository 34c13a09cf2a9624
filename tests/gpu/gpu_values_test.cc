// Special values through the reductions (label "gpu"; "cudaemu" on the emulated runtime): NaNs
// of every sign and payload, infinities, signed zeros, subnormals, the largest finite values
// (sums past them give inf, or fp8's saturation) and values that round, ties among them -- in
// fp16, bf16, both fp8 formats, float and double, through every op. The correctness matrix
// (collectives/matrix.h) keeps to values every format holds exactly; here the inputs are the
// formats' awkward corners, and each result is checked against what the CPU's own conversions
// (kernels/cpu/types.h) and float arithmetic give for that element.
//
// Two ranks as threads on GPU 0, one all-reduce per dtype x op on device buffers (the kernels:
// Simple, the ring's LL, and LL's gathered all-reduce for a handful of elements) and the same
// call on pageable host buffers (the CPU engine, its SIMD fp16 loops included), in place or out
// of place by turns. A result must be one the path that ran gives for some order of the two
// ranks (where the rounding of a pre-scaled input depends on which rank starts an element's
// chain, each order is allowed; PreMulSum's scalar differs between the ranks) and the same bits
// on both ranks; a NaN must be a NaN, of any sign and payload (a GPU's arithmetic gives its
// canonical NaN, where x86 keeps the operand's).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"
#include "kernels/cpu/types.h"
#include "runtime/dtype.h"

using namespace tutti::test;
namespace cpu = tutti::cpu;

namespace {

// A float format's bit patterns worth meeting: zeros, the subnormal extremes, the smallest
// normal, values about 1 (an ulp above, a half-ulp tie when added to 1), the largest finite
// value and the one below it, infinity and NaNs (quiet, and a signalling one with payload 1),
// each with both signs. For the formats whose top exponent holds inf and NaN (fp16, bf16, float,
// double); fp8 meets every pattern.
std::vector<uint64_t> specialPatterns(int expBits, int mantBits) {
  const uint64_t mant = (uint64_t(1) << mantBits) - 1, top = (uint64_t(1) << expBits) - 1;
  const uint64_t bias = top >> 1, sign = uint64_t(1) << (expBits + mantBits);
  const std::vector<uint64_t> magnitudes = {
      0,
      1,                                                    // the smallest subnormal
      mant,                                                 // the largest subnormal
      mant + 1,                                             // the smallest normal
      bias << mantBits,                                     // 1
      (bias << mantBits) + 1,                               // 1 + ulp
      (bias - mantBits - 1) << mantBits,                    // half an ulp of 1: 1 + it ties
      ((bias + 1) << mantBits) | (mant >> 1),               // about 3
      ((top - 1) << mantBits) | mant,                       // the largest finite
      ((top - 1) << mantBits) | (mant - 1),                 // the one below
      top << mantBits,                                      // inf
      (top << mantBits) | (uint64_t(1) << (mantBits - 1)),  // quiet NaN
      (top << mantBits) | 1,                                // signalling NaN, payload 1
  };
  std::vector<uint64_t> out;
  for (uint64_t m : magnitudes) {
    out.push_back(m);
    out.push_back(m | sign);
  }
  return out;
}

uint64_t mix(uint64_t x) {  // splitmix64's finaliser: the random pairs
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

enum Op { kSum, kProd, kMax, kMin, kAvg, kPreMul };
// Which code reduces: the kernels' ring (Simple, or LL over many steps), their gathered LL
// all-reduce of a few elements (dev::kAlgoGather: the planner gives it the 13-element LL runs
// below; tests/emu's EmuPlan tests hold the planner to that), or the CPU engine.
enum Path { kRing, kGathered, kHostEngine };
const char* opName(int op) {
  static const char* kNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};
  return kNames[op];
}

// One dtype: the CPU's conversions (the reference), the element size, and the inputs.
template <typename CT>
struct Format {
  using E = cpu::Elem<CT>;
  using Acc = typename E::Acc;
  using Bits = std::conditional_t<
      sizeof(CT) == 1, uint8_t,
      std::conditional_t<sizeof(CT) == 2, uint16_t,
                         std::conditional_t<sizeof(CT) == 4, uint32_t, uint64_t>>>;
  static CT of(uint64_t bits) {
    CT v;
    const Bits b = Bits(bits);
    memcpy(&v, &b, sizeof v);
    return v;
  }
  static uint64_t bitsOf(CT v) {
    Bits b;
    memcpy(&b, &v, sizeof b);
    return b;
  }
  static Acc load(uint64_t bits) { return E::load(of(bits)); }
  static uint64_t store(Acc v) { return bitsOf(E::store(v)); }
  static bool isNan(uint64_t bits) {
    const Acc v = load(bits);
    return v != v;
  }
  static Acc combine(int op, Acc a, Acc b) {
    switch (op) {
      case kProd:
        return a * b;
      case kMax:
        return (a < b || a != a) ? b : a;
      case kMin:
        return (b < a || a != a) ? b : a;
      default:
        return a + b;
    }
  }
  // What two ranks holding a and b may get on `path`. pre: the scalars rank 0's and rank 1's
  // inputs are multiplied by first (Avg on fp16 / bf16 / float / double, PreMulSum); post:
  // Avg's division of the finished sum (fp8). A chain's first rank sends its scaled input
  // rounded to the format, the next scales its own in Acc and adds (the ring: either rank may
  // start an element's chain); the gathered all-reduce sums the rounded inputs of both; the CPU
  // engine also has exchanges whose receivers scale both inputs in Acc.
  static std::vector<uint64_t> allowed(int op, uint64_t a, uint64_t b, const Acc* pre, bool post,
                                       Path path) {
    const Acc x = load(a), y = load(b);
    if (pre) {
      const Acc px = x * pre[0], py = y * pre[1], rx = load(store(px)), ry = load(store(py));
      if (path == kGathered) return {store(rx + ry)};
      if (path == kRing) return {store(rx + py), store(ry + px)};
      return {store(rx + py), store(ry + px), store(px + py)};
    }
    if (post) return {store((x + y) / Acc(2))};
    return {store(combine(op, x, y)), store(combine(op, y, x))};
  }
};

// Each rank's inputs for a dtype: every pattern of fp8 against every other; every fp16 / bf16
// pattern against the specials in turn, then against random patterns; for float and double
// the specials against each other, then random pairs. Last for all but fp8, 64 pairs of random
// values in [1, 2) of either sign, whose scaled sums round differently when one input was
// rounded before the sum (which the random pairs, mostly far apart in magnitude, seldom show).
struct Inputs {
  std::vector<uint64_t> a, b;
};
Inputs inputsFor(int dtype) {
  Inputs in;
  auto pair = [&in](uint64_t a, uint64_t b) {
    in.a.push_back(a);
    in.b.push_back(b);
  };
  auto closePairs = [&pair](int expBits, int mantBits) {
    const uint64_t mant = (uint64_t(1) << mantBits) - 1, bias = (uint64_t(1) << (expBits - 1)) - 1;
    const uint64_t sign = uint64_t(1) << (expBits + mantBits);
    for (uint64_t i = 0; i < 64; ++i) {
      const uint64_t r = mix(i + 0x10000), q = mix(r);
      pair((bias << mantBits) | (r & mant) | (r >> 63 ? sign : 0),
           (bias << mantBits) | (q & mant) | (q >> 63 ? sign : 0));
    }
  };
  if (dtype == ncclFloat8e4m3 || dtype == ncclFloat8e5m2) {
    for (uint64_t i = 0; i < 0x10000; ++i) pair(i & 0xff, i >> 8);
    return in;
  }
  if (dtype == ncclFloat16 || dtype == ncclBfloat16) {
    const std::vector<uint64_t> sp =
        dtype == ncclFloat16 ? specialPatterns(5, 10) : specialPatterns(8, 7);
    for (uint64_t j = 0; j < 3; ++j)
      for (uint64_t a = 0; a < 0x10000; ++a) pair(a, sp[(a + 7 * j) % sp.size()]);
    for (uint64_t a = 0; a < 0x10000; ++a) pair(a, mix(a) & 0xffff);
    if (dtype == ncclFloat16)
      closePairs(5, 10);
    else
      closePairs(8, 7);
    return in;
  }
  const bool dbl = dtype == ncclFloat64;
  const std::vector<uint64_t> sp = dbl ? specialPatterns(11, 52) : specialPatterns(8, 23);
  for (uint64_t a : sp)
    for (uint64_t b : sp) pair(a, b);
  for (uint64_t i = 0; i < 4096; ++i) {
    const uint64_t r = mix(i), s = mix(r);
    pair(dbl ? r : r & 0xffffffff, dbl ? s : s & 0xffffffff);
  }
  if (dbl)
    closePairs(11, 52);
  else
    closePairs(8, 23);
  return in;
}

struct Reduction {
  int dtype;
  int op;
  size_t count;   // the inputs' first `count` elements
  bool onDevice;  // device buffers (kernels) or host buffers (the CPU engine)
  bool inPlace;
  bool gathered = false;  // few enough elements for LL's gathered all-reduce
  size_t first = 0;       // where in the inputs its elements start
  Path path() const { return !onDevice ? kHostEngine : gathered ? kGathered : kRing; }
  std::string name() const {
    return std::string(opName(op)) + " on " + std::to_string(count) + " " +
           tutti::dtypeName(dtype) + (onDevice ? ", device buffers" : ", host buffers") +
           (inPlace ? ", in place" : "");
  }
};

std::vector<uint8_t> packed(const std::vector<uint64_t>& bits, size_t first, size_t count,
                            size_t es) {
  std::vector<uint8_t> out(count * es);
  for (size_t i = 0; i < count; ++i) memcpy(&out[i * es], &bits[first + i], es);  // little-endian
  return out;
}

uint64_t unpacked(const std::vector<uint8_t>& bytes, size_t i, size_t es) {
  uint64_t v = 0;
  memcpy(&v, &bytes[i * es], es);
  return v;
}

// "" or the first elements that are wrong (at most 5), with their inputs and what was allowed.
// preScalarBits: rank 0's and rank 1's scalars, or null.
template <typename CT>
std::string check(const Reduction& run, const Inputs& in, const std::vector<uint8_t>& got,
                  const uint64_t* preScalarBits, bool post) {
  using F = Format<CT>;
  typename F::Acc pre[2] = {};
  if (preScalarBits) pre[0] = F::load(preScalarBits[0]), pre[1] = F::load(preScalarBits[1]);
  std::string bad;
  int shown = 0;
  for (size_t e = 0; e < run.count && shown < 5; ++e) {
    const size_t i = run.first + e;
    const uint64_t g = unpacked(got, e, sizeof(CT));
    bool ok = false;
    const std::vector<uint64_t> allowed =
        F::allowed(run.op, in.a[i], in.b[i], preScalarBits ? pre : nullptr, post, run.path());
    for (uint64_t w : allowed) ok = ok || (F::isNan(w) ? F::isNan(g) : g == w);
    if (ok) continue;
    char line[256];
    snprintf(line, sizeof line, "\n  element %zu: %s(0x%llx, 0x%llx) = 0x%llx, expected 0x%llx", i,
             opName(run.op), (unsigned long long)in.a[i], (unsigned long long)in.b[i],
             (unsigned long long)g, (unsigned long long)allowed[0]);
    bad += line;
    for (size_t k = 1; k < allowed.size(); ++k) {
      if (std::find(allowed.begin(), allowed.begin() + long(k), allowed[k]) !=
          allowed.begin() + long(k)) {
        continue;
      }
      snprintf(line, sizeof line, " or 0x%llx", (unsigned long long)allowed[k]);
      bad += line;
    }
    ++shown;
  }
  return bad;
}

std::string checkAny(const Reduction& run, const Inputs& in, const std::vector<uint8_t>& got,
                     const uint64_t* pre, bool post) {
  switch (run.dtype) {
    case ncclFloat16:
      return check<cpu::half_t>(run, in, got, pre, post);
    case ncclBfloat16:
      return check<cpu::bf16_t>(run, in, got, pre, post);
    case ncclFloat8e4m3:
      return check<cpu::fp8e4m3_t>(run, in, got, pre, post);
    case ncclFloat8e5m2:
      return check<cpu::fp8e5m2_t>(run, in, got, pre, post);
    case ncclFloat32:
      return check<float>(run, in, got, pre, post);
    default:
      return check<double>(run, in, got, pre, post);
  }
}

// v in the format (rounded), as a scalar's bits: PreMulSum's on each rank (each rank's own, as
// NCCL lets them be), 0.3 and 1.7, so that pre-scaled inputs round; Avg's implied one, 1/2.
uint64_t scalarBits(int dtype, double v) {
  switch (dtype) {
    case ncclFloat16:
      return Format<cpu::half_t>::store(float(v));
    case ncclBfloat16:
      return Format<cpu::bf16_t>::store(float(v));
    case ncclFloat8e4m3:
      return Format<cpu::fp8e4m3_t>::store(float(v));
    case ncclFloat8e5m2:
      return Format<cpu::fp8e5m2_t>::store(float(v));
    case ncclFloat32:
      return Format<float>::bitsOf(float(v));
    default:
      return Format<double>::bitsOf(v);
  }
}

class GpuSpecialValues : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuSpecialValues, ReductionsOfEveryFloatFormatGiveWhatTheCpuGives) {
  SKIP_WITHOUT_GPU();
  const std::string proto = GetParam();
  ScopedEnv protoEnv("NCCL_PROTO", proto.c_str());
  ScopedEnv timeout("TUTTI_TIMEOUT", "60");
  constexpr int n = 2;
  std::vector<ncclComm_t> comms = initThreads(n);
  ASSERT_EQ(comms.size(), size_t(n));

  std::vector<Reduction> runs;
  std::map<int, Inputs> inputs;  // by dtype
  for (int dtype :
       {ncclFloat16, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2, ncclFloat32, ncclFloat64}) {
    const size_t all = (inputs[dtype] = inputsFor(dtype)).a.size();
    // The few elements of the gathered runs: normal values whose scaled sums round otherwise
    // than the ring's (so that such a run the planner gave the ring fails its PreMulSum in fp16,
    // bf16 and fp8; checked with TUTTI_LL_GATHER_MAX_BYTES=0): fp8's patterns 0x40-0x4c against
    // 0x3a, the pairs in [1, 2) at the end for the others.
    const size_t few = tutti::dtypeSize(dtype) == 1 ? 0x3a40 : all - 13;
    for (int op = kSum; op <= kPreMul; ++op) {
      for (bool dev : {true, false}) {
        const bool inPlace = (op + dev) % 2 == 1;  // each op both ways, each engine both ways
        runs.push_back({dtype, op, all, dev, inPlace});
        // A handful of elements: LL's gathered all-reduce (one step, one channel).
        if (proto == "LL" && dev) runs.push_back({dtype, op, 13, dev, !inPlace, true, few});
      }
    }
  }
  // Device and pinned buffers for the largest run, made here: never while a rank's kernel
  // may wait for another rank's thread (gpu_support.h's RankBuffers says why).
  size_t maxBytes = 0;
  for (const Reduction& r : runs)
    maxBytes = std::max(maxBytes, r.count * tutti::dtypeSize(r.dtype));
  void* dev[n][2] = {};
  void* pinned[n][2] = {};
  cudaStream_t streams[n] = {};
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < 2; ++k) {
      ASSERT_EQ(cudaMalloc(&dev[r][k], maxBytes), cudaSuccess);
      ASSERT_EQ(cudaMallocHost(&pinned[r][k], maxBytes), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), cudaSuccess);
  }

  RankFailures failures;
  size_t failed = 0;  // wrong results so far: each run is checked, whatever those before gave
  for (const Reduction& run : runs) {
    const Inputs& in = inputs[run.dtype];
    const size_t es = tutti::dtypeSize(run.dtype), bytes = run.count * es;
    const bool fp8 = es == 1;
    const uint64_t scalars[n] = {scalarBits(run.dtype, run.op == kAvg ? 0.5 : 0.3),
                                 scalarBits(run.dtype, run.op == kAvg ? 0.5 : 1.7)};
    const bool pre = run.op == kPreMul || (run.op == kAvg && !fp8);
    std::vector<uint8_t> results[n];
    onThreads(n, [&](int r) {
      ncclComm_t comm = comms[size_t(r)];
      const std::string what = run.name() + ", rank " + std::to_string(r);
      ncclRedOp_t op = ncclRedOp_t(run.op == kAvg ? int(ncclAvg) : run.op);
      uint64_t s = scalars[r];
      if (run.op == kPreMul &&
          !failures.ok(r,
                       ncclRedOpCreatePreMulSum(&op, &s, ncclDataType_t(run.dtype),
                                                ncclScalarHostImmediate, comm),
                       comm, "ncclRedOpCreatePreMulSum")) {
        return;
      }
      // Pageable memory for the CPU engine (pinned memory is the kernels' to reach).
      std::vector<uint8_t> mine = packed(r == 0 ? in.a : in.b, run.first, run.count, es),
                           pageable(bytes);
      uint8_t* send = run.onDevice ? static_cast<uint8_t*>(pinned[r][0]) : mine.data();
      uint8_t* recv = run.inPlace    ? send
                      : run.onDevice ? static_cast<uint8_t*>(pinned[r][1])
                                     : pageable.data();
      if (send != mine.data()) memcpy(send, mine.data(), bytes);
      if (!run.inPlace) memset(recv, 0xa5, bytes);  // poison: a NaN-free pattern in every format
      cudaStream_t st = streams[r];
      void* callSend = send;
      void* callRecv = recv;
      if (run.onDevice) {
        callSend = dev[r][0];
        callRecv = run.inPlace ? callSend : dev[r][1];
        EXPECT_EQ(cudaMemcpyAsync(callSend, send, bytes, cudaMemcpyHostToDevice, st), cudaSuccess);
        if (!run.inPlace) {
          EXPECT_EQ(cudaMemcpyAsync(callRecv, recv, bytes, cudaMemcpyHostToDevice, st),
                    cudaSuccess);
        }
      }
      if (failures.ok(
              r,
              ncclAllReduce(callSend, callRecv, run.count, ncclDataType_t(run.dtype), op, comm, st),
              comm, ("ncclAllReduce, " + what).c_str()) &&
          run.onDevice) {
        EXPECT_EQ(cudaMemcpyAsync(recv, callRecv, bytes, cudaMemcpyDeviceToHost, st), cudaSuccess);
      }
      if (cudaStreamSynchronize(st) != cudaSuccess) failures.add(r, what + ": stream failed");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      if (async != ncclSuccess) failures.add(r, what + ": " + ncclGetLastError(comm));
      results[r].assign(recv, recv + bytes);
      if (run.op == kPreMul) ncclRedOpDestroy(op, comm);
    });
    if (failures.list.size() > failed) break;  // a call failed: the rest would wait for it
    const std::string bad =
        checkAny(run, in, results[0], pre ? scalars : nullptr, run.op == kAvg && fp8);
    if (!bad.empty()) failures.add(0, run.name() + ":" + bad);
    if (results[0] != results[1]) {
      size_t i = 0;
      while (i < bytes && results[0][i] == results[1][i]) ++i;
      failures.add(1, run.name() + ": not rank 0's bits, first at byte " + std::to_string(i));
    }
    failed = failures.list.size();
  }
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < 2; ++k) {
      cudaFree(dev[r][k]);
      cudaFreeHost(pinned[r][k]);
    }
    cudaStreamDestroy(streams[r]);
  }
  destroyAll(comms);
  failures.report();
}

INSTANTIATE_TEST_SUITE_P(Protocols, GpuSpecialValues, ::testing::Values("Simple", "LL"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

}  // namespace
