// tutti-copy-bw: device-to-device copy bandwidth of this GPU, the yardstick for the GPU
// targets (scripts/device-check). cudaMemcpyAsync of one buffer into another, timed with
// events over many repetitions after a warm-up; prints bytes copied per second (count each
// byte once; the memory moves twice that, a read and a write).
//   tutti-copy-bw [bytes=1G] [reps=20]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "tutti-copy-bw: %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? strtoull(argv[1], nullptr, 0) : (size_t(1) << 30);
  const int reps = argc > 2 ? std::max(1, atoi(argv[2])) : 20;
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, bytes), "cudaMalloc");
  check(cudaMalloc(&b, bytes), "cudaMalloc");
  check(cudaMemset(a, 1, bytes), "cudaMemset");
  cudaStream_t s;
  check(cudaStreamCreate(&s), "cudaStreamCreate");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 3; ++i)
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "copy");
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start, s), "cudaEventRecord");
    check(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    check(cudaEventRecord(stop, s), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2] / 1e3;
  printf("d2d copy: %zu bytes, median of %d: %.3f ms, %.1f GB/s copied (%.1f GB/s read+write)\n",
         bytes, reps, median * 1e3, double(bytes) / median / 1e9, 2 * double(bytes) / median / 1e9);
  cudaFree(a);
  cudaFree(b);
  return 0;
}
