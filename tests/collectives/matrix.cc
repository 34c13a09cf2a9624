#include "collectives/matrix.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <sstream>

#include "kernels/cpu/elem_value.h"
#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include "runtime/dtype.h"

namespace tutti::test {
namespace {

constexpr uint8_t kPoison = 0xA5;

// A rank thread's GPU memory for its cases (Memory::kDevice), made once by
// reserveDeviceMemory: cudaMalloc and cudaFree may wait for the whole GPU, where another
// rank's kernel may be waiting for this rank's next call.
// Copies go through pinned host memory: a copy from or to pageable memory may make the thread
// wait inside the driver (for its stream, and for staging memory other threads' copies hold)
// while a sibling rank's kernel waits for this thread's next call -- a deadlock no library can
// prevent (NCCL documents the same for cudaMemcpy between ranks sharing a process).
struct DeviceArena {
  char* base = nullptr;
  char* pinned = nullptr;  // host staging of the same size
  size_t bytes = 0;
};
thread_local DeviceArena tArena;

constexpr size_t kArenaAlign = 256;
size_t alignUp(size_t n) { return (n + kArenaAlign - 1) / kArenaAlign * kArenaAlign; }

// GPU copies of a case's buffers, in the thread's arena, moved in stream order on the
// operation's stream.
struct DeviceBuffers {
  uint8_t* send = nullptr;
  uint8_t* recv = nullptr;
  void* scalar = nullptr;
  void* stream = nullptr;
#ifdef TUTTI_HAVE_CUDA
  static std::string err(const char* what, cudaError_t e) {
    return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
  }
  cudaStream_t st() const { return static_cast<cudaStream_t>(stream); }
  std::string make(const uint8_t* s, size_t sBytes, const uint8_t* r, size_t rBytes, void* strm) {
    stream = strm;
    if (alignUp(sBytes) + alignUp(rBytes) + kArenaAlign > tArena.bytes) {
      return "needs " + std::to_string(alignUp(sBytes) + alignUp(rBytes) + kArenaAlign) +
             " bytes of GPU memory, this thread reserved " + std::to_string(tArena.bytes) +
             " (reserveDeviceMemory)";
    }
    send = reinterpret_cast<uint8_t*>(tArena.base);
    recv = send + alignUp(sBytes);
    scalar = recv + alignUp(rBytes);
    // The previous case's copies are done (finish waited), so the staging is free.
    memcpy(pinnedOf(send), s, sBytes);
    memcpy(pinnedOf(recv), r, rBytes);
    return err("cudaMemcpyAsync", cudaMemcpyAsync(send, pinnedOf(send), alignUp(sBytes) + rBytes,
                                                  cudaMemcpyHostToDevice, st()));
  }
  std::string makeScalar(const uint8_t* v) {
    memcpy(pinnedOf(scalar), v, 8);
    return err("cudaMemcpyAsync",
               cudaMemcpyAsync(scalar, pinnedOf(scalar), 8, cudaMemcpyHostToDevice, st()));
  }
  // Brings the receive buffer back once the operation is done, and waits for it.
  std::string finish(uint8_t* r, size_t rBytes) {
    std::string e = err("cudaMemcpyAsync", cudaMemcpyAsync(pinnedOf(recv), recv, rBytes,
                                                           cudaMemcpyDeviceToHost, st()));
    if (e.empty()) e = err("cudaStreamSynchronize", cudaStreamSynchronize(st()));
    if (e.empty()) memcpy(r, pinnedOf(recv), rBytes);
    return e;
  }
  static void* pinnedOf(void* device) {
    return tArena.pinned + (static_cast<char*>(device) - tArena.base);
  }
#else
  std::string make(const uint8_t*, size_t, const uint8_t*, size_t, void*) {
    return "this build has no CUDA";
  }
  std::string makeScalar(const uint8_t*) { return "this build has no CUDA"; }
  std::string finish(uint8_t*, size_t) { return "this build has no CUDA"; }
#endif
};

bool isFloat(int t) {
  return t == ncclFloat16 || t == ncclFloat32 || t == ncclFloat64 || t == ncclBfloat16 ||
         t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}
bool isSigned(int t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64; }
size_t sizeOf(int t) { return tutti::dtypeSize(t); }
// Relative spacing of the format: the tolerance of one final rounding.
double epsOf(int t) {
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
int rangeOf(int t) {
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

uint64_t loadBits(int t, const void* src) {
  uint64_t x = 0;
  memcpy(&x, src, sizeOf(t));
  return x;
}

uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}

// Rank r's input element j for a case.
double inputValue(const Case& c, int r, size_t j) {
  uint64_t h = mix(uint64_t(r) * 1000003u + j * 7919u + uint64_t(c.dtype) * 131u + uint64_t(c.op));
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

// The reduction over ranks of element j, as the type's bit pattern (integers) or value.
struct Expect {
  bool exactBits;
  uint64_t bits;
  double value;
  double tol;
};

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

}  // namespace

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

namespace {

std::string runCaseImpl(ncclComm_t comm, int rank, int n, const Case& c, Memory mem, void* stream,
                        const CallFn* custom) {
  const size_t es = sizeOf(c.dtype), count = c.count, un = size_t(n);
  size_t sendElems = count, recvElems = count;
  switch (c.coll) {
    case TestColl::kAllGather:
    case TestColl::kGather:
      recvElems = count * un;
      break;
    case TestColl::kReduceScatter:
    case TestColl::kScatter:
      sendElems = count * un;
      break;
    case TestColl::kAlltoAll:
      sendElems = recvElems = count * un;
      break;
    default:
      break;
  }
  const bool inPlace = c.inPlace && hasInPlace(c.coll);
  // One allocation; in-place layouts put the send buffer inside the receive buffer.
  std::unique_ptr<uint8_t[]> sendMem(new uint8_t[sendElems * es + 1]);
  std::unique_ptr<uint8_t[]> recvMem(new uint8_t[std::max(recvElems, sendElems) * es + 1]);
  uint8_t* recv = recvMem.get();
  uint8_t* send = sendMem.get();
  memset(recv, kPoison, std::max(recvElems, sendElems) * es + 1);
  if (inPlace) {
    if (c.coll == TestColl::kAllGather)
      send = recv + size_t(rank) * count * es;
    else
      send = recv;  // AllReduce, Broadcast, Reduce; ReduceScatter below
    if (c.coll == TestColl::kReduceScatter) recv = send + size_t(rank) * count * es;
  }
  for (size_t j = 0; j < sendElems; ++j)
    cpu::storeElem(c.dtype, inputValue(c, rank, j), send + j * es);
  // GPU memory: the same two allocations, same contents, same offsets; the call gets the
  // device addresses and the results come back into recvMem to be checked.
  const size_t sendBytes = sendElems * es + 1;
  const size_t recvBytes = std::max(recvElems, sendElems) * es + 1;
  DeviceBuffers dev;
  uint8_t* callSend = send;
  uint8_t* callRecv = recv;
  if (mem == Memory::kDevice) {
    std::string err = dev.make(sendMem.get(), sendBytes, recvMem.get(), recvBytes, stream);
    if (!err.empty()) return c.name() + ": " + err;
    auto at = [&](uint8_t* p) {
      if (p >= recvMem.get() && p < recvMem.get() + recvBytes)
        return dev.recv + (p - recvMem.get());
      return dev.send + (p - sendMem.get());
    };
    callSend = at(send);
    callRecv = at(recv);
  }

  ncclRedOp_t op = ncclSum;
  std::unique_ptr<uint8_t[]> scalar(new uint8_t[8]);
  if (custom) {  // the caller's own engine does the operation
    if (isReduction(c.coll) && (c.op == kPreMulHost || c.op == kPreMulDevice))
      cpu::storeElem(c.dtype, preScalar(c), scalar.get());
    std::string err = (*custom)(callSend, callRecv, scalar.get());
    if (!err.empty()) return c.name() + ": rank " + std::to_string(rank) + ": " + err;
  } else if (isReduction(c.coll)) {
    op = static_cast<ncclRedOp_t>(c.op);
    if (c.op == kPreMulHost || c.op == kPreMulDevice) {
      cpu::storeElem(c.dtype, preScalar(c), scalar.get());
      void* where = scalar.get();
      if (mem == Memory::kDevice && c.op == kPreMulDevice) {
        std::string err = dev.makeScalar(scalar.get());
        if (!err.empty()) return c.name() + ": " + err;
        where = dev.scalar;
      }
      ncclResult_t r = ncclRedOpCreatePreMulSum(
          &op, where, static_cast<ncclDataType_t>(c.dtype),
          c.op == kPreMulHost ? ncclScalarHostImmediate : ncclScalarDevice, comm);
      if (r != ncclSuccess)
        return c.name() + ": ncclRedOpCreatePreMulSum: " + ncclGetLastError(comm);
      // A host-immediate scalar is copied at creation: changing it now must not matter.
      if (c.op == kPreMulHost) memset(scalar.get(), 0, 8);
    }
  }
  auto dt = static_cast<ncclDataType_t>(c.dtype);
  auto st = static_cast<cudaStream_t>(stream);
  ncclResult_t r = ncclSuccess;
  switch (custom ? TestColl(-1) : c.coll) {
    case TestColl::kAllReduce:
      r = ncclAllReduce(callSend, callRecv, count, dt, op, comm, st);
      break;
    case TestColl::kAllGather:
      r = ncclAllGather(callSend, callRecv, count, dt, comm, st);
      break;
    case TestColl::kReduceScatter:
      r = ncclReduceScatter(callSend, callRecv, count, dt, op, comm, st);
      break;
    case TestColl::kBroadcast:
      r = ncclBroadcast(callSend, callRecv, count, dt, c.root, comm, st);
      break;
    case TestColl::kReduce:
      r = ncclReduce(callSend, callRecv, count, dt, op, c.root, comm, st);
      break;
    case TestColl::kAlltoAll:
      r = ncclAlltoAll(callSend, callRecv, count, dt, comm, st);
      break;
    case TestColl::kGather:
      r = ncclGather(callSend, callRecv, count, dt, c.root, comm, st);
      break;
    case TestColl::kScatter:
      r = ncclScatter(callSend, callRecv, count, dt, c.root, comm, st);
      break;
    case TestColl::kSendRecv:
      ncclGroupStart();
      ncclSend(callSend, count, dt, (rank + 1) % n, comm, st);
      ncclRecv(callRecv, count, dt, (rank + n - 1) % n, comm, st);
      r = ncclGroupEnd();
      break;
  }
  if (r == ncclSuccess && mem == Memory::kDevice) {
    std::string err = dev.finish(recvMem.get(), recvBytes);
    if (!err.empty()) return c.name() + ": rank " + std::to_string(rank) + ": " + err;
  }
  if (op >= ncclNumOps) ncclRedOpDestroy(op, comm);
  if (r != ncclSuccess) {
    return c.name() + ": returned " + ncclGetErrorString(r) + ": " + ncclGetLastError(comm);
  }
  auto check = [&](size_t i, const Expect& e) -> std::string {
    const uint8_t* got = recv + i * es;
    return matches(c.dtype, got, e) ? "" : describeMismatch(c, "recvbuff", i, got, e);
  };
  auto untouched = [&]() -> std::string {
    for (size_t i = 0; i < recvElems * es; ++i) {
      if (recvMem[i] != kPoison)
        return c.name() + ": rank " + std::to_string(rank) +
               " is not the root but its recvbuff was written";
    }
    return "";
  };
  const size_t rk = size_t(rank);
  for (size_t i = 0; i < count; ++i) {
    std::string bad;
    switch (c.coll) {
      case TestColl::kAllReduce:
        bad = check(i, reduceOracle(c, n, i));
        break;
      case TestColl::kReduceScatter:
        bad = check(i, reduceOracle(c, n, rk * count + i));
        break;
      case TestColl::kReduce:
        if (rank != c.root) return inPlace ? "" : untouched();
        bad = check(i, reduceOracle(c, n, i));
        break;
      case TestColl::kBroadcast:
        bad = check(i, copied(c, c.root, i));
        break;
      case TestColl::kScatter:
        bad = check(i, copied(c, c.root, rk * count + i));
        break;
      case TestColl::kSendRecv:
        bad = check(i, copied(c, (rank + n - 1) % n, i));
        break;
      case TestColl::kAllGather:
      case TestColl::kAlltoAll:
      case TestColl::kGather:
        if (c.coll == TestColl::kGather && rank != c.root) return untouched();
        for (int q = 0; q < n && bad.empty(); ++q) {
          size_t src = c.coll == TestColl::kAlltoAll ? rk * count + i : i;
          bad = check(size_t(q) * count + i, copied(c, q, src));
        }
        break;
    }
    if (!bad.empty()) return "rank " + std::to_string(rank) + ": " + bad;
  }
  // Nothing may be written past the end of the result.
  if (!inPlace && recvMem[recvElems * es] != kPoison) {
    return "rank " + std::to_string(rank) + ": " + c.name() + ": wrote past the end of recvbuff";
  }
  return "";
}

}  // namespace

std::string reserveDeviceMemory(const std::vector<Case>& cases, int nranks) {
#ifdef TUTTI_HAVE_CUDA
  size_t most = 0;
  for (const Case& c : cases) {
    const size_t elems = c.count * size_t(nranks) + 1;  // the largest buffer any layout takes
    most = std::max(most, 2 * alignUp(elems * sizeOf(c.dtype) + 1) + kArenaAlign);
  }
  if (most <= tArena.bytes) return "";
  releaseDeviceMemory();
  void* p = nullptr;
  if (cudaError_t e = cudaMalloc(&p, most); e != cudaSuccess)
    return std::string("cudaMalloc: ") + cudaGetErrorString(e);
  void* h = nullptr;
  if (cudaError_t e = cudaMallocHost(&h, most); e != cudaSuccess) {
    cudaFree(p);
    return std::string("cudaMallocHost: ") + cudaGetErrorString(e);
  }
  tArena = {static_cast<char*>(p), static_cast<char*>(h), most};
  return "";
#else
  (void)cases;
  (void)nranks;
  return "this build has no CUDA";
#endif
}

void releaseDeviceMemory() {
#ifdef TUTTI_HAVE_CUDA
  if (tArena.base) cudaFree(tArena.base);
  if (tArena.pinned) cudaFreeHost(tArena.pinned);
#endif
  tArena = {};
}

std::string runCase(ncclComm_t comm, int rank, int n, const Case& c, Memory mem, void* stream) {
  return runCaseImpl(comm, rank, n, c, mem, stream, nullptr);
}

std::string runCaseWith(int rank, int nranks, const Case& c, const CallFn& call) {
  return runCaseImpl(nullptr, rank, nranks, c, Memory::kHost, nullptr, &call);
}

std::vector<std::string> runCases(ncclComm_t comm, int rank, int nranks,
                                  const std::vector<Case>& cases, size_t maxReport, Memory mem,
                                  void* stream) {
  std::vector<std::string> bad;
  for (const Case& c : cases) {
    std::string why = runCase(comm, rank, nranks, c, mem, stream);
    if (!why.empty() && bad.size() < maxReport) bad.push_back(why);
  }
  return bad;
}

}  // namespace tutti::test
