// The bootstrap ring itself: all-gather, barrier and point-to-point messages, IPv4 and IPv6.
#include "runtime/bootstrap.h"

#include <gtest/gtest.h>
#include <netinet/in.h>

#include <chrono>
#include <memory>
#include <thread>

#include "harness/harness.h"
#include "runtime/bootstrap_root.h"
#include "runtime/lifecycle.h"

using namespace tutti;
using tutti::test::onThreads;

namespace {

// A listener on 127.0.0.1, at a port the kernel picks.
Result<net::Socket> listenOnLoopback() {
  net::SockAddr any = net::parseHostPort("127.0.0.1:1").value();
  any.setPort(0);
  return net::Socket::listen(any);
}

std::vector<std::unique_ptr<Bootstrap>> formRing(int n, const wire::UniqueId& id) {
  std::vector<std::unique_ptr<Bootstrap>> b(static_cast<size_t>(n));
  std::vector<std::string> err(static_cast<size_t>(n));
  onThreads(n, [&](int r) {
    if (r == 0 && (id.flags & wire::kRootStartedByRank0)) {
      auto stop = startRootForId(id);
      if (!stop.ok()) err[r] = stop.status().message();
    }
    auto res = Bootstrap::create(id, r, n, nullptr, 20);
    if (res.ok()) {
      b[r] = res.take();
    } else {
      err[r] = res.status().message();
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(b[r]) << "rank " << r << ": " << err[r];
  return b;
}

void checkAllGather(std::vector<std::unique_ptr<Bootstrap>>& b) {
  int n = static_cast<int>(b.size());
  // Slices of 1 MiB: larger than socket buffers, so both directions must progress together.
  const size_t slice = 1 << 20;
  std::vector<std::vector<uint32_t>> data(n, std::vector<uint32_t>(n * slice / 4, 0));
  onThreads(n, [&](int r) {
    for (size_t i = 0; i < slice / 4; ++i) data[r][r * slice / 4 + i] = r * 1000003u + i;
    ASSERT_TRUE(b[r]->allGather(data[r].data(), slice).ok());
  });
  for (int r = 0; r < n; ++r) {
    for (int s = 0; s < n; ++s) {
      ASSERT_EQ(data[r][s * slice / 4 + 17], s * 1000003u + 17) << "rank " << r << " slice " << s;
    }
  }
}

}  // namespace

TEST(Bootstrap, AllGatherBarrierAndMessages) {
  auto id = newUniqueId();
  ASSERT_TRUE(id.ok()) << id.status().message();
  auto b = formRing(5, id.value());
  checkAllGather(b);
  onThreads(5, [&](int r) { EXPECT_TRUE(b[r]->barrier().ok()); });

  // Every rank sends two tagged messages to every other; receivers ask in reverse order.
  onThreads(5, [&](int r) {
    for (int p = 0; p < 5; ++p) {
      if (p == r) continue;
      for (uint32_t tag : {1u, 2u}) {
        int v = r * 100 + p * 10 + static_cast<int>(tag);
        ASSERT_TRUE(b[r]->send(p, tag, &v, sizeof(v)).ok());
      }
    }
    for (int p = 4; p >= 0; --p) {
      if (p == r) continue;
      for (uint32_t tag : {2u, 1u}) {
        int v = -1;
        Status s = b[r]->recv(p, tag, &v, sizeof(v));
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_EQ(v, p * 100 + r * 10 + static_cast<int>(tag));
      }
    }
  });
}

TEST(Bootstrap, Ipv6Rendezvous) {
  auto probe = net::Socket::listen(net::parseHostPort("[::1]:1").value());
  if (!probe.ok()) GTEST_SKIP() << "no IPv6 loopback here";
  // A fixed address, as NCCL_COMM_ID gives it: rank 0 hosts the root there.
  net::SockAddr a = net::parseHostPort("[::1]:1").value();
  a.setPort(0);
  auto l = net::Socket::listen(a);
  ASSERT_TRUE(l.ok());
  int port = l.value().localAddr().value().port();
  l.value().close();
  auto id = idForAddress("[::1]:" + std::to_string(port), "test");
  ASSERT_TRUE(id.ok());
  auto b = formRing(3, id.value());
  for (auto& x : b) ASSERT_EQ(x->listenAddr().family(), AF_INET6);
  checkAllGather(b);
}

TEST(Bootstrap, MessageSizeMismatchIsAnError) {
  auto id = newUniqueId();
  ASSERT_TRUE(id.ok());
  auto b = formRing(2, id.value());
  int v = 5;
  ASSERT_TRUE(b[0]->send(1, 9, &v, sizeof(v)).ok());
  double d = 0;
  Status s = b[1]->recv(0, 9, &d, sizeof(d));
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("expected 8"), std::string::npos) << s.message();
}

// A rank that finds another program at the root's address (torchrun's store on MASTER_PORT, say)
// says so, naming the address, whether that program drops the connection or answers nonsense.
TEST(Bootstrap, AnotherProgramAtTheRootsAddressIsNamed) {
  for (bool answers : {false, true}) {
    auto l = listenOnLoopback();
    ASSERT_TRUE(l.ok());
    const std::string addr = "127.0.0.1:" + std::to_string(l.value().localAddr().value().port());
    std::thread other([&] {
      const net::Deadline end = net::deadlineAfter(10);
      while (std::chrono::steady_clock::now() < end) {
        Result<net::Socket> c = l.value().tryAccept();
        ASSERT_TRUE(c.ok());
        if (!c.value().valid()) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          continue;
        }
        if (answers) {  // reads the check-in, then answers what a store or web server might
          char in[sizeof(wire::Hello)];
          (void)c.value().recvAll(in, sizeof in, end, nullptr);
          std::string junk(sizeof(wire::RootReply), 'x');
          (void)c.value().sendAll(junk.data(), junk.size(), end, nullptr);
        }
        return;  // closes the connection
      }
    });
    auto id = idForAddress(addr, "test");
    ASSERT_TRUE(id.ok());
    auto b = Bootstrap::create(id.value(), 1, 2, nullptr, 10);
    other.join();
    ASSERT_FALSE(b.ok());
    const std::string m = b.status().message();
    EXPECT_NE(m.find("rank 1"), std::string::npos) << m;
    EXPECT_NE(m.find("at " + addr), std::string::npos) << m;
    EXPECT_NE(m.find("another program listening there?"), std::string::npos) << m;
    if (answers) EXPECT_NE(m.find("is not a tutti bootstrap root"), std::string::npos) << m;
    // The reset connection's address is still known (getpeername no longer gives it).
    if (!answers) EXPECT_NE(m.find(addr + ": "), std::string::npos) << m;
    EXPECT_EQ(m.find("<no address>"), std::string::npos) << m;
  }
}

// A job on several hosts whose rendezvous name is a loopback address on rank 0's host (Debian
// and Ubuntu map a host's own name to 127.0.1.1): the root listens on every address, so the
// other hosts reach it by the name's address there, and the ranks listen on their interface,
// not on loopback. Without the launcher saying so, all stays on loopback.
TEST(Bootstrap, ALoopbackRendezvousOfAJobOnSeveralHostsIsReachableFromThem) {
  auto freePort = [] {
    auto l = listenOnLoopback();
    return l.ok() ? l.value().localAddr().value().port() : 0;
  };
  for (bool spans : {true, false}) {
    const int port = freePort();
    ASSERT_GT(port, 0);
    auto id = idForAddress("127.0.1.1:" + std::to_string(port), "test", spans);
    ASSERT_TRUE(id.ok()) << id.status().message();
    EXPECT_EQ((id.value().flags & wire::kJobSpansHosts) != 0, spans);
    auto root = startRootForId(id.value());
    ASSERT_TRUE(root.ok()) << root.status().message();
    // Another address of this host than the one named: only a root on every address answers.
    const net::SockAddr other = net::parseHostPort("127.0.0.1:" + std::to_string(port)).value();
    auto probe = net::Socket::connect(other, net::deadlineAfter(0.5), nullptr);
    EXPECT_EQ(probe.ok(), spans) << (probe.ok() ? "" : probe.status().message());
    if (probe.ok()) probe.value().close();  // the root drops a connection that says nothing
    root.value()->stopAndWait();
  }
  // Where the launcher does not say so, a root at such a name that times out says other hosts
  // cannot reach it.
  {
    tutti::test::ScopedEnv deadline("TUTTI_BOOTSTRAP_TIMEOUT", "1");  // the root's
    auto id = idForAddress("127.0.1.1:" + std::to_string(freePort()), "test", false);
    ASSERT_TRUE(id.ok());
    auto root = startRootForId(id.value());
    ASSERT_TRUE(root.ok()) << root.status().message();
    auto alone = Bootstrap::create(id.value(), 0, 2, nullptr, 1);  // rank 1 never comes
    ASSERT_FALSE(alone.ok());
    const std::string m = alone.status().message();
    EXPECT_NE(m.find("rank(s) 1 of 2 did not check in"), std::string::npos) << m;
    EXPECT_NE(m.find("listens on a loopback address, which ranks on other hosts cannot reach"),
              std::string::npos)
        << m;
    root.value()->stopAndWait();
  }
  // The ranks of such a job listen on the interface NCCL_SOCKET_IFNAME (or the default) names,
  // where other hosts reach them (the tests name lo; here the first other one, where this host
  // has one), and their ring forms.
  std::vector<net::Interface> up = net::findInterfaces("", AF_INET);
  const bool onlyLo = up.empty() || up[0].addr.isLoopback();
  tutti::test::ScopedEnv ifname("NCCL_SOCKET_IFNAME", onlyLo ? "lo" : up[0].name.c_str());
  auto id = idForAddress("127.0.1.1:" + std::to_string(freePort()), "test", true);
  ASSERT_TRUE(id.ok());
  auto b = formRing(3, id.value());
  for (auto& x : b) {
    ASSERT_TRUE(x);
    if (!onlyLo) EXPECT_FALSE(x->listenAddr().isLoopback()) << x->listenAddr().toString();
  }
  checkAllGather(b);
}
