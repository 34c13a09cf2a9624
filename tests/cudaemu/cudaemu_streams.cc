// The emulated CUDA runtime (cudaemu.h): devices, streams, events and kernel launches.
#include <cuda.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <thread>

#include "kernels/cuda/dev_emu.h"
#include "kernels/cuda/dev_work.h"
#include "kernels/cuda/kernel_table.h"
#include "tests/cudaemu/cudaemu.h"

namespace cudaemu {
namespace {

int envInt(const char* name, int dflt, int lo, int hi) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  const int n = atoi(v);
  return n < lo ? lo : n > hi ? hi : n;
}

// Never destroyed: streams' workers may still run while the process exits.
struct State {
  std::vector<std::unique_ptr<Device>> devices;
  int threads = 2;
  std::mutex mu;  // the handles below
  std::map<Stream*, StreamPtr> streams;
  State() {
    const int n = envInt("TUTTI_EMU_GPUS", 1, 0, 64);
    const int sms = envInt("TUTTI_EMU_SMS", 132, 1, 1024);
    threads = envInt("TUTTI_EMU_THREADS", 2, 1, 64);
    // TUTTI_EMU_VISIBLE_DEVICES, the emulator's CUDA_VISIBLE_DEVICES (the real one, which a
    // developer's or a runner's environment may hold, must not hide the emulated GPUs): the
    // GPUs this process sees, by index, up to the first entry that names none, as CUDA reads
    // its own (UUIDs are not taken here).
    std::vector<int> visible;
    const char* v = getenv("TUTTI_EMU_VISIBLE_DEVICES");
    if (v) {
      std::string list(v);
      size_t at = 0;
      while (at <= list.size()) {
        const size_t end = std::min(list.find(',', at), list.size());
        const std::string item = list.substr(at, end - at);
        char* rest = nullptr;
        const long g = strtol(item.c_str(), &rest, 10);
        if (item.empty() || *rest != 0 || g < 0 || g >= n ||
            std::find(visible.begin(), visible.end(), int(g)) != visible.end()) {
          break;
        }
        visible.push_back(int(g));
        at = end + 1;
      }
    } else {
      for (int i = 0; i < n; ++i) visible.push_back(i);
    }
    for (size_t i = 0; i < visible.size(); ++i) {
      auto d = std::make_unique<Device>();
      d->id = int(i);
      d->physical = visible[i];
      d->sms = sms;
      d->freeSlots = sms;
      devices.push_back(std::move(d));
    }
  }
};
State& state() {
  static State* s = new State;
  return *s;
}

thread_local int tDevice = 0;
thread_local int tBound = -1;              // boundDevice()
thread_local size_t tLaunchBytes = 0;      // cudaemuThreadLastLaunch()
thread_local unsigned tLaunchThreads = 0;  // cudaemuThreadLastLaunch()
thread_local std::map<int, StreamPtr>* tPerThread = nullptr;

void worker(StreamPtr s) {
  for (;;) {
    Work w;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return !s->queue.empty() || s->destroyed; });
      if (s->queue.empty()) return;  // destroyed, and all its work done
      w = std::move(s->queue.front());
      s->queue.pop_front();
    }
    w();
    {
      std::lock_guard<std::mutex> lock(s->mu);
      ++s->done;
    }
    s->cv.notify_all();
  }
}

StreamPtr makeStream(int dev, bool blocking, bool legacy) {
  auto s = std::make_shared<Stream>();
  s->device = dev;
  s->blocking = blocking;
  s->legacy = legacy;
  std::thread(worker, s).detach();
  Device& d = device(dev);
  std::lock_guard<std::mutex> lock(d.mu);
  d.streams.erase(std::remove_if(d.streams.begin(), d.streams.end(),
                                 [](const std::weak_ptr<Stream>& w) { return w.expired(); }),
                  d.streams.end());
  d.streams.push_back(s);
  return s;
}

// Work that waits until stream `s` has run its first n items.
Work waitStream(StreamPtr s, uint64_t n) {
  return [s, n] { s->waitFor(n); };
}

void push(Stream& s, Work w) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.push_back(std::move(w));
    ++s.queued;
  }
  s.cv.notify_all();
}

// CUDA may run the host functions of all streams one at a time: the worst case, here.
std::mutex& hostFunctionTurn() {
  static std::mutex* m = new std::mutex;
  return *m;
}

}  // namespace

void Stream::waitFor(uint64_t n) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done >= n; });
}

uint64_t Stream::queuedSoFar() {
  std::lock_guard<std::mutex> lock(mu);
  return queued;
}

int deviceCount() { return int(state().devices.size()); }
Device& device(int id) { return *state().devices[size_t(id)]; }
int currentDevice() {
  if (tDevice < deviceCount() && !device(tDevice).context.load(std::memory_order_relaxed))
    device(tDevice).context = true;
  tBound = tDevice;
  return tDevice;
}
int boundDevice() { return tBound; }
int selectedDevice() { return tDevice; }
void setCurrentDevice(int id) {
  tDevice = id;
  tBound = id;
  device(id).context = true;
}
int threadsPerBlock() { return state().threads; }

StreamPtr resolve(cudaStream_t h) {
  if (deviceCount() == 0) return nullptr;
  if (h == nullptr || h == cudaStreamLegacy) {
    Device& d = device(currentDevice());
    std::unique_lock<std::mutex> lock(state().mu);
    if (!d.legacyStream) {
      lock.unlock();
      StreamPtr s = makeStream(tDevice, true, true);
      lock.lock();
      if (!d.legacyStream) d.legacyStream = s;
    }
    return d.legacyStream;
  }
  if (h == cudaStreamPerThread) {
    if (!tPerThread) tPerThread = new std::map<int, StreamPtr>;  // left at the thread's exit
    StreamPtr& s = (*tPerThread)[currentDevice()];
    if (!s) s = makeStream(tDevice, true, false);
    return s;
  }
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().streams.find(reinterpret_cast<Stream*>(h));
  return it == state().streams.end() ? nullptr : it->second;
}

cudaError_t enqueue(const StreamPtr& s, Work w) {
  bool captured = false;
  if (cudaError_t e = captureWork(s, w, &captured); e != cudaSuccess || captured) return e;
  Device& d = device(s->device);
  if (s->legacy) {
    // The legacy stream waits for every blocking stream's earlier work.
    std::vector<StreamPtr> others;
    {
      std::lock_guard<std::mutex> lock(d.mu);
      for (auto& weak : d.streams)
        if (StreamPtr o = weak.lock(); o && o != s && o->blocking) others.push_back(o);
    }
    for (const StreamPtr& o : others) {
      const uint64_t n = o->queuedSoFar();
      if (n > 0) push(*s, waitStream(o, n));
    }
  } else if (s->blocking) {
    // ... and blocking streams wait for its earlier work.
    StreamPtr legacy;
    {
      std::lock_guard<std::mutex> lock(state().mu);
      legacy = d.legacyStream;
    }
    if (legacy) {
      const uint64_t n = legacy->queuedSoFar();
      if (n > 0) push(*s, waitStream(legacy, n));
    }
  }
  push(*s, std::move(w));
  return cudaSuccess;
}

void synchronizeDevice(int id) {
  Device& d = device(id);
  std::vector<StreamPtr> all;
  {
    std::lock_guard<std::mutex> lock(d.mu);
    for (auto& weak : d.streams)
      if (StreamPtr s = weak.lock()) all.push_back(s);
  }
  for (const StreamPtr& s : all) s->waitFor(s->queuedSoFar());
}

void runBlocks(int dev, unsigned blocks, const std::function<void()>& body) {
  using tutti::dev::emu::Block;
  using tutti::dev::emu::ThreadCtx;
  Device& d = device(dev);
  const unsigned threads = unsigned(threadsPerBlock());
  struct Running {
    Block block;
    std::atomic<unsigned> left;
  };
  std::vector<std::unique_ptr<Running>> rs;
  std::vector<std::thread> ts;
  for (unsigned b = 0; b < blocks; ++b) {
    {
      std::unique_lock<std::mutex> lock(d.mu);
      d.cv.wait(lock, [&] { return d.freeSlots > 0; });
      --d.freeSlots;
    }
    rs.push_back(std::make_unique<Running>());
    Running* r = rs.back().get();
    r->block.vote[0] = 0;
    r->block.vote[1] = 0;
    r->left = threads;
    pthread_barrier_init(&r->block.barrier, nullptr, threads);
    for (unsigned t = 0; t < threads; ++t) {
      ts.emplace_back([&d, &body, r, b, t, threads, blocks] {
        tutti::dev::emu::tCtx = ThreadCtx{{t}, {b}, {threads}, &r->block, 0, {blocks}};
        body();
        if (r->left.fetch_sub(1) == 1) {  // the block's last thread frees its slot
          {
            std::lock_guard<std::mutex> lock(d.mu);
            ++d.freeSlots;
          }
          d.cv.notify_all();
        }
      });
    }
  }
  for (auto& t : ts) t.join();
  for (auto& r : rs) pthread_barrier_destroy(&r->block.barrier);
}

}  // namespace cudaemu

using namespace cudaemu;

namespace {

// Queues kernel `func`, whose one parameter is a W, on `blocks` blocks of s's device. The
// parameter is copied now, as CUDA copies it at the launch.
// bytes: how many of the parameter's bytes the launch passes (the driver's cuLaunchKernel
// with a parameter buffer); the rest hold 0xa5, as a GPU's would hold whatever was there.
template <class W>
cudaError_t launchOn(const StreamPtr& s, const void* func, unsigned blocks, unsigned threads,
                     const void* param, size_t bytes = sizeof(W)) {
  auto k = reinterpret_cast<void (*)(W)>(const_cast<void*>(func));
  auto w = std::make_shared<W>();
  memset(static_cast<void*>(w.get()), 0xa5, sizeof(W));
  memcpy(static_cast<void*>(w.get()), param, bytes);
  tLaunchBytes = bytes;
  tLaunchThreads = threads;
  const int dev = s->device;
  return enqueue(s, [dev, blocks, k, w] { runBlocks(dev, blocks, [&] { k(*w); }); });
}

// The checks of a launch both entry points make; cudaSuccess or the error to return.
// device: the context the call runs in.
cudaError_t checkLaunch(const StreamPtr& s, int device, const void* func, unsigned gx, unsigned gy,
                        unsigned gz, unsigned bx) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (!func) return cudaErrorInvalidDeviceFunction;
  if (gx == 0 || gy != 1 || gz != 1 || bx == 0 || bx > 1024) return cudaErrorInvalidConfiguration;
  // A stream of another device than the current one is another context's.
  if (s->device != device) return cudaErrorInvalidResourceHandle;
  // TUTTI_EMU_FAIL_LAUNCH_AFTER=n: the launches after the process's first n fail, as a launch
  // that asks for more than the GPU has left does (the library's failure path, for tests).
  static const int launchLimit = envInt("TUTTI_EMU_FAIL_LAUNCH_AFTER", -1, -1, 1 << 30);
  static std::atomic<int> launches{0};
  if (launchLimit >= 0 && launches.fetch_add(1) >= launchLimit)
    return cudaErrorLaunchOutOfResources;
  return cudaSuccess;
}

// A kernel's handle in one device's context (cudaGetFuncBySymbol), as a CUfunction: made once
// per (device, kernel), never freed. The driver's launch takes it only in that context.
struct Function {
  int device;
  const void* symbol;
};
std::mutex& functionsMu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::map<std::pair<int, const void*>, Function*>& functions() {
  static auto* m = new std::map<std::pair<int, const void*>, Function*>;
  return *m;
}
const Function* findFunction(const void* handle) {
  std::lock_guard<std::mutex> lock(functionsMu());
  for (const auto& [key, fn] : functions())
    if (fn == handle) return fn;
  return nullptr;
}

bool isCollKernel(const void* func) {
  static const std::set<const void*> known = [] {
    std::set<const void*> k;
    for (const void* f : tutti::dev::allKernels())
      if (f != tutti::dev::p2pManyKernel()) k.insert(f);
    return k;
  }();
  return known.count(func) != 0;
}

cudaError_t createStream(cudaStream_t* out, unsigned flags) {
  if (!out) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  StreamPtr s = makeStream(currentDevice(), (flags & cudaStreamNonBlocking) == 0, false);
  {
    std::lock_guard<std::mutex> lock(state().mu);
    state().streams[s.get()] = s;
  }
  *out = reinterpret_cast<cudaStream_t>(s.get());
  return cudaSuccess;
}

}  // namespace

extern "C" {

cudaError_t cudaStreamCreate(cudaStream_t* s) {
  CUDAEMU_CALL;
  return createStream(s, cudaStreamDefault);
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  CUDAEMU_CALL;
  return createStream(s, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t h) {
  CUDAEMU_CALL;
  StreamPtr s;
  {
    std::lock_guard<std::mutex> lock(state().mu);
    auto it = state().streams.find(reinterpret_cast<Stream*>(h));
    if (it == state().streams.end()) return fail(cudaErrorInvalidResourceHandle);
    s = it->second;
    state().streams.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->destroyed = true;  // its worker ends once the work queued so far has run
  }
  s->cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t h) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (refuseCapturing(s) || !captureAllowsUnsafeCall())
    return fail(cudaErrorStreamCaptureUnsupported);
  if (s->legacy && legacyBlockedByCapture(s->device)) return fail(cudaErrorStreamCaptureImplicit);
  s->waitFor(s->queuedSoFar());
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (refuseCapturing(s)) return fail(cudaErrorStreamCaptureUnsupported);
  if (s->legacy && legacyBlockedByCapture(s->device)) return fail(cudaErrorStreamCaptureImplicit);
  std::lock_guard<std::mutex> lock(s->mu);
  return s->done >= s->queued ? cudaSuccess : fail(cudaErrorNotReady);
}

cudaError_t cudaStreamGetDevice(cudaStream_t h, int* dev) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!dev) return fail(cudaErrorInvalidValue);
  *dev = s->device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  CUDAEMU_CALL;
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  if (!captureAllowsUnsafeCall() || deviceCapturing(currentDevice()))
    return fail(cudaErrorStreamCaptureUnsupported);
  synchronizeDevice(currentDevice());
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void* data) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!fn) return fail(cudaErrorInvalidValue);
  return enqueue(s, [fn, data] {
    std::lock_guard<std::mutex> turn(hostFunctionTurn());
    fn(data);
  });
}

cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t,
                             cudaStream_t h) {
  CUDAEMU_CALL;
  StreamPtr s = resolve(h);
  if (!args) return fail(cudaErrorInvalidDeviceFunction);
  if (cudaError_t e = checkLaunch(s, currentDevice(), func, grid.x, grid.y, grid.z, block.x);
      e != cudaSuccess)
    return fail(e);
  if (func == tutti::dev::p2pManyKernel())
    return launchOn<tutti::dev::DevP2pWork>(s, func, grid.x, block.x, args[0]);
  if (!isCollKernel(func)) return fail(cudaErrorInvalidDeviceFunction);
  return launchOn<tutti::dev::DevArgs>(s, func, grid.x, block.x, args[0]);
}

void cudaemuThreadLastLaunch(size_t* bytes, unsigned* threads) {
  *bytes = tLaunchBytes;
  *threads = tLaunchThreads;
}

cudaError_t cudaGetFuncBySymbol(cudaFunction_t* f, const void* symbol) {
  CUDAEMU_CALL;
  if (!f || !symbol) return fail(cudaErrorInvalidValue);
  if (!isCollKernel(symbol) && symbol != tutti::dev::p2pManyKernel())
    return fail(cudaErrorInvalidDeviceFunction);
  const int device = currentDevice();  // the function of this context
  std::lock_guard<std::mutex> lock(functionsMu());
  Function*& fn = functions()[{device, symbol}];
  if (!fn) fn = new Function{device, symbol};
  *f = reinterpret_cast<cudaFunction_t>(fn);
  return cudaSuccess;
}

cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int,
                                             unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  CUDAEMU_CALL;
  if (!symbol || !fn) return fail(cudaErrorInvalidValue);
  // The driver calls emulated.
  void* f = nullptr;
  if (strcmp(symbol, "cuLaunchKernel") == 0) f = reinterpret_cast<void*>(&cuLaunchKernel);
  if (strcmp(symbol, "cuDeviceGet") == 0) f = reinterpret_cast<void*>(&cuDeviceGet);
  if (strcmp(symbol, "cuDevicePrimaryCtxGetState") == 0)
    f = reinterpret_cast<void*>(&cuDevicePrimaryCtxGetState);
  const bool found = f != nullptr;
  *fn = f;
  if (status) *status = found ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return found ? cudaSuccess : fail(cudaErrorSymbolNotFound);
}

}  // extern "C"

// The driver's launch, as cudaGetDriverEntryPointByVersion hands it out (not exported): kernel
// parameters in one buffer of a given size (CU_LAUNCH_PARAM_BUFFER_POINTER / _SIZE) only, the
// collective kernels only, each by its function in the context current here. A buffer larger than
// the parameter is refused, as CUDA refuses it; with TUTTI_EMU_PARAMS_EXACT=1 a smaller one too (a
// driver that wants every byte). Like the driver, it needs the device's context current on the
// calling thread: one a runtime call of this thread made current (cudaSetDevice, or a call that
// works on the device).
extern "C" CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy,
                                           unsigned int gz, unsigned int bx, unsigned int by,
                                           unsigned int bz, unsigned int, CUstream h, void** params,
                                           void** extra) {
  const ApiCall call("cuLaunchKernel");  // counted, without making a context current
  void* buffer = nullptr;
  size_t* size = nullptr;
  for (int i = 0; extra && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = static_cast<size_t*>(extra[i + 1]);
  }
  if (params || !buffer || !size || by != 1 || bz != 1) return CUDA_ERROR_INVALID_VALUE;
  const Function* fn = findFunction(f);
  if (!fn || !isCollKernel(fn->symbol)) return CUDA_ERROR_INVALID_HANDLE;
  if (boundDevice() < 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (fn->device != boundDevice()) return CUDA_ERROR_INVALID_HANDLE;  // another context's
  const void* func = fn->symbol;
  const bool exact = envInt("TUTTI_EMU_PARAMS_EXACT", 0, 0, 1) != 0;
  if (*size > sizeof(tutti::dev::DevArgs) || *size < sizeof(tutti::dev::DevHeader) ||
      (exact && *size != sizeof(tutti::dev::DevArgs)))
    return CUDA_ERROR_INVALID_VALUE;
  StreamPtr s = resolve(reinterpret_cast<cudaStream_t>(h));
  if (cudaError_t e = checkLaunch(s, boundDevice(), func, gx, gy, gz, bx); e != cudaSuccess)
    return CUresult(e);  // the codes these checks give are the same in both APIs
  return CUresult(launchOn<tutti::dev::DevArgs>(s, func, gx, bx, buffer, *size));
}

// The driver's device handle: its ordinal here. Neither call makes a context.
extern "C" CUresult CUDAAPI cuDeviceGet(CUdevice* dev, int ordinal) {
  const ApiCall call("cuDeviceGet");
  if (!dev) return CUDA_ERROR_INVALID_VALUE;
  if (ordinal < 0 || ordinal >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  *dev = ordinal;
  return CUDA_SUCCESS;
}

// Whether the device's primary context was made (cudaemuContextMade); no flags are set.
extern "C" CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int* flags,
                                                       int* active) {
  const ApiCall call("cuDevicePrimaryCtxGetState");
  if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= deviceCount()) return CUDA_ERROR_INVALID_DEVICE;
  *flags = 0;
  *active = device(dev).context.load() ? 1 : 0;
  return CUDA_SUCCESS;
}

extern "C" {

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void* func, int, size_t) {
  CUDAEMU_CALL;
  if (!n || !func) return fail(cudaErrorInvalidValue);
  *n = 1;  // one resident block per emulated SM
  return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  CUDAEMU_CALL;
  if (!attr || !func) return fail(cudaErrorInvalidValue);
  memset(attr, 0, sizeof(*attr));
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 64;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  return cudaSuccess;
}

}  // extern "C"
