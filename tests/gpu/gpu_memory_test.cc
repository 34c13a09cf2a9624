// What a GPU rank takes besides device buffers, and what it refuses before anything runs
// (label "gpu"): page-locked host memory runs as kernels in stream order, as NCCL's does;
// pageable host memory runs on the CPU engine after the caller's stream; a stream being
// captured cannot hold a host operation; a device-resident PreMulSum scalar in pinned memory;
// the send/receive limit of one group; the application's pending CUDA error is left alone;
// one rank's collectives as copies made at the call.
// Every test skips, saying why, where no GPU is present.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"

using namespace tutti::test;

namespace {

// Two ranks as threads of this process on GPU 0, made by one thread (ncclCommInitAll).
struct TwoRanks {
  ncclComm_t comms[2] = {nullptr, nullptr};
  cudaStream_t streams[2] = {nullptr, nullptr};
  TwoRanks() {
    int devs[2] = {0, 0};
    EXPECT_EQ(ncclCommInitAll(comms, 2, devs), ncclSuccess) << ncclGetLastError(nullptr);
    for (cudaStream_t& s : streams) {
      EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    }
  }
  // Both ranks all-reduce their buffer of b in place, summing, in one group: the group's
  // result, or the first call's failure.
  ncclResult_t allReduce(RankBuffers& b) {
    if (ncclResult_t e = ncclGroupStart(); e != ncclSuccess) return e;
    for (int r = 0; r < 2; ++r) {
      ncclResult_t e = ncclAllReduce(b.bufs[size_t(r)], b.bufs[size_t(r)], b.count, ncclFloat,
                                     ncclSum, comms[r], streams[r]);
      if (e != ncclSuccess) {
        ncclGroupEnd();
        return e;
      }
    }
    return ncclGroupEnd();
  }
  // In one group, each rank sends its buffer of `from` to the other in messages of `piece`
  // floats, and receives the other's into its buffer of `to`: the group's result, or the first
  // call's failure.
  ncclResult_t exchangeInPieces(RankBuffers& from, RankBuffers& to, size_t piece) {
    if (ncclResult_t e = ncclGroupStart(); e != ncclSuccess) return e;
    for (size_t at = 0; at < from.count; at += piece) {
      for (int r = 0; r < 2; ++r) {
        ncclResult_t e =
            ncclSend(from.bufs[size_t(r)] + at, piece, ncclFloat, 1 - r, comms[r], streams[r]);
        if (e == ncclSuccess)
          e = ncclRecv(to.bufs[size_t(r)] + at, piece, ncclFloat, 1 - r, comms[r], streams[r]);
        if (e != ncclSuccess) {
          ncclGroupEnd();
          return e;
        }
      }
    }
    return ncclGroupEnd();
  }
  ~TwoRanks() {
    for (ncclComm_t c : comms) {
      if (c) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    }
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
  }
};

// Each rank's stream is held (a host function) ahead of the copy into its pinned buffer when
// ncclAllReduce is called: a kernel in stream order reads what the copy wrote, and the group
// returns while the stream is still held. The CPU engine, which took pinned memory before,
// would wait for the stream at ncclGroupEnd (until the gate's limit) or read the buffer early.
TEST(GpuHostMemory, PinnedHostBuffersRunAsKernelsInStreamOrder) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kCount = size_t(16) << 20;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  TwoRanks t;
  float* src[2] = {nullptr, nullptr};
  float* pinned[2] = {nullptr, nullptr};
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(cudaMalloc(&src[r], kCount * 4), cudaSuccess);
    EXPECT_EQ(cudaMallocHost(&pinned[r], kCount * 4), cudaSuccess);
    if (!src[r] || !pinned[r]) break;
    std::vector<float> v(kCount, float(r + 1));
    EXPECT_EQ(cudaMemcpy(src[r], v.data(), kCount * 4, cudaMemcpyHostToDevice), cudaSuccess);
    for (size_t i = 0; i < kCount; ++i) pinned[r][i] = -100.0f;
  }
  // cudaMemcpy from pageable memory and cudaMemset return before the bytes land, on the legacy
  // stream, which the non-blocking streams below do not wait for.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (!HasFailure()) {
    // The engines made first (kernels loaded, FIFOs allocated: calls that may wait for the
    // GPU), on other buffers, so that the held streams meet only the operation under test.
    RankBuffers warm(2, 256);
    EXPECT_EQ(t.allReduce(warm), ncclSuccess) << ncclGetLastError(nullptr);
    for (cudaStream_t s : t.streams) EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    StreamGate gate(std::chrono::seconds(20));
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(gate.hold(t.streams[r]), cudaSuccess);
      EXPECT_EQ(
          cudaMemcpyAsync(pinned[r], src[r], kCount * 4, cudaMemcpyDeviceToHost, t.streams[r]),
          cudaSuccess);
    }
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(
          ncclAllReduce(pinned[r], pinned[r], kCount, ncclFloat, ncclSum, t.comms[r], t.streams[r]),
          ncclSuccess)
          << ncclGetLastError(t.comms[r]);
    }
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_FALSE(gate.released()) << "the all-reduce of pinned buffers waited for the stream";
    gate.open();
    for (int r = 0; r < 2; ++r) EXPECT_EQ(cudaStreamSynchronize(t.streams[r]), cudaSuccess);
    for (int r = 0; r < 2 && !HasFailure(); ++r) {
      for (size_t i = 0; i < kCount; i += 4099) {
        if (pinned[r][i] != 3.0f) {
          ADD_FAILURE() << "rank " << r << " element " << i << ": " << pinned[r][i];
          break;
        }
      }
      EXPECT_EQ(pinned[r][kCount - 1], 3.0f) << "rank " << r;
    }
  }
  for (int r = 0; r < 2; ++r) {
    cudaFree(src[r]);
    cudaFreeHost(pinned[r]);
  }
}

struct LateWrite {
  std::vector<float>* buf;
  float value;
};

// Host buffers (pageable) on a GPU rank: the CPU engine runs them after the work the caller
// queued on its stream before they run -- here a host function that writes the buffer 200 ms
// after it is queued: before a plain call, and in a group after the call but before
// ncclGroupEnd (where NCCL would enqueue the operation).
TEST(GpuHostMemory, PageableHostBuffersWaitForTheCallersStream) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 2;
  constexpr size_t kCount = 4096;
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  std::vector<ncclComm_t> comms = initThreads(n);
  for (bool grouped : {false, true}) {
    std::vector<std::vector<float>> bufs(n, std::vector<float>(kCount, -100.0f));
    std::vector<LateWrite> writes = {{&bufs[0], 1.0f}, {&bufs[1], 2.0f}};
    RankFailures failures;
    onThreads(n, [&](int r) {
      cudaStream_t s;
      if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        failures.add(r, "cudaStreamCreate failed");
        return;
      }
      auto write = [](void* p) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        auto* w = static_cast<LateWrite*>(p);
        for (float& x : *w->buf) x = w->value;
      };
      auto call = [&] {
        ncclResult_t res = ncclAllReduce(bufs[size_t(r)].data(), bufs[size_t(r)].data(), kCount,
                                         ncclFloat, ncclSum, comms[size_t(r)], s);
        if (res != ncclSuccess) failures.add(r, ncclGetLastError(comms[size_t(r)]));
      };
      if (grouped) {
        ncclGroupStart();
        call();
        if (cudaLaunchHostFunc(s, write, &writes[size_t(r)]) != cudaSuccess)
          failures.add(r, "cudaLaunchHostFunc failed");
        if (ncclGroupEnd() != ncclSuccess) failures.add(r, ncclGetLastError(nullptr));
      } else {
        if (cudaLaunchHostFunc(s, write, &writes[size_t(r)]) != cudaSuccess)
          failures.add(r, "cudaLaunchHostFunc failed");
        call();
      }
      // The call returned with the operation done: no stream wait needed to read the result.
      for (size_t i = 0; i < kCount; ++i) {
        if (bufs[size_t(r)][i] != 3.0f) {
          failures.add(r, std::string(grouped ? "in a group, " : "") + "element " +
                              std::to_string(i) + ": " + std::to_string(bufs[size_t(r)][i]) +
                              ", expected 3");
          break;
        }
      }
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    });
    failures.report();
  }
  destroyAll(comms);
}

// The CPU engine runs a host-buffer call when it is made, so it cannot go into a CUDA graph:
// refused, and neither the capture nor the communicator suffers.
TEST(GpuHostMemory, HostBuffersOnACapturingStreamAreRefused) {
  SKIP_WITHOUT_GPU();
  std::vector<ncclComm_t> comms = initThreads(1);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  std::vector<float> h(64, 2.0f);
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  EXPECT_EQ(ncclAllReduce(h.data(), h.data(), 64, ncclFloat, ncclSum, comms[0], s),
            ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(comms[0])).find("cannot be captured"), std::string::npos)
      << ncclGetLastError(comms[0]);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess);
  if (graph) cudaGraphDestroy(graph);
  EXPECT_EQ(ncclAllReduce(h.data(), h.data(), 64, ncclFloat, ncclSum, comms[0], s), ncclSuccess)
      << ncclGetLastError(comms[0]);
  EXPECT_EQ(h[0], 2.0f);
  cudaStreamDestroy(s);
  destroyAll(comms);
}

// ncclScalarDevice: the kernel reads the scalar from pinned host memory (accepted, as NCCL
// does); pageable memory it cannot read is refused at the call, the communicator usable
// after; a host-buffer call reads a scalar in GPU memory with a copy.
TEST(GpuValidation, PreMulSumScalarsWhereverTheReaderCanReachThem) {
  SKIP_WITHOUT_GPU();
  std::vector<ncclComm_t> comms = initThreads(1);
  ncclComm_t c = comms[0];
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  RankBuffers b(1, 256);
  b.fill(0, 2.0f, s);
  float* pinnedScalar = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinnedScalar, sizeof(float)), cudaSuccess);
  *pinnedScalar = 3.0f;
  ncclRedOp_t op;
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, pinnedScalar, ncclFloat, ncclScalarDevice, c),
            ncclSuccess);
  EXPECT_EQ(ncclAllReduce(b.bufs[0], b.bufs[0], b.count, ncclFloat, op, c, s), ncclSuccess)
      << ncclGetLastError(c);
  EXPECT_EQ(b.check(0, 6.0f, s), "");
  ncclRedOpDestroy(op, c);

  float pageableScalar = 5.0f;
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &pageableScalar, ncclFloat, ncclScalarDevice, c),
            ncclSuccess);
  EXPECT_EQ(ncclAllReduce(b.bufs[0], b.bufs[0], b.count, ncclFloat, op, c, s), ncclInvalidArgument);
  EXPECT_NE(std::string(ncclGetLastError(c)).find("cannot read"), std::string::npos)
      << ncclGetLastError(c);
  ncclRedOpDestroy(op, c);

  float* devScalar = nullptr;
  ASSERT_EQ(cudaMalloc(&devScalar, sizeof(float)), cudaSuccess);
  const float seven = 7.0f;
  ASSERT_EQ(cudaMemcpy(devScalar, &seven, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // it returns before the bytes land
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, devScalar, ncclFloat, ncclScalarDevice, c), ncclSuccess);
  std::vector<float> h(64, 2.0f);
  EXPECT_EQ(ncclAllReduce(h.data(), h.data(), 64, ncclFloat, op, c, s), ncclSuccess)
      << ncclGetLastError(c);
  EXPECT_EQ(h[0], 14.0f);
  EXPECT_EQ(h[63], 14.0f);
  ncclRedOpDestroy(op, c);

  EXPECT_EQ(ncclAllReduce(b.bufs[0], b.bufs[0], b.count, ncclFloat, ncclSum, c, s), ncclSuccess)
      << ncclGetLastError(c);  // still usable after the refusal
  EXPECT_EQ(b.check(0, 6.0f, s), "");
  cudaFree(devScalar);
  cudaFreeHost(pinnedScalar);
  cudaStreamDestroy(s);
  destroyAll(comms);
}

// A group of more sends and receives than one kernel's work holds (dev::kMaxOps, 16) runs them
// through p2pManyKernel: 32 messages each way between two ranks of one thread's group. More
// than 64 with the peers at one distance round the ranks (two ranks: all of them) is refused at
// ncclGroupEnd before anything runs, and both ranks go on.
TEST(GpuValidation, ManySendsInOneGroupRunAndTooManyAreRefused) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  TwoRanks t;
  RankBuffers b(2, 1024), c(2, 1024);
  for (int r = 0; r < 2; ++r) {
    b.fill(r, float(r + 1), t.streams[r]);
    c.fill(r, -1.0f, t.streams[r]);
  }
  // 32 messages of 32 floats each way: the whole buffer.
  ASSERT_EQ(t.exchangeInPieces(b, c, 32), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(c.check(0, 2.0f, t.streams[0]), "");
  EXPECT_EQ(c.check(1, 1.0f, t.streams[1]), "");

  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int i = 0; i < 65; ++i) {
    EXPECT_EQ(ncclSend(b.bufs[0], b.count, ncclFloat, 1, t.comms[0], t.streams[0]), ncclSuccess);
  }
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("at most 64"), std::string::npos)
      << ncclGetLastError(nullptr);
  ASSERT_EQ(t.allReduce(b), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(b.check(r, 3.0f, t.streams[r]), "");
}

// n ranks on the one GPU, one thread's group: each rank sends `per` messages to every rank
// (itself included) and receives `per` from each, all in an order of its own (shuffled from
// seed, each pair's messages in turn; seed 0: every send, then every receive); with 1 KiB slots
// (NCCL_BUFFSIZE, set by the caller) the later messages on each pair are past the FIFO's 8
// slots, so senders wait for their receivers. Every message must arrive whole, and a
// collective after it runs.
void exchangeEveryWayOnOneGpu(int n, int per, unsigned seed) {
  auto count = [](int from, int to, int m) {  // floats
    return m == 0 ? size_t(1 + 97 * ((from * 5 + to) % 7))
                  : size_t(2600 + 700 * ((from + 2 * to + m) % 5));
  };
  auto value = [](int from, int to, int m, size_t i) {
    return float(10000 * from + 100 * to + 10 * m) + float(i % 9);
  };
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  std::vector<int> devs(size_t(n), 0);
  ASSERT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess)
      << ncclGetLastError(nullptr);
  std::vector<cudaStream_t> streams(size_t(n), nullptr);
  // [(r * n + q) * per + m]: rank r's m-th message to / from rank q, on the device.
  std::vector<float*> in(size_t(n * n * per), nullptr), out(size_t(n * n * per), nullptr);
  auto at = [n, per](int r, int q, int m) { return size_t((r * n + q) * per + m); };
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&streams[size_t(r)], cudaStreamNonBlocking), cudaSuccess);
    for (int q = 0; q < n; ++q) {
      for (int m = 0; m < per; ++m) {
        std::vector<float> h(count(r, q, m));
        for (size_t k = 0; k < h.size(); ++k) h[k] = value(r, q, m, k);
        EXPECT_EQ(cudaMalloc(&in[at(r, q, m)], h.size() * 4), cudaSuccess);
        EXPECT_EQ(cudaMemcpy(in[at(r, q, m)], h.data(), h.size() * 4, cudaMemcpyHostToDevice),
                  cudaSuccess);
        EXPECT_EQ(cudaMalloc(&out[at(r, q, m)], count(q, r, m) * 4), cudaSuccess);
        EXPECT_EQ(cudaMemset(out[at(r, q, m)], 0xff, count(q, r, m) * 4), cudaSuccess);
      }
    }
  }
  // cudaMemcpy from pageable memory and cudaMemset return before the bytes land, on the legacy
  // stream, which the non-blocking streams below do not wait for.
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (!::testing::Test::HasFailure()) {
    // Each group's calls checked with EXPECT: the group is always ended, whatever failed.
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      // Every (peer, direction) `per` times: its k-th turn takes message k.
      std::vector<int> turns;
      for (int t = 0; t < 2 * n; t += 2) turns.insert(turns.end(), size_t(per), t);
      for (int t = 1; t < 2 * n; t += 2) turns.insert(turns.end(), size_t(per), t);
      if (seed != 0)
        std::shuffle(turns.begin(), turns.end(), std::mt19937(seed + 11 * unsigned(r)));
      std::vector<int> taken(size_t(2 * n), 0);
      for (int t : turns) {
        const int q = t / 2, m = taken[size_t(t)]++;
        ncclComm_t c = comms[size_t(r)];
        cudaStream_t s = streams[size_t(r)];
        const ncclResult_t res =
            t % 2 == 0 ? ncclSend(in[at(r, q, m)], count(r, q, m), ncclFloat, q, c, s)
                       : ncclRecv(out[at(r, q, m)], count(q, r, m), ncclFloat, q, c, s);
        EXPECT_EQ(res, ncclSuccess) << ncclGetLastError(nullptr);
      }
    }
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    std::string first;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
      ncclResult_t async = ncclSuccess;
      EXPECT_EQ(ncclCommGetAsyncError(comms[size_t(r)], &async), ncclSuccess);
      EXPECT_EQ(async, ncclSuccess) << "rank " << r << ": " << ncclGetLastError(comms[size_t(r)]);
      for (int q = 0; q < n && first.empty(); ++q) {
        for (int m = 0; m < per && first.empty(); ++m) {
          std::vector<float> h(count(q, r, m));
          EXPECT_EQ(cudaMemcpy(h.data(), out[at(r, q, m)], h.size() * 4, cudaMemcpyDeviceToHost),
                    cudaSuccess);
          for (size_t k = 0; k < h.size() && first.empty(); ++k) {
            if (h[k] != value(q, r, m, k)) {
              first = "rank " + std::to_string(r) + ", message " + std::to_string(m) +
                      " from rank " + std::to_string(q) + ", element " + std::to_string(k);
            }
          }
        }
      }
    }
    EXPECT_EQ(first, "");
    // The communicators go on: an all-reduce of every rank's first input's first float.
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(ncclAllReduce(in[at(r, 0, 0)], out[at(r, 0, 0)], 1, ncclFloat, ncclSum,
                              comms[size_t(r)], streams[size_t(r)]),
                ncclSuccess);
    }
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    float want = 0;
    for (int r = 0; r < n; ++r) want += value(r, 0, 0, 0);
    for (int r = 0; r < n; ++r) {
      float got = 0;
      EXPECT_EQ(cudaStreamSynchronize(streams[size_t(r)]), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(&got, out[at(r, 0, 0)], 4, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(got, want) << "rank " << r;
    }
  }
  for (float* p : in) cudaFree(p);
  for (float* p : out) cudaFree(p);
  for (int r = 0; r < n; ++r) {
    if (streams[size_t(r)]) cudaStreamDestroy(streams[size_t(r)]);
    EXPECT_EQ(ncclCommDestroy(comms[size_t(r)]), ncclSuccess);
  }
}

// Ranks sharing a GPU may each have only the blocks that can be resident at once
// (DeviceEngine::findP2pBlockCap; TUTTI_P2P_MAX_BLOCKS forces 3 here): past that, a block runs
// several (peer, direction) pairs in turn, only sending or only receiving, by distance round the
// ranks (devplan::plan). 6 ranks, 2 messages every way, in shuffled orders.
TEST(GpuValidation, SendsAndReceivesPastTheResidentBlockCapShareBlocksAndComplete) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  ScopedEnv cap("TUTTI_P2P_MAX_BLOCKS", "3");
  ScopedEnv buff("NCCL_BUFFSIZE", "8192");
  exchangeEveryWayOnOneGpu(6, 2, 5);
}

// Past 64 sends and receives to other ranks, a group runs in launches of whole rounds (the
// peers at one distance round the ranks), at most 64 operations each (devplan::plan): 12 ranks,
// 3 messages every way, 66 operations with other ranks each, 6 a round: two launches. Every
// send first (a launch that split a round would deadlock there), then in shuffled orders.
TEST(GpuValidation, ManySendsAndReceivesRunInLaunchesOfWholeRounds) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  ScopedEnv buff("NCCL_BUFFSIZE", "8192");
  exchangeEveryWayOnOneGpu(12, 3, 0);
  exchangeEveryWayOnOneGpu(12, 3, 9);
}

// The gathered LL all-reduce (dev::kAlgoGather) on the GPU: 4 ranks on the one GPU, driven by one
// thread's groups, 300 small all-reduces back to back (each round's inputs differ, so a line
// left from an earlier round shows), on values whose sums round. Every rank must hold exactly
// the rank-order float sum, the same bits everywhere: what the gather computes, and what a
// torn or stale LL line would break.
TEST(GpuGather, BackToBackSmallAllReducesGiveTheRankOrderSumOnEveryRank) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4, kRounds = 300;
  constexpr size_t kCount = 64;  // 256 bytes: gathered
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  ScopedEnv proto("NCCL_PROTO", "LL");
  ncclComm_t comms[n];
  int devs[n] = {0, 0, 0, 0};
  ASSERT_EQ(ncclCommInitAll(comms, n, devs), ncclSuccess) << ncclGetLastError(nullptr);
  auto input = [](int r, int round, size_t i) {
    return 1.0f / float(3 + 7 * r + int(i % 13) + round % 17);
  };
  const size_t total = kCount * kRounds;
  cudaStream_t streams[n];
  float *in[n], *out[n];
  std::vector<float> host(total);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&in[r], total * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&out[r], total * 4), cudaSuccess);
    for (int k = 0; k < kRounds; ++k)
      for (size_t i = 0; i < kCount; ++i) host[size_t(k) * kCount + i] = input(r, k, i);
    ASSERT_EQ(cudaMemcpy(in[r], host.data(), total * 4, cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemset(out[r], 0xff, total * 4), cudaSuccess);
  }
  // cudaMemcpy from pageable memory and cudaMemset return before the bytes land, on the legacy
  // stream, which the non-blocking streams below do not wait for.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int k = 0; k < kRounds; ++k) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < n; ++r) {
      const size_t at = size_t(k) * kCount;
      EXPECT_EQ(
          ncclAllReduce(in[r] + at, out[r] + at, kCount, ncclFloat, ncclSum, comms[r], streams[r]),
          ncclSuccess);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  }
  size_t bad = 0;
  std::string first;
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(cudaStreamSynchronize(streams[r]), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(host.data(), out[r], total * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int k = 0; k < kRounds; ++k) {
      for (size_t i = 0; i < kCount; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want = q == 0 ? input(q, k, i) : want + input(q, k, i);
        const float got = host[size_t(k) * kCount + i];
        if (memcmp(&got, &want, 4) != 0 && bad++ == 0) {
          first = "rank " + std::to_string(r) + " round " + std::to_string(k) + " element " +
                  std::to_string(i);
        }
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "first: " << first;
  for (int r = 0; r < n; ++r) {
    cudaFree(in[r]);
    cudaFree(out[r]);
    cudaStreamDestroy(streams[r]);
    EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
  }
}

// ncclCommAbort while the communicator's work is still queued behind something that does not
// end (here a host function that blocks rank 0's stream; in practice another communicator's
// stuck kernel): the abort returns within seconds instead of waiting for it, and what the work
// needs stays allocated. Then the stream is let go, and the queued kernel stops on the abort word.
TEST(GpuAbort, AnAbortDoesNotWaitForWorkQueuedBehindAStuckStream) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "60");
  TwoRanks t;
  RankBuffers b(2, 1024);
  for (int r = 0; r < 2; ++r) b.fill(r, 1.0f, t.streams[r]);
  // The engines made first (kernels loaded, FIFOs allocated: calls that may wait for the
  // GPU), so that nothing but the abort meets the blocked stream.
  ASSERT_EQ(t.allReduce(b), ncclSuccess) << ncclGetLastError(nullptr);
  for (cudaStream_t s : t.streams) ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  // If the abort waits for the stream after all, that wait ends at 40 s.
  StreamGate gate(std::chrono::seconds(40));
  ASSERT_EQ(gate.hold(t.streams[0]), cudaSuccess);
  ASSERT_EQ(t.allReduce(b), ncclSuccess) << ncclGetLastError(nullptr);  // queued behind it
  for (ncclComm_t& c : t.comms) {
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
    c = nullptr;
  }
  EXPECT_FALSE(gate.released()) << "the abort waited for the blocked stream";
  gate.open();
  for (cudaStream_t s : t.streams) EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
}

// An error the application's own CUDA call left pending is still there after a collective
// (tutti clears only the errors of its own calls). Two ranks: the engine's path (one rank's
// collective is a plain copy).
TEST(GpuValidation, TheApplicationsPendingCudaErrorIsLeftForIt) {
  SKIP_WITHOUT_GPU();
  ScopedEnv timeout("TUTTI_TIMEOUT", "30");
  TwoRanks t;
  RankBuffers b(2, 256);
  for (int r = 0; r < 2; ++r) b.fill(r, float(r + 1), t.streams[r]);
  void* huge = nullptr;
  ASSERT_NE(cudaMalloc(&huge, size_t(1) << 62), cudaSuccess);
  EXPECT_EQ(t.allReduce(b), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(b.check(r, 3.0f, t.streams[r]), "");
}

// One rank: a collective is a copy made at the call (or nothing in place), a PreMulSum a
// kernel; in a group that holds the communicator's operations the copies wait their turn, so
// both orders of calling give c = 2a: b = a; b *= 2 (in place); c = b.
TEST(GpuOneRank, CopiesAndKernelsKeepTheCallsOrder) {
  SKIP_WITHOUT_GPU();
  std::vector<ncclComm_t> comms = initThreads(1);
  ncclComm_t c = comms[0];
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  RankBuffers a(1, 1 << 20), bb(1, 1 << 20), cc(1, 1 << 20);
  float two = 2.0f;
  ncclRedOp_t twice;
  ASSERT_EQ(ncclRedOpCreatePreMulSum(&twice, &two, ncclFloat, ncclScalarHostImmediate, c),
            ncclSuccess);
  for (bool grouped : {false, true}) {
    a.fill(0, 3.0f, s);
    bb.fill(0, -1.0f, s);
    cc.fill(0, -1.0f, s);
    if (grouped) ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(a.bufs[0], bb.bufs[0], a.count, ncclFloat, ncclSum, c, s), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(bb.bufs[0], bb.bufs[0], a.count, ncclFloat, twice, c, s), ncclSuccess);
    EXPECT_EQ(ncclAllReduce(bb.bufs[0], cc.bufs[0], a.count, ncclFloat, ncclAvg, c, s),
              ncclSuccess);
    if (grouped) ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    EXPECT_EQ(cc.check(0, 6.0f, s), "") << (grouped ? "in a group" : "one by one");
    EXPECT_EQ(bb.check(0, 6.0f, s), "") << (grouped ? "in a group" : "one by one");
  }
  ncclRedOpDestroy(twice, c);
  cudaStreamDestroy(s);
  destroyAll(comms);
}

}  // namespace
