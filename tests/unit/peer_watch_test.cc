// The process-wide watch on peer processes (runtime/peer_watch.h), with real child processes.
#include "runtime/peer_watch.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tutti {
namespace {

using namespace std::chrono_literals;

// A child that sleeps until killed; reaped by the destructor.
struct Child {
  pid_t pid = -1;
  Child() {
    pid = fork();
    if (pid == 0) {
      for (;;) pause();
    }
  }
  void kill9() { kill(pid, SIGKILL); }
  ~Child() {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
};

struct Seen {
  std::mutex mu;
  std::vector<peerwatch::Peer> peers;
  size_t count() {
    std::lock_guard<std::mutex> lock(mu);
    return peers.size();
  }
};

bool waitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

class PeerWatch : public ::testing::Test {
 protected:
  void SetUp() override { peerwatch::setPeriod(20ms); }
  void TearDown() override { peerwatch::setPeriod(200ms); }
};

// A peer killed (a zombie until reaped: it counts as gone) is reported once, by rank and pid;
// the live one never is.
TEST_F(PeerWatch, APeerThatExitsIsReportedOnceAndTheLiveOneNever) {
  Child live, dying;
  Seen seen;
  const uint64_t t = peerwatch::add({{1, live.pid}, {2, dying.pid}}, [&](const peerwatch::Peer& p) {
    std::lock_guard<std::mutex> lock(seen.mu);
    seen.peers.push_back(p);
    return true;
  });
  std::this_thread::sleep_for(100ms);  // five checks
  EXPECT_EQ(seen.count(), 0u);
  dying.kill9();
  ASSERT_TRUE(waitFor([&] { return seen.count() > 0; }, 10s)) << "the exit was not seen";
  std::this_thread::sleep_for(100ms);  // five more checks: still once
  peerwatch::remove(t);
  ASSERT_EQ(seen.count(), 1u);
  EXPECT_EQ(seen.peers[0].rank, 2);
  EXPECT_EQ(seen.peers[0].pid, dying.pid);
}

// A callback that could not act is asked again at the next check until it says it did.
TEST_F(PeerWatch, ACallbackThatCouldNotActIsAskedAgain) {
  Child dying;
  dying.kill9();
  std::atomic<int> calls{0};
  const uint64_t t = peerwatch::add({{5, dying.pid}}, [&](const peerwatch::Peer&) {
    return ++calls >= 3;  // "busy" twice
  });
  ASSERT_TRUE(waitFor([&] { return calls.load() >= 3; }, 10s));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(calls.load(), 3);
  peerwatch::remove(t);
}

// remove() waits for a callback that is running, and none runs after it returned.
TEST_F(PeerWatch, RemoveWaitsForARunningCallbackAndStopsTheWatch) {
  Child dying;
  std::atomic<bool> inside{false}, removed{false}, ranAfterRemove{false};
  const uint64_t t = peerwatch::add({{3, dying.pid}}, [&](const peerwatch::Peer&) {
    if (removed) ranAfterRemove = true;
    inside = true;
    std::this_thread::sleep_for(200ms);
    inside = false;
    return false;  // would be asked again, were it not removed
  });
  dying.kill9();
  ASSERT_TRUE(waitFor([&] { return inside.load(); }, 10s));
  peerwatch::remove(t);
  EXPECT_FALSE(inside.load()) << "remove() returned while the callback ran";
  removed = true;
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(ranAfterRemove.load());
}

// Watches are independent: removing one leaves the other watched.
TEST_F(PeerWatch, AWatchRemovedLeavesTheOthers) {
  Child a, b;
  std::atomic<int> first{0}, second{0};
  const uint64_t ta = peerwatch::add({{0, a.pid}}, [&](const peerwatch::Peer&) {
    ++first;
    return true;
  });
  const uint64_t tb = peerwatch::add({{0, b.pid}}, [&](const peerwatch::Peer&) {
    ++second;
    return true;
  });
  peerwatch::remove(ta);
  a.kill9();
  b.kill9();
  ASSERT_TRUE(waitFor([&] { return second.load() == 1; }, 10s));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(first.load(), 0);
  peerwatch::remove(tb);
}

}  // namespace
}  // namespace tutti
