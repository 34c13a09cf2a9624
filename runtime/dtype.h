// Facts about ncclDataType_t / ncclRedOp_t values that every layer needs.
#pragma once

#include <cstddef>

#include "runtime/coll_args.h"

namespace tutti {

size_t dtypeSize(int dtype);  // 0 for an unknown datatype
const char* dtypeName(int dtype);
// "sum", ..., "avg", "premulsum" for a user op (>= ncclNumOps).
const char* redOpName(int op);
// ncclAvg as NCCL computes it: for fp16, bf16, float and double each rank's input is multiplied
// by 1/nranks (rounded to the datatype) before the sum, so partial sums stay in range (a sum of
// 8 fp16 values near 10000 overflowed before its division); integers and fp8 sum, then divide.
RedOpSpec averageSpec(int dtype, int nranks);

}  // namespace tutti
