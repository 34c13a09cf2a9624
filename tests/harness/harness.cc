#include "harness/harness.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace tutti::test {

ScopedEnv::ScopedEnv(const char* name, const char* value) : name_(name) {
  const char* old = getenv(name);
  had_ = old != nullptr;
  if (had_) old_ = old;
  if (value) {
    setenv(name, value, 1);
  } else {
    unsetenv(name);
  }
}

ScopedEnv::~ScopedEnv() {
  if (had_) {
    setenv(name_.c_str(), old_.c_str(), 1);
  } else {
    unsetenv(name_.c_str());
  }
}

ncclUniqueId makeId() {
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  return id;
}

void onThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

std::vector<ncclComm_t> initThreads(int n) {
  ncclUniqueId id = makeId();
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  std::vector<ncclResult_t> rcs(static_cast<size_t>(n), ncclInternalError);
  std::vector<std::string> errors(static_cast<size_t>(n));
  onThreads(n, [&](int r) {
    rcs[r] = ncclCommInitRank(&comms[r], n, id, r);
    if (rcs[r] != ncclSuccess) errors[r] = ncclGetLastError(nullptr);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(rcs[r], ncclSuccess) << "rank " << r << ": " << errors[r];
  return comms;
}

void destroyAll(std::vector<ncclComm_t>& comms) {
  for (auto& c : comms) {
    if (c) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    c = nullptr;
  }
}

ncclConfig_t nonblockingConfig() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

RunResult runShell(const std::string& command) {
  double start = now();
  RunResult r{-1, "", 0};
  FILE* p = popen(("{ " + command + "\n} 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = secondsSince(start);
  return r;
}

namespace {
// Every test stays on loopback (this machine's other addresses are not test hosts) and uses
// a short bootstrap deadline so that a broken rendezvous fails fast instead of hanging.
struct LoopbackEnvironment : ::testing::Environment {
  void SetUp() override {
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    setenv("TUTTI_BOOTSTRAP_TIMEOUT", "30", 0);
  }
};
const auto* kEnv = ::testing::AddGlobalTestEnvironment(new LoopbackEnvironment);
}  // namespace

int leftoverShmSegments() {
  std::string prefix = "tutti-" + std::to_string(getpid()) + "-";
  int n = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (dirent* e = readdir(d)) n += std::string(e->d_name).rfind(prefix, 0) == 0;
    closedir(d);
  }
  return n;
}

}  // namespace tutti::test
