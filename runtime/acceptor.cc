#include "runtime/acceptor.h"

#include <poll.h>

#include <algorithm>

#include "runtime/log.h"

namespace tutti {

void Acceptor::drop(size_t index, const char* why) {
  TUTTI_WARN("%s: dropped a connection from %s: %s", owner_.c_str(),
             pending_[index].socket.peerAddr().toString().c_str(), why);
  pending_.erase(pending_.begin() + static_cast<long>(index));
}

Result<Acceptor::Accepted> Acceptor::next(net::Deadline deadline, const std::atomic<bool>* abort) {
  while (true) {
    if (abort && abort->load(std::memory_order_relaxed)) return net::abortedStatus();
    auto now = net::Clock::now();
    for (size_t i = pending_.size(); i-- > 0;) {
      if (now >= pending_[i].expires) drop(i, "no complete handshake in time");
    }
    double left = net::secondsLeft(deadline);
    if (left <= 0) return timeoutError("timed out waiting for a connection");

    std::vector<pollfd> fds;
    fds.push_back({listener_->fd(), POLLIN, 0});
    for (auto& p : pending_) fds.push_back({p.socket.fd(), POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::min(left * 1000 + 1, 100.0)));
    if (rc < 0 && errno != EINTR) return errnoStatus("poll", errno);
    if (rc <= 0) continue;

    // Read handshakes first (indices in fds match pending_ before new accepts are appended).
    for (size_t i = pending_.size(); i-- > 0;) {
      if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Pending& p = pending_[i];
      auto* bytes = reinterpret_cast<char*>(&p.hello);
      Result<size_t> n = p.socket.recvSome(bytes + p.received, sizeof(p.hello) - p.received);
      if (!n.ok()) {
        drop(i, "closed before completing the handshake");
        continue;
      }
      p.received += n.value();
      if (p.received >= sizeof(uint64_t) && p.hello.magic != wire::kHelloMagic) {
        drop(i, "not a tutti handshake (bad magic)");
        continue;
      }
      if (p.received >= 2 * sizeof(uint64_t) && p.hello.secret != secret_) {
        drop(i, "wrong secret (a rank of another job, or a stale one)");
        continue;
      }
      if (p.received == sizeof(p.hello)) {
        Accepted a{std::move(p.socket), p.hello};
        pending_.erase(pending_.begin() + static_cast<long>(i));
        return a;
      }
    }
    if (fds[0].revents & POLLIN) {
      while (true) {
        TUTTI_ASSIGN(s, listener_->tryAccept());
        if (!s.valid()) break;
        // A flood of idle connections must not exhaust file descriptors: drop the oldest.
        if (pending_.size() >= kMaxPending) drop(0, "too many pending connections");
        pending_.push_back({std::move(s), {}, 0, net::deadlineAfter(kHandshakeSeconds)});
      }
    }
  }
}

}  // namespace tutti
