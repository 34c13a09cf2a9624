// The emulated CUDA runtime (cudaemu.h): device and page-locked memory, what a pointer is,
// IPC handles, and copies and sets.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "tests/cudaemu/cudaemu.h"

namespace cudaemu {
namespace {

enum class Kind { kDevice, kHostAlloc, kHostRegistered, kIpcOpened };

struct Alloc {
  size_t bytes = 0;
  Kind kind = Kind::kDevice;
  int device = 0;
  int fd = -1;  // device memory: the memfd it lives in
};

// Handles given out by cudaIpcGetMemHandle.
constexpr uint64_t kIpcMagic = 0x7475747469656d75ull;  // "tuttiemu"
struct IpcHandle {
  uint64_t magic;
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
  int32_t device;
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t));

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, Alloc> allocs;  // by base address
};
Memory& memory() {
  static Memory* m = new Memory;  // never destroyed (workers may run at exit)
  return *m;
}

// The allocation holding p, or end().
std::map<uintptr_t, Alloc>::iterator find(const void* p) {
  auto& a = memory().allocs;
  const auto u = reinterpret_cast<uintptr_t>(p);
  auto it = a.upper_bound(u);
  if (it == a.begin()) return a.end();
  --it;
  return u < it->first + it->second.bytes ? it : a.end();
}

size_t pages(size_t bytes) {
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

bool isPageable(const void* p) {
  std::lock_guard<std::mutex> lock(memory().mu);
  return find(p) == memory().allocs.end();
}

cudaError_t hostAlloc(void** p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  void* m = nullptr;
  if (posix_memalign(&m, 4096, pages(bytes ? bytes : 1)) != 0) return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(memory().mu);
  memory().allocs[reinterpret_cast<uintptr_t>(m)] =
      Alloc{bytes ? bytes : 1, Kind::kHostAlloc, currentDevice(), -1};
  *p = m;
  return cudaSuccess;
}

// A copy queued on s. Pageable host memory as CUDA treats it: a source is read at the call
// (the caller may reuse it once the call returns) and a copy into it is waited for.
cudaError_t copy(void* dst, const void* src, size_t n, const StreamPtr& s) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  if (isPageable(src) && !capturing(s)) {
    auto held = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + n);
    if (cudaError_t e = enqueue(s, [dst, held] { memcpy(dst, held->data(), held->size()); });
        e != cudaSuccess)
      return e;
  } else if (cudaError_t e = enqueue(s, [dst, src, n] { memmove(dst, src, n); });
             e != cudaSuccess) {
    return e;
  }
  if (isPageable(dst) && !capturing(s)) return cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(
      s->legacy ? nullptr : s.get()));
  return cudaSuccess;
}

}  // namespace
}  // namespace cudaemu

using namespace cudaemu;

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  const int fd = memfd_create("cudaemu", MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  const size_t len = pages(bytes);
  if (ftruncate(fd, off_t(len)) != 0) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  void* m = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  std::lock_guard<std::mutex> lock(memory().mu);
  memory().allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{len, Kind::kDevice, currentDevice(), fd};
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  Alloc a;
  {
    std::lock_guard<std::mutex> lock(memory().mu);
    auto it = memory().allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == memory().allocs.end() || it->second.kind != Kind::kDevice)
      return fail(cudaErrorInvalidValue);
    a = it->second;
  }
  // As CUDA's: waits for the device's work queued so far (a kernel may still use it).
  synchronizeDevice(a.device);
  std::lock_guard<std::mutex> lock(memory().mu);
  memory().allocs.erase(reinterpret_cast<uintptr_t>(p));
  munmap(p, a.bytes);
  close(a.fd);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return hostAlloc(p, bytes); }
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return hostAlloc(p, bytes); }

cudaError_t cudaFreeHost(void* p) {
  if (!p) return cudaSuccess;
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  {
    std::lock_guard<std::mutex> lock(memory().mu);
    auto it = memory().allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == memory().allocs.end() || it->second.kind != Kind::kHostAlloc)
      return fail(cudaErrorInvalidValue);
    memory().allocs.erase(it);
  }
  // As CUDA's, it waits for the device's work first.
  synchronizeDevice(currentDevice());
  free(p);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
  if (!p || bytes == 0) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(memory().mu);
  if (find(p) != memory().allocs.end() ||
      find(static_cast<char*>(p) + bytes - 1) != memory().allocs.end())
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  memory().allocs[reinterpret_cast<uintptr_t>(p)] =
      Alloc{bytes, Kind::kHostRegistered, currentDevice(), -1};
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
  std::lock_guard<std::mutex> lock(memory().mu);
  auto it = memory().allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == memory().allocs.end() || it->second.kind != Kind::kHostRegistered)
    return fail(cudaErrorHostMemoryNotRegistered);
  memory().allocs.erase(it);
  return cudaSuccess;
}

cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int) {
  if (!dev) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(memory().mu);
  auto it = find(host);
  if (it == memory().allocs.end() ||
      (it->second.kind != Kind::kHostAlloc && it->second.kind != Kind::kHostRegistered))
    return fail(cudaErrorInvalidValue);
  *dev = host;  // mapped memory has one address for both sides (unified addressing)
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  if (!attr) return fail(cudaErrorInvalidValue);
  memset(attr, 0, sizeof(*attr));
  attr->device = -2;
  std::lock_guard<std::mutex> lock(memory().mu);
  auto it = find(p);
  if (it == memory().allocs.end()) {
    attr->type = cudaMemoryTypeUnregistered;
    return cudaSuccess;
  }
  const Alloc& a = it->second;
  attr->device = a.device;
  attr->devicePointer = const_cast<void*>(p);
  if (a.kind == Kind::kDevice || a.kind == Kind::kIpcOpened) {
    attr->type = cudaMemoryTypeDevice;
  } else {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(p);
  }
  return cudaSuccess;
}

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t* h, void* p) {
  if (!h) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(memory().mu);
  auto it = memory().allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == memory().allocs.end() || it->second.kind != Kind::kDevice)
    return fail(cudaErrorInvalidValue);
  memset(h, 0, sizeof(*h));
  const IpcHandle ipc{kIpcMagic, int32_t(getpid()), it->second.fd, it->second.bytes,
                      it->second.device};
  memcpy(h->reserved, &ipc, sizeof(ipc));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned int) {
  if (!p) return fail(cudaErrorInvalidValue);
  IpcHandle ipc;
  memcpy(&ipc, h.reserved, sizeof(ipc));
  if (ipc.magic != kIpcMagic) return fail(cudaErrorInvalidValue);
  if (ipc.pid == getpid()) return fail(cudaErrorDeviceUninitialized);  // as CUDA: not here
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", int(ipc.pid), int(ipc.fd));
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMapBufferObjectFailed);
  void* m = mmap(nullptr, ipc.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (m == MAP_FAILED) return fail(cudaErrorMapBufferObjectFailed);
  std::lock_guard<std::mutex> lock(memory().mu);
  memory().allocs[reinterpret_cast<uintptr_t>(m)] =
      Alloc{size_t(ipc.bytes), Kind::kIpcOpened, currentDevice(), -1};
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* p) {
  Alloc a;
  {
    std::lock_guard<std::mutex> lock(memory().mu);
    auto it = memory().allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == memory().allocs.end() || it->second.kind != Kind::kIpcOpened)
      return fail(cudaErrorInvalidValue);
    a = it->second;
    memory().allocs.erase(it);
  }
  synchronizeDevice(a.device);
  munmap(p, a.bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t h) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  return copy(dst, src, n, s);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  StreamPtr s = resolve(nullptr);
  if (!s) return fail(cudaErrorNoDevice);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  if (cudaError_t e = copy(dst, src, n, s); e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t h) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (n == 0) return cudaSuccess;
  if (!p) return fail(cudaErrorInvalidValue);
  return enqueue(s, [p, v, n] { memset(p, v, n); });
}

cudaError_t cudaMemset(void* p, int v, size_t n) {
  if (cudaError_t e = cudaMemsetAsync(p, v, n, nullptr); e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

}  // extern "C"
