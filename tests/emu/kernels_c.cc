// See kernels_a.cc.
#include "kernels/cuda/coll_kernel.cuh"

TUTTI_DEFINE_KERNELS(emu_double, double)
TUTTI_DEFINE_KERNELS(emu_bfloat16, Bf16)
TUTTI_DEFINE_KERNELS(emu_fp8e4m3, E4m3)
TUTTI_DEFINE_KERNELS(emu_fp8e5m2, E5m2)
