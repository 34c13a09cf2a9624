// Scoped CUDA state for the device engine's calls (runtime/device_engine.cc and
// runtime/device_launch.cc): the capture mode, and the current device. CUDA builds only.
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/cuda_shim.h"

namespace tutti {

// Lets this thread make set-up calls while one of its streams is being captured.
class CaptureModeRelaxed {
 public:
  CaptureModeRelaxed() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~CaptureModeRelaxed() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Makes the communicator's device current and gives the caller back its own afterwards.
// (Four per operation: a call to restore what did not change is one CUDA call less each.)
// Not a device whose context this process never made, though: a thread that never chose a
// GPU has device 0 current, and going back to it would make GPU 0's context (cudaSetDevice
// does, since CUDA 12) in every process whose watchdog thread aborts a communicator on
// another GPU. Such a thread keeps the communicator's device.
// A failed call of ours (an event not ready yet, say) leaves CUDA's last error set, which the
// application would take for its own: cleared at the end -- unless the application's own
// error was pending when we began, which stays for it to see (an error either way).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    callersError_ = cudaPeekAtLastError() != cudaSuccess;
    if (cudaGetDevice(&saved_) != cudaSuccess) saved_ = -1;
    if (saved_ != device) {
#if CUDART_VERSION >= 12000  // (before CUDA 12, cudaSetDevice made no context: always back)
      restore_ = cuda::contextMade(saved_);
#else
      restore_ = saved_ >= 0;
#endif
      changed_ = cudaSetDevice(device) == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (changed_ && restore_) cudaSetDevice(saved_);
    if (!callersError_) cudaGetLastError();
  }

 private:
  int saved_ = -1;
  bool changed_ = false;
  bool restore_ = false;  // saved_ is a device this process has a context on
  bool callersError_ = false;
};

}  // namespace tutti
