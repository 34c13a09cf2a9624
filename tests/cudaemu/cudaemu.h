// An emulated CUDA runtime for the GPU tests on machines without a GPU (TUTTI_CUDA=EMU): the
// cuda* calls libtutti and tests/gpu make, implemented on CPU threads with the toolkit's own
// headers and signatures, so that the host side of the GPU path -- streams, events, the launch
// order, captures, the links' memory, IPC between processes, abort and teardown -- runs in CI.
// The kernels are the library's own source compiled for the host (kernels/cuda/dev_emu.h).
//
// What it models, and how far:
// - devices: TUTTI_EMU_GPUS of them (1 unless set; TUTTI_EMU_VISIBLE_DEVICES, a list of their
//   indices as CUDA_VISIBLE_DEVICES is, shows the process those alone, in its order: bus ids
//   and UUIDs follow the GPU, not the process's numbering; IPC handles of GPUs it cannot see
//   still open, as CUDA documents), each with TUTTI_EMU_SMS "SMs" (132 unless
//   set: an H100 SXM's or an H200's) of one resident block each; a block waits for a free one
//   before it starts, so blocks that wait for blocks which cannot become resident hang here as
//   on a GPU;
// - a block runs TUTTI_EMU_THREADS CPU threads (2 unless set), whatever blockDim says;
// - streams: one worker thread each, running its work in order; the legacy default stream
//   and blocking streams wait for each other; cudaStreamPerThread is a blocking stream of each
//   thread; events with a generation per record (a wait is for the latest record when asked,
//   and for that one alone), host functions (one at a time in the process, as CUDA may run
//   them), copies and sets in stream order, and cudaMemcpy / cudaMemset returning when CUDA
//   documents they return (before the bytes land, for a pageable source or a device target);
// - memory: device memory is host memory in a memfd (so that cudaIpc* handles open it in other
//   processes), filled with 0xa5 bytes, not zeros, and mapped between pages that fault, its end
//   as near the next as 256-byte alignment allows (an access past it crashes the test at that
//   access, as memcheck would report it); cudaFree waits for the device's work as
//   CUDA's does, and so, unless TUTTI_EMU_ALLOC_SYNC=0, do the calls CUDA may make wait
//   (cudaMalloc, cudaHostRegister ...); page-locked host memory is mapped;
//   cudaPointerGetAttributes knows what each allocation is; a kernel launched on a stream of
//   another device than the current one, or an event recorded on one, is refused;
// - captures: see cudaemu_graph.cc;
// - what a test may ask that CUDA cannot tell: the calls of each entry point a thread made
//   (cudaemuThreadCalls), and whether a device's primary context was made (cudaemuContextMade:
//   by cudaSetDevice, as CUDA 12 does, or by any call but those that ask about devices and
//   errors, on the current device: 0 where a thread never chose one); and, to test the library's
//   failure paths, launches that fail (TUTTI_EMU_FAIL_LAUNCH_AFTER=n: those after the process's
//   first n), and GPUs that cannot reach each other (TUTTI_EMU_NO_PEER_ACCESS=1:
//   cudaDeviceCanAccessPeer says no, cudaDeviceEnablePeerAccess and cudaIpcOpenMemHandle of
//   another GPU's memory fail with cudaErrorPeerAccessUnsupported).
// What it does not: the GPU's memory model and timing (performance means nothing here), the
// hardware queues (CUDA_DEVICE_MAX_CONNECTIONS), blocks resident across processes or taken by
// the application's own kernels, occupancy above one block per SM, the order in which waiting
// kernels get free SMs, peer access (a kernel reaches any GPU's memory, enabled or not), MIG,
// separate address
// spaces (device and host memory are one: a kernel that reads pageable memory, or the host
// reading device memory, works here), and faults (an illegal address is a crash of the test,
// not a sticky error). Not emulated, and refused: a graph launched inside a capture, and
// cudaStreamGetCaptureInfo's graph and dependencies. Simple kernels of a program's own
// (cudaemu_sequential.h) run their threads one after another, so races inside them cannot
// show; the cuBLAS of include/cublas_v2.h is the CPU's OpenBLAS with each GEMM's inner dimension
// summed in two parts (cudaemu_cublas.cc), so a GPU run compared with a CPU run differs by
// rounding here too, if by less than on a GPU.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace cudaemu {

struct Capture;

// Work queued on a stream, or a node of a captured graph: run() does it, in the worker's
// thread (a wait blocks there).
using Work = std::function<void()>;

struct Stream {
  int device = 0;
  bool blocking = true;  // waits for and is waited for by the legacy default stream
  bool legacy = false;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Work> queue;
  uint64_t queued = 0, done = 0;  // counts of work items
  bool destroyed = false;

  // Graph capture (cudaemu_graph.cc): the capture this stream records into, or null, and the
  // nodes its next work depends on. Guarded by the capture registry's lock.
  std::shared_ptr<Capture> capture;
  std::vector<int> deps;

  // Waits until the first n items queued have run; how many are queued so far.
  void waitFor(uint64_t n);
  uint64_t queuedSoFar();
};
using StreamPtr = std::shared_ptr<Stream>;

struct Event {
  int device = 0;
  unsigned flags = 0;
  std::mutex mu;
  std::condition_variable cv;
  // Generations: the latest record (0: none); every one up to doneBelow has run, and those in
  // doneAbove past it (records on different streams end in any order). A wait is for one
  // record, the latest when it was asked.
  uint64_t recorded = 0, doneBelow = 0;
  std::set<uint64_t> doneAbove;
  double ms = 0;  // when record msOf ran
  uint64_t msOf = 0;
  // Recorded in a capture (not external): the capture and the nodes the record stood after;
  // nothing once that capture has ended.
  std::shared_ptr<Capture> capture;
  std::vector<int> captureDeps;

  bool isDone(uint64_t g) const { return g <= doneBelow || doneAbove.count(g) != 0; }
};
using EventPtr = std::shared_ptr<Event>;

struct Device {
  int id = 0;
  int physical = 0;  // its index among the TUTTI_EMU_GPUS (TUTTI_EMU_VISIBLE_DEVICES picks)
  int sms = 132;
  std::mutex mu;
  std::condition_variable cv;
  int freeSlots = 132;
  StreamPtr legacyStream;
  std::vector<std::weak_ptr<Stream>> streams;  // every stream of the device, for syncs
  bool peerEnabled[64] = {};
  // The device's primary context was made: by cudaSetDevice (as CUDA 12 and later do), or by a
  // call that works on the current device (which is 0 on a thread that never chose one).
  std::atomic<bool> context{false};
};

// ---- shared state (cudaemu_streams.cc) ----------------------------------------------------
int deviceCount();
Device& device(int id);
// The current device, whose context the caller is about to use (made if it was not).
int currentDevice();
// The current device, for cudaGetDevice alone: asking makes no context.
int selectedDevice();
void setCurrentDevice(int id);  // and makes its context
// The device whose context a runtime call of this thread made current (-1: none yet): what the
// driver's calls run on.
int boundDevice();
int threadsPerBlock();
// TUTTI_EMU_NO_PEER_ACCESS=1: GPUs that cannot reach each other's memory (no NVLink, PCIe
// switches that refuse peer traffic), read at each call (cudaemu_device.cc).
bool peerAccessDenied();
// The stream a handle names (0 and cudaStreamLegacy: the current device's legacy stream;
// cudaStreamPerThread: this thread's), or null for a handle that is not a live stream.
StreamPtr resolve(cudaStream_t s);
EventPtr findEvent(cudaEvent_t e);
// Queues work on s (into its capture where s captures), after the legacy stream's or the
// blocking streams' earlier work as CUDA's default-stream rules say.
cudaError_t enqueue(const StreamPtr& s, Work w);
// Waits for everything queued so far on the device's streams.
void synchronizeDevice(int id);
// Runs a kernel's blocks on the device (waiting for resident slots); returns when all ended.
void runBlocks(int device, unsigned blocks, const std::function<void()>& body);

// ---- calls (cudaemu_device.cc) ------------------------------------------------------------
// Every entry point counts itself, per thread (a call made by another entry point does not
// count): cudaemuThreadCalls below tells a test how many CUDA calls an operation made, the
// host-side cost a GPU would charge for each.
struct ApiCall {
  explicit ApiCall(const char* name);
  ~ApiCall();
  ApiCall(const ApiCall&) = delete;
  ApiCall& operator=(const ApiCall&) = delete;
};
#define CUDAEMU_CALL const ::cudaemu::ApiCall cudaemuApiCall_(__func__)

// ---- errors (cudaemu_device.cc) -----------------------------------------------------------
// Records e as this thread's last error where it is one, and returns it.
cudaError_t fail(cudaError_t e);
// Whether this thread may make a call that CUDA forbids during a capture in global or
// thread-local mode (it invalidates the capture and fails where not).
bool captureAllowsUnsafeCall();

// ---- captures (cudaemu_graph.cc) ----------------------------------------------------------
// Adds w as a node of s's capture (*captured: whether s captures); an error where the capture
// was invalidated, or where work on the legacy stream would wait for a capturing stream.
cudaError_t captureWork(const StreamPtr& s, const Work& w, bool* captured);
// Whether s captures; a capture asked for this way (a synchronization, a query) is invalidated.
bool refuseCapturing(const StreamPtr& s);
bool capturing(const StreamPtr& s);
// Whether a blocking stream of the device captures, so that the legacy stream (which would
// wait for it) may not be synchronized or asked about; such captures are invalidated.
bool legacyBlockedByCapture(int device);
// Whether any stream of the device captures (cudaDeviceSynchronize is invalid then).
bool deviceCapturing(int device);
// The capture-side of cudaEventRecord / cudaStreamWaitEvent on a capturing stream or a
// captured event; cudaSuccess with *handled false where neither captures.
cudaError_t captureRecord(const EventPtr& e, const StreamPtr& s, bool external, bool* handled);
cudaError_t captureWait(const StreamPtr& s, const EventPtr& e, bool external, bool* handled);
// Marks an event's record `generation` done, and work that waits for it (cudaemu_events.cc).
void completeRecord(const EventPtr& e, uint64_t generation);
Work waitWork(const EventPtr& e, uint64_t generation);
// The capture an event's latest record belongs to, where it is still open (else null).
std::shared_ptr<Capture> openCaptureOf(const EventPtr& e);
// Whether the event's latest record is in an open capture; that capture is then invalidated
// (a query or a synchronization of it is invalid, as CUDA has it).
bool refuseCapturedEvent(const EventPtr& e);

}  // namespace cudaemu

// The calls of an entry point this thread made so far (name: "cudaLaunchKernel"), or of all of
// them (null); not a CUDA function.
extern "C" unsigned long cudaemuThreadCalls(const char* name);
// Whether this process made the primary context of device d (a GPU's memory taken by a
// process that never meant to use it shows as such a context); not a CUDA function.
extern "C" int cudaemuContextMade(int d);
// This thread's last kernel launch: the parameter bytes it passed (cudaLaunchKernel: the whole
// parameter; the driver's cuLaunchKernel: its buffer's size) and the threads per block it asked
// for (the emulated blocks run TUTTI_EMU_THREADS of them whatever it asked); not a CUDA function.
extern "C" void cudaemuThreadLastLaunch(size_t* bytes, unsigned* threads);
