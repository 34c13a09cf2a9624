// The emulated CUDA runtime (cudaemu.h): events. Each record has a generation; a wait, a query
// and a synchronization are for the latest record when asked, and that record alone: records
// on different streams may end in any order.
#include <chrono>
#include <map>

#include "tests/cudaemu/cudaemu.h"

namespace cudaemu {
namespace {

struct Events {
  std::mutex mu;
  std::map<Event*, EventPtr> all;
};
Events& events() {
  static Events* e = new Events;  // never destroyed (workers may run at exit)
  return *e;
}

double nowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The latest record's generation (0: never recorded).
uint64_t latest(const EventPtr& e) {
  std::lock_guard<std::mutex> lock(e->mu);
  return e->recorded;
}

}  // namespace

EventPtr findEvent(cudaEvent_t h) {
  std::lock_guard<std::mutex> lock(events().mu);
  auto it = events().all.find(reinterpret_cast<Event*>(h));
  return it == events().all.end() ? nullptr : it->second;
}

void completeRecord(const EventPtr& e, uint64_t g) {
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (!e->isDone(g)) {
      e->doneAbove.insert(g);
      while (!e->doneAbove.empty() && *e->doneAbove.begin() == e->doneBelow + 1) {
        e->doneAbove.erase(e->doneAbove.begin());
        ++e->doneBelow;
      }
    }
    if (g >= e->msOf) {
      e->msOf = g;
      e->ms = nowMs();
    }
  }
  e->cv.notify_all();
}

Work waitWork(const EventPtr& e, uint64_t g) {
  return [e, g] {
    std::unique_lock<std::mutex> lock(e->mu);
    e->cv.wait(lock, [&] { return e->isDone(g); });
  };
}

namespace {

// The event h names, in *e, where it may be asked about or waited for now; else the error.
cudaError_t askable(cudaEvent_t h, EventPtr* e) {
  *e = findEvent(h);
  if (!*e) return fail(cudaErrorInvalidResourceHandle);
  if (refuseCapturedEvent(*e) || !captureAllowsUnsafeCall())
    return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}

}  // namespace

}  // namespace cudaemu

using namespace cudaemu;

extern "C" {

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* out, unsigned int flags) {
  CUDAEMU_CALL;
  if (!out) return fail(cudaErrorInvalidValue);
  if (deviceCount() == 0) return fail(cudaErrorNoDevice);
  auto e = std::make_shared<Event>();
  e->device = currentDevice();
  e->flags = flags;
  std::lock_guard<std::mutex> lock(events().mu);
  events().all[e.get()] = e;
  *out = reinterpret_cast<cudaEvent_t>(e.get());
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* out) {
  CUDAEMU_CALL;
  return cudaEventCreateWithFlags(out, 0);
}

cudaError_t cudaEventDestroy(cudaEvent_t h) {
  CUDAEMU_CALL;
  std::lock_guard<std::mutex> lock(events().mu);
  if (events().all.erase(reinterpret_cast<Event*>(h)) == 0)
    return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;  // work that records or waits for it holds it still
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t h, cudaStream_t sh, unsigned int flags) {
  CUDAEMU_CALL;
  EventPtr e = findEvent(h);
  StreamPtr s = resolve(sh);
  if (!e || !s) return fail(cudaErrorInvalidResourceHandle);
  if (e->device != s->device) return fail(cudaErrorInvalidResourceHandle);  // another context
  bool handled = false;
  if (cudaError_t r = captureRecord(e, s, (flags & cudaEventRecordExternal) != 0, &handled);
      r != cudaSuccess || handled)
    return r;
  uint64_t before, g;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    before = e->recorded;
    g = ++e->recorded;
    e->capture.reset();
    e->captureDeps.clear();
  }
  const cudaError_t r = enqueue(s, [e, g] { completeRecord(e, g); });
  if (r != cudaSuccess) {  // as if never called: the record before stays the latest
    completeRecord(e, g);
    std::lock_guard<std::mutex> lock(e->mu);
    if (e->recorded == g) e->recorded = before;
  }
  return r;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  CUDAEMU_CALL;
  return cudaEventRecordWithFlags(e, s, cudaEventRecordDefault);
}

cudaError_t cudaEventQuery(cudaEvent_t h) {
  CUDAEMU_CALL;
  EventPtr e;
  if (cudaError_t err = askable(h, &e); err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(e->mu);
  return e->isDone(e->recorded) ? cudaSuccess : fail(cudaErrorNotReady);
}

cudaError_t cudaEventSynchronize(cudaEvent_t h) {
  CUDAEMU_CALL;
  EventPtr e;
  if (cudaError_t err = askable(h, &e); err != cudaSuccess) return err;
  waitWork(e, latest(e))();
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  CUDAEMU_CALL;
  EventPtr ea = findEvent(a), eb = findEvent(b);
  if (!ea || !eb) return fail(cudaErrorInvalidResourceHandle);
  if (!ms) return fail(cudaErrorInvalidValue);
  if ((ea->flags | eb->flags) & cudaEventDisableTiming) return fail(cudaErrorInvalidResourceHandle);
  double t[2];
  const EventPtr* both[2] = {&ea, &eb};
  for (int i = 0; i < 2; ++i) {
    Event& e = **both[i];
    std::lock_guard<std::mutex> lock(e.mu);
    if (e.recorded == 0) return fail(cudaErrorInvalidResourceHandle);
    if (!e.isDone(e.recorded) || e.msOf != e.recorded) return fail(cudaErrorNotReady);
    t[i] = e.ms;
  }
  *ms = float(t[1] - t[0]);
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t sh, cudaEvent_t h, unsigned int flags) {
  CUDAEMU_CALL;
  EventPtr e = findEvent(h);
  StreamPtr s = resolve(sh);
  if (!e || !s) return fail(cudaErrorInvalidResourceHandle);
  bool handled = false;
  if (cudaError_t r = captureWait(s, e, (flags & cudaEventWaitExternal) != 0, &handled);
      r != cudaSuccess || handled)
    return r;
  const uint64_t g = latest(e);
  return g > 0 ? enqueue(s, waitWork(e, g)) : cudaSuccess;
}

}  // extern "C"
