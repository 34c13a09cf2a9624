#include "emu/emu_launch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "kernels/cuda/coll_kernel.cuh"

#define TUTTI_EMU_TYPES(X)                                                            \
  X(emu_int8, 0)                                                                      \
  X(emu_uint8, 1)                                                                     \
  X(emu_int32, 2) X(emu_uint32, 3) X(emu_int64, 4) X(emu_uint64, 5) X(emu_float16, 6) \
      X(emu_float, 7) X(emu_double, 8) X(emu_bfloat16, 9) X(emu_fp8e4m3, 10) X(emu_fp8e5m2, 11)
#define TUTTI_DECLARE(NAME, DTYPE) void tuttiRegisterKernels_##NAME(void** table);
TUTTI_EMU_TYPES(TUTTI_DECLARE)
#undef TUTTI_DECLARE
void* tuttiP2pManyKernel_emu_uint8();

namespace {

using Kernel = void (*)(tutti::dev::DevArgs);

struct Table {
  void* k[tutti::dev::kNumDtypes][tutti::dev::kNumFns * tutti::dev::kNumProtos] = {};
  Table() {
#define TUTTI_REGISTER(NAME, DTYPE) tuttiRegisterKernels_##NAME(k[DTYPE]);
    TUTTI_EMU_TYPES(TUTTI_REGISTER)
#undef TUTTI_REGISTER
  }
};

}  // namespace

void emuLaunch(int dtype, int fn, int proto, unsigned blocks, unsigned threads, const void* work) {
  static const Table table;
  auto k = reinterpret_cast<Kernel>(table.k[dtype][fn * tutti::dev::kNumProtos + proto]);
  if (!k) {
    fprintf(stderr, "emuLaunch: no kernel for %d/%d/%d\n", dtype, fn, proto);
    abort();
  }
  // Packed as the engine passes it (dev::packArgs), the bytes it does not pass 0xa5: a
  // kernel that reads past them reads garbage, as it would on a GPU.
  auto w = std::make_unique<tutti::dev::DevArgs>();
  memset(static_cast<void*>(w.get()), 0xa5, sizeof(*w));
  tutti::dev::packArgs(*static_cast<const tutti::dev::DevWork*>(work), w.get());
  tutti::dev::emu::launch(blocks, threads, [&] { k(*w); });
}

void emuLaunchP2pMany(unsigned blocks, unsigned threads, const void* work) {
  using ManyKernel = void (*)(tutti::dev::DevP2pWork);
  auto k = reinterpret_cast<ManyKernel>(tuttiP2pManyKernel_emu_uint8());
  // Held by the heap, not the stack: 14 KB per launch beside the threads' own stacks.
  auto w =
      std::make_unique<tutti::dev::DevP2pWork>(*static_cast<const tutti::dev::DevP2pWork*>(work));
  tutti::dev::emu::launch(blocks, threads, [&] { k(*w); });
}
