// Sockets for the bootstrap (and later the tcp transport's setup): addresses, interface choice
// honouring NCCL_SOCKET_IFNAME, and non-blocking I/O in which every wait has a deadline and
// polls an abort flag.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "runtime/status.h"

namespace tutti::net {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

Deadline deadlineAfter(double seconds);
double secondsLeft(Deadline d);

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;

  int family() const { return storage.ss_family; }
  uint16_t port() const;
  void setPort(uint16_t port);
  bool isLoopback() const;
  bool isUsualLoopback() const;  // 127.0.0.1 or ::1 (isLoopback: all of 127/8 too)
  bool isWildcard() const;
  bool empty() const { return len == 0; }
  std::string toString() const;  // 10.0.0.1:29500, [fe80::1]:29500
  const sockaddr* sa() const { return reinterpret_cast<const sockaddr*>(&storage); }
  sockaddr* sa() { return reinterpret_cast<sockaddr*>(&storage); }
};

// "host:port", "[v6]:port" or "v6addr:port" (last colon separates the port); names resolve.
Result<SockAddr> parseHostPort(const std::string& text);
Result<SockAddr> resolveHost(const std::string& host, uint16_t port);

struct Interface {
  std::string name;
  SockAddr addr;
};

// NCCL_SOCKET_IFNAME semantics: comma-separated prefixes; '^' excludes; '=' means exact names.
bool interfaceMatches(const std::string& spec, const std::string& ifname);
// Up interfaces with an address of `family` (AF_UNSPEC: both) that match `spec` (empty: the
// default, which skips lo and docker*, and falls back to lo when nothing else is up).
std::vector<Interface> findInterfaces(const std::string& spec, int family);
// Whether addr (its port aside) is one of this host's: a loopback one, or an interface's.
bool isLocalAddress(const SockAddr& addr);
// The local address to listen on so that a peer at `toward` can reach us: loopback when
// `toward` is loopback (unless peersElsewhere: other hosts must reach us too), else the
// NCCL_SOCKET_IFNAME / default interface of the same family.
Result<SockAddr> localAddressToward(const SockAddr& toward, bool peersElsewhere = false);
// Every address of the family (0.0.0.0, ::) at port.
SockAddr wildcardAddress(int family, uint16_t port);

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_), peer_(o.peer_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // Listening socket on addr (port 0: any free port). Falls back to the family's wildcard
  // address when addr is not local (MASTER_ADDR naming this host by another address).
  static Result<Socket> listen(const SockAddr& addr);
  // Connects, retrying refused connections (the listener may not be up yet) until `deadline`.
  static Result<Socket> connect(const SockAddr& addr, Deadline deadline,
                                const std::atomic<bool>* abort);

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  void close();
  Result<SockAddr> localAddr() const;
  // The connected peer's address; kept from connect or accept, so a reset or closed
  // connection (getpeername fails then) still names it in messages.
  SockAddr peerAddr() const;

  // Non-blocking accept; an invalid Socket when none is pending.
  Result<Socket> tryAccept();

  Status sendAll(const void* data, size_t size, Deadline deadline, const std::atomic<bool>* abort);
  Status recvAll(void* data, size_t size, Deadline deadline, const std::atomic<bool>* abort);
  // Reads what is available without blocking: bytes read, 0 if none, error on EOF/reset.
  Result<size_t> recvSome(void* data, size_t size);

 private:
  int fd_ = -1;
  SockAddr peer_;  // from connect or accept (empty for a listener)
};

// Sends to one socket while receiving from another, so that a ring step cannot deadlock on
// full socket buffers.
Status sendRecv(Socket& to, const void* sendData, size_t sendSize, Socket& from, void* recvData,
                size_t recvSize, Deadline deadline, const std::atomic<bool>* abort);

// Waits for `events` on fd until the deadline, in slices short enough to notice an abort.
Status waitFd(int fd, short events, Deadline deadline, const std::atomic<bool>* abort);

Status abortedStatus();

}  // namespace tutti::net
