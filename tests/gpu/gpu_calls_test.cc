// The CUDA calls an eager operation makes, counted by the emulated CUDA runtime (tests/cudaemu):
// on a GPU each costs the calling thread a microsecond or more, and small operations are made
// of little else (issue 5's 8-byte targets), so these tests hold them to what each path needs.
// Only the calls that reach the driver are counted; the thread-local ones (the current device,
// the last error, the capture mode) are left out.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"
#include "kernels/cuda/dev_work.h"

extern "C" unsigned long cudaemuThreadCalls(const char* name);
extern "C" void cudaemuThreadLastLaunch(size_t* bytes, unsigned* threads);

using namespace tutti::test;

namespace {

const char* const kCostly[] = {"cudaEventCreate",
                               "cudaEventCreateWithFlags",
                               "cudaEventDestroy",
                               "cudaEventRecord",
                               "cudaEventRecordWithFlags",
                               "cudaEventQuery",
                               "cudaEventSynchronize",
                               "cudaStreamWaitEvent",
                               "cudaStreamSynchronize",
                               "cudaStreamQuery",
                               "cudaStreamGetCaptureInfo",
                               "cudaStreamIsCapturing",
                               "cudaStreamGetDevice",
                               "cudaPointerGetAttributes",
                               "cudaLaunchKernel",
                               "cuLaunchKernel",
                               "cudaLaunchHostFunc",
                               "cudaMemcpyAsync",
                               "cudaMemsetAsync",
                               "cudaMemcpy",
                               "cudaMemset",
                               "cudaDeviceSynchronize",
                               "cudaMalloc",
                               "cudaFree",
                               "cudaHostRegister",
                               "cudaHostGetDevicePointer"};

std::vector<unsigned long> costlySoFar() {
  std::vector<unsigned long> n;
  for (const char* name : kCostly) n.push_back(cudaemuThreadCalls(name));
  return n;
}

// The costly calls this thread made in fn, per operation (ops of them): "cudaLaunchKernel 1,
// cudaPointerGetAttributes 2" (fractions as "1.5"); all but `leaveOut`'s, where one is named.
std::string costlyCallsPerOp(int ops, const std::function<void()>& fn,
                             const char* leaveOut = nullptr) {
  const std::vector<unsigned long> before = costlySoFar();
  fn();
  const std::vector<unsigned long> after = costlySoFar();
  std::string out;
  for (size_t i = 0; i < after.size(); ++i) {
    const unsigned long d = after[i] - before[i];
    if (d == 0 || (leaveOut && strcmp(kCostly[i], leaveOut) == 0)) continue;
    std::string per = std::to_string(d / unsigned(ops));
    if (d % unsigned(ops) != 0) per = std::to_string(double(d) / ops);
    out += (out.empty() ? "" : ", ") + std::string(kCostly[i]) + " " + per;
  }
  return out;
}

constexpr int kOps = 20;

// One rank: out of place, a copy on the caller's stream after asking what each buffer is and
// which GPU the stream is on; in place, nothing to copy.
TEST(GpuCalls, OneRanksAllReduceIsOneCopyAfterItsQueries) {
  SKIP_WITHOUT_GPU();
  ncclComm_t comm;
  int dev = 0;
  ASSERT_EQ(ncclCommInitAll(&comm, 1, &dev), ncclSuccess);
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 64), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 64), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto run = [&](float* out) {
    for (int i = 0; i < kOps; ++i)
      ASSERT_EQ(ncclAllReduce(a, out, 2, ncclFloat, ncclSum, comm, s), ncclSuccess);
  };
  run(b);  // the first calls set up the engine
  EXPECT_EQ(costlyCallsPerOp(kOps, [&] { run(b); }),
            "cudaStreamGetDevice 1, cudaPointerGetAttributes 2, cudaMemcpyAsync 1");
  EXPECT_EQ(costlyCallsPerOp(kOps, [&] { run(a); }),
            "cudaStreamGetDevice 1, cudaPointerGetAttributes 1");
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  cudaStreamDestroy(s);
  cudaFree(a);
  cudaFree(b);
}

// Four ranks on one GPU, from one thread in one group, each on a stream of its own: per rank
// one kernel (the driver's launch, passing the parameter bytes it uses), a record of where the
// caller's stream stood (a sibling sharing it would wait there), one of the kernel's end, and the
// capture query that orders it after the last.
TEST(GpuCalls, FourRanksInOneGroupEachLaunchOnceOnTheirOwnStream) {
  SKIP_WITHOUT_GPU();
  constexpr int kRanks = 4;
  std::vector<ncclComm_t> comms(kRanks);
  std::vector<int> devs(kRanks, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), kRanks, devs.data()), ncclSuccess);
  std::vector<float*> bufs(kRanks);
  std::vector<cudaStream_t> streams(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(cudaMalloc(&bufs[size_t(r)], 64), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking), cudaSuccess);
  }
  auto run = [&] {
    for (int i = 0; i < kOps; ++i) {
      ASSERT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < kRanks; ++r)
        ASSERT_EQ(ncclAllReduce(bufs[size_t(r)], bufs[size_t(r)], 2, ncclFloat, ncclSum,
                                comms[size_t(r)], streams[size_t(r)]),
                  ncclSuccess);
      ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    }
  };
  run();
  EXPECT_EQ(costlyCallsPerOp(kOps, run),
            "cudaEventRecord 4, cudaEventRecordWithFlags 4, cudaStreamGetCaptureInfo 4, "
            "cudaStreamGetDevice 4, cudaPointerGetAttributes 4, cuLaunchKernel 4");
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
    EXPECT_EQ(ncclCommDestroy(comms[size_t(r)]), ncclSuccess);
    cudaStreamDestroy(streams[size_t(r)]);
    cudaFree(bufs[size_t(r)]);
  }
}

// Four ranks in one group on one GPU, from this thread: each sums two buffers of count floats
// (rank r's hold r + 1 and 2 (r + 1)) in one group, `ops` times, the two in one launch; returns
// the launches' calls per group and the shape of the last launch; checks the sums (an operation
// that ran twice, or read a byte of its launch wrong, shows).
struct LaunchSeen {
  std::string calls;
  size_t bytes = 0;
  unsigned threads = 0;
};
LaunchSeen allReduceInOneGroup(size_t count, int ops) {
  constexpr int kRanks = 4;
  std::vector<ncclComm_t> comms(kRanks);
  std::vector<int> devs(kRanks, 0);
  EXPECT_EQ(ncclCommInitAll(comms.data(), kRanks, devs.data()), ncclSuccess);
  RankBuffers a(kRanks, count), b(kRanks, count);
  std::vector<cudaStream_t> streams(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking), cudaSuccess);
    a.fill(r, float(r + 1), streams[size_t(r)]);
    b.fill(r, float(2 * (r + 1)), streams[size_t(r)]);
  }
  auto run = [&] {
    for (int i = 0; i < ops; ++i) {
      EXPECT_EQ(ncclGroupStart(), ncclSuccess);
      for (int r = 0; r < kRanks; ++r) {
        for (RankBuffers* x : {&a, &b}) {
          EXPECT_EQ(ncclAllReduce(x->bufs[size_t(r)], x->bufs[size_t(r)], count, ncclFloat, ncclSum,
                                  comms[size_t(r)], streams[size_t(r)]),
                    ncclSuccess);
        }
      }
      EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    }
  };
  LaunchSeen seen;
  seen.calls = costlyCallsPerOp(ops, run);
  cudaemuThreadLastLaunch(&seen.bytes, &seen.threads);
  float sum = 10.0f;  // 1 + 2 + 3 + 4, then four times that at each further round
  for (int i = 1; i < ops; ++i) sum *= 4.0f;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(a.check(r, sum, streams[size_t(r)]), "");
    EXPECT_EQ(b.check(r, 2.0f * sum, streams[size_t(r)]), "");
    EXPECT_EQ(ncclCommDestroy(comms[size_t(r)]), ncclSuccess);
    cudaStreamDestroy(streams[size_t(r)]);
  }
  return seen;
}

// Only the calls that launch.
std::string launchCalls(const std::string& calls) {
  std::string out;
  for (const char* name : {"cudaLaunchKernel", "cuLaunchKernel"}) {
    const std::string key = std::string(name) + " ";
    for (size_t at = calls.find(key); at != std::string::npos; at = calls.find(key, at + 1)) {
      if (at != 0 && calls[at - 1] != ' ') continue;  // cuLaunchKernel inside cudaLaunchKernel
      const size_t end = calls.find(',', at);
      out +=
          (out.empty() ? "" : ", ") + calls.substr(at, end == std::string::npos ? end : end - at);
    }
  }
  return out;
}

// A kernel's parameter (dev::DevArgs) holds room for 16 operations on 16 channels, 5.5 KB; a
// launch passes the header, the channels its collectives use and its operations, through the
// driver's cuLaunchKernel (the runtime's cudaLaunchKernel copies a parameter whole). The rest
// of the parameter holds 0xa5 on the emulated GPU: the sums check that no kernel reads it. A
// small LL launch asks for 64 threads a block.
TEST(GpuCalls, ALaunchPassesOnlyTheParameterBytesItUses) {
  SKIP_WITHOUT_GPU();
  using namespace tutti::dev;
  const LaunchSeen small = allReduceInOneGroup(2, 3);
  EXPECT_EQ(launchCalls(small.calls), "cuLaunchKernel 4");
  EXPECT_EQ(small.bytes, sizeof(DevHeader) + sizeof(DevChannel) + 2 * sizeof(DevOp));
  EXPECT_EQ(small.bytes, 576u);
  EXPECT_EQ(small.threads, 64u);
  // 2 MiB each: Simple, more channels, each passed, and blocks of kThreads.
  const LaunchSeen big = allReduceInOneGroup(512 << 10, 1);
  EXPECT_EQ(launchCalls(big.calls), "cuLaunchKernel 4");
  const size_t channelBytes = big.bytes - sizeof(DevHeader) - 2 * sizeof(DevOp);
  EXPECT_EQ(channelBytes % sizeof(DevChannel), 0u) << big.bytes;
  EXPECT_GE(channelBytes / sizeof(DevChannel), 2u) << big.bytes;
  EXPECT_LE(channelBytes / sizeof(DevChannel), size_t(kMaxChannels)) << big.bytes;
  EXPECT_EQ(big.threads, unsigned(kThreads));
}

// TUTTI_LL_FULL_BLOCKS=1: LL launches take kThreads a block, as before.
TEST(GpuCalls, LLLaunchesTakeFullBlocksWhenAskedTo) {
  SKIP_WITHOUT_GPU();
  ScopedEnv full("TUTTI_LL_FULL_BLOCKS", "1");
  const LaunchSeen seen = allReduceInOneGroup(2, 1);
  EXPECT_EQ(seen.threads, unsigned(tutti::dev::kThreads));
}

// TUTTI_LAUNCH_FULL_PARAMS=1: the runtime's launch with the whole parameter (to compare the
// two on a GPU: scripts/device-check).
TEST(GpuCalls, LaunchesPassTheWholeParameterWhenAskedTo) {
  SKIP_WITHOUT_GPU();
  ScopedEnv full("TUTTI_LAUNCH_FULL_PARAMS", "1");
  const LaunchSeen seen = allReduceInOneGroup(2, 3);
  EXPECT_EQ(launchCalls(seen.calls), "cudaLaunchKernel 4");
  EXPECT_EQ(seen.bytes, sizeof(tutti::dev::DevArgs));
}

// A driver that refuses a parameter buffer shorter than the parameter (TUTTI_EMU_PARAMS_EXACT
// makes the emulated one do so): the first launch of each communicator tries it, then launches
// by the runtime with the whole parameter, and every later one goes there at once.
TEST(GpuCalls, ADriverThatWantsWholeParametersGetsThem) {
  SKIP_WITHOUT_GPU();
  ScopedEnv exact("TUTTI_EMU_PARAMS_EXACT", "1");
  const LaunchSeen seen = allReduceInOneGroup(2, 3);
  // Over the 3 operations: 4 refused driver launches, then 12 by the runtime.
  EXPECT_EQ(launchCalls(seen.calls), "cudaLaunchKernel 4, cuLaunchKernel 1.333333");
  EXPECT_EQ(seen.bytes, sizeof(tutti::dev::DevArgs));
}

// Four ranks on one GPU as threads, each on a stream of its own, calling without a group, in
// step (what `tutti-perf -t 4` times, issue 5's 4-rank 8-byte target): per rank and operation
// what a rank in a group makes (above), so a rank's thread pays for no group of one -- a record
// of where its stream stood, one of its kernel's end, the capture query, the stream's GPU, the
// buffers' kinds (one query in place, two out of place) and the launch.
TEST(GpuCalls, FourThreadRanksWithoutAGroupEachLaunchOncePerOperation) {
  SKIP_WITHOUT_GPU();
  constexpr int kRanks = 4;
  std::vector<ncclComm_t> comms(kRanks);
  std::vector<int> devs(kRanks, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), kRanks, devs.data()), ncclSuccess);
  ThreadBarrier barrier(kRanks);
  std::vector<std::string> inPlace(kRanks), outOfPlace(kRanks);
  std::vector<unsigned long> eventsMade(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const size_t i = size_t(r);
      EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
      float *a = nullptr, *b = nullptr;
      cudaStream_t s;
      EXPECT_EQ(cudaMalloc(&a, 64), cudaSuccess);
      EXPECT_EQ(cudaMalloc(&b, 64), cudaSuccess);
      EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      auto ops = [&](float* out) {  // in step: no rank more than one operation ahead
        for (int k = 0; k < kOps; ++k) {
          barrier.wait();
          ASSERT_EQ(ncclAllReduce(a, out, 2, ncclFloat, ncclSum, comms[i], s), ncclSuccess)
              << ncclGetLastError(comms[i]);
        }
      };
      ops(a);  // the first operations connect the links and make the events
      ops(b);
      const unsigned long made = cudaemuThreadCalls("cudaEventCreateWithFlags");
      inPlace[i] = costlyCallsPerOp(
          kOps, [&] { ops(a); }, "cudaEventCreateWithFlags");
      outOfPlace[i] = costlyCallsPerOp(
          kOps, [&] { ops(b); }, "cudaEventCreateWithFlags");
      eventsMade[i] = cudaemuThreadCalls("cudaEventCreateWithFlags") - made;
      barrier.wait();
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaStreamDestroy(s);
      cudaFree(a);
      cudaFree(b);
    });
  }
  for (std::thread& t : threads) t.join();
  const std::string common =
      "cudaEventRecord 1, cudaEventRecordWithFlags 1, cudaStreamGetCaptureInfo 1, "
      "cudaStreamGetDevice 1, cudaPointerGetAttributes ";
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(inPlace[size_t(r)], common + "1, cuLaunchKernel 1") << "rank " << r << ", in place";
    EXPECT_EQ(outOfPlace[size_t(r)], common + "2, cuLaunchKernel 1")
        << "rank " << r << ", out of place";
    // The pool of entry events is the process's: a thread makes one where the others' hold
    // them all, as their threads happen to run -- a few, never one an operation.
    EXPECT_LE(eventsMade[size_t(r)], 4u) << "rank " << r;
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Four ranks on one GPU as threads, each on a stream of its own, calling without a group: each
// leaves an entry event on its stream at every operation (a sibling that shared the stream
// would wait there), given back once every sibling has passed that operation. Threads run
// ahead of one another (nothing holds an eager rank back until the GPU's queue is full), here
// on purpose: rank 0 makes 100 operations, then the others do. Once the first such round has
// made the events, the next makes none and destroys none (with a pool of 64 it made and
// destroyed about one per operation).
TEST(GpuCalls, RanksRunningAheadOfTheirSiblingsReuseTheirEntryEvents) {
  SKIP_WITHOUT_GPU();
  constexpr int kRanks = 4, kAhead = 100;
  std::vector<ncclComm_t> comms(kRanks);
  std::vector<int> devs(kRanks, 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), kRanks, devs.data()), ncclSuccess);
  ThreadBarrier barrier(kRanks);
  std::vector<unsigned long> made(kRanks), destroyed(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      const size_t i = size_t(r);
      EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
      float* buf = nullptr;
      cudaStream_t s;
      EXPECT_EQ(cudaMalloc(&buf, 64), cudaSuccess);
      EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
      auto ops = [&](int n) {
        for (int k = 0; k < n; ++k)
          ASSERT_EQ(ncclAllReduce(buf, buf, 2, ncclFloat, ncclSum, comms[i], s), ncclSuccess)
              << ncclGetLastError(comms[i]);
      };
      auto round = [&] {  // then the others, together (at most one operation apart)
        barrier.wait();
        if (r == 0) ops(kAhead);
        for (int k = 0; k < kAhead; ++k) {
          barrier.wait();
          if (r != 0) ops(1);
        }
      };
      ops(5);  // together: the first operation connects the ranks' links
      round();
      const unsigned long m = cudaemuThreadCalls("cudaEventCreateWithFlags");
      const unsigned long d = cudaemuThreadCalls("cudaEventDestroy");
      round();
      round();
      made[i] = cudaemuThreadCalls("cudaEventCreateWithFlags") - m;
      destroyed[i] = cudaemuThreadCalls("cudaEventDestroy") - d;
      barrier.wait();
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      cudaStreamDestroy(s);
      cudaFree(buf);
    });
  }
  for (std::thread& t : threads) t.join();
  // Rank 0 holds 100 entries at once in every round; the others' hold a few more, as their
  // threads happen to run: a later round may hold a few more than the first, not 100.
  unsigned long madeAll = 0;
  for (int r = 0; r < kRanks; ++r) {
    madeAll += made[size_t(r)];
    EXPECT_EQ(destroyed[size_t(r)], 0u) << "rank " << r << " destroyed events";
  }
  EXPECT_LE(madeAll, unsigned(3 * kRanks)) << "events made after the first round";
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

}  // namespace
