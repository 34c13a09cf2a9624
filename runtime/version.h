#pragma once

namespace tutti {

// The NCCL API level tutti implements (see bindings/c/include/nccl.h).
inline constexpr int kNcclVersionCode = 22707;
inline constexpr const char* kNcclVersionString = "2.27.7";
inline constexpr int kTuttiVersionCode = 100;  // 0.1.0
inline constexpr const char* kTuttiVersionString = "0.1.0";
#ifdef TUTTI_HAVE_CUDA
inline constexpr const char* kCudaDescription = "built with CUDA";
#else
inline constexpr const char* kCudaDescription = "built without CUDA";
#endif

}  // namespace tutti
