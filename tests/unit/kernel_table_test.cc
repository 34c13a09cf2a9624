// The device kernel table: what the CUDA engine can launch, checked on any machine (no GPU is
// touched; the entries are the kernels' host-side handles).
#include "kernels/cuda/kernel_table.h"

#include <gtest/gtest.h>

#include "kernels/cuda/dev_work.h"

namespace {

using namespace tutti::dev;

TEST(KernelTable, EveryBuiltDatatypeHasAllFunctionsAndBothProtocols) {
#ifndef TUTTI_HAVE_CUDA
  EXPECT_EQ(kernelFor(7, kFnSum, kSimple), nullptr) << "a build without CUDA has no kernels";
  GTEST_SKIP() << "built without CUDA";
#else
  // uint8 is always built: copy-only collectives and send/recv run on it.
  ASSERT_NE(kernelFor(1, kFnSum, kSimple), nullptr);
  const bool all = builtKernelTypes() == "all";
  int built = 0;
  for (int t = 0; t < kNumDtypes; ++t) {
    const bool has = kernelFor(t, kFnSum, kSimple) != nullptr;
    built += has;
    if (all) EXPECT_TRUE(has) << "datatype " << t;
    if (!has) continue;
    for (int f = 0; f < kNumFns; ++f) {
      for (int p = 0; p < kNumProtos; ++p) {
        const void* k = kernelFor(t, f, p);
        EXPECT_NE(k, nullptr) << "datatype " << t << " fn " << f << " proto " << p;
        // Every (fn, proto) is its own instantiation.
        for (int g = 0; g < f; ++g) EXPECT_NE(k, kernelFor(t, g, p));
        if (p > 0) EXPECT_NE(k, kernelFor(t, f, 0));
      }
    }
  }
  EXPECT_EQ(built == kNumDtypes, all) << builtKernelTypes();
#endif
}

TEST(KernelTable, OutOfRangeLookupsFindNothing) {
  EXPECT_EQ(kernelFor(-1, kFnSum, kSimple), nullptr);
  EXPECT_EQ(kernelFor(kNumDtypes, kFnSum, kSimple), nullptr);
  EXPECT_EQ(kernelFor(7, kNumFns, kSimple), nullptr);
  EXPECT_EQ(kernelFor(7, kFnSum, kNumProtos), nullptr);
}

}  // namespace
