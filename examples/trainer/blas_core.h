// Which CPU kernels the BLAS runs. OpenBLAS picks them when it loads, by the CPU's model
// number, and takes a model it does not know for a generic one: Debian 12's OpenBLAS 0.3.21
// takes family 6 model 207 (a 5th-generation Xeon, common in cloud VMs) for a Prescott and runs
// its SSE3 kernels, three times slower there than its AVX-512 ones. The CPU's feature flags say
// what it can run; OPENBLAS_CORETYPE, read at load, overrides the model's verdict.
#pragma once

#include <string>

namespace trainer {

// The vector extensions this CPU and its OS support (CPUID and XGETBV, as the compiler's
// __builtin_cpu_supports reads them).
struct CpuVectors {
  bool avx = false;
  bool avx2_fma = false;
  bool avx512 = false;  // F, CD, BW, DQ and VL: what OpenBLAS's SkylakeX kernels use
};
CpuVectors cpuVectors();

// The OPENBLAS_CORETYPE to run with where OpenBLAS chose `chosen` (its openblas_get_corename())
// on a CPU with `cpu`: the widest kernels the CPU runs, where OpenBLAS chose a core with no
// AVX kernels at all and the CPU has AVX; "" to keep OpenBLAS's choice (a core it knows, or a
// CPU without AVX).
std::string betterBlasCore(const std::string& chosen, const CpuVectors& cpu);

// OpenBLAS's core ("SkylakeX"); "" where the BLAS is not OpenBLAS.
std::string blasCoreName();

// Called first thing in main, before any thread or communicator: where OPENBLAS_CORETYPE is
// unset and betterBlasCore() names a core, runs this program again (execv of the path
// /proc/self/exe names, the same arguments and environment, so a launcher's rank variables
// stay) with OPENBLAS_CORETYPE set, and TUTTI_TRAIN_BLAS_CHOSE holding OpenBLAS's first choice
// (for blasText(), and so that it is done once). Returns where it did not (or execv failed).
void rerunWithBetterBlas(char** argv);

// One line for the run's header: the BLAS core, and why where tutti-train chose it.
std::string blasText();

}  // namespace trainer
