// Byte layouts that cross process boundaries: the unique id and the bootstrap handshakes.
// Fixed-size, trivially copyable structs; every receiver checks magic and secret before it
// trusts a single other byte.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "runtime/socket.h"

namespace tutti::wire {

// A socket address in 24 bytes (sockaddr_storage would not fit a unique id comfortably).
struct Addr {
  uint16_t family;  // AF_INET / AF_INET6
  uint16_t port;    // host byte order
  uint32_t scope;   // IPv6 scope id
  uint8_t bytes[16];
};
static_assert(sizeof(Addr) == 24);

Addr fromSockAddr(const net::SockAddr& a);
net::SockAddr toSockAddr(const Addr& a);

inline constexpr uint64_t kIdMagic = 0x3144495454555401ull;     // "\1TUTTID1"
inline constexpr uint64_t kHelloMagic = 0x314f4c4c45485401ull;  // "\1THELLO1"
inline constexpr uint64_t kReplyMagic = 0x31594c5045525401ull;  // "\1TREPLY1"

enum IdFlags : uint32_t {
  // The root listener is started by rank 0 inside ncclCommInitRank (NCCL_COMM_ID style),
  // not by ncclGetUniqueId.
  kRootStartedByRank0 = 1u << 0,
  // The launcher says the ranks are on several hosts. A root address that is a loopback one
  // here (a host's own name that /etc/hosts maps to 127.0.1.1, as Debian and Ubuntu do) is
  // then not where the other hosts reach it: the root listens on every address, and ranks
  // listen on their interface's, not on loopback.
  kJobSpansHosts = 1u << 1,
};

// What ncclUniqueId.internal holds.
struct UniqueId {
  uint64_t magic;
  uint64_t secret;
  uint32_t flags;
  uint32_t reserved;
  Addr root;
  uint8_t pad[128 - 8 - 8 - 4 - 4 - sizeof(Addr)];
};
static_assert(sizeof(UniqueId) == 128);
static_assert(std::is_trivially_copyable_v<UniqueId>);

// kData: a tcp transport data socket (tag = socket index, size = connection id,
// nranks = sockets in the connection).
enum class HelloKind : uint32_t { kCheckIn = 1, kRing = 2, kP2p = 3, kData = 4 };

// First bytes on every bootstrap connection.
struct Hello {
  uint64_t magic;
  uint64_t secret;
  uint32_t kind;
  int32_t rank;
  int32_t nranks;
  uint32_t tag;   // kCheckIn: the sender's buildFingerprint()
  uint64_t size;  // payload bytes that follow (kP2p); the sender's processToken() (kCheckIn)
  Addr addr;      // the sender's bootstrap listener (kCheckIn)
};
static_assert(sizeof(Hello) == 64);

// What the ranks exchange once the bootstrap ring stands (PeerInfo's layout, the settings they
// compare, the release) in 32 bits, never 0. Ranks of builds that differ there would misread
// each other's peer info, so the root refuses the job at check-in; builds from before the check
// send 0. (Defined beside PeerInfo, runtime/peer_info.cc.)
uint32_t buildFingerprint();

// The root's answer to a check-in: ok + the next rank's address, or an error text.
struct RootReply {
  uint64_t magic;
  int32_t code;  // tutti::Code
  int32_t reserved;
  Addr next;
  char message[480];
};
static_assert(sizeof(RootReply) == 520);

}  // namespace tutti::wire
