#include "runtime/socket.h"

#include <gtest/gtest.h>
#include <unistd.h>

using namespace tutti::net;
using tutti::Status;

TEST(Socket, InterfaceSpec) {
  EXPECT_TRUE(interfaceMatches("eth", "eth0"));
  EXPECT_TRUE(interfaceMatches("ib,eth", "eth1"));
  EXPECT_FALSE(interfaceMatches("ib", "eth0"));
  EXPECT_FALSE(interfaceMatches("^eth", "eth0"));
  EXPECT_TRUE(interfaceMatches("^eth", "ib0"));
  EXPECT_TRUE(interfaceMatches("=eth0", "eth0"));
  EXPECT_FALSE(interfaceMatches("=eth0", "eth01"));
  EXPECT_FALSE(interfaceMatches("^=lo", "lo"));
  EXPECT_TRUE(interfaceMatches("^=lo", "lo0"));
}

TEST(Socket, LoopbackInterfaceIsFoundByName) {
  auto ifs = findInterfaces("lo", AF_INET);
  ASSERT_FALSE(ifs.empty());
  EXPECT_EQ(ifs[0].name, "lo");
  EXPECT_TRUE(ifs[0].addr.isLoopback());
}

TEST(Socket, ParseAddresses) {
  auto a = parseHostPort("127.0.0.1:1234");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a.value().family(), AF_INET);
  EXPECT_EQ(a.value().port(), 1234);
  EXPECT_EQ(a.value().toString(), "127.0.0.1:1234");
  auto b = parseHostPort("[::1]:80");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b.value().family(), AF_INET6);
  EXPECT_TRUE(b.value().isLoopback());
  EXPECT_EQ(b.value().toString(), "[::1]:80");
  EXPECT_FALSE(parseHostPort("nohost").ok());
  EXPECT_FALSE(parseHostPort("1.2.3.4:0").ok());
  EXPECT_FALSE(parseHostPort("1.2.3.4:99999").ok());
  EXPECT_FALSE(parseHostPort("[::1:80").ok());
}

TEST(Socket, SendRecvWithDeadlines) {
  SockAddr lo = parseHostPort("127.0.0.1:1").value();
  lo.setPort(0);
  auto l = Socket::listen(lo);
  ASSERT_TRUE(l.ok());
  SockAddr where = l.value().localAddr().value();
  auto c = Socket::connect(where, deadlineAfter(5), nullptr);
  ASSERT_TRUE(c.ok()) << c.status().message();
  Socket server;
  for (int i = 0; i < 100 && !server.valid(); ++i) {
    server = l.value().tryAccept().take();
    if (!server.valid()) usleep(10000);
  }
  ASSERT_TRUE(server.valid());
  std::string msg(1 << 20, 'x');  // larger than socket buffers: exercises partial writes
  std::string got(msg.size(), '\0');
  Status st = sendRecv(c.value(), msg.data(), msg.size(), server, got.data(), got.size(),
                       deadlineAfter(10), nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(got, msg);

  // Nothing arrives: the wait ends at its deadline with a timeout, not a hang.
  char byte;
  auto t0 = Clock::now();
  Status late = server.recvAll(&byte, 1, deadlineAfter(0.3), nullptr);
  EXPECT_EQ(late.code(), tutti::Code::kTimeout);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);

  // An abort flag ends a wait well before its deadline.
  std::atomic<bool> abort{true};
  Status aborted = server.recvAll(&byte, 1, deadlineAfter(5), &abort);
  EXPECT_NE(aborted.message().find("abort"), std::string::npos) << aborted.message();

  // The peer closes: a remote error, at once.
  c.value().close();
  Status closed = server.recvAll(&byte, 1, deadlineAfter(5), nullptr);
  EXPECT_EQ(closed.code(), tutti::Code::kRemoteError);
}

// What the bootstrap root takes for this host's addresses (a rank listening elsewhere is on
// another host): loopback ones, every interface's, also written IPv4-mapped (a root on every
// IPv6 address sees IPv4 peers so), and no other.
TEST(Socket, LocalAddressesAreTold) {
  auto addr = [](const std::string& s) { return parseHostPort(s).value(); };
  EXPECT_TRUE(isLocalAddress(addr("127.0.0.1:1")));
  EXPECT_TRUE(isLocalAddress(addr("127.0.1.1:1")));
  EXPECT_TRUE(isLocalAddress(addr("[::1]:1")));
  EXPECT_TRUE(isLocalAddress(addr("[::ffff:127.0.0.1]:1")));
  EXPECT_FALSE(isLocalAddress(addr("203.0.113.7:1")));  // TEST-NET-3: no host's
  EXPECT_FALSE(isLocalAddress(addr("[::ffff:203.0.113.7]:1")));
  EXPECT_FALSE(isLocalAddress(addr("[2001:db8::7]:1")));
  for (const Interface& i : findInterfaces("", AF_UNSPEC)) {
    EXPECT_TRUE(isLocalAddress(i.addr)) << i.name << " " << i.addr.toString();
    if (i.addr.family() != AF_INET) continue;
    const std::string v4 = i.addr.toString();
    const std::string mapped = "[::ffff:" + v4.substr(0, v4.rfind(':')) + "]:1";
    EXPECT_TRUE(isLocalAddress(addr(mapped))) << mapped;
  }
  EXPECT_TRUE(addr("127.0.0.1:1").isUsualLoopback());
  EXPECT_TRUE(addr("[::1]:1").isUsualLoopback());
  EXPECT_FALSE(addr("127.0.1.1:1").isUsualLoopback());
  EXPECT_TRUE(addr("127.0.1.1:1").isLoopback());
}
