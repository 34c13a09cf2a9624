// Running a case of the correctness matrix on one rank: its buffers (in host memory, or copied
// to GPU memory in the thread's arena), the call, and the check of every output element against
// the oracle (collectives/oracle.h).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/matrix.h"
#include "collectives/oracle.h"
#include "kernels/cpu/elem_value.h"
#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tutti::test {

using namespace oracle;

namespace {

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
  std::string make(const uint8_t* s, size_t sBytes, const uint8_t* r, size_t rBytes, void* strm,
                   size_t offset) {
    stream = strm;
    const size_t need = offset + alignUp(sBytes) + alignUp(rBytes) + kArenaAlign;
    if (offset % kArenaAlign != 0 || need > tArena.bytes) {
      return "needs " + std::to_string(need) + " bytes of GPU memory (offset " +
             std::to_string(offset) + "), this thread reserved " + std::to_string(tArena.bytes) +
             " (reserveDeviceMemory)";
    }
    send = reinterpret_cast<uint8_t*>(tArena.base + offset);
    recv = send + alignUp(sBytes);
    scalar = recv + alignUp(rBytes);
    // The staging of this part of the arena is free: the copies of the case that used it
    // last are done (its check waited for them).
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
  // Brings the receive buffer back in strm's order (after the operation), and waits for it.
  std::string finish(uint8_t* r, size_t rBytes, void* strm) {
    auto s = static_cast<cudaStream_t>(strm);
    std::string e = err("cudaMemcpyAsync",
                        cudaMemcpyAsync(pinnedOf(recv), recv, rBytes, cudaMemcpyDeviceToHost, s));
    if (e.empty()) e = err("cudaStreamSynchronize", cudaStreamSynchronize(s));
    if (e.empty()) memcpy(r, pinnedOf(recv), rBytes);
    return e;
  }
  static void* pinnedOf(void* device) {
    return tArena.pinned + (static_cast<char*>(device) - tArena.base);
  }
#else
  std::string make(const uint8_t*, size_t, const uint8_t*, size_t, void*, size_t) {
    return "this build has no CUDA";
  }
  std::string makeScalar(const uint8_t*) { return "this build has no CUDA"; }
  std::string finish(uint8_t*, size_t, void*) { return "this build has no CUDA"; }
#endif
};

}  // namespace

struct CaseRun::State {
  int rank, n;
  Case c;
  size_t es, sendElems, recvElems, sendBytes, recvBytes;
  bool inPlace;
  Memory mem = Memory::kHost;
  std::unique_ptr<uint8_t[]> sendMem, recvMem;
  uint8_t* send = nullptr;  // this rank's views of the host buffers (in-place: inside recvMem)
  uint8_t* recv = nullptr;
  uint8_t* callSend = nullptr;  // what the call gets: the same, or their GPU copies
  uint8_t* callRecv = nullptr;
  DeviceBuffers dev;
  std::unique_ptr<uint8_t[]> scalar{new uint8_t[8]};
  ncclComm_t opComm = nullptr;  // where op was made, when it is a PreMulSum
  ncclRedOp_t op = ncclSum;
};

CaseRun::CaseRun(int rank, int nranks, const Case& c) : s_(new State) {
  State& s = *s_;
  s.rank = rank;
  s.n = nranks;
  s.c = c;
  s.es = sizeOf(c.dtype);
  const size_t count = c.count, un = size_t(nranks);
  s.sendElems = s.recvElems = count;
  switch (c.coll) {
    case TestColl::kAllGather:
    case TestColl::kGather:
      s.recvElems = count * un;
      break;
    case TestColl::kReduceScatter:
    case TestColl::kScatter:
      s.sendElems = count * un;
      break;
    case TestColl::kAlltoAll:
      s.sendElems = s.recvElems = count * un;
      break;
    default:
      break;
  }
  s.inPlace = c.inPlace && hasInPlace(c.coll);
  s.sendBytes = s.sendElems * s.es + 1;
  s.recvBytes = std::max(s.recvElems, s.sendElems) * s.es + 1;
}

CaseRun::~CaseRun() {
  if (s_->opComm && s_->op >= ncclNumOps) ncclRedOpDestroy(s_->op, s_->opComm);
}

const Case& CaseRun::testCase() const { return s_->c; }

std::string CaseRun::prepare(ncclComm_t comm, Memory mem, void* stream, size_t arenaOffset) {
  State& s = *s_;
  const Case& c = s.c;
  const size_t es = s.es, count = c.count;
  s.mem = mem;
  // One allocation each; in-place layouts put the send buffer inside the receive buffer.
  s.sendMem.reset(new uint8_t[s.sendBytes]);
  s.recvMem.reset(new uint8_t[s.recvBytes]);
  s.recv = s.recvMem.get();
  s.send = s.sendMem.get();
  memset(s.recv, kPoison, s.recvBytes);
  if (s.inPlace) {
    if (c.coll == TestColl::kAllGather)
      s.send = s.recv + size_t(s.rank) * count * es;
    else
      s.send = s.recv;  // AllReduce, Broadcast, Reduce; ReduceScatter below
    if (c.coll == TestColl::kReduceScatter) s.recv = s.send + size_t(s.rank) * count * es;
  }
  for (size_t j = 0; j < s.sendElems; ++j)
    cpu::storeElem(c.dtype, inputValue(c, s.rank, j), s.send + j * es);
  // GPU memory: the same two allocations, same contents, same offsets; the call gets the
  // device addresses and the results come back into recvMem to be checked.
  s.callSend = s.send;
  s.callRecv = s.recv;
  if (mem == Memory::kDevice) {
    std::string err =
        s.dev.make(s.sendMem.get(), s.sendBytes, s.recvMem.get(), s.recvBytes, stream, arenaOffset);
    if (!err.empty()) return c.name() + ": " + err;
    auto at = [&](uint8_t* p) {
      if (p >= s.recvMem.get() && p < s.recvMem.get() + s.recvBytes)
        return s.dev.recv + (p - s.recvMem.get());
      return s.dev.send + (p - s.sendMem.get());
    };
    s.callSend = at(s.send);
    s.callRecv = at(s.recv);
  }
  if (!isReduction(c.coll) || !isPreMul(c.op)) {
    s.op = static_cast<ncclRedOp_t>(isReduction(c.coll) ? c.op : ncclSum);
    return "";
  }
  cpu::storeElem(c.dtype, preScalar(c), s.scalar.get());
  if (!comm) return "";  // the caller's engine takes the scalar (issueWith)
  void* where = s.scalar.get();
  if (mem == Memory::kDevice && c.op == kPreMulDevice) {
    std::string err = s.dev.makeScalar(s.scalar.get());
    if (!err.empty()) return c.name() + ": " + err;
    where = s.dev.scalar;
  }
  ncclResult_t r = ncclRedOpCreatePreMulSum(
      &s.op, where, static_cast<ncclDataType_t>(c.dtype),
      c.op == kPreMulHost ? ncclScalarHostImmediate : ncclScalarDevice, comm);
  if (r != ncclSuccess) return c.name() + ": ncclRedOpCreatePreMulSum: " + ncclGetLastError(comm);
  s.opComm = comm;
  // A host-immediate scalar is copied at creation: changing it now must not matter.
  if (c.op == kPreMulHost) memset(s.scalar.get(), 0, 8);
  return "";
}

std::string CaseRun::issueWith(const CallFn& call) {
  std::string err = call(s_->callSend, s_->callRecv, s_->scalar.get());
  return err.empty() ? "" : s_->c.name() + ": rank " + std::to_string(s_->rank) + ": " + err;
}

ncclResult_t CaseRun::issue(ncclComm_t comm, void* stream) {
  const State& s = *s_;
  const Case& c = s.c;
  const size_t count = c.count;
  const int rank = s.rank, n = s.n;
  uint8_t* send = s.callSend;
  uint8_t* recv = s.callRecv;
  auto dt = static_cast<ncclDataType_t>(c.dtype);
  auto st = static_cast<cudaStream_t>(stream);
  switch (c.coll) {
    case TestColl::kAllReduce:
      return ncclAllReduce(send, recv, count, dt, s.op, comm, st);
    case TestColl::kAllGather:
      return ncclAllGather(send, recv, count, dt, comm, st);
    case TestColl::kReduceScatter:
      return ncclReduceScatter(send, recv, count, dt, s.op, comm, st);
    case TestColl::kBroadcast:
      return ncclBroadcast(send, recv, count, dt, c.root, comm, st);
    case TestColl::kReduce:
      return ncclReduce(send, recv, count, dt, s.op, c.root, comm, st);
    case TestColl::kAlltoAll:
      return ncclAlltoAll(send, recv, count, dt, comm, st);
    case TestColl::kGather:
      return ncclGather(send, recv, count, dt, c.root, comm, st);
    case TestColl::kScatter:
      return ncclScatter(send, recv, count, dt, c.root, comm, st);
    case TestColl::kSendRecv:
      ncclGroupStart();
      ncclSend(send, count, dt, (rank + 1) % n, comm, st);
      ncclRecv(recv, count, dt, (rank + n - 1) % n, comm, st);
      return ncclGroupEnd();
  }
  return ncclInvalidArgument;
}

std::string CaseRun::check(void* stream) {
  State& s = *s_;
  const Case& c = s.c;
  const int rank = s.rank, n = s.n;
  const size_t es = s.es, count = c.count;
  if (s.mem == Memory::kDevice) {
    std::string err = s.dev.finish(s.recvMem.get(), s.recvBytes, stream);
    if (!err.empty()) return c.name() + ": rank " + std::to_string(rank) + ": " + err;
  }
  const uint8_t* recv = s.recv;
  const uint8_t* recvMem = s.recvMem.get();
  auto check = [&](size_t i, const Expect& e) -> std::string {
    const uint8_t* got = recv + i * es;
    return matches(c.dtype, got, e) ? "" : describeMismatch(c, "recvbuff", i, got, e);
  };
  auto untouched = [&]() -> std::string {
    for (size_t i = 0; i < s.recvElems * es; ++i) {
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
        if (rank != c.root) return s.inPlace ? "" : untouched();
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
  if (!s.inPlace && recvMem[s.recvElems * es] != kPoison) {
    return "rank " + std::to_string(rank) + ": " + c.name() + ": wrote past the end of recvbuff";
  }
  return "";
}

size_t caseDeviceBytes(const Case& c, int nranks) {
  const size_t elems = c.count * size_t(nranks) + 1;  // the largest buffer any layout takes
  return 2 * alignUp(elems * sizeOf(c.dtype) + 1) + kArenaAlign;
}

std::string reserveDeviceMemory(const std::vector<Case>& cases, int nranks) {
  size_t most = 0;
  for (const Case& c : cases) most = std::max(most, caseDeviceBytes(c, nranks));
  return reserveDeviceMemory(most);
}

std::string reserveDeviceMemory(size_t most) {
#ifdef TUTTI_HAVE_CUDA
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
  (void)most;
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
  CaseRun run(rank, n, c);
  std::string err = run.prepare(comm, mem, stream);
  if (!err.empty()) return err;
  if (ncclResult_t r = run.issue(comm, stream); r != ncclSuccess) {
    return c.name() + ": returned " + ncclGetErrorString(r) + ": " + ncclGetLastError(comm);
  }
  return run.check(stream);
}

std::string runCaseWith(int rank, int nranks, const Case& c, const CallFn& call) {
  CaseRun run(rank, nranks, c);
  std::string err = run.prepare(nullptr, Memory::kHost, nullptr);
  if (err.empty()) err = run.issueWith(call);
  return err.empty() ? run.check(nullptr) : err;
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
