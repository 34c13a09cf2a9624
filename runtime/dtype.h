// Facts about ncclDataType_t / ncclRedOp_t values that every layer needs.
#pragma once

#include <cstddef>

namespace tutti {

size_t dtypeSize(int dtype);  // 0 for an unknown datatype
const char* dtypeName(int dtype);
// "sum", ..., "avg", "premulsum" for a user op (>= ncclNumOps).
const char* redOpName(int op);

}  // namespace tutti
