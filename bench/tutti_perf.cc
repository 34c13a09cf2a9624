// tutti-perf: nccl-tests' all_reduce_perf & co. in one binary, with their flags, columns,
// #wrong check and summary lines, so numbers and habits carry over.
//   tutti-perf all_reduce -b 8 -e 64M -f 4 -t 2          (2 ranks as threads)
//   tutti-run -n 2 tutti-perf all_reduce -b 8 -e 64M     (2 ranks as processes)
// Ranks are threads of one process (-t N), or one per process under tutti-run, torchrun,
// mpirun or srun. Host buffers (--mem host) or GPU buffers (--mem device: rank r on device
// r % device count, so -t 4 on one GPU runs 4 ranks there; each rank has a stream of its own).
// With -t, only the NCCL API and the CUDA runtime are used, so the same binary runs on NVIDIA's
// NCCL (LD_LIBRARY_PATH or LD_PRELOAD its libnccl.so.2) for comparison; under a launcher it
// joins through tuttiCommInitFromEnv, which NVIDIA's library does not have.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "bench/perf_device.h"
#include "bench/perf_options.h"
#include "bench/perf_values.h"
#include "kernels/cpu/elem_value.h"
#include "nccl.h"
#include "runtime/thread_barrier.h"
#include "tutti.h"

namespace {

using namespace tutti::perf;
using tutti::ThreadBarrier;

struct Rank {
  ncclComm_t comm;
  int rank, nranks;
};

// One size, one op, in- or out-of-place: average seconds per call and wrong elements.
struct Result {
  double seconds;
  long long wrong;
};

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What ranks as threads (-t N) share: the timing barrier and the combining of times and wrong
// counts happen in this process, outside the library under test (whose failure could otherwise
// hide wrong counts, and whose all-reduces would be timed between iterations with -z 1).
class ThreadShared {
 public:
  explicit ThreadShared(int n) : barrier_(n), slots_(size_t(n)) {}
  void wait() { barrier_.wait(); }
  // Every thread's v, combined as op (sum, min, max); every thread gets the result.
  double combine(int rank, double v, ncclRedOp_t op) {
    slots_[size_t(rank)] = v;
    barrier_.wait();
    double r = slots_[0];
    for (size_t i = 1; i < slots_.size(); ++i) {
      if (op == ncclSum) r += slots_[i];
      if (op == ncclMin) r = std::min(r, slots_[i]);
      if (op == ncclMax) r = std::max(r, slots_[i]);
    }
    barrier_.wait();  // every thread has read the slots before any writes them again
    return r;
  }

 private:
  ThreadBarrier barrier_;
  std::vector<double> slots_;
};

class Runner {
 public:
  Runner(const Options& o, const Rank& r, DeviceMem* dev, ThreadShared* threads)
      : o_(o), r_(r), dev_(dev), threads_(threads) {}

  // count: elements per rank block (per-rank coll) or of the whole buffer, of type dtype.
  Result run(size_t count, int dtype, int op, bool inPlace) {
    dtype_ = dtype;
    const size_t es = typeSize(dtype_), n = size_t(r_.nranks);
    const CollInfo& c = *o_.coll;
    size_t sendElems = count, recvElems = count;
    if (c.perRankBlocks) {
      if (c.coll == Coll::kAllGather || c.coll == Coll::kGather) recvElems = count * n;
      if (c.coll == Coll::kReduceScatter || c.coll == Coll::kScatter) sendElems = count * n;
      if (c.coll == Coll::kAlltoAll) sendElems = recvElems = count * n;
    }
    const bool inPlaceOk = c.coll != Coll::kAlltoAll && c.coll != Coll::kGather &&
                           c.coll != Coll::kScatter && c.coll != Coll::kSendRecv;
    if (inPlace && !inPlaceOk) return {-1, 0};
    // Each call's buffers lie `big` bytes after the last one's, round the whole allocation (of
    // -e bytes, at least), as nccl-tests places them: a size that fits in a cache is not read
    // hot from the call before, and a library that keeps something per address is exercised.
    const size_t big = std::max(sendElems, recvElems) * es;
    char* sendBase = nullptr;
    char* recvBase = nullptr;
    const size_t room = std::max(o_.maxBytes, big);  // (device memory has 4 KiB to spare)
#ifdef TUTTI_HAVE_CUDA
    if (dev_) {
      dev_->reserve(std::max<size_t>(room, 1));
      sendBase = dev_->send();
      recvBase = dev_->recv();
    }
#endif
    if (!dev_) {
      try {
        if (recvBuf_.size() < room) recvBuf_.assign(room, 0);
        if (sendBuf_.size() < room) sendBuf_.assign(room, 0);
      } catch (const std::bad_alloc&) {
        fprintf(stderr, "tutti-perf: rank %d: no room for two host buffers of %zu bytes (-e)\n",
                r_.rank, room);
        exit(1);
      }
      sendBase = sendBuf_.data();
      recvBase = recvBuf_.data();
    }
    const size_t places = big > 0 ? std::max<size_t>(1, room / big) : 1;
    // Call `k`'s send and receive buffers.
    auto buffers = [&](size_t k) {
      const size_t shift = big * (k % places);
      char* send = sendBase + shift;
      char* recv = recvBase + shift;
      if (inPlace) {
        send = recv;
        if (c.coll == Coll::kAllGather) send = recv + size_t(r_.rank) * count * es;
        if (c.coll == Coll::kReduceScatter) recv = send + size_t(r_.rank) * count * es;
      }
      return std::pair<char*, char*>(send, recv);
    };
    auto mustSucceed = [&](ncclResult_t res, const char* what) {
      if (res == ncclSuccess) return;
      fprintf(stderr, "tutti-perf: rank %d: %s%s: %s\n", r_.rank, what, ncclGetErrorString(res),
              ncclGetLastError(r_.comm));
      exit(1);
    };
    // Iteration `it`: -m calls (in one group where there are several, as nccl-tests groups
    // them), each on buffers of its own.
    auto once = [&](size_t it, const char* what) {
      const bool group = o_.agg > 1;
      if (group) ncclGroupStart();
      ncclResult_t first = ncclSuccess;  // a call refused inside the group is as fatal
      for (int a = 0; a < o_.agg; ++a) {
        auto [send, recv] = buffers(it * size_t(o_.agg) + size_t(a));
        ncclResult_t res = call(send, recv, count, op);
        if (first == ncclSuccess) first = res;
      }
      if (group) {
        ncclResult_t end = ncclGroupEnd();
        if (first == ncclSuccess) first = end;
      }
      mustSucceed(first, what);
      if (o_.blocking) {
        waitStream();
        sync();
      }
    };
    size_t it = 0;
    for (int w = 0; w < o_.warmup; ++w) once(it++, "warm-up: ");
    waitStream();
    sync();
    auto timed = [&] {
      for (int k = 0; k < o_.iters; ++k) once(it++, "");
    };
    double seconds;
#ifdef TUTTI_HAVE_CUDA
    if (dev_ && o_.graphLaunches > 0) {
      // The iterations captured once, the graph launched graphLaunches times: launch costs
      // out of the picture, as nccl-tests -G does.
      CapturedGraph g(dev_->stream(), timed);
      g.launch(dev_->stream());  // warm-up
      dev_->sync();
      sync();
      double t0 = now();
      for (int k = 0; k < o_.graphLaunches; ++k) g.launch(dev_->stream());
      waitStream();
      seconds = (now() - t0) / o_.graphLaunches / o_.iters / o_.agg;
    } else
#endif
    {
      double t0 = now();
      timed();
      waitStream();  // device: the calls returned at once; the time is when the stream is done
      seconds = (now() - t0) / o_.iters / o_.agg;
    }
    long long wrong = 0;
    const Inputs inputs(dtype_, c.reduces ? op : -1, r_.nranks);
    // -c N: N checked calls, each on buffers of its own place (the first at the start).
    for (int k = 0; k < o_.check; ++k) {
      auto [send, recv] = buffers(size_t(k));
      // Filled and checked on the host; on the GPU through copies of the same bytes.
      // The output is poisoned first, then the input written: in place, the input is a part of
      // the output (all-gather) or the output a part of the input (reduce-scatter), and what
      // is left of the poison shows a block nobody wrote.
      char* hs = send;
      char* hr = recv;
      if (dev_) {
        hostSend_.resize(std::max(hostSend_.size(), big));
        hostRecv_.resize(std::max(hostRecv_.size(), big));
        hs = hostSend_.data();
        hr = hostRecv_.data();
      }
      const bool poison = !inPlace || c.coll == Coll::kAllGather;
#ifdef TUTTI_HAVE_CUDA
      if (dev_ && poison) dev_->fill(recv, 0xff, recvElems * es);
#endif
      if (!dev_ && poison) memset(recv, 0xff, recvElems * es);
      for (size_t j = 0; j < sendElems; ++j)
        tutti::cpu::storeElem(dtype_, inputs.at(r_.rank, j), hs + j * es);
#ifdef TUTTI_HAVE_CUDA
      if (dev_) dev_->toDevice(send, hs, sendElems * es);
      if (dev_ && o_.graphLaunches > 0) {
        // Checked as it was timed: the call captured in a graph, and the graph launched.
        CapturedGraph g(dev_->stream(), [&, send = send, recv = recv] {
          mustSucceed(call(send, recv, count, op), "the checked call (captured): ");
        });
        g.launch(dev_->stream());
        waitStream();
      } else
#endif
      {
        mustSucceed(call(send, recv, count, op), "the checked call: ");
        waitStream();
      }
#ifdef TUTTI_HAVE_CUDA
      if (dev_) dev_->toHost(hr, recv, recvElems * es);
#endif
      wrong += verify(hr, count, inputs);
    }
    return {seconds, wrong};
  }

  Rank rank() const { return r_; }

 private:
  ncclResult_t call(const void* s, void* r, size_t count, int op) {
    auto t = static_cast<ncclDataType_t>(dtype_);
    auto rop = static_cast<ncclRedOp_t>(op);
    ncclComm_t cm = r_.comm;
    cudaStream_t st = stream();
    switch (o_.coll->coll) {
      case Coll::kAllReduce:
        return ncclAllReduce(s, r, count, t, rop, cm, st);
      case Coll::kAllGather:
        return ncclAllGather(s, r, count, t, cm, st);
      case Coll::kReduceScatter:
        return ncclReduceScatter(s, r, count, t, rop, cm, st);
      case Coll::kBroadcast:
        return ncclBroadcast(s, r, count, t, o_.root, cm, st);
      case Coll::kReduce:
        return ncclReduce(s, r, count, t, rop, o_.root, cm, st);
      case Coll::kAlltoAll:
        return ncclAlltoAll(s, r, count, t, cm, st);
      case Coll::kGather:
        return ncclGather(s, r, count, t, o_.root, cm, st);
      case Coll::kScatter:
        return ncclScatter(s, r, count, t, o_.root, cm, st);
      case Coll::kSendRecv: {
        ncclGroupStart();
        ncclSend(s, count, t, (r_.rank + 1) % r_.nranks, cm, st);
        ncclRecv(r, count, t, (r_.rank + r_.nranks - 1) % r_.nranks, cm, st);
        return ncclGroupEnd();
      }
    }
    return ncclInternalError;
  }

  long long verify(const char* recv, size_t count, const Inputs& in) {
    const size_t es = typeSize(dtype_);
    const int n = r_.nranks, me = r_.rank;
    long long wrong = 0;
    auto expect = [&](size_t at, double want) {
      double got = tutti::cpu::loadElem(dtype_, recv + at * es);
      if (!(std::fabs(got - want) <= in.tolerance(want))) ++wrong;
    };
    for (size_t i = 0; i < count; ++i) {
      switch (o_.coll->coll) {
        case Coll::kAllReduce:
          expect(i, in.reduced(i));
          break;
        case Coll::kReduceScatter:
          expect(i, in.reduced(i, size_t(me) * count));
          break;
        case Coll::kReduce:
          if (me == o_.root) expect(i, in.reduced(i));
          break;
        case Coll::kBroadcast:
          expect(i, in.at(o_.root, i));
          break;
        case Coll::kScatter:
          expect(i, in.at(o_.root, size_t(me) * count + i));
          break;
        case Coll::kSendRecv:
          expect(i, in.at((me + n - 1) % n, i));
          break;
        case Coll::kAllGather:
        case Coll::kGather:
        case Coll::kAlltoAll:
          if (o_.coll->coll == Coll::kGather && me != o_.root) break;
          for (int q = 0; q < n; ++q) {
            size_t src = o_.coll->coll == Coll::kAlltoAll ? size_t(me) * count + i : i;
            expect(size_t(q) * count + i, in.at(q, src));
          }
          break;
      }
    }
    return wrong;
  }

  cudaStream_t stream() const {
#ifdef TUTTI_HAVE_CUDA
    if (dev_) return dev_->stream();
#endif
    return nullptr;
  }
  void waitStream() {
#ifdef TUTTI_HAVE_CUDA
    if (dev_) dev_->sync();
#endif
  }

  // Every rank waits for every other.
  void sync() {
    if (threads_) {
      threads_->wait();
    } else {
      combine(0, ncclSum);
    }
  }

 public:
  // Combines a per-rank value across all ranks: among the threads of this process, or, one
  // rank a process, with the communicator itself (nothing else joins the processes; on the GPU
  // in device mode: NVIDIA's NCCL takes no host buffers).
  double combine(double v, ncclRedOp_t op) {
    if (threads_) return threads_->combine(r_.rank, v, op);
    ncclResult_t res;
#ifdef TUTTI_HAVE_CUDA
    if (dev_) {
      dev_->toDevice(dev_->scratch(), &v, sizeof(v));
      res = ncclAllReduce(dev_->scratch(), dev_->scratch(), 1, ncclDouble, op, r_.comm,
                          dev_->stream());
      dev_->sync();
      dev_->toHost(&v, dev_->scratch(), sizeof(v));
    } else
#endif
    {
      res = ncclAllReduce(&v, &v, 1, ncclDouble, op, r_.comm, nullptr);
    }
    if (res != ncclSuccess) {  // the times and wrong counts of every rank would be lost
      fprintf(stderr, "tutti-perf: rank %d: combining the ranks' results: %s: %s\n", r_.rank,
              ncclGetErrorString(res), ncclGetLastError(r_.comm));
      exit(1);
    }
    return v;
  }

 private:
  const Options& o_;
  Rank r_;
  std::vector<char> sendBuf_, recvBuf_;    // host buffers (--mem host)
  std::vector<char> hostSend_, hostRecv_;  // --mem device: the checked call's bytes on the host
  DeviceMem* dev_;                         // --mem device, else null
  ThreadShared* threads_;                  // ranks as threads (-t), else null
  int dtype_ = ncclFloat;                  // the type of the run under way
};

// One line per size for one type and op (out of place, then in place).
void runSizes(const Options& o, const Rank& r, Runner& run, int dtype, int op, bool printer,
              double* busSum, int* lines, long long* wrongTotal) {
  const CollInfo& c = *o.coll;
  const size_t es = typeSize(dtype), n = size_t(r.nranks);
  for (size_t bytes = o.minBytes; bytes <= o.maxBytes;
       bytes = o.factor > 1 ? size_t(std::max(double(bytes + 1), bytes * o.factor))
                            : bytes + std::max<size_t>(o.stepBytes, 1)) {
    size_t total = std::max<size_t>(bytes / es, 0);
    size_t count = c.perRankBlocks ? total / n : total;
    total = c.perRankBlocks ? count * n : count;
    char line[512];
    int len =
        // count: elements per rank where each rank holds a block (as nccl-tests prints it).
        snprintf(line, sizeof(line), "%12zu  %12zu  %8s  %6s  %6d", total * es,
                 c.perRankBlocks ? count : total, kTypeNames[dtype],
                 op >= 0 ? kOpNames[op] : "none", c.rooted ? o.root : -1);
    for (bool inPlace : {false, true}) {
      Result res = run.run(count, dtype, op, inPlace);
      double t = res.seconds;
      if (t >= 0) {
        ncclRedOp_t how = o.average == 2 ? ncclMin : o.average == 3 ? ncclMax : ncclSum;
        t = run.combine(t, how);
        if (o.average == 1) t /= r.nranks;
        if (o.average == 0) t = res.seconds;  // rank 0's own time
      }
      long long wrong = (long long)run.combine(double(res.wrong), ncclSum);
      double algbw = t > 0 ? double(total * es) / t / 1e9 : 0;
      double factor = 1;
      if (c.coll == Coll::kAllReduce) factor = 2.0 * double(n - 1) / double(n);
      if (c.perRankBlocks) factor = double(n - 1) / double(n);
      double busbw = algbw * factor;
      if (t < 0) {
        len += snprintf(line + len, sizeof(line) - size_t(len), "  %8s  %6s  %6s  %6s", "N/A",
                        "N/A", "N/A", "N/A");
      } else {
        len += snprintf(line + len, sizeof(line) - size_t(len), "  %8.2f  %6.2f  %6.2f  %6lld",
                        t * 1e6, algbw, busbw, o.check ? wrong : -1LL);
        *busSum += busbw;
        ++*lines;
        *wrongTotal += wrong;
      }
    }
    if (printer) printf("%s\n", line);
    if (bytes == o.maxBytes) break;
    if (o.factor <= 1 && o.stepBytes == 0) break;
  }
}

int runRank(const Options& o, const Rank& r, DeviceMem* dev, ThreadShared* threads, bool printer,
            double* busSum, int* lines, long long* wrongTotal) {
  Runner run(o, r, dev, threads);
  // As nccl-tests orders them: each type, each op, every size.
  for (int dtype : o.dtypes) {
    for (int op : (o.coll->reduces ? o.ops : std::vector<int>{-1}))
      runSizes(o, r, run, dtype, op, printer, busSum, lines, wrongTotal);
  }
  return 0;
}

// The launcher's count of processes (0: none said).
int launcherSize() {
  for (const char* name : {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}) {
    if (const char* v = getenv(name)) return atoi(v);
  }
  return 0;
}

// A task srun started (a job step's), not a batch script or an allocation's shell, which
// Slurm also gives SLURM_PROCID and SLURM_NTASKS: their step is "batch", "extern" or
// "interactive", or has no id.
bool slurmTask() {
  const char* step = getenv("SLURM_STEP_ID");
  if (!step) step = getenv("SLURM_STEPID");
  if (!step || !*step) return false;
  char* end = nullptr;
  const unsigned long long id = strtoull(step, &end, 10);
  // The special steps' ids, where Slurm writes them as numbers: 0xfffffffa and up.
  return end != step && *end == 0 && id < 0xfffffffaull;
}

void header(const Options& o, int nranks, const std::vector<Rank>& local) {
  printf("# Collective test starting: %s_perf (tutti-perf)\n", o.coll->name);
  printf(
      "# nThread %d nGpus 1 minBytes %zu maxBytes %zu step: %g(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: %d\n#\n",
      o.threads, o.minBytes, o.maxBytes, o.factor > 1 ? o.factor : double(o.stepBytes),
      o.factor > 1 ? "factor" : "bytes", o.warmup, o.iters, o.agg, o.check,
      o.deviceMem ? o.graphLaunches : 0);
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  printf("# Using devices (%s memory: %d rank(s) in all)\n", o.deviceMem ? "device" : "host",
         nranks);
  for (const Rank& r : local) {
    int dev = -1;
    if (o.deviceMem) ncclCommCuDevice(r.comm, &dev);
    printf("#  Rank %2d Group  0 Pid %6d on %10s device %2d [%s]\n", r.rank, int(getpid()), host,
           dev, o.deviceMem ? "GPU" : "CPU");
  }
  printf("#\n#%*s%s%*s%s\n", 57, "", "out-of-place", 25, "", "in-place");
  printf(
      "#       size         count      type   redop    root      time   algbw   busbw #wrong"
      "      time   algbw   busbw #wrong\n");
  printf(
      "#        (B)    (elements)                                (us)  (GB/s)  (GB/s)       "
      "      (us)  (GB/s)  (GB/s)       \n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  int devices = 0;
#ifdef TUTTI_HAVE_CUDA
  if (o.deviceMem && cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
#endif
  if (o.deviceMem && devices == 0) {
    fprintf(stderr, "tutti-perf: --mem device: no CUDA device%s; use --mem host\n",
#ifdef TUTTI_HAVE_CUDA
            ""
#else
            " (built without CUDA)"
#endif
    );
    return 2;
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  // A process started by a launcher as one of its ranks: a rank variable is set (the size alone
  // is not enough: a Slurm batch script or salloc shell has SLURM_NTASKS, and its
  // tutti-perf -t N runs ranks as threads; a task that srun started has its step's id).
  // A job of one process (srun -n 1 tutti-perf -t 8, as nccl-tests is run) runs its -t ranks
  // as threads.
  const bool launched =
      ((getenv("RANK") && getenv("WORLD_SIZE")) || getenv("OMPI_COMM_WORLD_RANK") ||
       getenv("PMI_RANK") || (getenv("SLURM_PROCID") && getenv("SLURM_NTASKS") && slurmTask())) &&
      !(o.threads > 1 && launcherSize() == 1);
  std::vector<Rank> ranks;
  if (launched) {
    if (o.threads != 1) {
      fprintf(stderr, "tutti-perf: -t %d: with a launcher, each process is one rank\n", o.threads);
      return 2;
    }
    ncclComm_t comm;
    if (tuttiCommInitFromEnv(&comm) != ncclSuccess) {
      fprintf(stderr, "tutti-perf: %s\n", ncclGetLastError(nullptr));
      return 1;
    }
    int rank, n;
    ncclCommUserRank(comm, &rank);
    ncclCommCount(comm, &n);
    ranks.push_back({comm, rank, n});
  } else {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) {
      fprintf(stderr, "tutti-perf: %s\n", ncclGetLastError(nullptr));
      return 1;
    }
    ranks.resize(size_t(o.threads));
    ncclGroupStart();
    for (int t = 0; t < o.threads; ++t) {
      ranks[size_t(t)] = {nullptr, t, o.threads};
#ifdef TUTTI_HAVE_CUDA
      if (o.deviceMem) DeviceMem::check(cudaSetDevice(t % devices), "cudaSetDevice");
#endif
      ncclCommInitRank(&ranks[size_t(t)].comm, o.threads, id, t);
    }
    if (ncclGroupEnd() != ncclSuccess) {
      fprintf(stderr, "tutti-perf: init: %s\n", ncclGetLastError(nullptr));
      return 1;
    }
  }
  const int nranks = ranks[0].nranks;
  if (o.coll->rooted && (o.root < 0 || o.root >= nranks)) usage("-r: root out of range");
  const bool printer = ranks[0].rank == 0;
  if (printer) header(o, nranks, ranks);
  std::vector<double> busSum(ranks.size(), 0);
  std::vector<int> lines(ranks.size(), 0);
  std::vector<long long> wrong(ranks.size(), 0);
  // GPU memory for every rank before any starts (see DeviceMem).
  std::vector<std::unique_ptr<DeviceMem>> mems(ranks.size());
#ifdef TUTTI_HAVE_CUDA
  for (size_t t = 0; t < ranks.size() && o.deviceMem; ++t) {
    int d = 0;
    ncclCommCuDevice(ranks[t].comm, &d);
    DeviceMem::check(cudaSetDevice(d), "cudaSetDevice");
    mems[t] = std::make_unique<DeviceMem>(o.maxBytes + 4096);
  }
#endif
  ThreadShared shared(int(ranks.size()));
  std::vector<std::thread> threads;
  for (size_t t = 0; t < ranks.size(); ++t) {
    threads.emplace_back([&, t] {
#ifdef TUTTI_HAVE_CUDA
      if (o.deviceMem) {
        int d = 0;
        ncclCommCuDevice(ranks[t].comm, &d);
        DeviceMem::check(cudaSetDevice(d), "cudaSetDevice");
      }
#endif
      runRank(o, ranks[t], mems[t].get(), launched ? nullptr : &shared, printer && t == 0,
              &busSum[t], &lines[t], &wrong[t]);
    });
  }
  for (auto& th : threads) th.join();
  mems.clear();
  // NCCL_TESTS_MIN_BW (nccl-tests' health check): the average bus bandwidth must reach 90% of
  // it, else FAILED and exit status 1 -- rank 0's figure on every rank (with -a 0 each rank's
  // own times would give each its own).
  double avgBus = lines[0] ? busSum[0] / lines[0] : 0.0;
  const char* minBw = getenv("NCCL_TESTS_MIN_BW");
  const double floor = minBw && *minBw ? 0.9 * atof(minBw) : -1;
  if (launched && floor >= 0 &&
      ncclBroadcast(&avgBus, &avgBus, 1, ncclDouble, 0, ranks[0].comm, nullptr) != ncclSuccess) {
    fprintf(stderr, "tutti-perf: rank %d: NCCL_TESTS_MIN_BW: rank 0's bandwidth: %s\n",
            ranks[0].rank, ncclGetLastError(ranks[0].comm));
    return 1;
  }
  const bool slow = floor >= 0 && avgBus < floor;
  if (printer) {  // (before the destroys: a launcher may stop this rank once another has exited)
    printf("# Out of bounds values : %lld %s\n", wrong[0], wrong[0] ? "FAILED" : "OK");
    printf("# Avg bus bandwidth    : %g %s\n#\n", avgBus, floor < 0 ? "" : slow ? "FAILED" : "OK");
  }
  for (Rank& r : ranks) ncclCommDestroy(r.comm);
  return wrong[0] || slow ? 1 : 0;
}
