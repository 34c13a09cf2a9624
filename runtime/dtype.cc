#include "runtime/dtype.h"

#include "nccl.h"

namespace tutti {

size_t dtypeSize(int t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
    case ncclFloat8e4m3:
    case ncclFloat8e5m2:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      return 0;
  }
}

const char* dtypeName(int t) {
  static const char* kNames[] = {"int8", "uint8", "int32",  "uint32", "int64",   "uint64",
                                 "half", "float", "double", "bf16",   "fp8e4m3", "fp8e5m2"};
  return t >= 0 && t < ncclNumTypes ? kNames[t] : "unknown";
}

const char* redOpName(int op) {
  static const char* kNames[] = {"sum", "prod", "max", "min", "avg"};
  if (op >= ncclNumOps) return "premulsum";
  return op >= 0 ? kNames[op] : "unknown";
}

}  // namespace tutti
