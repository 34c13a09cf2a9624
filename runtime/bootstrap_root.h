// The rendezvous root: collects one check-in per rank, then tells each rank where the next
// rank of the ring listens. It runs in a detached thread and ends once every rank has its
// answer, or at its deadline, when it tells the ranks that came which ranks did not.
#pragma once

#include <memory>

#include "runtime/socket.h"
#include "runtime/wire.h"

namespace tutti {

// A fresh random 64-bit secret (getrandom).
uint64_t randomSecret();
// This process's mark at check-in (wire::Hello::size), random, made once: the root answers the
// ranks of its own process last. (A pid would do on one host, but containers on other hosts
// often run ranks under the same small pids.)
uint64_t processToken();

// Listens on `bindAddr` and starts the root thread; returns the id that leads ranks to it.
Result<wire::UniqueId> startRootWithNewId(const net::SockAddr& bindAddr);

// Lets the comm whose rank 0 hosts a root stop it, so its port is free for a retry at once.
struct RootControl {
  std::atomic<bool> stop{false};
  std::atomic<bool> done{false};
  // Asks the root to stop and waits (briefly) until its thread has closed the port.
  void stopAndWait();
};

// Starts the root for an id whose address was fixed in advance (NCCL_COMM_ID); rank 0 calls it.
Result<std::shared_ptr<RootControl>> startRootForId(const wire::UniqueId& id);

}  // namespace tutti
