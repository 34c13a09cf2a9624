// A library preloaded in front of tutti (LD_PRELOAD) that makes some collectives wrong the way a
// faulty library might, so that tests/bench/perf_check_test.sh can show tutti-perf's check
// counts them (a check that passes wrong results measures nothing). TUTTI_WRONG picks how:
//   shift      ncclAllReduce's result moved one element down (a misplaced copy)
//   neighbour  ncclReduceScatter returns the next rank's block (a block taken from a wrong place)
//   rank       ncclAllGather's block of rank 1 holds rank 2's (a wrong peer read)
//   root       ncclBroadcast and ncclReduce run from / to the next rank after the root
//   peer       ncclSend goes two ranks on, ncclRecv takes from two ranks back (every rank alike,
//              so the pairs still meet)
// Host buffers only (the calls have completed when they return).
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nccl.h"

namespace {

size_t sizeOf(ncclDataType_t t) {
  static const size_t kSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  return t >= 0 && t < ncclNumTypes ? kSizes[t] : 1;
}

std::string mode() {
  const char* m = getenv("TUTTI_WRONG");
  return m ? m : "";
}

int ranksOf(ncclComm_t comm) {
  int n = 1;
  ncclCommCount(comm, &n);
  return n;
}

template <class Fn>
Fn real(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

}  // namespace

#define WRONG_EXPORT __attribute__((visibility("default")))

extern "C" {

WRONG_EXPORT ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count,
                                        ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                                        cudaStream_t s) {
  using Fn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t);
  static const Fn fn = real<Fn>("ncclAllReduce");
  ncclResult_t r = fn(send, recv, count, t, op, comm, s);
  if (r == ncclSuccess && mode() == "shift" && count > 1) {
    const size_t es = sizeOf(t);
    memmove(recv, static_cast<char*>(recv) + es, (count - 1) * es);
  }
  return r;
}

WRONG_EXPORT ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count,
                                            ncclDataType_t t, ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t s) {
  using Fn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                              cudaStream_t);
  static const Fn fn = real<Fn>("ncclReduceScatter");
  if (mode() != "neighbour") return fn(send, recv, count, t, op, comm, s);
  int rank = 0;
  ncclCommUserRank(comm, &rank);
  const int n = ranksOf(comm);
  const size_t es = sizeOf(t);
  std::vector<char> all(count * size_t(n) * es);
  ncclResult_t r = ncclAllReduce(send, all.data(), count * size_t(n), t, op, comm, s);
  if (r == ncclSuccess) memcpy(recv, all.data() + size_t((rank + 1) % n) * count * es, count * es);
  return r;
}

WRONG_EXPORT ncclResult_t ncclAllGather(const void* send, void* recv, size_t count,
                                        ncclDataType_t t, ncclComm_t comm, cudaStream_t s) {
  using Fn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  static const Fn fn = real<Fn>("ncclAllGather");
  ncclResult_t r = fn(send, recv, count, t, comm, s);
  const int n = ranksOf(comm);
  if (r == ncclSuccess && mode() == "rank" && n > 2) {
    const size_t b = count * sizeOf(t);
    memcpy(static_cast<char*>(recv) + b, static_cast<char*>(recv) + 2 * b, b);
  }
  return r;
}

WRONG_EXPORT ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count,
                                        ncclDataType_t t, int root, ncclComm_t comm,
                                        cudaStream_t s) {
  using Fn =
      ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  static const Fn fn = real<Fn>("ncclBroadcast");
  const int n = ranksOf(comm);
  return fn(send, recv, count, t, mode() == "root" ? (root + 1) % n : root, comm, s);
}

WRONG_EXPORT ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t t,
                                     ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t s) {
  using Fn = ncclResult_t (*)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int,
                              ncclComm_t, cudaStream_t);
  static const Fn fn = real<Fn>("ncclReduce");
  const int n = ranksOf(comm);
  return fn(send, recv, count, t, op, mode() == "root" ? (root + 1) % n : root, comm, s);
}

WRONG_EXPORT ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer,
                                   ncclComm_t comm, cudaStream_t s) {
  using Fn = ncclResult_t (*)(const void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  static const Fn fn = real<Fn>("ncclSend");
  const int n = ranksOf(comm);
  return fn(send, count, t, mode() == "peer" ? (peer + 1) % n : peer, comm, s);
}

WRONG_EXPORT ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer,
                                   ncclComm_t comm, cudaStream_t s) {
  using Fn = ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  static const Fn fn = real<Fn>("ncclRecv");
  const int n = ranksOf(comm);
  return fn(recv, count, t, mode() == "peer" ? (peer - 1 + n) % n : peer, comm, s);
}

}  // extern "C"
