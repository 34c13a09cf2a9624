#include "examples/trainer/blas_core.h"

#include <strings.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

// OpenBLAS's, declared weak so that another BLAS links too (it then has none).
extern "C" char* openblas_get_corename(void) __attribute__((weak));

namespace trainer {

CpuVectors cpuVectors() {
  CpuVectors v;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  v.avx = __builtin_cpu_supports("avx");
  v.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  v.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#endif
  return v;
}

std::string betterBlasCore(const std::string& chosen, const CpuVectors& cpu) {
  // OpenBLAS's x86 cores whose kernels predate AVX (its dynamic-arch names).
  static const char* const kNoAvx[] = {"Unknown",  "Katmai",       "Coppermine", "Northwood",
                                       "Prescott", "Banias",       "Atom",       "Core2",
                                       "Penryn",   "Dunnington",   "Nehalem",    "Athlon",
                                       "Opteron",  "Opteron_SSE3", "Barcelona",  "Nano"};
  bool generic = false;
  for (const char* n : kNoAvx) generic = generic || strcasecmp(chosen.c_str(), n) == 0;
  if (!generic) return "";
  if (cpu.avx512) return "SKYLAKEX";
  if (cpu.avx2_fma) return "HASWELL";
  if (cpu.avx) return "SANDYBRIDGE";
  return "";
}

std::string blasCoreName() {
  if (!openblas_get_corename) return "";
  const char* n = openblas_get_corename();
  return n ? n : "";
}

void rerunWithBetterBlas(char** argv) {
  if (getenv("OPENBLAS_CORETYPE") || getenv("TUTTI_TRAIN_BLAS_CHOSE")) return;
  const std::string chosen = blasCoreName();
  const std::string better = betterBlasCore(chosen, cpuVectors());
  if (better.empty()) return;
  // The program's own path, not /proc/self/exe itself: the process takes its name (ps, pgrep,
  // pkill) from the last part of the path it was run by.
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return;  // no /proc: OpenBLAS's kernels, and blasText() says what would be faster
  self[n] = '\0';
  setenv("OPENBLAS_CORETYPE", better.c_str(), 1);
  setenv("TUTTI_TRAIN_BLAS_CHOSE", chosen.c_str(), 1);
  execv(self, argv);
  fprintf(stderr, "tutti-train: could not run again with OPENBLAS_CORETYPE=%s: %m\n",
          better.c_str());
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv("TUTTI_TRAIN_BLAS_CHOSE");
}

std::string blasText() {
  const std::string core = blasCoreName();
  if (core.empty()) return "BLAS: not OpenBLAS";
  std::string s = "BLAS: OpenBLAS, " + core + " kernels";
  const char* chose = getenv("TUTTI_TRAIN_BLAS_CHOSE");
  const char* set = getenv("OPENBLAS_CORETYPE");
  const std::string better = betterBlasCore(core, cpuVectors());  // "": kernels with AVX
  if (chose && set && !better.empty()) {
    s += std::string(" (tutti-train set OPENBLAS_CORETYPE=") + set +
         ", which this OpenBLAS does not take: not a DYNAMIC_ARCH build?)";
  } else if (chose && set) {
    s += std::string(" (tutti-train set OPENBLAS_CORETYPE=") + set +
         ": OpenBLAS took this CPU for " + (*chose ? chose : "an unknown one") +
         ", whose kernels have no AVX; set OPENBLAS_CORETYPE to choose)";
  } else if (set) {
    s += std::string(" (OPENBLAS_CORETYPE=") + set + ")";
  } else if (!better.empty()) {
    s += " (this CPU has AVX; OPENBLAS_CORETYPE=" + better + " would run faster)";
  }
  return s;
}

}  // namespace trainer
