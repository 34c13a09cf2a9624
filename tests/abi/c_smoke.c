/* A C program built against tutti's nccl.h and linked with -lnccl (libnccl.so.2 = tutti). */
#include <stdio.h>
#include <string.h>

#include "nccl.h"

#define CHECK(cond)                                                        \
  do {                                                                     \
    if (!(cond)) {                                                         \
      fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #cond, \
              ncclGetLastError(NULL));                                     \
      return 1;                                                            \
    }                                                                      \
  } while (0)

int main(void) {
  int version = 0, count = 0, rank = -1;
  float x = 1.0f;
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.commName = "c-smoke";
  /* tutti reports API level 2.27.7 whichever header the program was built with */
  CHECK(ncclGetVersion(&version) == ncclSuccess && version == 22707);
  CHECK(ncclGetUniqueId(&id) == ncclSuccess);
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclSuccess);
  CHECK(ncclCommCount(comm, &count) == ncclSuccess && count == 1);
  CHECK(ncclCommUserRank(comm, &rank) == ncclSuccess && rank == 0);
  CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, (ncclRedOp_t)42, comm, NULL) == ncclInvalidArgument);
  CHECK(strstr(ncclGetLastError(comm), "reduction op 42") != NULL);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  printf("c_smoke: ok (NCCL API %d)\n", version);
  return 0;
}
