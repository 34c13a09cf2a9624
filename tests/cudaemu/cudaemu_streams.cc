// The emulated CUDA runtime (cudaemu.h): devices, streams, events and kernel launches.
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
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
  std::map<Event*, EventPtr> events;
  State() {
    const int n = envInt("TUTTI_EMU_GPUS", 1, 0, 64);
    const int sms = envInt("TUTTI_EMU_SMS", 132, 1, 1024);
    threads = envInt("TUTTI_EMU_THREADS", 2, 1, 64);
    for (int i = 0; i < n; ++i) {
      auto d = std::make_unique<Device>();
      d->id = i;
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
  d.streams.push_back(s);
  return s;
}

// Work that waits until stream `s` has run its first n items.
Work waitStream(StreamPtr s, uint64_t n) {
  return [s, n] { s->waitFor(n); };
}

uint64_t queuedOn(Stream& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  return s.queued;
}

void push(Stream& s, Work w) {
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.queue.push_back(std::move(w));
    ++s.queued;
  }
  s.cv.notify_all();
}

double nowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void Stream::waitFor(uint64_t n) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done >= n; });
}

int deviceCount() { return int(state().devices.size()); }
Device& device(int id) { return *state().devices[size_t(id)]; }
int currentDevice() { return tDevice; }
void setCurrentDevice(int id) { tDevice = id; }
int threadsPerBlock() { return state().threads; }

StreamPtr resolve(cudaStream_t h) {
  if (deviceCount() == 0) return nullptr;
  if (h == nullptr || h == cudaStreamLegacy) {
    Device& d = device(tDevice);
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
    StreamPtr& s = (*tPerThread)[tDevice];
    if (!s) s = makeStream(tDevice, true, false);
    return s;
  }
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().streams.find(reinterpret_cast<Stream*>(h));
  return it == state().streams.end() ? nullptr : it->second;
}

EventPtr findEvent(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(state().mu);
  auto it = state().events.find(reinterpret_cast<Event*>(e));
  return it == state().events.end() ? nullptr : it->second;
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
      const uint64_t n = queuedOn(*o);
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
      const uint64_t n = queuedOn(*legacy);
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
  for (const StreamPtr& s : all) s->waitFor(queuedOn(*s));
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
      ts.emplace_back([&d, &body, r, b, t, threads] {
        tutti::dev::emu::tCtx = ThreadCtx{{t}, {b}, {threads}, &r->block};
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

void completeRecord(const EventPtr& e, uint64_t g) {
  std::lock_guard<std::mutex> lock(e->mu);
  if (g > e->completed) {
    e->completed = g;
    e->ms = nowMs();
  }
  e->cv.notify_all();
}

Work waitWork(const EventPtr& e, uint64_t generation) {
  return [e, generation] {
    std::unique_lock<std::mutex> lock(e->mu);
    e->cv.wait(lock, [&] { return e->completed >= generation; });
  };
}

}  // namespace cudaemu

using namespace cudaemu;

namespace {

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

cudaError_t cudaStreamCreate(cudaStream_t* s) { return createStream(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  return createStream(s, flags);
}

cudaError_t cudaStreamDestroy(cudaStream_t h) {
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
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (refuseCapturing(s) || !captureAllowsUnsafeCall())
    return fail(cudaErrorStreamCaptureUnsupported);
  s->waitFor(queuedOn(*s));
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t h) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (refuseCapturing(s)) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(s->mu);
  return s->done >= s->queued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaStreamGetDevice(cudaStream_t h, int* dev) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!dev) return fail(cudaErrorInvalidValue);
  *dev = s->device;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  synchronizeDevice(currentDevice());
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t h, cudaHostFn_t fn, void* data) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!fn) return fail(cudaErrorInvalidValue);
  return enqueue(s, [fn, data] { fn(data); });
}

cudaError_t cudaLaunchKernel(const void* func, dim3 grid, dim3 block, void** args, size_t,
                             cudaStream_t h) {
  StreamPtr s = resolve(h);
  if (!s) return fail(cudaErrorInvalidResourceHandle);
  if (!func || !args) return fail(cudaErrorInvalidDeviceFunction);
  if (grid.x == 0 || grid.y != 1 || grid.z != 1 || block.x == 0 || block.x > 1024)
    return fail(cudaErrorInvalidConfiguration);
  const int dev = s->device;
  const unsigned blocks = grid.x;
  // The parameter is copied now, as CUDA copies it at the launch.
  if (func == tutti::dev::p2pManyKernel()) {
    using K = void (*)(tutti::dev::DevP2pWork);
    auto w = std::make_shared<const tutti::dev::DevP2pWork>(
        *static_cast<const tutti::dev::DevP2pWork*>(args[0]));
    auto k = reinterpret_cast<K>(const_cast<void*>(func));
    return enqueue(s, [dev, blocks, k, w] { runBlocks(dev, blocks, [&] { k(*w); }); });
  }
  bool known = false;
  for (const void* k : tutti::dev::allKernels()) known = known || k == func;
  if (!known) return fail(cudaErrorInvalidDeviceFunction);
  using K = void (*)(tutti::dev::DevWork);
  auto w = std::make_shared<const tutti::dev::DevWork>(
      *static_cast<const tutti::dev::DevWork*>(args[0]));
  auto k = reinterpret_cast<K>(const_cast<void*>(func));
  return enqueue(s, [dev, blocks, k, w] { runBlocks(dev, blocks, [&] { k(*w); }); });
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int flags) {
  if (!out) return fail(cudaErrorInvalidValue);
  auto e = std::make_shared<Event>();
  e->flags = flags;
  std::lock_guard<std::mutex> lock(state().mu);
  state().events[e.get()] = e;
  *out = reinterpret_cast<cudaEvent_t>(e.get());
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* out) { return cudaEventCreateWithFlags(out, 0); }

cudaError_t cudaEventDestroy(cudaEvent_t h) {
  std::lock_guard<std::mutex> lock(state().mu);
  if (state().events.erase(reinterpret_cast<Event*>(h)) == 0)
    return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t h, cudaStream_t sh, unsigned int flags) {
  EventPtr e = findEvent(h);
  StreamPtr s = resolve(sh);
  if (!e || !s) return fail(cudaErrorInvalidResourceHandle);
  bool handled = false;
  if (cudaError_t r = captureRecord(e, s, (flags & cudaEventRecordExternal) != 0, &handled);
      r != cudaSuccess || handled)
    return r;
  uint64_t g;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    g = ++e->recorded;
    e->capture.reset();
    e->captureDeps.clear();
  }
  return enqueue(s, [e, g] { completeRecord(e, g); });
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  return cudaEventRecordWithFlags(e, s, cudaEventRecordDefault);
}

cudaError_t cudaEventQuery(cudaEvent_t h) {
  EventPtr e = findEvent(h);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->capture) return fail(cudaErrorStreamCaptureUnsupported);
  return e->completed >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t h) {
  EventPtr e = findEvent(h);
  if (!e) return fail(cudaErrorInvalidResourceHandle);
  if (!captureAllowsUnsafeCall()) return fail(cudaErrorStreamCaptureUnsupported);
  std::unique_lock<std::mutex> lock(e->mu);
  if (e->capture) return fail(cudaErrorStreamCaptureUnsupported);
  const uint64_t g = e->recorded;
  e->cv.wait(lock, [&] { return e->completed >= g; });
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  EventPtr ea = findEvent(a), eb = findEvent(b);
  if (!ea || !eb) return fail(cudaErrorInvalidResourceHandle);
  if (!ms) return fail(cudaErrorInvalidValue);
  if ((ea->flags | eb->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  double ta, tb;
  {
    std::lock_guard<std::mutex> lock(ea->mu);
    if (ea->recorded == 0 || ea->completed < ea->recorded) return fail(cudaErrorNotReady);
    ta = ea->ms;
  }
  {
    std::lock_guard<std::mutex> lock(eb->mu);
    if (eb->recorded == 0 || eb->completed < eb->recorded) return fail(cudaErrorNotReady);
    tb = eb->ms;
  }
  *ms = float(tb - ta);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t sh, cudaEvent_t h, unsigned int flags) {
  EventPtr e = findEvent(h);
  StreamPtr s = resolve(sh);
  if (!e || !s) return fail(cudaErrorInvalidResourceHandle);
  bool handled = false;
  if (cudaError_t r = captureWait(s, e, (flags & cudaEventWaitExternal) != 0, &handled);
      r != cudaSuccess || handled)
    return r;
  uint64_t g;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    g = e->recorded;
  }
  return g > 0 ? enqueue(s, waitWork(e, g)) : cudaSuccess;
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, const void* func, int,
                                                          size_t) {
  if (!n || !func) return fail(cudaErrorInvalidValue);
  *n = 1;  // one resident block per emulated SM
  return cudaSuccess;
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, const void* func) {
  if (!attr || !func) return fail(cudaErrorInvalidValue);
  memset(attr, 0, sizeof(*attr));
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 64;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  return cudaSuccess;
}

}  // extern "C"
