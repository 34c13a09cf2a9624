// The smallest tutti program: every rank joins a communicator built from the launcher's
// environment (tutti-run, torchrun, srun, mpirun), reports where it runs, and leaves.
//   tutti-run -n 4 ./tutti-hello          (NCCL_DEBUG=INFO shows the runtime's log)
#include <cstdio>

#include "tutti.h"

int main() {
  ncclComm_t comm = nullptr;
  ncclResult_t rc = tuttiCommInitFromEnv(&comm);
  if (rc != ncclSuccess) {
    fprintf(stderr, "tuttiCommInitFromEnv failed: %s: %s\n", ncclGetErrorString(rc),
            ncclGetLastError(nullptr));
    return 1;
  }
  int rank = -1, nranks = 0, device = -2, version = 0;
  if (ncclCommUserRank(comm, &rank) != ncclSuccess || ncclCommCount(comm, &nranks) != ncclSuccess ||
      ncclCommCuDevice(comm, &device) != ncclSuccess || ncclGetVersion(&version) != ncclSuccess) {
    fprintf(stderr, "query failed: %s\n", ncclGetLastError(comm));
    return 1;
  }
  printf("rank %d of %d joined the communicator (%s), NCCL API level %d\n", rank, nranks,
         device >= 0 ? "GPU rank" : "CPU rank", version);
  // One collective on host memory: every rank contributes its rank number.
  long long sum = rank;
  if (ncclAllReduce(&sum, &sum, 1, ncclInt64, ncclSum, comm, nullptr) != ncclSuccess) {
    fprintf(stderr, "ncclAllReduce failed: %s\n", ncclGetLastError(comm));
    return 1;
  }
  printf("rank %d: AllReduce(sum of ranks) = %lld, expected %d\n", rank, sum,
         nranks * (nranks - 1) / 2);
  if (sum != nranks * (nranks - 1) / 2) return 1;
  if (ncclCommFinalize(comm) != ncclSuccess || ncclCommDestroy(comm) != ncclSuccess) {
    fprintf(stderr, "teardown failed: %s\n", ncclGetLastError(comm));
    return 1;
  }
  return 0;
}
