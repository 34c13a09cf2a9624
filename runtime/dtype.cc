#include "runtime/dtype.h"

#include <cstring>

#include "kernels/cpu/types.h"
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

RedOpSpec averageSpec(int dtype, int nranks) {
  RedOpSpec spec;
  spec.fn = ncclSum;
  const double inv = 1.0 / nranks;
  auto put = [&spec](auto v) {
    static_assert(sizeof(v) <= sizeof(spec.scalar));
    memcpy(spec.scalar, &v, sizeof(v));
    spec.pre = true;
  };
  switch (nranks > 1 ? dtype : -1) {
    case ncclFloat16:
      put(cpu::Elem<cpu::half_t>::store(float(inv)));
      break;
    case ncclBfloat16:
      put(cpu::Elem<cpu::bf16_t>::store(float(inv)));
      break;
    case ncclFloat32:
      put(float(inv));
      break;
    case ncclFloat64:
      put(inv);
      break;
    default:  // one rank (a copy), integers, fp8 (1/n in 3 mantissa bits would be far off)
      spec.post = true;
  }
  return spec;
}

}  // namespace tutti
