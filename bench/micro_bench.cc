// Micro-benchmarks (Google Benchmark), so a regression shows where it starts:
//  - the host reduction loops per datatype and op, against memcpy of the same bytes;
//  - memcpy against the streaming copy, by size;
//  - one FIFO hop per transport: a send/recv pair between two ranks (threads) over shm or
//    tcp, 8 bytes (latency) and one 128 KiB slot (bandwidth).
//   build/tutti-micro-bench --benchmark_filter=Reduce
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "kernels/cpu/reduce.h"
#include "kernels/cpu/simd.h"
#include "nccl.h"

namespace {

using namespace tutti::cpu;

constexpr size_t kElems = 1 << 20;

void BM_Memcpy(benchmark::State& state) {
  std::vector<char> a(kElems * 4, 1), b(kElems * 4);
  for (auto _ : state) {
    memcpy(b.data(), a.data(), a.size());
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(a.size()));
}
BENCHMARK(BM_Memcpy);

// memcpy (0) against the streaming copy (1, cpu::simd::streamCopy) by size, the same buffers
// copied again and again: where streaming starts to pay is what TUTTI_STREAM_COPY_MIN's
// default rests on.
void BM_CopyBySize(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  const bool stream = state.range(1) != 0;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  for (auto _ : state) {
    if (stream) {
      simd::streamCopy(b.data(), a.data(), bytes);
    } else {
      memcpy(b.data(), a.data(), bytes);
    }
    benchmark::DoNotOptimize(b.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
}
BENCHMARK(BM_CopyBySize)
    ->ArgsProduct({{256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 32 << 20}, {0, 1}})
    ->UseRealTime();

// dst = recv (op) mine over 1 Mi elements; bytes = the output size (as memcpy's).
template <typename T, RedFn F>
void BM_Reduce(benchmark::State& state) {
  std::vector<T> a(kElems), b(kElems), out(kElems);
  for (size_t i = 0; i < kElems; ++i) {
    a[i] = Elem<T>::store(typename Elem<T>::Acc(i % 7));
    b[i] = Elem<T>::store(typename Elem<T>::Acc(i % 5));
  }
  Reducer<T, F> r;
  r.hasPost = state.range(0) != 0;  // with ncclAvg's divide
  r.postDivisor = 2;
  for (auto _ : state) {
    r.reduce(out.data(), a.data(), b.data(), kElems, true);
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(kElems * sizeof(T)));
}
BENCHMARK(BM_Reduce<float, RedFn::kSum>)->Arg(0)->Arg(1);
BENCHMARK(BM_Reduce<double, RedFn::kSum>)->Arg(0);
BENCHMARK(BM_Reduce<int32_t, RedFn::kSum>)->Arg(0);
BENCHMARK(BM_Reduce<int8_t, RedFn::kSum>)->Arg(0);
BENCHMARK(BM_Reduce<float, RedFn::kMax>)->Arg(0);
BENCHMARK(BM_Reduce<float, RedFn::kProd>)->Arg(0);
BENCHMARK(BM_Reduce<half_t, RedFn::kSum>)->Arg(0);
BENCHMARK(BM_Reduce<bf16_t, RedFn::kSum>)->Arg(0);
BENCHMARK(BM_Reduce<fp8e4m3_t, RedFn::kSum>)->Arg(0);

// One hop: rank 0 sends `bytes`, rank 1 (a thread) receives, for a fixed iteration count.
void BM_FifoHop(benchmark::State& state, const char* transport) {
  const size_t bytes = size_t(state.range(0));
  const int iters = int(state.max_iterations);
  setenv("NCCL_SHM_DISABLE", std::string(transport) == "tcp" ? "1" : "0", 1);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclComm_t comms[2];
  ncclGroupStart();
  for (int r = 0; r < 2; ++r) ncclCommInitRank(&comms[r], 2, id, r);
  ncclGroupEnd();
  std::vector<char> src(bytes, 1), dst(bytes);
  // Connect first (outside the timing).
  std::thread warm([&] { ncclRecv(dst.data(), bytes, ncclInt8, 0, comms[1], nullptr); });
  ncclSend(src.data(), bytes, ncclInt8, 1, comms[0], nullptr);
  warm.join();
  std::thread peer([&] {
    for (int i = 0; i < iters; ++i) ncclRecv(dst.data(), bytes, ncclInt8, 0, comms[1], nullptr);
  });
  for (auto _ : state) ncclSend(src.data(), bytes, ncclInt8, 1, comms[0], nullptr);
  peer.join();
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(bytes));
}
BENCHMARK_CAPTURE(BM_FifoHop, shm, "shm")->Arg(8)->Arg(128 << 10)->Iterations(20000)->UseRealTime();
BENCHMARK_CAPTURE(BM_FifoHop, tcp, "tcp")->Arg(8)->Arg(128 << 10)->Iterations(5000)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
