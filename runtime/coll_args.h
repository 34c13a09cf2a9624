// One operation as the runtime carries it from the C API to an engine.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti {

enum class CollKind : int {
  kAllReduce,
  kAllGather,
  kReduceScatter,
  kBroadcast,
  kReduce,
  kSend,
  kRecv
};

// "AllReduce", ... for logs and messages.
inline const char* collKindName(CollKind k) {
  static const char* const kNames[] = {"AllReduce", "AllGather", "ReduceScatter", "Broadcast",
                                       "Reduce",    "Send",      "Recv"};
  const int i = static_cast<int>(k);
  return i >= 0 && i < 7 ? kNames[i] : "?";
}

// A resolved ncclRedOp_t: the binary function plus NCCL's implied scalings.
struct RedOpSpec {
  int fn = 0;                       // cpu::RedFn: sum, prod, max, min
  bool pre = false;                 // ncclRedOpCreatePreMulSum: input * scalar before the sum
  uint8_t scalar[8]{};              // the scalar, as one element of the datatype
  const void* scalarPtr = nullptr;  // ncclScalarDevice: read when the operation runs
  bool post = false;                // ncclAvg: divide the sum by nranks
};

struct CollArgs {
  CollKind kind;
  const char* name;  // the API call, for messages: "ncclAllReduce"
  const void* send;
  void* recv;
  size_t count;  // elements: per rank for AllGather (send) / ReduceScatter (recv)
  int dtype;
  int op;  // the ncclRedOp_t as passed, -1 for non-reductions
  RedOpSpec red;
  int root;                 // root, or peer for send/recv
  void* stream = nullptr;   // cudaStream_t: where an operation on GPU buffers is enqueued
  bool device = false;      // GPU buffers: the CUDA engine runs it
  bool pageLocked = false;  // host buffers of which one is page-locked (the GPU may write it)

  // Whether input and output, `bytes` each (an all-reduce's), share no byte: buffers that
  // overlap in part count as in place.
  bool outOfPlace(size_t bytes) const {
    const auto* in = static_cast<const char*>(send);
    const auto* out = static_cast<const char*>(recv);
    return in + bytes <= out || out + bytes <= in;
  }
};

}  // namespace tutti
