// Run by kernel_filter_test.sh against a build with TUTTI_KERNEL_FILTER=float on the emulated
// CUDA runtime: two ranks on GPU 0 from one thread. A reduction of a type the build has no
// kernel for is refused at the call, with a message that names the type and the build's
// kernels, and the communicators stay usable: a half broadcast (a copy, whose kernel every
// build has) and a float all-reduce then give the right values.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "nccl.h"

namespace {

int failures = 0;
void check(bool ok, const std::string& what) {
  if (!ok) {
    fprintf(stderr, "kernel filter probe: FAILED: %s\n", what.c_str());
    ++failures;
  }
}

}  // namespace

int main() {
  constexpr int kRanks = 2, kCount = 1000;
  ncclComm_t comms[kRanks];
  int devs[kRanks] = {0, 0};
  if (ncclCommInitAll(comms, kRanks, devs) != ncclSuccess) {
    fprintf(stderr, "ncclCommInitAll: %s\n", ncclGetLastError(nullptr));
    return 1;
  }
  float* bufs[kRanks];
  cudaStream_t streams[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    float host[kCount];
    for (int i = 0; i < kCount; ++i) host[i] = float(r + 1) * float(i % 7);
    check(cudaMalloc(&bufs[r], sizeof(host)) == cudaSuccess, "cudaMalloc");
    check(cudaMemcpy(bufs[r], host, sizeof(host), cudaMemcpyHostToDevice) == cudaSuccess,
          "cudaMemcpy");
    check(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking) == cudaSuccess,
          "cudaStreamCreate");
  }
  check(cudaDeviceSynchronize() == cudaSuccess, "cudaDeviceSynchronize");

  // fp16 has no kernel in this build: refused at the call, on each rank.
  ncclGroupStart();
  for (int r = 0; r < kRanks; ++r) {
    const ncclResult_t res =
        ncclAllReduce(bufs[r], bufs[r], kCount, ncclHalf, ncclSum, comms[r], streams[r]);
    check(res == ncclInvalidUsage, "rank " + std::to_string(r) + ": a half all-reduce returned " +
                                       ncclGetErrorString(res) + ", not ncclInvalidUsage");
    const std::string msg = ncclGetLastError(comms[r]);
    check(msg.find("no device kernel for half (kernels built for: uint8, float; see "
                   "TUTTI_KERNEL_FILTER)") != std::string::npos,
          "rank " + std::to_string(r) + "'s message: " + msg);
  }
  ncclGroupEnd();  // (what it returns after refused calls is NCCL's business; nothing ran)

  // The communicators are intact: a half broadcast of rank 0's first kCount halves (2 * kCount
  // bytes: the first half of its floats), then a float all-reduce.
  auto group = [&](const char* what, auto call) {
    check(ncclGroupStart() == ncclSuccess, "ncclGroupStart");
    for (int r = 0; r < kRanks; ++r) {
      check(call(r) == ncclSuccess,
            "rank " + std::to_string(r) + ": " + what + ": " + ncclGetLastError(comms[r]));
    }
    check(ncclGroupEnd() == ncclSuccess, std::string("ncclGroupEnd: ") + ncclGetLastError(nullptr));
  };
  group("half broadcast", [&](int r) {
    return ncclBroadcast(bufs[r], bufs[r], kCount, ncclHalf, 0, comms[r], streams[r]);
  });
  group("float all-reduce", [&](int r) {
    return ncclAllReduce(bufs[r], bufs[r], kCount, ncclFloat, ncclSum, comms[r], streams[r]);
  });
  for (int r = 0; r < kRanks; ++r) {
    check(cudaStreamSynchronize(streams[r]) == cudaSuccess, "cudaStreamSynchronize");
    float host[kCount];
    check(cudaMemcpy(host, bufs[r], sizeof(host), cudaMemcpyDeviceToHost) == cudaSuccess,
          "cudaMemcpy back");
    // Broadcast: both ranks' first half is rank 0's (i % 7); then summed.
    int wrong = 0;
    for (int i = 0; i < kCount; ++i)
      wrong += host[i] != float(i < kCount / 2 ? 2 : 3) * float(i % 7);
    check(wrong == 0, "rank " + std::to_string(r) + ": " + std::to_string(wrong) + " of " +
                          std::to_string(kCount) + " values wrong");
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comms[r], &async) == ncclSuccess && async == ncclSuccess,
          "rank " + std::to_string(r) + " carries an error");
  }
  for (int r = 0; r < kRanks; ++r) {
    check(ncclCommDestroy(comms[r]) == ncclSuccess, "ncclCommDestroy");
    cudaStreamDestroy(streams[r]);
    cudaFree(bufs[r]);
  }
  if (failures) return 1;
  printf("kernel filter probe: refused half with its message; float and a half copy ran\n");
  return 0;
}
