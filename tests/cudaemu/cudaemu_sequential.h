// A simple kernel (no __syncthreads, no __shared__) on the emulated CUDA runtime
// (tests/cudaemu): its blocks' threads run one after another on the stream's worker, in stream
// order, as a host function. For programs of their own kernels, such as the trainer's GPU half
// (examples/trainer/gpu_model.cu), which it runs in CI.
#pragma once

#include <cuda_runtime_api.h>

#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cuda/dev_emu.h"

namespace cudaemu {

// kernel(args...) on `grid` blocks of `block` threads. The arguments are converted to the
// kernel's parameters and held at the call, as a launch takes them.
template <class... Params, class... Args>
cudaError_t launchSequential(cudaStream_t s, unsigned grid, unsigned block,
                             void (*kernel)(Params...), Args&&... args) {
  using Job = std::function<void()>;
  auto* job = new Job([grid, block, kernel,
                       held = std::make_tuple(std::decay_t<Params>(std::forward<Args>(args))...)] {
    for (unsigned b = 0; b < grid; ++b) {
      for (unsigned t = 0; t < block; ++t) {
        tutti::dev::emu::tCtx = tutti::dev::emu::ThreadCtx{{t}, {b}, {block}, nullptr, 0, {grid}};
        std::apply(kernel, held);
      }
    }
  });
  const cudaError_t e = cudaLaunchHostFunc(
      s, [](void* p) { std::unique_ptr<Job>(static_cast<Job*>(p))->operator()(); }, job);
  if (e != cudaSuccess) delete job;
  return e;
}

}  // namespace cudaemu
