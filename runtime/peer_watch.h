// A watch on peer processes of this host, on one thread for the whole process. A host wait
// asks its connection's health (shm: whether the peer's pid still exists), but a device kernel
// that waits for a peer process which died cannot: it would spin until TUTTI_TIMEOUT. So the
// device engine registers its communicator's peer processes here, and when one exits the
// callback marks the links to it broken, which the kernels poll.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

namespace tutti::peerwatch {

struct Peer {
  int rank;
  int64_t pid;  // a process of this host and pid namespace (canWatchProcess)
};

// Runs on the watcher's thread for a peer found gone; returns false to be asked again at the
// next check (it could not act now: a lock was busy), true when done with that peer.
using OnExit = std::function<bool(const Peer&)>;

// Watches peers until remove(); onExit runs once per peer that exits. Returns the ticket.
uint64_t add(std::vector<Peer> peers, OnExit onExit);
// When it returns, onExit of this ticket is not running and never runs again. Must not be
// called from an onExit.
void remove(uint64_t ticket);
// The time between two checks (200 ms; tests make it shorter). Applies from the next check.
void setPeriod(std::chrono::milliseconds period);

}  // namespace tutti::peerwatch
