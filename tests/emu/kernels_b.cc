// See kernels_a.cc.
#include "kernels/cuda/coll_kernel.cuh"

TUTTI_DEFINE_KERNELS(emu_int64, int64_t)
TUTTI_DEFINE_KERNELS(emu_uint64, uint64_t)
TUTTI_DEFINE_KERNELS(emu_float16, Half)
TUTTI_DEFINE_KERNELS(emu_float, float)
