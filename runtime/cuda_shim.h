// The few CUDA runtime calls the host runtime needs, behind functions that also exist in a
// build without CUDA and on a machine without a driver (they then report no devices).
// libtutti links the static CUDA runtime, which opens the driver lazily: nothing here makes
// the library fail to load where libcuda.so is absent.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/status.h"

namespace tutti::cuda {

// Number of usable devices; 0 without CUDA, without a driver or without a GPU.
int deviceCount();
// The calling thread's current device, or -1 when there are no devices.
int currentDevice();
Status setDevice(int device);
// PCI bus id ("0000:3b:00.0") or "" for -1 / no CUDA.
std::string busId(int device);
// The device's UUID (a MIG instance's own, under MIG, where instances of one GPU share a bus
// id) into out[16]; zeros for -1 / no CUDA / an error.
void deviceUuid(int device, unsigned char out[16]);
// The device's streaming multiprocessors (a MIG instance's own); 0 for -1 / no CUDA / an error.
int multiProcessorCount(int device);
// What the runtime says when it has no devices (for logs): "no CUDA driver", etc.
std::string unavailableReason();

Status deviceMalloc(void** ptr, size_t bytes);
Status deviceFree(void* ptr);
// What memory ptr is: device (or managed) memory known to the CUDA runtime, and for device
// memory the GPU it belongs to (-1 otherwise); or page-locked host memory (cudaHostAlloc,
// cudaHostRegister) that kernels reach at the same address (mapped). One runtime query.
struct PointerKind {
  bool device = false;
  int gpu = -1;
  bool mapped = false;
};
PointerKind pointerKind(const void* ptr);
inline bool isDevicePointer(const void* ptr) { return pointerKind(ptr).device; }
// The stream handles that name a default stream (0, cudaStreamLegacy, cudaStreamPerThread)
// rather than one the application made; the legacy ones (0, cudaStreamLegacy) are never
// captured.
inline bool isDefaultStream(const void* stream) { return reinterpret_cast<uintptr_t>(stream) <= 2; }
inline bool isLegacyStream(const void* stream) { return reinterpret_cast<uintptr_t>(stream) <= 1; }
// The GPU a stream the application made belongs to; -1 when CUDA cannot say.
int streamDevice(void* stream);
// Waits, on device's context, for the work queued on stream so far. Allowed while another
// thread captures a graph (relaxed capture mode).
Status streamSynchronize(void* stream, int device);
// cudaMemcpyAsync (cudaMemcpyDefault) on stream, with device current.
Status copyAsync(void* dst, const void* src, size_t bytes, void* stream, int device);
// Reads bytes (at most 8) of GPU memory in stream order on stream, through page-locked memory
// (a copy to pageable memory may wait for the whole GPU), and waits for it.
Status readInStreamOrder(void* dst, const void* src, size_t bytes, void* stream, int device);
// Whether device's primary context exists in this process (made by cudaSetDevice, or by a
// runtime call that works on the device). False for -1; true where the driver cannot say.
bool contextMade(int device);
// The driver's entry point `symbol` (the ABI of CUDA 4.0 on: "cuLaunchKernel" takes a
// CUfunction and a parameter buffer), or null where the driver or the runtime has none.
void* driverFunction(const char* symbol);
// The CUDA graph capture a stream is in: 0 when it captures nothing, else the capture's id.
// A capture already invalidated is an error. A query CUDA allows while the stream captures.
Status captureId(void* stream, unsigned long long* id);
// The same, asked with device current (cudaStreamPerThread names a stream of each device).
Status captureIdOn(void* stream, int device, unsigned long long* id);

}  // namespace tutti::cuda
