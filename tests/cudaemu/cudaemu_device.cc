// The emulated CUDA runtime (cudaemu.h): the devices' properties, the current device, and
// errors.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>

#include "tests/cudaemu/cudaemu.h"

namespace cudaemu {
namespace {

thread_local cudaError_t tLastError = cudaSuccess;

bool validDevice(int d) { return d >= 0 && d < deviceCount(); }

// Bus 0x10 + the GPU's index among all (not the process's numbering): distinct, and parseable
// back.
void formatBusId(char* out, int len, int d) {
  snprintf(out, size_t(len), "0000:%02x:00.0", 0x10 + device(d).physical);
}

thread_local int tCallDepth = 0;  // entry points this thread is inside
// Left at the thread's exit (a call from a destructor that runs after the thread's own would
// find it gone).
thread_local std::map<std::string, unsigned long>* tCalls = nullptr;

}  // namespace

// The calls that need no context of the current device (cudaSetDevice makes its own; the
// driver's cuLaunchKernel runs in the one this thread's runtime calls made current).
bool needsNoContext(const char* name) {
  static const std::set<std::string> none = {"cudaGetDevice",
                                             "cudaGetDeviceCount",
                                             "cudaSetDevice",
                                             "cudaGetDeviceProperties",
                                             "cudaDeviceGetAttribute",
                                             "cudaDeviceGetPCIBusId",
                                             "cudaDeviceGetByPCIBusId",
                                             "cudaDeviceCanAccessPeer",
                                             "cudaGetErrorName",
                                             "cudaGetErrorString",
                                             "cudaGetLastError",
                                             "cudaPeekAtLastError",
                                             "cudaThreadExchangeStreamCaptureMode",
                                             "cudaGetDriverEntryPointByVersion",
                                             "cuLaunchKernel",
                                             "cuDeviceGet",
                                             "cuDevicePrimaryCtxGetState"};
  return none.count(name) != 0;
}

ApiCall::ApiCall(const char* name) {
  if (tCallDepth++ != 0) return;
  if (!tCalls) tCalls = new std::map<std::string, unsigned long>;
  ++(*tCalls)[name];
  // Any other call works in the current device's context, made if it was not (CUDA's runtime
  // makes it at the first call that needs it).
  if (!needsNoContext(name) && deviceCount() > 0) currentDevice();
}
ApiCall::~ApiCall() { --tCallDepth; }

cudaError_t fail(cudaError_t e) {
  if (e != cudaSuccess) tLastError = e;  // cudaErrorNotReady too, as CUDA's
  return e;
}

bool peerAccessDenied() {
  const char* v = getenv("TUTTI_EMU_NO_PEER_ACCESS");
  return v && *v && strcmp(v, "0") != 0;
}

}  // namespace cudaemu

using namespace cudaemu;

extern "C" {

unsigned long cudaemuThreadCalls(const char* name) {
  if (!tCalls) return 0;
  if (name != nullptr) {
    auto it = tCalls->find(name);
    return it == tCalls->end() ? 0 : it->second;
  }
  unsigned long n = 0;
  for (const auto& [_, count] : *tCalls) n += count;
  return n;
}

int cudaemuContextMade(int d) { return validDevice(d) && device(d).context ? 1 : 0; }

cudaError_t cudaGetLastError(void) {
  CUDAEMU_CALL;
  const cudaError_t e = tLastError;
  tLastError = cudaSuccess;
  return e;
}
cudaError_t cudaPeekAtLastError(void) {
  CUDAEMU_CALL;
  return tLastError;
}

const char* cudaGetErrorName(cudaError_t e) {
  CUDAEMU_CALL;
  switch (e) {
#define NAME(x) \
  case x:       \
    return #x;
    NAME(cudaSuccess)
    NAME(cudaErrorInvalidValue)
    NAME(cudaErrorMemoryAllocation)
    NAME(cudaErrorInvalidConfiguration)
    NAME(cudaErrorLaunchOutOfResources)
    NAME(cudaErrorInvalidDevice)
    NAME(cudaErrorInvalidDeviceFunction)
    NAME(cudaErrorInvalidResourceHandle)
    NAME(cudaErrorNoDevice)
    NAME(cudaErrorNotReady)
    NAME(cudaErrorPeerAccessAlreadyEnabled)
    NAME(cudaErrorPeerAccessUnsupported)
    NAME(cudaErrorHostMemoryAlreadyRegistered)
    NAME(cudaErrorHostMemoryNotRegistered)
    NAME(cudaErrorDeviceUninitialized)
    NAME(cudaErrorMapBufferObjectFailed)
    NAME(cudaErrorStreamCaptureUnsupported)
    NAME(cudaErrorStreamCaptureInvalidated)
    NAME(cudaErrorStreamCaptureUnjoined)
    NAME(cudaErrorStreamCaptureIsolation)
    NAME(cudaErrorStreamCaptureMerge)
    NAME(cudaErrorStreamCaptureUnmatched)
    NAME(cudaErrorStreamCaptureImplicit)
    NAME(cudaErrorStreamCaptureWrongThread)
    NAME(cudaErrorIllegalState)
    NAME(cudaErrorNotSupported)
#undef NAME
    default:
      return "cudaErrorUnknown";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  CUDAEMU_CALL;
  static thread_local char buf[96];
  snprintf(buf, sizeof(buf), "%s (emulated CUDA runtime)", cudaGetErrorName(e));
  return e == cudaSuccess ? "no error" : buf;
}

cudaError_t cudaGetDeviceCount(int* n) {
  CUDAEMU_CALL;
  if (!n) return fail(cudaErrorInvalidValue);
  *n = deviceCount();
  return deviceCount() > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaGetDevice(int* d) {
  CUDAEMU_CALL;
  if (!d) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  *d = selectedDevice();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int d) {
  CUDAEMU_CALL;
  if (!validDevice(d)) return fail(cudaErrorInvalidDevice);
  setCurrentDevice(d);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int d) {
  CUDAEMU_CALL;
  if (!p) return fail(cudaErrorInvalidValue);
  if (!validDevice(d)) return fail(cudaErrorInvalidDevice);
  memset(p, 0, sizeof(*p));
  snprintf(p->name, sizeof(p->name), "tutti emulated GPU %d", d);
  for (int i = 0; i < 16; ++i) p->uuid.bytes[i] = char(0xe0 + (i == 15 ? device(d).physical : i));
  p->totalGlobalMem = size_t(16) << 30;
  p->multiProcessorCount = device(d).sms;
  p->maxThreadsPerBlock = 1024;
  p->warpSize = 32;
  p->major = 9;
  p->minor = 0;
  p->pciBusID = 0x10 + d;
  p->unifiedAddressing = 1;
  p->canMapHostMemory = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int d) {
  CUDAEMU_CALL;
  if (!v) return fail(cudaErrorInvalidValue);
  if (!validDevice(d)) return fail(cudaErrorInvalidDevice);
  switch (a) {
    case cudaDevAttrMultiProcessorCount:
      *v = device(d).sms;
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *v = 1024;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *v = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *v = 0;
      return cudaSuccess;
    case cudaDevAttrUnifiedAddressing:
    case cudaDevAttrCanMapHostMemory:
      *v = 1;
      return cudaSuccess;
    default:
      return fail(cudaErrorInvalidValue);
  }
}

cudaError_t cudaDeviceGetPCIBusId(char* out, int len, int d) {
  CUDAEMU_CALL;
  if (!out || len < 13) return fail(cudaErrorInvalidValue);
  if (!validDevice(d)) return fail(cudaErrorInvalidDevice);
  formatBusId(out, len, d);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetByPCIBusId(int* d, const char* id) {
  CUDAEMU_CALL;
  if (!d || !id) return fail(cudaErrorInvalidValue);
  for (int i = 0; i < deviceCount(); ++i) {
    char buf[32];
    formatBusId(buf, sizeof(buf), i);
    if (strcasecmp(buf, id) == 0) {
      *d = i;
      return cudaSuccess;
    }
  }
  return fail(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceCanAccessPeer(int* can, int d, int peer) {
  CUDAEMU_CALL;
  if (!can) return fail(cudaErrorInvalidValue);
  if (!validDevice(d) || !validDevice(peer)) return fail(cudaErrorInvalidDevice);
  *can = d != peer && !peerAccessDenied();
  return cudaSuccess;
}

cudaError_t cudaDeviceEnablePeerAccess(int peer, unsigned int flags) {
  CUDAEMU_CALL;
  if (flags != 0) return fail(cudaErrorInvalidValue);
  if (!validDevice(peer) || peer == currentDevice() || peer >= 64)
    return fail(cudaErrorInvalidDevice);
  if (peerAccessDenied()) return fail(cudaErrorPeerAccessUnsupported);
  Device& d = device(currentDevice());
  std::lock_guard<std::mutex> lock(d.mu);
  if (d.peerEnabled[peer]) return fail(cudaErrorPeerAccessAlreadyEnabled);
  d.peerEnabled[peer] = true;
  return cudaSuccess;
}

}  // extern "C"
