// Accepts bootstrap connections on a listening socket and returns only those whose handshake
// carries the right magic and secret. Anything else -- a port scanner, garbage bytes, a rank
// of another job -- is logged and dropped without disturbing the connections that matter.
// Handshakes are read from all pending connections at once, so a peer that connects and says
// nothing cannot hold up the real ranks.
#pragma once

#include <utility>
#include <vector>

#include "runtime/socket.h"
#include "runtime/wire.h"

namespace tutti {

class Acceptor {
 public:
  Acceptor(net::Socket* listener, uint64_t secret, std::string owner)
      : listener_(listener), secret_(secret), owner_(std::move(owner)) {}

  struct Accepted {
    net::Socket socket;
    wire::Hello hello;
  };
  Result<Accepted> next(net::Deadline deadline, const std::atomic<bool>* abort);

  // Connections that have not finished their handshake by then are dropped.
  static constexpr double kHandshakeSeconds = 10.0;
  static constexpr size_t kMaxPending = 256;

 private:
  struct Pending {
    net::Socket socket;
    wire::Hello hello{};
    size_t received = 0;
    net::Deadline expires;
  };
  void drop(size_t index, const char* why);

  net::Socket* listener_;
  uint64_t secret_;
  std::string owner_;
  std::vector<Pending> pending_;
};

}  // namespace tutti
