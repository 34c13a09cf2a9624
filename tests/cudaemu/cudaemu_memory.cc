// The emulated CUDA runtime (cudaemu.h): device and page-locked memory, what a pointer is,
// IPC handles, and copies and sets.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "tests/cudaemu/cudaemu.h"

namespace cudaemu {
namespace {

enum class Kind { kDevice, kHostAlloc, kHostRegistered, kIpcOpened };

struct Alloc {
  size_t bytes = 0;
  Kind kind = Kind::kDevice;
  int device = 0;
  int fd = -1;             // device memory: the memfd it lives in
  uint64_t serial = 0;     // device memory: its memfd's name is cudaemu-<serial>
  void* region = nullptr;  // device and IPC-opened memory: the guarded mapping (Guarded)
  size_t regionBytes = 0, offset = 0;  // ... its length, and where the pointer is in the memfd
};

// Handles given out by cudaIpcGetMemHandle.
constexpr uint64_t kIpcMagic = 0x7475747469656d75ull;  // "tuttiemu"
struct IpcHandle {
  uint64_t magic;
  int32_t pid;
  int32_t fd;
  uint64_t bytes;
  uint64_t serial;   // the fd's number may name another allocation once this one is freed
  uint64_t offset;   // of the pointer in the memfd
  int32_t physical;  // the GPU's index among all (cudaemu.h's Device::physical)
};
static_assert(sizeof(IpcHandle) <= sizeof(cudaIpcMemHandle_t));

struct Memory {
  std::mutex mu;
  std::map<uintptr_t, Alloc> allocs;  // by base address
  uint64_t serial = 0;
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

size_t pageBytes() { return size_t(sysconf(_SC_PAGESIZE)); }
size_t pages(size_t bytes) { return (bytes + pageBytes() - 1) / pageBytes() * pageBytes(); }

// A memfd of `len` bytes (whole pages) mapped between two pages that fault, as compute-
// sanitizer's memcheck would report: a kernel or a copy that reads or writes past an
// allocation crashes the test at that access. The pointer handed out is `offset` into the memfd:
// the allocation's end as near the following guard page as CUDA's 256-byte alignment allows.
struct Guarded {
  void* region = nullptr;  // guard, memfd, guard
  size_t regionBytes = 0;
  char* memfd = nullptr;  // where the memfd is mapped
};
bool mapGuarded(int fd, size_t len, Guarded* g) {
  const size_t page = pageBytes();
  g->regionBytes = len + 2 * page;
  g->region = mmap(nullptr, g->regionBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (g->region == MAP_FAILED) return false;
  g->memfd = static_cast<char*>(g->region) + page;
  if (mmap(g->memfd, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
    munmap(g->region, g->regionBytes);
    return false;
  }
  return true;
}
size_t endOffset(size_t bytes) { return pages(bytes) - (bytes + 255) / 256 * 256; }

// CUDA may make these calls wait for the device's work (cudaMalloc, cudaMallocHost,
// cudaHostRegister and cudaHostUnregister, opening an IPC handle): the worst case unless
// TUTTI_EMU_ALLOC_SYNC=0, so that code which must not make them while a kernel waits for its
// thread shows it. (cudaFree, cudaFreeHost and cudaIpcCloseMemHandle always wait.)
void mayWaitForDevice(int dev) {
  static const bool on = [] {
    const char* v = getenv("TUTTI_EMU_ALLOC_SYNC");
    return !(v && strcmp(v, "0") == 0);
  }();
  if (on) synchronizeDevice(dev);
}

// Where p lies: host memory no allocation knows, GPU memory (allocated or opened), or
// page-locked host memory.
enum class Where { kPageable, kDevice, kPinned };
Where whereIs(const void* p) {
  std::lock_guard<std::mutex> lock(memory().mu);
  auto it = find(p);
  if (it == memory().allocs.end()) return Where::kPageable;
  const Kind k = it->second.kind;
  return k == Kind::kDevice || k == Kind::kIpcOpened ? Where::kDevice : Where::kPinned;
}

// Takes the allocation based at p, of kind `kind`, out of the registry into *out (a second
// free of it fails from then on); `error` where there is none.
cudaError_t take(void* p, Kind kind, cudaError_t error, Alloc* out) {
  std::lock_guard<std::mutex> lock(memory().mu);
  auto it = memory().allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == memory().allocs.end() || it->second.kind != kind) return fail(error);
  *out = it->second;
  memory().allocs.erase(it);
  return cudaSuccess;
}

cudaError_t hostAlloc(void** p, size_t bytes) {
  if (!p) return fail(cudaErrorInvalidValue);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  mayWaitForDevice(currentDevice());
  void* m = nullptr;
  if (posix_memalign(&m, 4096, pages(bytes ? bytes : 1)) != 0)
    return fail(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> lock(memory().mu);
  memory().allocs[reinterpret_cast<uintptr_t>(m)] =
      Alloc{bytes ? bytes : 1, Kind::kHostAlloc, currentDevice(), -1, 0, nullptr, 0, 0};
  *p = m;
  return cudaSuccess;
}

// A copy queued on s, from `src` (lying `from`) to `dst` (lying `to`). Pageable host memory
// as CUDA treats it: a source is read at the call (the caller may reuse it once the call
// returns) and a copy into it is waited for.
cudaError_t copy(void* dst, Where to, const void* src, Where from, size_t n, const StreamPtr& s) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return fail(cudaErrorInvalidValue);
  if (from == Where::kPageable && !capturing(s)) {
    auto held = std::make_shared<std::vector<char>>(static_cast<const char*>(src),
                                                    static_cast<const char*>(src) + n);
    if (cudaError_t e = enqueue(s, [dst, held] { memcpy(dst, held->data(), held->size()); });
        e != cudaSuccess)
      return e;
  } else if (cudaError_t e = enqueue(s, [dst, src, n] { memmove(dst, src, n); });
             e != cudaSuccess) {
    return e;
  }
  if (to == Where::kPageable && !capturing(s)) s->waitFor(s->queuedSoFar());
  return cudaSuccess;
}

}  // namespace
}  // namespace cudaemu

using namespace cudaemu;

extern "C" {

cudaError_t cudaMalloc(void** p, size_t bytes) {
  CUDAEMU_CALL;
  if (!p) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  if (bytes == 0) {
    *p = nullptr;
    return cudaSuccess;
  }
  mayWaitForDevice(currentDevice());
  uint64_t serial;
  {
    std::lock_guard<std::mutex> lock(memory().mu);
    serial = ++memory().serial;
  }
  const int fd = memfd_create(("cudaemu-" + std::to_string(serial)).c_str(), MFD_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMemoryAllocation);
  const size_t len = pages(bytes);
  if (ftruncate(fd, off_t(len)) != 0) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  Guarded g;
  if (!mapGuarded(fd, len, &g)) {
    close(fd);
    return fail(cudaErrorMemoryAllocation);
  }
  // Not zeros: CUDA promises nothing, and a read of memory never written should show.
  memset(g.memfd, 0xa5, len);
  const size_t offset = endOffset(bytes);
  char* m = g.memfd + offset;
  std::lock_guard<std::mutex> lock(memory().mu);
  memory().allocs[reinterpret_cast<uintptr_t>(m)] =
      Alloc{bytes, Kind::kDevice, currentDevice(), fd, serial, g.region, g.regionBytes, offset};
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  CUDAEMU_CALL;
  if (!p) return cudaSuccess;
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  Alloc a;
  if (cudaError_t e = take(p, Kind::kDevice, cudaErrorInvalidValue, &a); e != cudaSuccess) return e;
  // As CUDA's: waits for the device's work queued so far (a kernel may still use it).
  synchronizeDevice(a.device);
  munmap(a.region, a.regionBytes);
  close(a.fd);
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  CUDAEMU_CALL;
  return hostAlloc(p, bytes);
}
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  CUDAEMU_CALL;
  return hostAlloc(p, bytes);
}

cudaError_t cudaFreeHost(void* p) {
  CUDAEMU_CALL;
  if (!p) return cudaSuccess;
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  Alloc a;
  if (cudaError_t e = take(p, Kind::kHostAlloc, cudaErrorInvalidValue, &a); e != cudaSuccess)
    return e;
  // As CUDA's, it waits for the device's work first.
  synchronizeDevice(currentDevice());
  free(p);
  return cudaSuccess;
}

cudaError_t cudaHostRegister(void* p, size_t bytes, unsigned int) {
  CUDAEMU_CALL;
  if (!p || bytes == 0) return fail(cudaErrorInvalidValue);
  mayWaitForDevice(currentDevice());
  std::lock_guard<std::mutex> lock(memory().mu);
  if (find(p) != memory().allocs.end() ||
      find(static_cast<char*>(p) + bytes - 1) != memory().allocs.end())
    return fail(cudaErrorHostMemoryAlreadyRegistered);
  memory().allocs[reinterpret_cast<uintptr_t>(p)] =
      Alloc{bytes, Kind::kHostRegistered, currentDevice(), -1, 0, nullptr, 0, 0};
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* p) {
  CUDAEMU_CALL;
  mayWaitForDevice(currentDevice());
  Alloc a;
  return take(p, Kind::kHostRegistered, cudaErrorHostMemoryNotRegistered, &a);
}

cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int) {
  CUDAEMU_CALL;
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
  CUDAEMU_CALL;
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
  CUDAEMU_CALL;
  if (!h) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(memory().mu);
  auto it = memory().allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == memory().allocs.end() || it->second.kind != Kind::kDevice)
    return fail(cudaErrorInvalidValue);
  memset(h, 0, sizeof(*h));
  const Alloc& a = it->second;
  const IpcHandle ipc{kIpcMagic, int32_t(getpid()),        a.fd, a.bytes, a.serial,
                      a.offset,  device(a.device).physical};
  memcpy(h->reserved, &ipc, sizeof(ipc));
  return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void** p, cudaIpcMemHandle_t h, unsigned int) {
  CUDAEMU_CALL;
  if (!p) return fail(cudaErrorInvalidValue);
  IpcHandle ipc;
  memcpy(&ipc, h.reserved, sizeof(ipc));
  if (ipc.magic != kIpcMagic) return fail(cudaErrorInvalidValue);
  if (ipc.pid == getpid()) return fail(cudaErrorDeviceUninitialized);  // as CUDA: not here
  // Another GPU's memory needs peer access to it (cudaIpcMemLazyEnablePeerAccess turns it on;
  // where the GPUs cannot have it, CUDA refuses the open so).
  if (ipc.physical != device(currentDevice()).physical && peerAccessDenied())
    return fail(cudaErrorPeerAccessUnsupported);
  mayWaitForDevice(currentDevice());
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", int(ipc.pid), int(ipc.fd));
  // The fd must still be that allocation's memfd ("/memfd:cudaemu-<serial> (deleted)").
  char target[128] = "";
  const ssize_t n = readlink(path, target, sizeof(target) - 1);
  const std::string want = "/memfd:cudaemu-" + std::to_string(ipc.serial) + " ";
  if (n <= 0 || std::string(target, size_t(n)).rfind(want, 0) != 0)
    return fail(cudaErrorInvalidValue);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail(cudaErrorMapBufferObjectFailed);
  Guarded g;
  const bool mapped = mapGuarded(fd, pages(ipc.bytes), &g);
  close(fd);
  if (!mapped) return fail(cudaErrorMapBufferObjectFailed);
  char* m = g.memfd + ipc.offset;
  // The exporter's GPU in this process's numbering; one it cannot see (CUDA opens such handles
  // too) is counted as the current device's.
  int owner = currentDevice();
  for (int d = 0; d < deviceCount(); ++d)
    if (device(d).physical == ipc.physical) owner = d;
  std::lock_guard<std::mutex> lock(memory().mu);
  memory().allocs[reinterpret_cast<uintptr_t>(m)] =
      Alloc{size_t(ipc.bytes), Kind::kIpcOpened,  owner, -1, 0, g.region,
            g.regionBytes,     size_t(ipc.offset)};
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void* p) {
  CUDAEMU_CALL;
  Alloc a;
  if (cudaError_t e = take(p, Kind::kIpcOpened, cudaErrorInvalidValue, &a); e != cudaSuccess)
    return e;
  synchronizeDevice(a.device);
  munmap(a.region, a.regionBytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind, cudaStream_t h) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  return copy(dst, whereIs(dst), src, whereIs(src), n, s);
}

// On the legacy stream. As CUDA documents its synchronization: from pageable memory into GPU
// memory, it returns once the source is staged (here: copied at the call); between two GPU
// buffers it does not wait; otherwise it waits for the copy.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(nullptr);
  if (!s) return fail(cudaErrorNoDevice);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  const Where to = whereIs(dst), from = whereIs(src);
  if (cudaError_t e = copy(dst, to, src, from, n, s); e != cudaSuccess) return e;
  if (to == Where::kDevice && from != Where::kPinned) return cudaSuccess;
  return cudaStreamSynchronize(nullptr);
}

cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t h) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (n == 0) return cudaSuccess;
  if (!p) return fail(cudaErrorInvalidValue);
  return enqueue(s, [p, v, n] { memset(p, v, n); });
}

// On the legacy stream; it waits only where p is page-locked host memory, as CUDA's.
cudaError_t cudaMemset(void* p, int v, size_t n) {
  CUDAEMU_CALL;
  if (cudaError_t e = cudaMemsetAsync(p, v, n, nullptr); e != cudaSuccess) return e;
  return whereIs(p) == Where::kDevice ? cudaSuccess : cudaStreamSynchronize(nullptr);
}

}  // extern "C"
