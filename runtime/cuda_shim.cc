#include "runtime/cuda_shim.h"

#ifdef TUTTI_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "runtime/cuda_scope.h"
#endif

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace tutti::cuda {

#ifdef TUTTI_HAVE_CUDA

namespace {

// Kernels of ranks that share a GPU wait for each other from different streams. CUDA maps
// streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 unless set), and two streams on
// one queue run in order: a caller's stream waiting for rank A's kernel ahead of rank B's kernel
// in the same queue would deadlock A and B. 32 queues (the most) fit 16 ranks per GPU with a
// stream each. Set at load, before the application makes its CUDA context; never overrides a
// value the user chose.
__attribute__((constructor)) void widenDeviceQueues() {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
}

struct Probe {
  int count = 0;
  std::string reason;
};
const Probe& probe() {
  static Probe p = [] {
    Probe r;
    cudaError_t e = cudaGetDeviceCount(&r.count);
    if (e != cudaSuccess) {
      r.count = 0;
      r.reason = cudaGetErrorString(e);
      cudaGetLastError();  // do not leave the error sticky for the application
    } else if (r.count == 0) {
      r.reason = "no CUDA device";
    }
    return r;
  }();
  return p;
}
Status cudaStatus(const char* what, cudaError_t e) {
  return Status(Code::kCudaError, std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace

int deviceCount() { return probe().count; }
std::string unavailableReason() { return probe().reason; }

int currentDevice() {
  if (deviceCount() == 0) return -1;
  int d = -1;
  if (cudaGetDevice(&d) != cudaSuccess) return -1;
  return d;
}

Status setDevice(int device) {
  if (device < 0 || device >= deviceCount()) {
    return invalidArgument("CUDA device " + std::to_string(device) + " does not exist (" +
                           std::to_string(deviceCount()) + " present)");
  }
  cudaError_t e = cudaSetDevice(device);
  return e == cudaSuccess ? Status::Ok() : cudaStatus("cudaSetDevice", e);
}

std::string busId(int device) {
  if (device < 0 || device >= deviceCount()) return "";
  char buf[32] = "";
  if (cudaDeviceGetPCIBusId(buf, sizeof(buf), device) != cudaSuccess) return "";
  return buf;
}

void deviceUuid(int device, unsigned char out[16]) {
  memset(out, 0, 16);
  cudaDeviceProp prop;
  if (device < 0 || device >= deviceCount() ||
      cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  memcpy(out, prop.uuid.bytes, 16);
}

int multiProcessorCount(int device) {
  int sms = 0;
  if (device < 0 || device >= deviceCount() ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

Status deviceMalloc(void** ptr, size_t bytes) {
  cudaError_t e = cudaMalloc(ptr, bytes);
  return e == cudaSuccess ? Status::Ok() : cudaStatus("cudaMalloc", e);
}

Status deviceFree(void* ptr) {
  cudaError_t e = cudaFree(ptr);
  return e == cudaSuccess ? Status::Ok() : cudaStatus("cudaFree", e);
}

PointerKind pointerKind(const void* ptr) {
  if (deviceCount() == 0 || !ptr) return {};
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  if (attr.type == cudaMemoryTypeDevice) return {true, attr.device};
  if (attr.type == cudaMemoryTypeHost) return {false, -1, attr.devicePointer == ptr};
  return {attr.type == cudaMemoryTypeManaged, -1};
}

int streamDevice(void* stream) {
#if CUDART_VERSION >= 12080  // cudaStreamGetDevice is new in CUDA 12.8
  int d = -1;
  if (cudaStreamGetDevice(static_cast<cudaStream_t>(stream), &d) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return d;
#else
  (void)stream;
  return -1;
#endif
}

// The calls below run on the communicator's device, in relaxed capture mode (another thread's
// global-mode capture may be open), with runtime/cuda_scope.h's guards; DeviceGuard also
// clears the error a failed call of ours leaves.

Status streamSynchronize(void* stream, int device) {
  CaptureModeRelaxed relaxed;
  DeviceGuard guard(device);
  const cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status::Ok() : cudaStatus("cudaStreamSynchronize", e);
}

Status copyAsync(void* dst, const void* src, size_t bytes, void* stream, int device) {
  CaptureModeRelaxed relaxed;
  DeviceGuard guard(device);
  const cudaError_t e =
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? Status::Ok() : cudaStatus("cudaMemcpyAsync", e);
}

Status readInStreamOrder(void* dst, const void* src, size_t bytes, void* stream, int device) {
  if (bytes > 8) return invalidArgument("readInStreamOrder: more than 8 bytes");
  CaptureModeRelaxed relaxed;
  DeviceGuard guard(device);
  thread_local void* bounce = nullptr;  // one page-locked word per thread, kept
  cudaError_t e = cudaSuccess;
  if (!bounce) e = cudaHostAlloc(&bounce, 8, cudaHostAllocPortable);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(bounce, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
  if (e != cudaSuccess) return cudaStatus("reading GPU memory", e);
  memcpy(dst, bounce, bytes);
  return Status::Ok();
}

Status captureId(void* stream, unsigned long long* id) {
  *id = 0;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long got = 0;
  const cudaError_t e = cudaStreamGetCaptureInfo(static_cast<cudaStream_t>(stream), &status, &got);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return Status(Code::kCudaError,
                  std::string("cudaStreamGetCaptureInfo: ") + cudaGetErrorString(e));
  }
  if (status == cudaStreamCaptureStatusInvalidated) {
    return Status(Code::kCudaError,
                  "the graph capture on this stream was invalidated already (an operation "
                  "not allowed during capture ran before this call)");
  }
  if (status == cudaStreamCaptureStatusActive) *id = got;
  return Status::Ok();
}

Status captureIdOn(void* stream, int device, unsigned long long* id) {
  CaptureModeRelaxed relaxed;
  DeviceGuard guard(device);
  return captureId(stream, id);
}

void* driverFunction(const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050  // cudaGetDriverEntryPoint is deprecated from then on
  const cudaError_t e = cudaGetDriverEntryPointByVersion(symbol, &fn, 4000, cudaEnableDefault, &q);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(symbol, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return fn;
}

bool contextMade(int device) {
  if (device < 0) return false;
  // Once made, a primary context stays (until the application resets the device): remembered.
  static std::atomic<uint64_t> made{0};
  const uint64_t bit = device < 64 ? 1ull << device : 0;
  if (made.load(std::memory_order_relaxed) & bit) return true;
  using GetFn = CUresult (*)(CUdevice*, int);
  using StateFn = CUresult (*)(CUdevice, unsigned int*, int*);
  static auto* get = reinterpret_cast<GetFn>(driverFunction("cuDeviceGet"));
  static auto* state = reinterpret_cast<StateFn>(driverFunction("cuDevicePrimaryCtxGetState"));
  CUdevice dev = 0;
  unsigned int flags = 0;
  int active = 1;
  if (!get || !state || get(&dev, device) != CUDA_SUCCESS ||
      state(dev, &flags, &active) != CUDA_SUCCESS)
    return true;  // as if it were: the caller goes back to it as before
  if (active) made.fetch_or(bit, std::memory_order_relaxed);
  return active != 0;
}

#else  // !TUTTI_HAVE_CUDA

int deviceCount() { return 0; }
std::string unavailableReason() { return "tutti was built without CUDA"; }
int currentDevice() { return -1; }
Status setDevice(int device) {
  return invalidArgument("CUDA device " + std::to_string(device) +
                         " requested, but tutti was built without CUDA");
}
std::string busId(int) { return ""; }
void deviceUuid(int, unsigned char out[16]) { memset(out, 0, 16); }
int multiProcessorCount(int) { return 0; }
Status deviceMalloc(void**, size_t) {
  return Status(Code::kCudaError, "tutti was built without CUDA");
}
Status deviceFree(void*) { return Status(Code::kCudaError, "tutti was built without CUDA"); }
PointerKind pointerKind(const void*) { return {}; }
int streamDevice(void*) { return -1; }
Status streamSynchronize(void*, int) { return Status::Ok(); }
Status readInStreamOrder(void*, const void*, size_t, void*, int) {
  return Status(Code::kCudaError, "tutti was built without CUDA");
}
Status copyAsync(void*, const void*, size_t, void*, int) {
  return Status(Code::kCudaError, "tutti was built without CUDA");
}
Status captureId(void*, unsigned long long* id) {
  *id = 0;
  return Status::Ok();
}
Status captureIdOn(void*, int, unsigned long long* id) {
  *id = 0;
  return Status::Ok();
}
void* driverFunction(const char*) { return nullptr; }
bool contextMade(int) { return false; }

#endif

}  // namespace tutti::cuda
