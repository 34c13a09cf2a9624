// The device kernels compiled for the CPU emulation (kernels/cuda/dev_emu.h), in a namespace
// of their own (tests/CMakeLists.txt compiles these files with -Dtutti=tutti_emu), so they
// never meet the library's CUDA kernels at link time.
#include "kernels/cuda/coll_kernel.cuh"

TUTTI_DEFINE_KERNELS(emu_int8, int8_t)
TUTTI_DEFINE_KERNELS(emu_uint8, uint8_t)
TUTTI_DEFINE_P2P_MANY_KERNEL(emu_uint8)
TUTTI_DEFINE_KERNELS(emu_int32, int32_t)
TUTTI_DEFINE_KERNELS(emu_uint32, uint32_t)
