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
