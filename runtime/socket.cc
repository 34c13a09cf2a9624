#include "runtime/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "runtime/env.h"
#include "runtime/log.h"

namespace tutti {

Status errnoStatus(const std::string& what, int err) {
  return systemError(what + ": " + strerror(err));
}

namespace net {

Deadline deadlineAfter(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

double secondsLeft(Deadline d) { return std::chrono::duration<double>(d - Clock::now()).count(); }

Status abortedStatus() { return internalError("operation aborted (ncclCommAbort)"); }

uint16_t SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

void SockAddr::setPort(uint16_t port) {
  if (family() == AF_INET) reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(port);
  if (family() == AF_INET6) reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(port);
}

bool SockAddr::isLoopback() const {
  if (family() == AF_INET) {
    auto a = ntohl(reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr);
    return (a >> 24) == 127;
  }
  if (family() == AF_INET6) {
    auto* a = &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr;
    if (IN6_IS_ADDR_LOOPBACK(a)) return true;
    if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
  }
  return false;
}

bool SockAddr::isUsualLoopback() const {
  if (family() == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_LOOPBACK);
  }
  return family() == AF_INET6 &&
         IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
}

bool SockAddr::isWildcard() const {
  if (family() == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (family() == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr);
  return false;
}

std::string SockAddr::toString() const {
  char host[INET6_ADDRSTRLEN + 8] = "?";
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, host,
              sizeof(host));
    return std::string(host) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_addr, host,
              sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(port());
  }
  return "<no address>";
}

Result<SockAddr> resolveHost(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || !res) {
    return invalidArgument("cannot resolve host '" + host + "': " + gai_strerror(rc));
  }
  SockAddr out;
  memcpy(&out.storage, res->ai_addr, res->ai_addrlen);
  out.len = res->ai_addrlen;
  freeaddrinfo(res);
  out.setPort(port);
  return out;
}

Result<SockAddr> parseHostPort(const std::string& text) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return invalidArgument("malformed address '" + text + "' (expected [v6addr]:port)");
    }
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return invalidArgument("malformed address '" + text + "' (expected host:port)");
    }
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  char* end = nullptr;
  long p = strtol(port.c_str(), &end, 10);
  if (port.empty() || *end != '\0' || p <= 0 || p > 65535) {
    return invalidArgument("malformed port in address '" + text + "'");
  }
  return resolveHost(host, static_cast<uint16_t>(p));
}

bool interfaceMatches(const std::string& specIn, const std::string& ifname) {
  std::string spec = specIn;
  bool exclude = false, exact = false;
  if (!spec.empty() && spec[0] == '^') {
    exclude = true;
    spec.erase(0, 1);
  }
  if (!spec.empty() && spec[0] == '=') {
    exact = true;
    spec.erase(0, 1);
  }
  bool matched = false;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    std::string tok = spec.substr(pos, comma - pos);
    if (!tok.empty()) {
      if (exact ? ifname == tok : ifname.compare(0, tok.size(), tok) == 0) matched = true;
    }
    pos = comma + 1;
  }
  return exclude ? !matched : matched;
}

std::vector<Interface> findInterfaces(const std::string& spec, int family) {
  std::vector<Interface> found, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return found;
  for (ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || !(it->ifa_flags & IFF_UP)) continue;
    int f = it->ifa_addr->sa_family;
    if (f != AF_INET && f != AF_INET6) continue;
    if (family != AF_UNSPEC && f != family) continue;
    Interface iface;
    iface.name = it->ifa_name;
    iface.addr.len = f == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    memcpy(&iface.addr.storage, it->ifa_addr, iface.addr.len);
    if (f == AF_INET6) {
      // Link-local addresses need a scope id and are rarely what a job means; skip them.
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&iface.addr.storage);
      if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;
    }
    if (!spec.empty()) {
      if (interfaceMatches(spec, iface.name)) found.push_back(iface);
      continue;
    }
    if (it->ifa_flags & IFF_LOOPBACK) {
      loopback.push_back(iface);
    } else if (iface.name.compare(0, 6, "docker") != 0) {
      found.push_back(iface);
    }
  }
  freeifaddrs(list);
  // Prefer IPv4 first within what matched, as NCCL does by default.
  std::stable_sort(found.begin(), found.end(), [](const Interface& a, const Interface& b) {
    return a.addr.family() == AF_INET && b.addr.family() != AF_INET;
  });
  if (found.empty() && spec.empty()) return loopback;
  return found;
}

bool isLocalAddress(const SockAddr& addrIn) {
  if (addrIn.isLoopback()) return true;
  SockAddr addr = addrIn;
  const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&addrIn.storage);
  if (addrIn.family() == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
    // An IPv4 peer of a socket listening on every IPv6 address: compare as IPv4.
    addr = SockAddr{};
    auto* a4 = reinterpret_cast<sockaddr_in*>(&addr.storage);
    a4->sin_family = AF_INET;
    memcpy(&a4->sin_addr, &a6->sin6_addr.s6_addr[12], 4);
    addr.len = sizeof(sockaddr_in);
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return true;  // cannot tell: take it for local
  bool local = false;
  for (ifaddrs* it = list; it && !local; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != addr.family()) continue;
    if (addr.family() == AF_INET) {
      local = reinterpret_cast<const sockaddr_in*>(it->ifa_addr)->sin_addr.s_addr ==
              reinterpret_cast<const sockaddr_in*>(&addr.storage)->sin_addr.s_addr;
    } else {
      local = memcmp(&reinterpret_cast<const sockaddr_in6*>(it->ifa_addr)->sin6_addr,
                     &reinterpret_cast<const sockaddr_in6*>(&addr.storage)->sin6_addr,
                     sizeof(in6_addr)) == 0;
    }
  }
  freeifaddrs(list);
  return local;
}

SockAddr wildcardAddress(int family, uint16_t port) {
  SockAddr any;
  any.storage.ss_family = static_cast<sa_family_t>(family);
  any.len = family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
  any.setPort(port);
  return any;
}

Result<SockAddr> localAddressToward(const SockAddr& toward, bool peersElsewhere) {
  if (toward.isLoopback() && !peersElsewhere) {
    SockAddr a;
    if (toward.family() == AF_INET6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&a.storage);
      a6->sin6_family = AF_INET6;
      a6->sin6_addr = in6addr_loopback;
      a.len = sizeof(sockaddr_in6);
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&a.storage);
      a4->sin_family = AF_INET;
      a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.len = sizeof(sockaddr_in);
    }
    return a;
  }
  std::string spec = env::getString("NCCL_SOCKET_IFNAME").value_or("");
  // Toward a loopback root whose job spans hosts, the family of the root's address says
  // nothing of how the other hosts reach us: any, IPv4 first (NCCL_SOCKET_FAMILY narrows it).
  int family = toward.family();
  if (toward.isLoopback()) {
    family = AF_UNSPEC;
    if (auto f = env::getString("NCCL_SOCKET_FAMILY")) {
      if (*f == "AF_INET") family = AF_INET;
      if (*f == "AF_INET6") family = AF_INET6;
    }
  }
  auto ifaces = findInterfaces(spec, family);
  if (ifaces.empty()) {
    return systemError(std::string("no usable network interface") +
                       (family == AF_UNSPEC ? "" : " of the root's address family") +
                       (spec.empty() ? std::string() : " matching NCCL_SOCKET_IFNAME=" + spec));
  }
  SockAddr a = ifaces[0].addr;
  if (peersElsewhere) {
    // Other hosts reach us on the first interface that is not loopback (an exclusion such as
    // ^docker0 matches lo too).
    auto reachable = std::find_if(ifaces.begin(), ifaces.end(),
                                  [](const Interface& i) { return !i.addr.isLoopback(); });
    if (reachable != ifaces.end()) {
      a = reachable->addr;
    } else {
      TUTTI_WARN("the ranks are on several hosts, but every interface %s is loopback (%s): "
                 "ranks on other hosts will not reach this one; set NCCL_SOCKET_IFNAME",
                 spec.empty() ? "up" : ("NCCL_SOCKET_IFNAME=" + spec + " names").c_str(),
                 ifaces[0].name.c_str());
    }
  }
  a.setPort(0);
  return a;
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    peer_ = o.peer_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

int newSocket(int family) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd;
}

}  // namespace

Result<Socket> Socket::listen(const SockAddr& addrIn) {
  SockAddr addr = addrIn;
  Socket s(newSocket(addr.family()));
  if (!s.valid()) return errnoStatus("socket()", errno);
  int one = 1, zero = 0;
  setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // Every address means IPv4 ones too, whatever net.ipv6.bindv6only says.
  if (addr.family() == AF_INET6 && addr.isWildcard()) {
    setsockopt(s.fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  }
  if (::bind(s.fd_, addr.sa(), addr.len) != 0) {
    int err = errno;
    if (err != EADDRNOTAVAIL) return errnoStatus("bind " + addr.toString(), err);
    // The address is not on one of this host's interfaces (NAT, a DNS alias -- or a wrong
    // NCCL_COMM_ID / MASTER_ADDR): listen on every address of the family, on the same port,
    // and say so, since other ranks will hang at their deadline if the address is wrong.
    TUTTI_WARN("%s is not an address of this host; listening on all interfaces, port %u instead",
               addr.toString().c_str(), addr.port());
    const SockAddr any = wildcardAddress(addr.family(), addr.port());
    if (any.family() == AF_INET6) setsockopt(s.fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (::bind(s.fd_, any.sa(), any.len) != 0) return errnoStatus("bind " + any.toString(), errno);
  }
  if (::listen(s.fd_, 1024) != 0) return errnoStatus("listen", errno);
  return s;
}

Result<Socket> Socket::connect(const SockAddr& addr, Deadline deadline,
                               const std::atomic<bool>* abort) {
  int delayMs = 10;
  while (true) {
    Socket s(newSocket(addr.family()));
    if (!s.valid()) return errnoStatus("socket()", errno);
    int rc = ::connect(s.fd_, addr.sa(), addr.len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      Status w = waitFd(s.fd_, POLLOUT, deadline, abort);
      if (!w.ok()) return w.withContext("connect to " + addr.toString());
      socklen_t len = sizeof(err);
      getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) {
      s.peer_ = addr;
      return s;
    }
    bool retry = err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT ||
                 err == EHOSTUNREACH || err == ENETUNREACH || err == EAGAIN;
    if (!retry) return errnoStatus("connect to " + addr.toString(), err);
    if (abort && abort->load()) return abortedStatus();
    if (Clock::now() + std::chrono::milliseconds(delayMs) >= deadline) {
      return timeoutError("connect to " + addr.toString() + ": " + strerror(err) +
                          " until the deadline");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    delayMs = std::min(delayMs * 2, 200);
  }
}

Result<SockAddr> Socket::localAddr() const {
  SockAddr a;
  a.len = sizeof(a.storage);
  if (getsockname(fd_, a.sa(), &a.len) != 0) return errnoStatus("getsockname", errno);
  return a;
}

SockAddr Socket::peerAddr() const {
  SockAddr a;
  a.len = sizeof(a.storage);
  if (getpeername(fd_, a.sa(), &a.len) != 0) return peer_;
  return a;
}

Result<Socket> Socket::tryAccept() {
  SockAddr peer;
  peer.len = sizeof(peer.storage);
  int fd = ::accept4(fd_, peer.sa(), &peer.len, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED)
      return Socket();
    return errnoStatus("accept", errno);
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  Socket s(fd);
  s.peer_ = peer;
  return s;
}

Status waitFd(int fd, short events, Deadline deadline, const std::atomic<bool>* abort) {
  while (true) {
    if (abort && abort->load(std::memory_order_relaxed)) return abortedStatus();
    double left = secondsLeft(deadline);
    if (left <= 0) return timeoutError("timed out");
    int ms = static_cast<int>(std::min(left * 1000.0 + 1, 100.0));
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms);
    if (rc > 0) return Status::Ok();
    if (rc < 0 && errno != EINTR) return errnoStatus("poll", errno);
  }
}

Status Socket::sendAll(const void* data, size_t size, Deadline deadline,
                       const std::atomic<bool>* abort) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd_, p, size, MSG_NOSIGNAL);
    if (n > 0) {
      p += n;
      size -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      TUTTI_TRY(waitFd(fd_, POLLOUT, deadline, abort));
      continue;
    }
    const int err = errno;  // before peerAddr(), whose getpeername may set it
    return remoteError(std::string("send to ") + peerAddr().toString() + ": " +
                       (n < 0 ? strerror(err) : "connection closed"));
  }
  return Status::Ok();
}

Result<size_t> Socket::recvSome(void* data, size_t size) {
  ssize_t n = ::recv(fd_, data, size, 0);
  if (n > 0) return static_cast<size_t>(n);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return size_t{0};
  const int err = errno;  // before peerAddr(), whose getpeername may set it
  return remoteError(std::string("receive from ") + peerAddr().toString() + ": " +
                     (n < 0 ? strerror(err) : "connection closed by peer"));
}

Status Socket::recvAll(void* data, size_t size, Deadline deadline, const std::atomic<bool>* abort) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    TUTTI_ASSIGN(n, recvSome(p, size));
    if (n == 0) {
      TUTTI_TRY(waitFd(fd_, POLLIN, deadline, abort));
      continue;
    }
    p += n;
    size -= n;
  }
  return Status::Ok();
}

Status sendRecv(Socket& to, const void* sendData, size_t sendSize, Socket& from, void* recvData,
                size_t recvSize, Deadline deadline, const std::atomic<bool>* abort) {
  const char* sp = static_cast<const char*>(sendData);
  char* rp = static_cast<char*>(recvData);
  while (sendSize > 0 || recvSize > 0) {
    if (abort && abort->load(std::memory_order_relaxed)) return abortedStatus();
    double left = secondsLeft(deadline);
    if (left <= 0) return timeoutError("timed out");
    pollfd fds[2];
    int n = 0;
    if (sendSize > 0) fds[n++] = {to.fd(), POLLOUT, 0};
    if (recvSize > 0) fds[n++] = {from.fd(), POLLIN, 0};
    int rc = ::poll(fds, n, static_cast<int>(std::min(left * 1000.0 + 1, 100.0)));
    if (rc < 0 && errno != EINTR) return errnoStatus("poll", errno);
    if (rc <= 0) continue;
    if (sendSize > 0) {
      ssize_t w = ::send(to.fd(), sp, sendSize, MSG_NOSIGNAL);
      if (w > 0) {
        sp += w;
        sendSize -= static_cast<size_t>(w);
      } else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        const int err = errno;  // before peerAddr()
        return remoteError("send to " + to.peerAddr().toString() + ": " + strerror(err));
      }
    }
    if (recvSize > 0) {
      TUTTI_ASSIGN(r, from.recvSome(rp, recvSize));
      rp += r;
      recvSize -= r;
    }
  }
  return Status::Ok();
}

}  // namespace net
}  // namespace tutti
