// One rank as a process, for the multi-process tests. Modes:
//   init         tuttiCommInitFromEnv, check rank/size and exchange pids over the bootstrap
//   getid        ncclGetUniqueId + ncclCommInitRank (with NCCL_COMM_ID every rank makes the id)
//   split        init, then split into even/odd ranks and check the new ranks
//   coll         init, then run the whole correctness matrix (NCCL_BUFFSIZE sets its counts)
//   coll-device  the same on GPU buffers, on a stream of this rank's own
//   program-device  a queued program on GPU buffers (collectives/program.h; NCCL_BUFFSIZE as
//                for coll): TUTTI_PROGRAM_SEED (1), TUTTI_PROGRAM_LENGTH (40) steps on two
//                streams of this rank's own, captured into a graph with TUTTI_PROGRAM_GRAPH=1,
//                some steps on pageable host buffers with TUTTI_PROGRAM_HOST=1
//   loop         init, then AllReduce 4 MiB again and again until one fails (a peer was
//                killed): prints "survivor: <result>: <message>" and exits 0 when the error
//                is ncclRemoteError and ncclCommGetAsyncError agrees, else 1
//   lifecycle-device  a lifecycle program on GPU buffers (collectives/lifecycle.h):
//                TUTTI_LIFECYCLE_SEED (1), 30 steps; ranks meet before a child is destroyed or
//                aborted by an all-reduce on the parent (host memory). Prints "lifecycle: ..."
//   splitbusy-device  a non-blocking ncclCommSplit (even and odd ranks), and at once the
//                parent's first all-reduce on GPU buffers (rank 2 a second later: the other
//                ranks' split exchange waits for it on the parent's bootstrap ring, which the
//                all-reduce's first use of the ring must not cut into). Prints
//                "splitbusy: ..." and exits 0 when the all-reduce's sum and the new
//                communicator's rank, size and all-reduce are right
//   ringshare-device  2 ranks: work adopted by the communicator as a user of its bootstrap ring
//                (Comm::adoptRingUser, as a non-blocking split's exchange is) all-gathers 128
//                bytes a rank on the ring, rank 0's 1 s late, while each rank's first all-reduce
//                on GPU buffers makes the ring's links and ends with a barrier on that ring:
//                rank 0's must wait for the adopted work. Prints "ringshare: ..." and exits 0 when
//                the all-gather's bytes and the all-reduce's sum are right
//   peerexit-device  2 ranks on GPU buffers: one all-reduce together, then rank 1 exits
//                (status 0, so tutti-run lets rank 0 go on) while rank 0's next kernel waits
//                for it: prints "device survivor: ..." and exits 0 when that kernel stopped
//                with ncclRemoteError naming rank 1's exit, else 1. peerexit-device: a 4 KiB
//                all-reduce, so rank 0 waits to receive, on its own FIFO; peerexit-device-big:
//                a 64-byte send and receive, then a 64 MiB ncclSend that rank 1 never receives,
//                more than a FIFO holds, so rank 0 waits for credit from the FIFO in rank 1's
//                memory (over CUDA IPC)
//   abortidle-device  2 ranks on GPU buffers: one all-reduce together; then rank 1 starts another,
//                whose kernel sends into rank 0's FIFO (free slots) and waits, while rank 0
//                aborts, idle, waits 2 s, and makes a communicator of 2 ranks on its GPU for
//                an all-reduce (its links free what the abort kept, TUTTI_ABORT_KEEP_S after
//                it): rank 1 prints "abort peer: <async result>: <message>" and exits 0 when
//                its kernel stopped with ncclRemoteError; rank 0 exits 0 when the new
//                communicator's all-reduce ran
//   settingsmismatch  rank 1 reads TUTTI_TEST_RANK1_SETS ("NAME=VALUE") into its environment
//                before init; every rank then calls a host-buffer all-reduce, and a grouped
//                broadcast: prints "settingsmismatch: <result>: <message>" and "... async <r>,
//                grouped <r>, destroy <r>" (result codes); exits 0 when both calls were refused
//                with ncclInvalidUsage while the communicator stayed healthy, else 1
//   readonly     2 ranks: rank 0 broadcasts 4 MiB into memory rank 1 may only read (shm
//                single copy fails there): prints "readonly: <result>: <message>" and exits 0
//                when the broadcast failed, 1 when it did not
// Prints "ok" and exits 0 on success, else prints the error and exits 1.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "collectives/lifecycle.h"
#include "collectives/matrix.h"
#include "collectives/program.h"
#include "harness/harness.h"
#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif
#include "runtime/comm.h"
#include "tutti.h"

namespace {

int failWith(const char* what, ncclComm_t comm) {
  fprintf(stderr, "%s failed: %s\n", what, ncclGetLastError(comm));
  return 1;
}

#ifdef TUTTI_HAVE_CUDA
// A stream and `count` zeroed floats of GPU memory, and a first all-reduce of 1024 of them
// together (it makes every channel's ring links): 0, or the exit status of a failure.
int deviceStart(ncclComm_t comm, size_t count, cudaStream_t* s, float** d) {
  if (cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc(d, count * 4) != cudaSuccess ||
      cudaMemsetAsync(*d, 0, count * 4, *s) != cudaSuccess) {
    fprintf(stderr, "CUDA set-up failed\n");
    return 1;
  }
  if (ncclAllReduce(*d, *d, 1024, ncclFloat, ncclSum, comm, *s) != ncclSuccess ||
      cudaStreamSynchronize(*s) != cudaSuccess) {
    return failWith("the first all-reduce", comm);
  }
  return 0;
}

// A non-blocking stream and `count` floats of GPU memory holding v: 0, or 1 after saying what
// failed.
int deviceFilled(size_t count, float v, cudaStream_t* s, float** d) {
  std::vector<float> host(count, v);
  if (cudaStreamCreateWithFlags(s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc(d, count * 4) != cudaSuccess ||
      cudaMemcpy(*d, host.data(), count * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
    fprintf(stderr, "CUDA set-up failed\n");
    return 1;
  }
  return 0;
}

// Whether the `count` floats at d hold `want` once s is done; says what they held if not.
bool deviceHolds(const float* d, size_t count, float want, cudaStream_t s, const char* what) {
  std::vector<float> host(count, 0);
  if (cudaStreamSynchronize(s) != cudaSuccess ||
      cudaMemcpy(host.data(), d, count * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
    fprintf(stderr, "%s: reading the result back failed\n", what);
    return false;
  }
  for (float v : host) {
    if (v != want) {
      fprintf(stderr, "%s gave %g, expected %g\n", what, v, want);
      return false;
    }
  }
  return true;
}
#endif

int checkComm(ncclComm_t comm, int wantRank, int wantSize) {
  int rank = -1, size = 0;
  if (ncclCommUserRank(comm, &rank) || ncclCommCount(comm, &size)) return failWith("query", comm);
  if (rank != wantRank || size != wantSize) {
    fprintf(stderr, "rank %d/%d, expected %d/%d\n", rank, size, wantRank, wantSize);
    return 1;
  }
  // Every rank learned every other's pid during init: they must be distinct processes (a pid
  // names one process within its pid namespace alone).
  auto* c = reinterpret_cast<tutti::Comm*>(comm);
  for (int r = 0; r < size; ++r) {
    if (c->peers()[r].rank != r) return failWith("peer table", comm);
    for (int q = 0; q < r; ++q) {
      if (c->peers()[q].pid == c->peers()[r].pid && c->peers()[q].pidNs == c->peers()[r].pidNs) {
        fprintf(stderr, "ranks %d and %d report the same pid\n", q, r);
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "init";
  int rank = atoi(getenv("RANK") ? getenv("RANK") : "0");
  int size = atoi(getenv("WORLD_SIZE") ? getenv("WORLD_SIZE") : "1");
  ncclComm_t comm = nullptr;
  // Rank 1 reads one setting differently from the others (TUTTI_TEST_RANK1_SETS).
  if (const char* set = getenv("TUTTI_TEST_RANK1_SETS"); mode == "settingsmismatch" && rank == 1) {
    if (set) putenv(strdup(set));
  }
  if (mode == "getid") {
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return failWith("ncclGetUniqueId", nullptr);
    if (ncclCommInitRank(&comm, size, id, rank) != ncclSuccess) {
      return failWith("ncclCommInitRank", nullptr);
    }
  } else if (tuttiCommInitFromEnv(&comm) != ncclSuccess) {
    return failWith("tuttiCommInitFromEnv", nullptr);
  }
  if (int rc = checkComm(comm, rank, size)) return rc;
  if (mode == "split") {
    ncclComm_t sub = nullptr;
    if (ncclCommSplit(comm, rank % 2, rank, &sub, nullptr) != ncclSuccess) {
      return failWith("ncclCommSplit", comm);
    }
    int subSize = (size + 1 - rank % 2) / 2;
    if (int rc = checkComm(sub, rank / 2, subSize)) return rc;
    ncclCommDestroy(sub);
  }
  if (mode == "coll" || mode == "coll-device") {
    const char* buff = getenv("NCCL_BUFFSIZE");
    size_t fifo = buff ? strtoull(buff, nullptr, 0) : (1u << 20);
    const bool device = mode == "coll-device";
    void* stream = nullptr;
#ifdef TUTTI_HAVE_CUDA
    if (device && cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(&stream),
                                            cudaStreamNonBlocking) != cudaSuccess) {
      fprintf(stderr, "cudaStreamCreate failed\n");
      return 1;
    }
#endif
    if (device) {
      std::string err =
          tutti::test::reserveDeviceMemory(tutti::test::matrixCases(size, fifo), size);
      if (!err.empty()) {
        fprintf(stderr, "%s\n", err.c_str());
        return 1;
      }
    }
    std::vector<std::string> bad = tutti::test::runCases(
        comm, rank, size, tutti::test::matrixCases(size, fifo), 10,
        device ? tutti::test::Memory::kDevice : tutti::test::Memory::kHost, stream);
    for (const std::string& b : bad) fprintf(stderr, "%s\n", b.c_str());
    if (!bad.empty()) return 1;
    printf("matrix: %zu cases passed on rank %d\n", tutti::test::matrixCases(size, fifo).size(),
           rank);
  }
  if (mode == "program-device") {
#ifdef TUTTI_HAVE_CUDA
    const char* buff = getenv("NCCL_BUFFSIZE");
    const char* seed = getenv("TUTTI_PROGRAM_SEED");
    const char* length = getenv("TUTTI_PROGRAM_LENGTH");
    const char* graph = getenv("TUTTI_PROGRAM_GRAPH");
    const char* host = getenv("TUTTI_PROGRAM_HOST");
    const std::vector<tutti::test::ProgramStep> program =
        tutti::test::randomProgram(size, buff ? strtoull(buff, nullptr, 0) : (1u << 20),
                                   seed ? uint32_t(strtoul(seed, nullptr, 0)) : 1,
                                   length ? atoi(length) : 40, host && atoi(host) == 1);
    tutti::test::ProgramRank pr{comm, rank, {nullptr, nullptr}};
    for (void*& st : pr.streams) {
      if (cudaStreamCreateWithFlags(reinterpret_cast<cudaStream_t*>(&st), cudaStreamNonBlocking) !=
          cudaSuccess) {
        fprintf(stderr, "cudaStreamCreate failed\n");
        return 1;
      }
    }
    tutti::test::ProgramRun run{{pr}, size, graph && atoi(graph) == 1, nullptr};
    std::vector<std::string> bad = tutti::test::runProgram(run, program);
    for (const std::string& b : bad) fprintf(stderr, "%s\n", b.c_str());
    if (!bad.empty()) {
      if (rank == 0)
        fprintf(stderr, "the program:\n%s", tutti::test::describeProgram(program).c_str());
      return 1;
    }
    printf("program: %zu steps passed on rank %d\n", program.size(), rank);
#else
    fprintf(stderr, "this build has no CUDA\n");
    return 1;
#endif
  }
  if (mode == "lifecycle-device") {
#ifdef TUTTI_HAVE_CUDA
    const char* seed = getenv("TUTTI_LIFECYCLE_SEED");
    const std::vector<tutti::test::LifecycleStep> steps =
        tutti::test::randomLifecycle(size, seed ? uint32_t(strtoul(seed, nullptr, 0)) : 1, 30);
    tutti::test::LifecycleDevice dev{};
    cudaStream_t s = nullptr;
    if (cudaMalloc(&dev.device, tutti::test::kLifecycleMaxCount * sizeof(float)) != cudaSuccess ||
        cudaMallocHost(&dev.pinned, tutti::test::kLifecycleMaxCount * sizeof(float)) !=
            cudaSuccess ||
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
      fprintf(stderr, "CUDA set-up failed\n");
      return 1;
    }
    dev.stream = s;
    auto barrier = [&] {
      float one = 1, sum = 0;
      if (ncclAllReduce(&one, &sum, 1, ncclFloat, ncclSum, comm, nullptr) != ncclSuccess)
        fprintf(stderr, "the barrier's all-reduce failed: %s\n", ncclGetLastError(comm));
    };
    const std::string err = tutti::test::runLifecycle(comm, rank, size, steps, barrier, &dev);
    if (!err.empty()) {
      fprintf(stderr, "%s\n", err.c_str());
      if (rank == 0)
        fprintf(stderr, "the program:\n%s", tutti::test::describeLifecycle(steps).c_str());
      return 1;
    }
    printf("lifecycle: %zu steps passed on rank %d\n", steps.size(), rank);
    cudaFree(dev.device);
    cudaFreeHost(dev.pinned);
    cudaStreamDestroy(s);
#else
    fprintf(stderr, "this build has no CUDA\n");
    return 1;
#endif
  }
  if (mode == "splitbusy-device") {
#ifdef TUTTI_HAVE_CUDA
    cudaStream_t s = nullptr;
    float* d = nullptr;
    const size_t count = 4096;
    if (int rc = deviceFilled(count, float(rank + 1), &s, &d)) return rc;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t sub = nullptr;
    if (rank == 2) usleep(1000 * 1000);
    const ncclResult_t split = ncclCommSplit(comm, rank % 2, rank, &sub, &config);
    if (split != ncclSuccess && split != ncclInProgress) return failWith("ncclCommSplit", comm);
    if (ncclAllReduce(d, d, count, ncclFloat, ncclSum, comm, s) != ncclSuccess)
      return failWith("the parent's all-reduce", comm);
    if (!deviceHolds(d, count, float(size * (size + 1) / 2), s,
                     "splitbusy: the parent's all-reduce"))
      return 1;
    if (tutti::test::waitInitialized(sub, 30) != ncclSuccess)
      return failWith("the new communicator", sub);
    if (int rc = checkComm(sub, rank / 2, (size + 1 - rank % 2) / 2)) return rc;
    if (ncclAllReduce(d, d, 1, ncclFloat, ncclSum, sub, s) != ncclSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
      return failWith("the new communicator's all-reduce", sub);
    printf("splitbusy: ok on rank %d\n", rank);
    ncclCommDestroy(sub);
    cudaFree(d);
    cudaStreamDestroy(s);
#else
    fprintf(stderr, "this build has no CUDA\n");
    return 1;
#endif
  }
  if (mode == "ringshare-device") {
#ifdef TUTTI_HAVE_CUDA
    auto* c = reinterpret_cast<tutti::Comm*>(comm);
    cudaStream_t s = nullptr;
    float* d = nullptr;
    const size_t count = 1024;
    if (int rc = deviceFilled(count, float(rank + 1), &s, &d)) return rc;
    constexpr size_t kSlice = 128;
    std::vector<uint8_t> gathered(size_t(size) * kSlice, 0);
    for (size_t i = 0; i < kSlice; ++i) gathered[size_t(rank) * kSlice + i] = uint8_t(rank * 7 + i);
    tutti::Status gatheredOk;
    std::shared_future<void> work = std::async(std::launch::async, [&] {
                                      if (rank == 0) usleep(1000 * 1000);
                                      gatheredOk =
                                          c->bootstrap()->allGather(gathered.data(), kSlice);
                                    }).share();
    struct Join {  // on every return: the work writes into gathered
      std::shared_future<void>& f;
      ~Join() { f.wait(); }
    } join{work};
    c->adoptRingUser(work);
    if (ncclAllReduce(d, d, count, ncclFloat, ncclSum, comm, s) != ncclSuccess)
      return failWith("the all-reduce", comm);
    const bool summed = deviceHolds(d, count, float(size * (size + 1) / 2), s, "the all-reduce");
    work.wait();
    int bad = 0;
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < kSlice; ++i)
        bad += gathered[size_t(r) * kSlice + i] != uint8_t(r * 7 + i);
    }
    printf("ringshare: all-gather %s, %d bytes wrong; all-reduce %s\n",
           gatheredOk.ok() ? "ok" : gatheredOk.message().c_str(), bad, summed ? "right" : "wrong");
    if (!gatheredOk.ok() || bad != 0 || !summed) return 1;
    cudaFree(d);
    cudaStreamDestroy(s);
#else
    fprintf(stderr, "this build has no CUDA\n");
    return 1;
#endif
  }
  if (mode == "peerexit-device" || mode == "peerexit-device-big") {
#ifdef TUTTI_HAVE_CUDA
    const bool big = mode == "peerexit-device-big";
    const size_t count = big ? (16u << 20) : 1024;
    cudaStream_t s = nullptr;
    float* d = nullptr;
    // Small: it makes every channel's ring links. Big: a small send to rank 1 first makes
    // the link the big one takes (sends and receives have links of their own).
    if (int rc = deviceStart(comm, count, &s, &d)) return rc;
    if (big) {
      const ncclResult_t r = rank == 0 ? ncclSend(d, 16, ncclFloat, 1, comm, s)
                                       : ncclRecv(d, 16, ncclFloat, 0, comm, s);
      if (r != ncclSuccess || cudaStreamSynchronize(s) != cudaSuccess)
        return failWith("the first send", comm);
    }
    if (rank == 1) {
      sleep(1);  // rank 0's next kernel waits for this rank by then
      _exit(0);
    }
    const ncclResult_t r = big ? ncclSend(d, count, ncclFloat, 1, comm, s)
                               : ncclAllReduce(d, d, count, ncclFloat, ncclSum, comm, s);
    const cudaError_t e = cudaStreamSynchronize(s);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    const std::string msg = ncclGetLastError(comm);
    printf("device survivor: %s, %s, async %s: %s\n", ncclGetErrorString(r), cudaGetErrorString(e),
           ncclGetErrorString(async), msg.c_str());
    fflush(stdout);
    ncclCommAbort(comm);
    return r == ncclSuccess && e == cudaSuccess && async == ncclRemoteError &&
                   msg.find("rank 1 (pid") != std::string::npos &&
                   msg.find("exited") != std::string::npos
               ? 0
               : 1;
#else
    fprintf(stderr, "peerexit-device: this build has no CUDA\n");
    return 1;
#endif
  }
  if (mode == "abortidle-device") {
#ifdef TUTTI_HAVE_CUDA
    cudaStream_t s = nullptr;
    float* d = nullptr;
    if (int rc = deviceStart(comm, 1024, &s, &d)) return rc;
    if (rank == 0) {
      sleep(1);  // rank 1's kernel has sent and waits by then
      ncclCommAbort(comm);
      sleep(2);  // this process (and its memory) stays while rank 1's kernel notices
      ncclComm_t two[2];
      const int devs[2] = {0, 0};
      float* bufs[2] = {d, nullptr};  // a buffer each: in place, they would race
      if (cudaMalloc(&bufs[1], 4096) != cudaSuccess ||
          cudaMemsetAsync(bufs[1], 0, 4096, s) != cudaSuccess)
        return failWith("a second buffer", nullptr);
      ncclResult_t r = ncclCommInitAll(two, 2, devs);
      if (r == ncclSuccess) r = ncclGroupStart();
      for (int i = 0; i < 2 && r == ncclSuccess; ++i)
        r = ncclAllReduce(bufs[i], bufs[i], 1024, ncclFloat, ncclSum, two[i], s);
      if (r == ncclSuccess) r = ncclGroupEnd();
      if (r != ncclSuccess || cudaStreamSynchronize(s) != cudaSuccess)
        return failWith("the new communicator's all-reduce", nullptr);
      for (ncclComm_t c : two) ncclCommDestroy(c);
      return 0;
    }
    const ncclResult_t r = ncclAllReduce(d, d, 1024, ncclFloat, ncclSum, comm, s);
    const cudaError_t e = cudaStreamSynchronize(s);
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(comm, &async);
    printf("abort peer: %s, %s, async %s: %s\n", ncclGetErrorString(r), cudaGetErrorString(e),
           ncclGetErrorString(async), ncclGetLastError(comm));
    fflush(stdout);
    ncclCommAbort(comm);
    return r == ncclSuccess && e == cudaSuccess && async == ncclRemoteError ? 0 : 1;
#else
    fprintf(stderr, "abortidle-device: this build has no CUDA\n");
    return 1;
#endif
  }
  if (mode == "readonly") {
    const size_t bytes = 4 << 20;
    void* buf = mmap(nullptr, bytes, rank == 0 ? PROT_READ | PROT_WRITE : PROT_READ,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) return failWith("mmap", comm);
    if (rank == 0) memset(buf, 7, bytes);
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclChar, 0, comm, nullptr);
    printf("readonly: %s: %s\n", ncclGetErrorString(r), ncclGetLastError(comm));
    fflush(stdout);
    ncclCommAbort(comm);
    return r == ncclSuccess ? 1 : 0;
  }
  if (mode == "settingsmismatch") {  // every rank refuses alike, at once, nothing breaks
    std::vector<float> buf(1024, 1.0f);
    ncclResult_t r =
        ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    printf("settingsmismatch: %s: %s\n", ncclGetErrorString(r), ncclGetLastError(comm));
    ncclResult_t async = ncclInProgress;
    ncclCommGetAsyncError(comm, &async);
    ncclGroupStart();
    ncclBroadcast(buf.data(), buf.data(), buf.size(), ncclFloat, 0, comm, nullptr);
    ncclResult_t grouped = ncclGroupEnd();
    ncclResult_t destroyed = ncclCommDestroy(comm);
    printf("settingsmismatch async %d, grouped %d, destroy %d\n", async, grouped, destroyed);
    fflush(stdout);
    return r == ncclInvalidUsage && async == ncclSuccess && grouped == ncclInvalidUsage &&
                   destroyed == ncclSuccess
               ? 0
               : 1;
  }
  if (mode == "peerexit") {  // rank 1 leaves right after init; the others then need it
    if (rank == 1) _exit(3);
    std::vector<float> buf(1 << 20, 1.0f);
    ncclResult_t r =
        ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
    printf("survivor: %s: %s\n", ncclGetErrorString(r), ncclGetLastError(comm));
    fflush(stdout);
    // Alive a while longer, so that the other survivor meets rank 1's exit and not this one's.
    sleep(2);
    ncclCommAbort(comm);
    return r == ncclRemoteError ? 0 : 1;
  }
  if (mode == "loop") {
    std::vector<float> buf(1 << 20, 1.0f);
    for (int i = 0;; ++i) {
      ncclResult_t r =
          ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr);
      if (i == 0 && r == ncclSuccess) {
        printf("running\n");
        fflush(stdout);
      }
      if (r == ncclSuccess) continue;
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm, &async);
      printf("survivor: %s: %s (async: %s)\n", ncclGetErrorString(r), ncclGetLastError(comm),
             ncclGetErrorString(async));
      ncclCommAbort(comm);
      return r == ncclRemoteError && async == r ? 0 : 1;
    }
  }
  if (ncclCommFinalize(comm) != ncclSuccess) return failWith("ncclCommFinalize", comm);
  if (ncclCommDestroy(comm) != ncclSuccess) return failWith("ncclCommDestroy", nullptr);
  printf("ok\n");
  return 0;
}
