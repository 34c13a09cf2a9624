// Test harness: ranks as threads in this process, ranks as processes, environment scoping.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "nccl.h"
#include "runtime/thread_barrier.h"

namespace tutti::test {

// Sets (or with nullptr unsets) an environment variable for the scope of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value);
  ~ScopedEnv();
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  bool had_;
  std::string old_;
};

// All rank threads meet here before going on.
using tutti::ThreadBarrier;

ncclUniqueId makeId();
// Runs fn(rank) on n threads at once and waits for all of them.
void onThreads(int n, const std::function<void(int)>& fn);
// n communicators formed by n threads calling ncclCommInitRank; fails the test on error.
std::vector<ncclComm_t> initThreads(int n);
void destroyAll(std::vector<ncclComm_t>& comms);
// NCCL_CONFIG_INITIALIZER with blocking = 0.
ncclConfig_t nonblockingConfig();

inline double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline double secondsSince(double start) { return now() - start; }

// Polls ncclCommGetAsyncError until the comm leaves ncclInProgress (`seconds` at most); returns
// the state it ended in (ncclInvalidArgument where the query fails). Inline, as the two above:
// code built without GoogleTest (tests/collectives, tutti_test_rank) uses them too.
inline ncclResult_t waitInitialized(ncclComm_t comm, double seconds = 10) {
  ncclResult_t state = ncclInProgress;
  for (int i = 0; i < int(seconds * 100) && state == ncclInProgress; ++i) {
    if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) return ncclInvalidArgument;
    if (state == ncclInProgress) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return state;
}

struct RunResult {
  int exitCode;        // -1 when killed by a signal
  std::string output;  // stdout and stderr together
  double seconds;
};
// Runs a shell command line and collects its output.
RunResult runShell(const std::string& command);
// How many times `what` occurs in `text` (a warning said once per process, say).
inline size_t timesIn(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// tutti shm segments of this process still in /dev/shm (there should never be any left).
int leftoverShmSegments();

}  // namespace tutti::test
