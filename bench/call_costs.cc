// tutti-call-costs: what the CUDA calls a small eager operation is made of cost on this machine,
// each timed alone, back to back, on the host (scripts/device-check prints it beside the 8-byte
// targets of issue 5, which are made of little else). Rows:
//   - the queries tutti makes at every call (which memory a buffer is, which GPU a stream is on,
//     whether it captures) and the event record of a launch;
//   - an 8-byte device-to-device cudaMemcpyAsync (a one-rank all-reduce out of place), and
//     tutti's whole ncclAllReduce call of one rank, out of place and in place;
//   - a launch of tutti's own kernel with no operations (it returns at once), its parameter
//     passed whole (cudaLaunchKernel, 5.5 KB) or as the bytes a launch uses (cuLaunchKernel with
//     a parameter buffer: 392 bytes for one collective on one channel, 48 for the header); from
//     one thread, then from 4 threads at once, each with a stream of its own, on the one GPU
//     (ranks on threads sharing it);
//   - the same launches back to back until the GPU has run them all: the GPU's time per launch,
//     eagerly and from a CUDA graph, with and without an external event record after each.
// Host rows submit in batches of 100 and wait for the GPU between batches, untimed, so that a
// full launch queue never blocks a timed call. Each row is the median of 5 rounds.
//   tutti-call-costs [calls per round = 2000]
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/dev_work.h"
#include "kernels/cuda/kernel_table.h"
#include "nccl.h"
#include "runtime/cuda_shim.h"

namespace {

void check(int e, const char* what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "tutti-call-costs: %s: %s (%d)\n", what,
          cudaGetErrorString(static_cast<cudaError_t>(e)), e);
  exit(1);
}

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

constexpr int kBatch = 100;
constexpr int kRounds = 5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Host nanoseconds per call of fn (calls per round of them, in batches, sync() between batches
// untimed), the median of kRounds rounds.
double hostNs(int calls, const std::function<void()>& fn, const std::function<void()>& sync) {
  std::vector<double> rounds;
  for (int r = 0; r < kRounds; ++r) {
    double spent = 0;
    for (int done = 0; done < calls; done += kBatch) {
      const double t0 = now();
      for (int i = 0; i < kBatch; ++i) fn();
      spent += now() - t0;
      sync();
    }
    rounds.push_back(spent / double((calls + kBatch - 1) / kBatch * kBatch) * 1e9);
  }
  return median(rounds);
}

// The GPU's nanoseconds per call of fn back to back: calls of them, then a wait for all.
double deviceNs(int calls, const std::function<void()>& fn, const std::function<void()>& sync) {
  std::vector<double> rounds;
  for (int r = 0; r < kRounds; ++r) {
    sync();
    const double t0 = now();
    for (int i = 0; i < calls; ++i) fn();
    sync();
    rounds.push_back((now() - t0) / calls * 1e9);
  }
  return median(rounds);
}

// A launch of tutti's kernel (uint8, sum, Simple) with no operations: whole or packed.
struct Launcher {
  const void* kernel = tutti::dev::kernelFor(1, tutti::dev::kFnSum, tutti::dev::kSimple);
  cudaFunction_t function = nullptr;
  PFN_cuLaunchKernel_v4000 driver = nullptr;
  std::unique_ptr<tutti::dev::DevArgs> args = std::make_unique<tutti::dev::DevArgs>();

  Launcher() {
    if (!kernel) {
      fprintf(stderr, "tutti-call-costs: this build has no uint8 kernel (TUTTI_KERNEL_FILTER)\n");
      exit(1);
    }
    check(cudaGetFuncBySymbol(&function, kernel), "cudaGetFuncBySymbol");
    // The library's own lookup (cudaGetDriverEntryPoint before CUDA 12.5).
    driver =
        reinterpret_cast<PFN_cuLaunchKernel_v4000>(tutti::cuda::driverFunction("cuLaunchKernel"));
    if (!driver) {
      fprintf(stderr, "tutti-call-costs: the driver has no cuLaunchKernel entry point\n");
      exit(1);
    }
    args->nops = 0;  // the kernel returns at once
  }
  void whole(cudaStream_t s) const {
    void* a[] = {args.get()};
    check(cudaLaunchKernel(kernel, dim3(1), dim3(64), a, 0, s), "cudaLaunchKernel");
  }
  void packed(cudaStream_t s, size_t bytes) const {
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args.get(), CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &bytes, CU_LAUNCH_PARAM_END};
    check(driver(static_cast<CUfunction>(function), 1, 1, 1, 64, 1, 1, 0,
                 reinterpret_cast<CUstream>(s), nullptr, extra),
          "cuLaunchKernel");
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::max(kBatch, atoi(argv[1])) : 2000;
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  cudaStream_t s;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cudaEvent_t ev;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  void *a = nullptr, *b = nullptr;
  check(cudaMalloc(&a, 64), "cudaMalloc");
  check(cudaMalloc(&b, 64), "cudaMalloc");
  std::vector<char> pageable(64);
  auto sync = [&] { check(cudaStreamSynchronize(s), "cudaStreamSynchronize"); };
  auto none = [] {};
  const Launcher launcher;
  namespace dev = tutti::dev;
  const size_t oneOp = sizeof(dev::DevHeader) + sizeof(dev::DevChannel) + sizeof(dev::DevOp);
  const size_t header = sizeof(dev::DevHeader);

  struct Row {
    std::string what;
    double ns;
  };
  std::vector<Row> rows;
  auto host = [&](const std::string& what, const std::function<void()>& fn, bool queues) {
    for (int i = 0; i < kBatch; ++i) fn();  // warm
    sync();
    rows.push_back({what, hostNs(calls, fn, queues ? std::function<void()>(sync) : none)});
  };
  auto pointerQuery = [&](const void* p) {
    return [p] {
      cudaPointerAttributes at;
      check(cudaPointerGetAttributes(&at, p), "cudaPointerGetAttributes");
    };
  };
  auto streamDevice = [&] {
    if (tutti::cuda::streamDevice(s) != 0) check(cudaErrorUnknown, "cudaStreamGetDevice");
  };
  auto captureQuery = [&] {
    cudaStreamCaptureStatus st;
    unsigned long long id;
    check(cudaStreamGetCaptureInfo(s, &st, &id), "cudaStreamGetCaptureInfo");
  };
  auto record = [&] { check(cudaEventRecord(ev, s), "cudaEventRecord"); };
  auto copy = [&] { check(cudaMemcpyAsync(b, a, 8, cudaMemcpyDefault, s), "cudaMemcpyAsync"); };
  auto whole = [&] { launcher.whole(s); };
  auto packedOne = [&] { launcher.packed(s, oneOp); };
  auto packedHeader = [&] { launcher.packed(s, header); };
  host("cudaPointerGetAttributes, GPU memory", pointerQuery(a), false);
  host("cudaPointerGetAttributes, pageable host memory", pointerQuery(pageable.data()), false);
  host("cudaStreamGetDevice", streamDevice, false);
  host("cudaStreamGetCaptureInfo", captureQuery, false);
  host("cudaEventRecord", record, true);
  host("cudaMemcpyAsync 8 B device to device", copy, true);
  host("cudaLaunchKernel, whole parameter (" + std::to_string(sizeof(dev::DevArgs)) + " B)", whole,
       true);
  host("cuLaunchKernel, " + std::to_string(oneOp) + " B (one collective, one channel)", packedOne,
       true);
  host("cuLaunchKernel, " + std::to_string(header) + " B (the header)", packedHeader, true);

  // 4 threads at once, a stream each: each thread's time per launch.
  auto fourThreads = [&](const std::string& what, bool whole) {
    constexpr int kThreads = 4;
    std::vector<double> perThread(kThreads);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        check(cudaSetDevice(0), "cudaSetDevice");
        cudaStream_t own;
        check(cudaStreamCreateWithFlags(&own, cudaStreamNonBlocking), "cudaStreamCreate");
        auto fn = [&] { whole ? launcher.whole(own) : launcher.packed(own, oneOp); };
        auto wait = [&] { check(cudaStreamSynchronize(own), "cudaStreamSynchronize"); };
        for (int i = 0; i < kBatch; ++i) fn();
        wait();
        perThread[size_t(t)] = hostNs(calls, fn, wait);
        check(cudaStreamDestroy(own), "cudaStreamDestroy");
      });
    }
    for (std::thread& t : ts) t.join();
    rows.push_back({what, median(perThread)});
  };
  fourThreads("4 threads at once, cudaLaunchKernel whole", true);
  fourThreads("4 threads at once, cuLaunchKernel " + std::to_string(oneOp) + " B", false);

  // tutti's own 1-rank all-reduce of 8 bytes, the whole call (issue 5's third target: no slower
  // than NCCL's, which tutti-perf measures by the same calls with NVIDIA's library preloaded):
  // its queries and the copy (out of place), the queries alone (in place).
  ncclComm_t comm;
  int dev0 = 0;
  check(ncclCommInitAll(&comm, 1, &dev0) == ncclSuccess ? cudaSuccess : cudaErrorUnknown,
        "ncclCommInitAll");
  auto oneRank = [&](void* out) {
    return [&, out] {
      if (ncclAllReduce(a, out, 2, ncclFloat, ncclSum, comm, s) != ncclSuccess)
        check(cudaErrorUnknown, "ncclAllReduce");
    };
  };
  host("ncclAllReduce, 1 rank, 8 B out of place (tutti, the call)", oneRank(b), true);
  host("ncclAllReduce, 1 rank, 8 B in place (tutti, the call)", oneRank(a), true);
  ncclCommDestroy(comm);

  rows.push_back({"GPU per launch back to back, whole parameter", deviceNs(calls, whole, sync)});
  rows.push_back({"GPU per launch back to back, " + std::to_string(oneOp) + " B",
                  deviceNs(calls, packedOne, sync)});
  rows.push_back({"GPU per 8 B copy back to back", deviceNs(calls, copy, sync)});
  // From a CUDA graph of kGraphOps launches, each followed by an external record of one event
  // or not: tutti records its serial_ event so after every launch it captures (docs/
  // architecture.md), a node on the kernels' path at every replay.
  constexpr int kGraphOps = 20;
  auto graphNs = [&](bool withRecord) {
    cudaGraph_t g;
    cudaGraphExec_t x;
    check(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    for (int i = 0; i < kGraphOps; ++i) {
      packedOne();
      if (withRecord)
        check(cudaEventRecordWithFlags(ev, s, cudaEventRecordExternal), "cudaEventRecord");
    }
    check(cudaStreamEndCapture(s, &g), "cudaStreamEndCapture");
    check(cudaGraphInstantiate(&x, g, 0), "cudaGraphInstantiate");
    auto replay = [&] { check(cudaGraphLaunch(x, s), "cudaGraphLaunch"); };
    const double ns = deviceNs(std::max(1, calls / kGraphOps), replay, sync) / kGraphOps;
    check(cudaGraphExecDestroy(x), "cudaGraphExecDestroy");
    check(cudaGraphDestroy(g), "cudaGraphDestroy");
    return ns;
  };
  rows.push_back({"GPU per launch from a graph of " + std::to_string(kGraphOps), graphNs(false)});
  rows.push_back(
      {"GPU per launch from a graph, each then an external event record", graphNs(true)});

  printf("# tutti-call-costs: GPU 0 (%s), %d calls a round, median of %d rounds\n", prop.name,
         calls, kRounds);
  printf("%-62s %10s\n", "call", "ns/call");
  for (const Row& r : rows) printf("%-62s %10.1f\n", r.what.c_str(), r.ns);
  cudaFree(a);
  cudaFree(b);
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  return 0;
}
