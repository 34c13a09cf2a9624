// Connections without the job's secret are dropped while the real ranks form their communicator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "harness/harness.h"
#include "nccl.h"
#include "runtime/socket.h"
#include "runtime/wire.h"

using namespace tutti;
using namespace tutti::test;

namespace {

net::SockAddr rootOf(const ncclUniqueId& raw) {
  wire::UniqueId id;
  memcpy(&id, raw.internal, sizeof(id));
  return wire::toSockAddr(id.root);
}

net::Socket connectTo(const net::SockAddr& a) {
  auto s = net::Socket::connect(a, net::deadlineAfter(5), nullptr);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? s.take() : net::Socket();
}

// A rank of another process checking in by hand: build fingerprint `tag` (0: a build from before
// the check), process mark `mark` (a pid, as builds before processToken() sent). Returns the
// socket the root answers on.
net::Socket checkIn(const ncclUniqueId& raw, int rank, int nranks, uint32_t tag,
                    uint64_t mark = 0) {
  wire::UniqueId id;
  memcpy(&id, raw.internal, sizeof(id));
  net::Socket s = connectTo(rootOf(raw));
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.secret = id.secret;
  h.kind = static_cast<uint32_t>(wire::HelloKind::kCheckIn);
  h.rank = rank;
  h.nranks = nranks;
  h.tag = tag;
  h.size = mark;
  EXPECT_TRUE(s.sendAll(&h, sizeof(h), net::deadlineAfter(5), nullptr).ok());
  return s;
}

// The root's answer on s (within 10 s): its code and message.
std::pair<int32_t, std::string> answerOn(net::Socket& s) {
  wire::RootReply reply{};
  Status st = s.recvAll(&reply, sizeof(reply), net::deadlineAfter(10), nullptr);
  EXPECT_TRUE(st.ok()) << st.message();
  reply.message[sizeof(reply.message) - 1] = 0;
  return {reply.code, reply.message};
}

}  // namespace

TEST(Security, IntrudersAreDroppedAndTheCommunicatorForms) {
  ncclUniqueId raw = makeId();
  wire::UniqueId id;
  memcpy(&id, raw.internal, sizeof(id));
  net::SockAddr root = rootOf(raw);

  // 1. Garbage bytes.
  net::Socket garbage = connectTo(root);
  std::string junk(200, '\x7f');
  ASSERT_TRUE(garbage.sendAll(junk.data(), junk.size(), net::deadlineAfter(5), nullptr).ok());
  // 2. A port scanner: connects and says nothing (must not hold up the others).
  net::Socket silent = connectTo(root);
  // 3. A well-formed check-in carrying another job's secret, claiming rank 0.
  net::Socket stale = connectTo(root);
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.secret = id.secret ^ 0x1234;
  h.kind = static_cast<uint32_t>(wire::HelloKind::kCheckIn);
  h.rank = 0;
  h.nranks = 3;
  ASSERT_TRUE(stale.sendAll(&h, sizeof(h), net::deadlineAfter(5), nullptr).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));

  // The intruders were dropped: their sockets see the close.
  char byte;
  EXPECT_EQ(garbage.recvAll(&byte, 1, net::deadlineAfter(5), nullptr).code(), Code::kRemoteError);
  EXPECT_EQ(stale.recvAll(&byte, 1, net::deadlineAfter(5), nullptr).code(), Code::kRemoteError);

  // The real ranks still form their communicator, while the silent connection stays open.
  std::vector<ncclComm_t> comms(3, nullptr);
  std::vector<ncclResult_t> rc(3);
  onThreads(3, [&](int r) { rc[r] = ncclCommInitRank(&comms[r], 3, raw, r); });
  for (int r = 0; r < 3; ++r) ASSERT_EQ(rc[r], ncclSuccess) << r;
  for (int r = 0; r < 3; ++r) {
    int rank = -1;
    EXPECT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    EXPECT_EQ(rank, r);
  }
  destroyAll(comms);
}

TEST(Security, WrongRankCountIsRefusedWithAMessage) {
  ncclUniqueId raw = makeId();
  wire::UniqueId id;
  memcpy(&id, raw.internal, sizeof(id));
  // One real rank of a 2-rank job checks in first ...
  ncclComm_t c0 = nullptr;
  ncclConfig_t cfg = nonblockingConfig();
  ASSERT_EQ(ncclCommInitRankConfig(&c0, 2, raw, 0, &cfg), ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // ... then a process that believes the job has 5 ranks: refused, told why.
  ncclComm_t bad = nullptr;
  ncclResult_t rc = ncclCommInitRank(&bad, 5, raw, 1);
  EXPECT_EQ(rc, ncclInvalidUsage);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("nranks=5"), std::string::npos)
      << ncclGetLastError(nullptr);
  // The right rank 1 still completes the job.
  ncclComm_t c1 = nullptr;
  ASSERT_EQ(ncclCommInitRank(&c1, 2, raw, 1), ncclSuccess) << ncclGetLastError(nullptr);
  EXPECT_EQ(waitInitialized(c0), ncclSuccess) << ncclGetLastError(c0);
  EXPECT_EQ(ncclCommDestroy(c0), ncclSuccess);
  EXPECT_EQ(ncclCommDestroy(c1), ncclSuccess);
}

// A rank of another tutti build (here a check-in with a build fingerprint of 0, as every build
// from before the check sends) fails the whole job at once, on every rank, naming the rank:
// before, the ranks went on to exchange peer info of different layouts.
TEST(Security, ARankOfAnotherTuttiBuildFailsTheWholeJobAtOnce) {
  ScopedEnv timeout("TUTTI_BOOTSTRAP_TIMEOUT", "60");
  ncclUniqueId raw = makeId();
  wire::UniqueId id;
  memcpy(&id, raw.internal, sizeof(id));
  // Ranks 0 and 2 of a 3-rank job check in ...
  ncclComm_t c0 = nullptr, c2 = nullptr;
  ncclConfig_t cfg = nonblockingConfig();
  ASSERT_EQ(ncclCommInitRankConfig(&c0, 3, raw, 0, &cfg), ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_EQ(ncclCommInitRankConfig(&c2, 3, raw, 2, &cfg), ncclInProgress);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // ... then rank 1, of an older build.
  const double start = now();
  net::Socket old = connectTo(rootOf(raw));
  wire::Hello h{};
  h.magic = wire::kHelloMagic;
  h.secret = id.secret;
  h.kind = static_cast<uint32_t>(wire::HelloKind::kCheckIn);
  h.rank = 1;
  h.nranks = 3;
  ASSERT_TRUE(old.sendAll(&h, sizeof(h), net::deadlineAfter(5), nullptr).ok());
  wire::RootReply reply{};
  ASSERT_TRUE(old.recvAll(&reply, sizeof(reply), net::deadlineAfter(10), nullptr).ok());
  reply.message[sizeof(reply.message) - 1] = 0;
  EXPECT_EQ(reply.code, static_cast<int32_t>(Code::kInvalidUsage));
  const std::string why =
      "rank 1 runs another tutti build than rank 0 (build fingerprints "
      "00000000 against ";
  EXPECT_NE(std::string(reply.message).find(why), std::string::npos) << reply.message;
  for (ncclComm_t c : {c0, c2}) {
    EXPECT_EQ(waitInitialized(c), ncclInvalidUsage);
    EXPECT_NE(std::string(ncclGetLastError(c)).find(why), std::string::npos) << ncclGetLastError(c);
    EXPECT_EQ(ncclCommAbort(c), ncclSuccess);
  }
  EXPECT_LT(secondsSince(start), 10.0);
  // Ranks of one build carry one fingerprint, never the 0 of the builds before the check.
  EXPECT_NE(wire::buildFingerprint(), 0u);
}

// A refused job's ranks still to come hear why before the root's own process does: told, that
// process may exit (its rank 0 failed), taking the root with it, and a rank that came later would
// wait for a root that is gone until its own deadline, not knowing why. So the root's own ranks
// are told once every rank has checked in, or 10 s (at most TUTTI_BOOTSTRAP_TIMEOUT) after the
// refusal, naming the ranks that had not come; those are still told as they come, until the job's
// deadline, while the root's process lives.
TEST(Security, ARefusedJobTellsTheRanksStillToComeBeforeTheRootsOwnRanks) {
  // Whichever of rank 0 and the old rank 1 checked in first, the other is named.
  auto refusal = [](const std::string& m) {
    return m.find("runs another tutti build than rank") != std::string::npos &&
           m.find("00000000") != std::string::npos;
  };
  ScopedEnv timeout("TUTTI_BOOTSTRAP_TIMEOUT", "60");
  {
    ncclUniqueId raw = makeId();  // the root runs in this process, as rank 0's does
    ncclComm_t c0 = nullptr;
    ncclConfig_t cfg = nonblockingConfig();
    ASSERT_EQ(ncclCommInitRankConfig(&c0, 3, raw, 0, &cfg), ncclInProgress);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // The old rank runs under this process's pid, as a container on another host may: it is
    // still told at once, not held back with this process's own ranks.
    net::Socket old = checkIn(raw, 1, 3, 0, static_cast<uint64_t>(getpid()));
    const double asked = now();
    auto [code1, msg1] = answerOn(old);
    EXPECT_LT(secondsSince(asked), 5.0);
    EXPECT_EQ(code1, static_cast<int32_t>(Code::kInvalidUsage));
    EXPECT_TRUE(refusal(msg1)) << msg1;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ncclResult_t state = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(c0, &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress) << "rank 0 was told before rank 2 came";
    const double start = now();
    net::Socket late = checkIn(raw, 2, 3, wire::buildFingerprint());
    auto [code2, msg2] = answerOn(late);
    EXPECT_EQ(code2, static_cast<int32_t>(Code::kInvalidUsage));
    EXPECT_TRUE(refusal(msg2)) << msg2;
    EXPECT_EQ(waitInitialized(c0), ncclInvalidUsage);
    EXPECT_TRUE(refusal(ncclGetLastError(c0))) << ncclGetLastError(c0);
    EXPECT_LT(secondsSince(start), 5.0);
    EXPECT_EQ(ncclCommAbort(c0), ncclSuccess);
  }
  {  // rank 2 comes after the grace: rank 0 is told when it ends, naming rank 2, which is still
     // told when it comes
    ncclUniqueId raw = makeId();
    ncclComm_t c0 = nullptr;
    ncclConfig_t cfg = nonblockingConfig();
    ASSERT_EQ(ncclCommInitRankConfig(&c0, 3, raw, 0, &cfg), ncclInProgress);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const double start = now();
    net::Socket old = checkIn(raw, 1, 3, 0);
    EXPECT_EQ(answerOn(old).first, static_cast<int32_t>(Code::kInvalidUsage));
    EXPECT_EQ(waitInitialized(c0), ncclInvalidUsage);
    const double told = secondsSince(start);
    const std::string last = ncclGetLastError(c0);
    EXPECT_TRUE(refusal(last)) << last;
    EXPECT_NE(last.find("(rank(s) 2 had not checked in 10 s after that)"), std::string::npos)
        << last;
    EXPECT_GT(told, 9.0);
    EXPECT_LT(told, 30.0);
    net::Socket late = checkIn(raw, 2, 3, wire::buildFingerprint());
    auto [code2, msg2] = answerOn(late);
    EXPECT_EQ(code2, static_cast<int32_t>(Code::kInvalidUsage));
    EXPECT_TRUE(refusal(msg2)) << msg2;
    EXPECT_EQ(ncclCommAbort(c0), ncclSuccess);
  }
}
