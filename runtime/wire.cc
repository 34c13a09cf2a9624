#include "runtime/wire.h"

#include <netinet/in.h>

namespace tutti::wire {

Addr fromSockAddr(const net::SockAddr& a) {
  Addr out{};
  out.family = static_cast<uint16_t>(a.family());
  out.port = a.port();
  if (a.family() == AF_INET) {
    memcpy(out.bytes, &reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr, 4);
  } else if (a.family() == AF_INET6) {
    auto* a6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    memcpy(out.bytes, &a6->sin6_addr, 16);
    out.scope = a6->sin6_scope_id;
  }
  return out;
}

net::SockAddr toSockAddr(const Addr& a) {
  net::SockAddr out;
  if (a.family == AF_INET) {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&out.storage);
    a4->sin_family = AF_INET;
    memcpy(&a4->sin_addr, a.bytes, 4);
    out.len = sizeof(sockaddr_in);
  } else if (a.family == AF_INET6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&out.storage);
    a6->sin6_family = AF_INET6;
    memcpy(&a6->sin6_addr, a.bytes, 16);
    a6->sin6_scope_id = a.scope;
    out.len = sizeof(sockaddr_in6);
  }
  out.setPort(a.port);
  return out;
}

}  // namespace tutti::wire
