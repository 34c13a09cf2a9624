#include "runtime/peer_watch.h"

#include <pthread.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "runtime/peer_info.h"

namespace tutti::peerwatch {
namespace {

struct Entry {
  std::vector<Peer> peers;  // those not yet reported gone
  OnExit onExit;
};

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
    std::vector<std::pair<uint64_t, Peer>> gone;
    for (auto& [ticket, e] : s.entries) {
      for (const Peer& p : e.peers) {
        if (!processAlive(p.pid)) gone.push_back({ticket, p});
      }
    }
    // Each callback outside the lock, unless its entry was removed meanwhile.
    for (const auto& [ticket, p] : gone) {
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
          if (q->rank == p.rank && q->pid == p.pid) {
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
  s.entries[ticket] = Entry{std::move(peers), std::move(onExit)};
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
  s.entries.erase(ticket);
  s.done.wait(lock, [&] { return s.running != ticket; });
}

void setPeriod(std::chrono::milliseconds period) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.period = period;
  s.wake.notify_all();
}

}  // namespace tutti::peerwatch
