// The device kernels this build has, by (ncclDataType_t, dev::Fn, dev::Proto).
#pragma once

#include <string>
#include <vector>

namespace tutti::dev {

// The kernel's host-side handle for cudaLaunchKernel, or nullptr when this build has no kernel
// for the datatype (TUTTI_KERNEL_FILTER) or no CUDA.
const void* kernelFor(int dtype, int fn, int proto);
// The kernel of a group's sends and receives past dev::kMaxOps (its parameter a
// dev::DevP2pWork), or nullptr without CUDA.
const void* p2pManyKernel();
// Every kernel this build has (to load them all up front: see DeviceEngine::init).
std::vector<const void*> allKernels();
// The datatypes with kernels, for messages: "all", or e.g. "uint8, float".
std::string builtKernelTypes();

}  // namespace tutti::dev
