#include "runtime/peer_watch.h"

#include <poll.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/peer_info.h"

namespace tutti::peerwatch {
namespace {

// A watched process: by a pidfd where the kernel has them (readable once the whole process has
// exited; a reused pid cannot fool it), else by pid (processAlive).
struct Watched {
  Peer peer;
  int pidfd;  // -1: none
};

int openPidfd(int64_t pid) {
#ifdef SYS_pidfd_open
  return int(syscall(SYS_pidfd_open, pid_t(pid), 0));
#else
  (void)pid;
  return -1;
#endif
}

bool gone(const Watched& w) {
  if (w.pidfd < 0) return !processAlive(w.peer.pid);
  pollfd p{w.pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

struct Entry {
  std::vector<Watched> peers;  // those not yet reported gone
  OnExit onExit;
};

void closeAll(const Entry& e) {
  for (const Watched& w : e.peers) {
    if (w.pidfd >= 0) close(w.pidfd);
  }
}

// Never destroyed: communicators may be destroyed during exit, after function statics, and
// the thread runs until the process ends (it sleeps while nothing is watched).
struct State {
  std::mutex mu;
  std::condition_variable wake;  // an entry was added, or the period changed
  std::condition_variable done;  // a callback returned
  std::map<uint64_t, Entry> entries;
  uint64_t next = 1;
  uint64_t running = 0;  // the ticket whose callback runs now (0: none)
  std::chrono::milliseconds period{200};
  bool started = false;
};

// A child of fork() has no watcher thread, and the lock may have been held at the fork: it
// starts afresh (the parent's state is left behind).
State*& statePtr() {
  static State* s = [] {
    pthread_atfork(nullptr, nullptr, [] { statePtr() = new State; });
    return new State;
  }();
  return s;
}
State& state() { return *statePtr(); }

void loop() {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  for (;;) {
    if (s.entries.empty()) {
      s.wake.wait(lock, [&] { return !s.entries.empty(); });
    } else {
      s.wake.wait_for(lock, s.period);
    }
    // Who is gone, found under the lock (kill(pid, 0) and a read of /proc: microseconds).
    std::vector<std::pair<uint64_t, Peer>> exited;
    for (auto& [ticket, e] : s.entries) {
      for (const Watched& w : e.peers) {
        if (gone(w)) exited.push_back({ticket, w.peer});
      }
    }
    // Each callback outside the lock, unless its entry was removed meanwhile.
    for (const auto& [ticket, p] : exited) {
      auto it = s.entries.find(ticket);
      if (it == s.entries.end()) continue;
      OnExit cb = it->second.onExit;
      s.running = ticket;
      lock.unlock();
      const bool handled = cb(p);
      lock.lock();
      s.running = 0;
      s.done.notify_all();
      it = s.entries.find(ticket);
      if (handled && it != s.entries.end()) {
        auto& peers = it->second.peers;
        for (auto q = peers.begin(); q != peers.end(); ++q) {
          if (q->peer.rank == p.rank && q->peer.pid == p.pid) {
            if (q->pidfd >= 0) close(q->pidfd);
            peers.erase(q);
            break;
          }
        }
        if (peers.empty()) s.entries.erase(it);
      }
    }
  }
}

}  // namespace

uint64_t add(std::vector<Peer> peers, OnExit onExit) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t ticket = s.next++;
  if (peers.empty()) return ticket;  // nothing to watch: remove() finds nothing
  Entry e;
  e.onExit = std::move(onExit);
  for (const Peer& p : peers) e.peers.push_back({p, openPidfd(p.pid)});  // -1: by pid then
  s.entries[ticket] = std::move(e);
  if (!s.started) {
    s.started = true;
    std::thread(loop).detach();
  }
  s.wake.notify_all();
  return ticket;
}

void remove(uint64_t ticket) {
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  auto it = s.entries.find(ticket);
  if (it != s.entries.end()) {
    closeAll(it->second);
    s.entries.erase(it);
  }
  s.done.wait(lock, [&] { return s.running != ticket; });
}

void setPeriod(std::chrono::milliseconds period) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.period = period;
  s.wake.notify_all();
}

}  // namespace tutti::peerwatch
