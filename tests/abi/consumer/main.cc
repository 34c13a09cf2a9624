#include <nccl.h>
#include <tutti.h>

#include <cstdio>

int main() {
  int v = 0, t = 0;
  if (ncclGetVersion(&v) != ncclSuccess || tuttiGetVersion(&t) != ncclSuccess) return 1;
  std::printf("consumer: NCCL API %d, tutti %d\n", v, t);
  return v == NCCL_VERSION_CODE ? 0 : 1;
}
