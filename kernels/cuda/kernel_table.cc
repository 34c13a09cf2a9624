#include "kernels/cuda/kernel_table.h"

#include "kernels/cuda/dev_work.h"
#include "kernels/cuda/kernel_list.h"  // generated: TUTTI_KERNEL_TYPES(X), X(name, dtype)

#define TUTTI_DECLARE(NAME, DTYPE) void tuttiRegisterKernels_##NAME(void** table);
TUTTI_KERNEL_TYPES(TUTTI_DECLARE)
#undef TUTTI_DECLARE
#ifdef TUTTI_HAVE_P2P_MANY_KERNEL
void* tuttiP2pManyKernel_uint8();
#endif

namespace tutti::dev {
namespace {

struct Table {
  void* k[kNumDtypes][kNumFns * kNumProtos] = {};
  std::string names;
  int count = 0;
  Table() {
#define TUTTI_REGISTER(NAME, DTYPE)                        \
  tuttiRegisterKernels_##NAME(k[DTYPE]);                   \
  names += std::string(names.empty() ? "" : ", ") + #NAME; \
  ++count;
    TUTTI_KERNEL_TYPES(TUTTI_REGISTER)
#undef TUTTI_REGISTER
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

const void* kernelFor(int dtype, int fn, int proto) {
  if (dtype < 0 || dtype >= kNumDtypes || fn < 0 || fn >= kNumFns || proto < 0 ||
      proto >= kNumProtos)
    return nullptr;
  return table().k[dtype][fn * kNumProtos + proto];
}

const void* p2pManyKernel() {
#ifdef TUTTI_HAVE_P2P_MANY_KERNEL
  static const void* k = tuttiP2pManyKernel_uint8();
  return k;
#else
  return nullptr;
#endif
}

std::vector<const void*> allKernels() {
  std::vector<const void*> out;
  if (const void* k = p2pManyKernel()) out.push_back(k);
  for (const auto& row : table().k)
    for (void* k : row)
      if (k) out.push_back(k);
  return out;
}

std::string builtKernelTypes() { return table().count == kNumDtypes ? "all" : table().names; }

}  // namespace tutti::dev
