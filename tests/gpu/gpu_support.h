// What the GPU tests share (tests/gpu/*_test.cc): the skip where no GPU is present, a barrier
// for rank threads, failures gathered from rank threads, and device buffers per rank with
// pinned staging.
#pragma once

#include <cuda_runtime_api.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "harness/harness.h"
#include "nccl.h"

namespace tutti::test {

inline std::string noGpuReason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
  }
  return n > 0 ? "" : "no CUDA device";
}

// How many GPUs a random program spreads its thread ranks over (rank r on GPU r % that): the
// environment variable's count (TUTTI_PROGRAM_GPUS, TUTTI_LIFECYCLE_GPUS; 1 where unset), at
// most the GPUs there are. ctest runs the programs so on two emulated GPUs (TUTTI_EMU_GPUS=2).
inline int spreadGpus(const char* env) {
  const char* v = getenv(env);
  int want = v && *v ? atoi(v) : 1, present = 0;
  if (cudaGetDeviceCount(&present) != cudaSuccess) cudaGetLastError();
  return std::max(1, std::min(want, present));
}

// The links an NCCL_DEBUG=INFO (subsystem INIT) run made, one line each ("rank 1 -> rank 2
// channel 0 via shm/mapped"): the ranks at both ends, what the link is, and the line.
struct LinkLine {
  int from, to;
  std::string via, line;
};
inline std::vector<LinkLine> linkLines(const std::string& out) {
  static const std::regex link(R"(rank (\d+) -> rank (\d+) channel \d+ via (\S+))");
  std::vector<LinkLine> lines;
  for (std::sregex_iterator it(out.begin(), out.end(), link), end; it != end; ++it)
    lines.push_back({std::stoi((*it)[1]), std::stoi((*it)[2]), (*it)[3], (*it)[0]});
  return lines;
}

// The pids of a run's ranks, from their log lines ("[rank 0] host:pid:tid ...": tutti-run's
// prefix, then the library's; NCCL_DEBUG at INFO or WARN).
inline std::vector<std::string> pidsIn(const std::string& out) {
  static const std::regex prefix(R"(\[rank \d+\] [^: ]+:(\d+):)");
  std::vector<std::string> pids;
  for (std::sregex_iterator it(out.begin(), out.end(), prefix), end; it != end; ++it) {
    if (std::find(pids.begin(), pids.end(), (*it)[1]) == pids.end()) pids.push_back((*it)[1]);
  }
  return pids;
}

// The shared-memory segments (/dev/shm/tutti-*) those processes left behind: their names carry
// the pid of the process that made them.
inline std::vector<std::string> shmLeftBy(const std::vector<std::string>& pids) {
  std::vector<std::string> left;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      for (const std::string& pid : pids) {
        if (name.rfind("tutti-", 0) == 0 && name.find("-" + pid + "-") != std::string::npos)
          left.push_back(name);
      }
    }
    closedir(d);
  }
  return left;
}

// n ranks as threads, rank r on GPU r % gpus (ncclCommInitRank after cudaSetDevice).
inline std::vector<ncclComm_t> initThreadsOnGpus(int n, int gpus) {
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  const ncclUniqueId id = makeId();
  onThreads(n, [&](int r) {
    EXPECT_EQ(cudaSetDevice(r % gpus), cudaSuccess);
    EXPECT_EQ(ncclCommInitRank(&comms[size_t(r)], n, id, r), ncclSuccess)
        << "rank " << r << ": " << ncclGetLastError(nullptr);
  });
  return comms;
}

// Holds streams at a host function until open(), or until `limit` has passed (so that a test in
// which something waits for the held stream after all ends, and can say so: released()). The
// flag lives on the heap, shared with each held stream's host function: one may still be
// polling it (or not have started) when a failed test destroys the gate.
class StreamGate {
 public:
  using Flag = std::shared_ptr<std::atomic<bool>>;
  explicit StreamGate(std::chrono::seconds limit)
      : safety_([this, limit] {
          std::unique_lock<std::mutex> lock(mu_);
          cv_.wait_for(lock, limit, [this] { return opened_; });
          released_->store(true);
        }) {}
  ~StreamGate() {
    open();
    safety_.join();
  }
  cudaError_t hold(cudaStream_t s) {
    auto* mine = new Flag(released_);
    const cudaError_t e = cudaLaunchHostFunc(s, wait, mine);
    if (e != cudaSuccess) delete mine;
    return e;
  }
  // Before open(): true only where the limit let the streams go.
  bool released() const { return released_->load(); }
  void open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      opened_ = true;
    }
    cv_.notify_all();
  }

 private:
  static void wait(void* p) {
    std::unique_ptr<Flag> flag(static_cast<Flag*>(p));
    while (!(*flag)->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool opened_ = false;
  Flag released_ = std::make_shared<std::atomic<bool>>(false);
  std::thread safety_;  // last: it uses the members above
};

// Runs this binary's gtest `test` (its full name, DISABLED_ ones too) in a child process with
// `env` (VAR=value ..., or -u VAR) set: what it printed, and whether it passed. For what the
// process's start fixes (the emulator's GPUs, the log's level). A hang fails within the
// child's TUTTI_TIMEOUT (30 s), with its output.
inline std::string runChildTest(const std::string& env, const std::string& test, bool* passed) {
  *passed = false;
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "";
  self[n] = 0;
  const std::string cmd = "env " + env + " TUTTI_TIMEOUT=30 '" + self +
                          "' --gtest_also_run_disabled_tests --gtest_filter=" + test + " 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "";
  char buf[4096];
  size_t got;
  while ((got = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, got);
  *passed = pclose(p) == 0;
  return out;
}

#define SKIP_WITHOUT_GPU()                                  \
  do {                                                      \
    std::string why = noGpuReason();                        \
    if (!why.empty()) GTEST_SKIP() << why << " (GPU test)"; \
  } while (0)

// What went wrong on the ranks' threads, reported on the test's own thread.
struct RankFailures {
  std::mutex mu;
  std::vector<std::string> list;
  void add(int r, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    list.push_back("rank " + std::to_string(r) + ": " + what);
  }
  // Whether rank r's call on comm succeeded; if not, records what failed and comm's last error.
  bool ok(int r, ncclResult_t rc, ncclComm_t comm, const char* what) {
    if (rc != ncclSuccess) add(r, std::string(what) + ": " + ncclGetLastError(comm));
    return rc == ncclSuccess;
  }
  void report() {
    for (const std::string& f : list) ADD_FAILURE() << f;
  }
};

// Device buffers filled with v, one per rank.
struct RankBuffers {
  std::vector<float*> bufs;
  size_t count;
  std::vector<float*> staging;  // pinned, one per rank, made before any rank's thread runs
  RankBuffers(int n, size_t count) : count(count) {
    for (int r = 0; r < n; ++r) {
      float* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, count * sizeof(float)), cudaSuccess);
      bufs.push_back(p);
      void* h = nullptr;
      EXPECT_EQ(cudaMallocHost(&h, count * sizeof(float)), cudaSuccess);
      staging.push_back(static_cast<float*>(h));
    }
  }
  ~RankBuffers() {
    for (float* p : bufs) cudaFree(p);
    for (float* p : staging) cudaFreeHost(p);
  }
  // In stream order on the stream the operations use (a plain cudaMemcpy is not ordered with
  // non-blocking streams, and may return before the bytes land), through pinned memory: a copy
  // from pageable memory may wait for the whole GPU, where another rank's kernel may wait for
  // this thread (it hung the first GPU run's matrix). cudaMallocHost and cudaFreeHost may
  // too, so the staging is made and freed outside the ranks' threads.
  void fill(int r, float v, cudaStream_t s) {
    float* h = staging[size_t(r)];
    for (size_t i = 0; i < count; ++i) h[i] = v;
    EXPECT_EQ(cudaMemcpyAsync(bufs[size_t(r)], h, count * 4, cudaMemcpyHostToDevice, s),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  }
  // "" or what differs from want.
  std::string check(int r, float want, cudaStream_t s) {
    float* h = staging[size_t(r)];
    if (cudaMemcpyAsync(h, bufs[size_t(r)], count * 4, cudaMemcpyDeviceToHost, s) != cudaSuccess ||
        cudaStreamSynchronize(s) != cudaSuccess)
      return "cudaMemcpy failed";
    for (size_t i = 0; i < count; ++i) {
      if (h[i] != want) {
        return "rank " + std::to_string(r) + " element " + std::to_string(i) + ": " +
               std::to_string(h[i]) + ", expected " + std::to_string(want);
      }
    }
    return "";
  }
};

// No asynchronous error on the communicator, and each buffer of rank r holds its value.
inline void expectResults(RankFailures& failures, int r, ncclComm_t comm, cudaStream_t s,
                          std::initializer_list<std::pair<RankBuffers*, float>> want) {
  ncclResult_t async = ncclSuccess;
  ncclCommGetAsyncError(comm, &async);
  if (async != ncclSuccess) failures.add(r, std::string("async error: ") + ncclGetLastError(comm));
  for (auto [buf, value] : want) {
    std::string bad = buf->check(r, value, s);
    if (!bad.empty()) failures.add(r, bad);
  }
}

}  // namespace tutti::test
