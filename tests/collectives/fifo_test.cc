// The FIFOs under the collectives, driven by thread ranks in this process: slots and cells over
// shm and tcp, how far ahead a sender runs, shm single copy (adaptive, and in pieces), tcp with
// the default buffers, and waits that see whether the peer shares this rank's CPU.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "harness/harness.h"
#include "runtime/comm.h"
#include "runtime/links.h"
#include "runtime/waiter.h"

using namespace tutti::test;

// Waits and the CPU they run on: two ranks on threads over shm, pinned (after init, so the
// communicator does not count itself oversubscribed) first to one CPU, then to two. Both
// all-reduces must give the right sums, and a wait must see its peer on its own CPU in the
// first case (it then yields at once instead of spinning up to TUTTI_SPIN_NS while the peer
// cannot run) and not in the second.
TEST(Waits, AShmWaitSeesWhetherThePeerSharesItsCpu) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof(all), &all), 0);
  if (CPU_COUNT(&all) < 2) GTEST_SKIP() << "needs two CPUs";
  int cpus[2], k = 0;
  for (int c = 0; c < CPU_SETSIZE && k < 2; ++c) {
    if (CPU_ISSET(c, &all)) cpus[k++] = c;
  }
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  std::vector<ncclComm_t> comms = initThreads(2);
  for (bool oneCpu : {true, false}) {
    std::vector<int> sameCpu(2);  // not vector<bool>: its elements share words
    onThreads(2, [&](int r) {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[oneCpu ? 0 : r], &one);
      ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
      std::vector<float> v(1 << 18, float(r + 1));  // 1 MiB: many slots, many waits
      for (int i = 0; i < 3; ++i) {
        ASSERT_EQ(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comms[size_t(r)],
                                nullptr),
                  ncclSuccess);
      }
      EXPECT_EQ(v.front(), 12.0f);  // 1 + 2, then doubled twice
      EXPECT_EQ(v.back(), 12.0f);
      auto* c = reinterpret_cast<tutti::Comm*>(comms[size_t(r)]);
      sameCpu[size_t(r)] =
          tutti::Waiter::peerOnMyCpu(*c->links().recv(1 - r, 0), tutti::Waiter::Dir::kRecv);
    });
    EXPECT_EQ(sameCpu[0], int(oneCpu));
    EXPECT_EQ(sameCpu[1], int(oneCpu));
  }
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}

// Whether the page holding addr is mapped in this process (/proc/self/pagemap, bit 63).
static bool pageMapped(const void* addr) {
  FILE* f = fopen("/proc/self/pagemap", "rb");
  if (!f) return false;
  uint64_t entry = 0;
  const long page = sysconf(_SC_PAGESIZE);
  const bool ok =
      fseek(f, long(reinterpret_cast<uintptr_t>(addr) / uintptr_t(page) * 8), SEEK_SET) == 0 &&
      fread(&entry, sizeof(entry), 1, f) == 1;
  fclose(f);
  return ok && (entry >> 63) != 0;
}

// Every slot's first page is mapped on both ends when a connection is made, before any
// operation touches it: a first touch in the middle of an operation costs a page fault (8
// ranks on 2 cores over shm: the first 8 small all-reduces took 100-450 us, later ones 20).
// One 8-byte all-reduce uses one slot (tcp) or cell (shm) per FIFO; every slot's first page
// and every cell must be mapped.
TEST(Fifos, EverySlotsFirstPageIsMappedWhenTheConnectionIsMade) {
  namespace tr = tutti::transport;
  for (const char* disable : {"0", "1"}) {
    SCOPED_TRACE(std::string("NCCL_SHM_DISABLE=") + disable);
    ScopedEnv shm("NCCL_SHM_DISABLE", disable);
    std::vector<ncclComm_t> comms = initThreads(2);
    onThreads(2, [&](int r) {
      float v[2] = {1, 2};
      ASSERT_EQ(ncclAllReduce(v, v, 2, ncclFloat, ncclSum, comms[size_t(r)], nullptr), ncclSuccess);
    });
    for (int r = 0; r < 2; ++r) {
      auto* c = reinterpret_cast<tutti::Comm*>(comms[size_t(r)]);
      for (const tutti::transport::FifoView* f :
           {c->links().send(1 - r, 0), c->links().recv(1 - r, 0)}) {
        ASSERT_NE(f, nullptr);
        for (uint64_t k = 0; k < tutti::transport::kSlots; ++k) {
          EXPECT_TRUE(pageMapped(f->slot(k)))
              << "rank " << r << ", peer " << f->peer << ", slot " << k;
        }
        EXPECT_EQ(f->cells != nullptr, std::string(disable) == "0");
        for (uint64_t k = 0; f->cells && k < tutti::transport::kSteps; ++k) {
          EXPECT_EQ(f->payload(k, 8), f->cells + k * (f->cellBytes + 64) + tr::kCellHeader);
          EXPECT_TRUE(pageMapped(f->payload(k, 8)))
              << "rank " << r << ", peer " << f->peer << ", cell " << k;
          EXPECT_TRUE(pageMapped(f->payload(k, 8) + f->cellBytes - 1))
              << "rank " << r << ", peer " << f->peer << ", cell " << k << "'s end";
        }
      }
    }
    destroyAll(comms);
  }
}

// Cells are a slot's 1/64, at most 2 KiB (they are committed when a link is made, whatever
// NCCL_BUFFSIZE says), and none where one would be under a cache line.
TEST(Fifos, CellsAreASlotsSixtyFourthUpTo2KiB) {
  namespace tr = tutti::transport;
  EXPECT_EQ(tr::cellBytesFor(128 << 10), 2048u);  // shm's default slot
  EXPECT_EQ(tr::cellBytesFor(2 << 20), 2048u);    // NCCL_BUFFSIZE=16M
  EXPECT_EQ(tr::cellBytesFor(32 << 10), 512u);    // NCCL_BUFFSIZE=256K
  EXPECT_EQ(tr::cellBytesFor(64 * 64), 64u);
  EXPECT_EQ(tr::cellBytesFor(64 * 64 - 64), 0u);
}

namespace {
// Two ranks on threads whose links run both ways (one send and one receive each).
std::vector<ncclComm_t> twoRanksLinkedBothWays() {
  std::vector<ncclComm_t> comms = initThreads(2);
  onThreads(2, [&](int r) {
    uint8_t a = 1, b = 0;
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(&a, 1, ncclUint8, 1 - r, comms[size_t(r)], nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(&b, 1, ncclUint8, 1 - r, comms[size_t(r)], nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
  });
  return comms;
}
}  // namespace

// Over shm a payload that fits a cell (2 KiB with the default buffers) goes there, and such
// steps run up to kSteps (64) ahead of the receiver; bigger ones, in slots, up to kSlots (8).
// Rank 0 sends more messages than that while rank 1 holds off: exactly the window's worth
// complete, and once rank 1 receives, every message arrives intact (no cell or slot reused
// before its step was consumed).
TEST(Fifos, SmallStepsRunAsFarAheadAsTheCellsAllowBigOnesAsTheSlots) {
  namespace tr = tutti::transport;
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
  std::vector<ncclComm_t> comms = twoRanksLinkedBothWays();
  const tr::FifoView* f = reinterpret_cast<tutti::Comm*>(comms[0])->links().send(1, 0);
  ASSERT_NE(f, nullptr);
  ASSERT_STREQ(f->conn->transportName(), "shm");
  ASSERT_EQ(f->cellBytes, 2048u);
  auto value = [](size_t i, int msg) { return uint8_t(i * 131 + size_t(msg) * 7 + 3); };
  for (size_t bytes : {size_t(64), size_t(2048), size_t(2112), size_t(8192)}) {
    SCOPED_TRACE(std::to_string(bytes) + " bytes per message");
    const int ahead = bytes <= f->cellBytes ? tr::kSteps : tr::kSlots;
    const int total = ahead + 8;
    std::atomic<int> sent{0};
    onThreads(2, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      if (r == 0) {
        for (int m = 0; m < total; ++m) {
          std::vector<uint8_t> msg(bytes);  // gone once the call returns: copied, not lent
          for (size_t i = 0; i < bytes; ++i) msg[i] = value(i, m);
          ASSERT_EQ(ncclSend(msg.data(), bytes, ncclUint8, 1, c, nullptr), ncclSuccess);
          sent.fetch_add(1);
        }
        return;
      }
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (sent.load() < ahead && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_EQ(sent.load(), ahead) << "messages sent before the receiver took any";
      for (int m = 0; m < total; ++m) {
        std::vector<uint8_t> got(bytes, 0);
        ASSERT_EQ(ncclRecv(got.data(), bytes, ncclUint8, 0, c, nullptr), ncclSuccess);
        for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(got[i], value(i, m)) << "message " << m;
      }
    });
    EXPECT_EQ(sent.load(), total);
  }
  destroyAll(comms);
}

// Over shm the receiver takes a step from its cell's word (transport::posted), which carries
// the step's number and size word and shares a small payload's cache line. Through three
// rounds of the 64 cells: before each step is posted, the cell still holds the word of the
// step 64 back (or nothing) and must not count as posted; once posted, the receiver reads the
// size word as sent (without the step's number) and the payload that shares the line.
TEST(Fifos, AReceiverTakesAStepFromItsCellWordNeverAStaleOne) {
  namespace tr = tutti::transport;
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
  std::vector<ncclComm_t> comms = twoRanksLinkedBothWays();
  tr::FifoView& sf = *reinterpret_cast<tutti::Comm*>(comms[0])->links().send(1, 0);
  tr::FifoView& rf = *reinterpret_cast<tutti::Comm*>(comms[1])->links().recv(0, 0);
  ASSERT_STREQ(sf.conn->transportName(), "shm");
  ASSERT_NE(rf.cells, nullptr);
  ASSERT_EQ(sf.step, rf.step);
  for (int k = 0; k < 3 * tr::kSteps; ++k) {
    SCOPED_TRACE("step " + std::to_string(sf.step));
    const size_t bytes = 8 + size_t(k % 48);  // within the word's line
    EXPECT_FALSE(tr::posted(rf));
    char* p = sf.payload(sf.step, bytes);
    EXPECT_EQ(p, reinterpret_cast<char*>(&sf.cellWord(sf.step)) + tr::kCellHeader);
    for (size_t i = 0; i < bytes; ++i) p[i] = char(i * 13 + size_t(k));
    const uint64_t word = bytes | (k % 2 ? tr::kLastSlot : 0) | (k % 3 ? 0 : tr::kWaySlot);
    sf.ctrl->sizes[sf.step % tr::kSteps].store(word);
    tr::postTail(sf);
    ASSERT_TRUE(tr::posted(rf));
    EXPECT_EQ(tr::postedWord(rf), word);
    const char* q = rf.payload(rf.step, bytes);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(q[i], char(i * 13 + size_t(k))) << "byte " << i;
    tr::postHead(rf);
  }
  destroyAll(comms);
}

// shm single copy by default is adaptive: big payloads go through slots while copying into a
// slot runs fast, by address for a while once the median of 8 copies ran slow. With the
// threshold at 10^6 GB/s every copy is slow: after the first operations (whose copies touch
// fresh pages and do not count) the sends switch to addresses; at 0 they never do; with
// TUTTI_SHM_SINGLE_COPY=0 there is no single copy at all. Every result must be exact across
// the switch. (Only the all-reduce's sends take the adaptive choice: the two-rank all-gather
// and broadcast go by address whenever single copy is on.)
TEST(SingleCopy, AdaptiveSendsByAddressOnceSlotCopiesRunSlow) {
  struct Case {
    const char* slowGBps;
    const char* mode;
    bool byAddress;
  };
  for (const Case& c :
       {Case{"1000000", nullptr, true}, Case{"0", nullptr, false}, Case{"1000000", "0", false}}) {
    SCOPED_TRACE(std::string("TUTTI_SHM_SLOW_GBPS=") + c.slowGBps +
                 " TUTTI_SHM_SINGLE_COPY=" + (c.mode ? c.mode : "(unset)"));
    ScopedEnv shm("NCCL_SHM_DISABLE", "0");
    ScopedEnv slow("TUTTI_SHM_SLOW_GBPS", c.slowGBps);
    ScopedEnv mode("TUTTI_SHM_SINGLE_COPY", c.mode);
    std::vector<ncclComm_t> comms = initThreads(2);
    std::vector<int> byAddress(2);
    onThreads(2, [&](int r) {
      const size_t count = 1 << 18;  // 1 MiB of float per rank: many 4 KiB+ steps
      // Rounds enough for 8 timed copies over slots each touched before, wherever the
      // all-reduce's timed sends fall among the kSlots slots (the all-gather and broadcast
      // before it take one step per round each way, sent by address).
      for (int round = 0; round < 5; ++round) {
        std::vector<float> in(count), gathered(2 * count), bcast(count), sum(count);
        for (size_t i = 0; i < count; ++i) in[i] = float(r * 1000 + round * 7 + int(i % 97));
        ncclComm_t comm = comms[size_t(r)];
        ASSERT_EQ(ncclAllGather(in.data(), gathered.data(), count, ncclFloat, comm, nullptr),
                  ncclSuccess);
        ASSERT_EQ(ncclBroadcast(in.data(), bcast.data(), count, ncclFloat, 1, comm, nullptr),
                  ncclSuccess);
        ASSERT_EQ(ncclAllReduce(in.data(), sum.data(), count, ncclFloat, ncclSum, comm, nullptr),
                  ncclSuccess);
        for (size_t i = 0; i < count; ++i) {
          const float v0 = float(round * 7 + int(i % 97)),
                      v1 = float(1000 + round * 7 + int(i % 97));
          ASSERT_EQ(gathered[i], v0) << "round " << round << " i " << i;
          ASSERT_EQ(gathered[count + i], v1) << "round " << round << " i " << i;
          ASSERT_EQ(bcast[i], v1) << "round " << round << " i " << i;
          ASSERT_EQ(sum[i], v0 + v1) << "round " << round << " i " << i;
        }
      }
      auto* comm = reinterpret_cast<tutti::Comm*>(comms[size_t(r)]);
      byAddress[size_t(r)] = comm->links().send(1 - r, 0)->conn->bigByAddress();
    });
    EXPECT_EQ(byAddress[0], int(c.byAddress));
    EXPECT_EQ(byAddress[1], int(c.byAddress));
    destroyAll(comms);
  }
}

// shm single copy in pieces: a sender that waits copies pieces of the receiver's copy into
// the receiver's destination, the receiver copies the rest, and the step completes only once
// every piece is in. Driven by hand on one step of a real shm FIFO between two thread ranks,
// so that who copies what is fixed: the sender takes `helped` of the 4 pieces of 256 KiB
// before the receiver lands, the receiver the others (in an exchange, of 2 pieces). A stale step
// must never be helped.
TEST(SingleCopy, TheSenderCopiesPiecesOfTheReceiversCopyWhileItWaits) {
  namespace tr = tutti::transport;
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv mode("TUTTI_SHM_SINGLE_COPY", "1");
  std::vector<ncclComm_t> comms = initThreads(2);
  auto sum = [&] {
    onThreads(2, [&](int r) {
      std::vector<float> v(1 << 16, float(r + 1));
      ASSERT_EQ(ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comms[size_t(r)],
                              nullptr),
                ncclSuccess);
      EXPECT_EQ(v[12345], 3.0f);
    });
  };
  sum();  // connects
  ASSERT_NE(reinterpret_cast<tutti::Comm*>(comms[0])->links().send(1, 0), nullptr);
  tr::FifoView& sf = *reinterpret_cast<tutti::Comm*>(comms[0])->links().send(1, 0);
  tr::FifoView& rf = *reinterpret_cast<tutti::Comm*>(comms[1])->links().recv(0, 0);
  ASSERT_STREQ(sf.conn->transportName(), "shm");
  const size_t bytes = 256 << 10;  // 4 pieces of 64 KiB
  std::vector<char> src(bytes), dst(bytes);
  for (int helped = 0; helped <= 4; ++helped) {
    SCOPED_TRACE("pieces the sender copies: " + std::to_string(helped));
    for (size_t i = 0; i < bytes; ++i) src[i] = char(i * 131 + size_t(helped)), dst[i] = 0;
    ASSERT_EQ(sf.step, rf.step);
    const uint64_t step = sf.step;
    ASSERT_TRUE(sf.conn->sendFrom(step, src.data(), bytes, tr::SendHow::kAdaptive));  // by address
    sf.ctrl->sizes[step % tr::kSteps].store(bytes);
    tr::postTail(sf);
    EXPECT_FALSE(sf.conn->help()) << "the receiver has not asked for the step yet";
    rf.conn->recvInto(step, dst.data(), bytes);
    for (int k = 0; k < helped; ++k) ASSERT_TRUE(sf.conn->help()) << "piece " << k;
    bool inDst = false;
    ASSERT_TRUE(rf.conn->land(step, &inDst).ok());
    EXPECT_TRUE(inDst);
    EXPECT_TRUE(rf.conn->landed(step));
    EXPECT_FALSE(sf.conn->help()) << "every piece is taken";
    EXPECT_EQ(memcmp(src.data(), dst.data(), bytes), 0);
    tr::postHead(rf);
    rf.conn->recvInto(UINT64_MAX, nullptr, 0);
  }
  // A receiver expecting another size (ranks that disagree on the count) gets nothing written
  // into its buffer, and the sender gives up helping with that step; a claim closed at the
  // end of an operation takes no more pieces. Each step is then posted again with the right
  // size and lands whole, copied by the receiver.
  for (bool mismatch : {true, false}) {
    SCOPED_TRACE(mismatch ? "size mismatch" : "claim closed");
    const uint64_t step = sf.step;
    for (size_t i = 0; i < bytes; ++i) src[i] = char(i * 7 + size_t(mismatch)), dst[i] = 0;
    ASSERT_TRUE(sf.conn->sendFrom(step, src.data(), bytes, tr::SendHow::kAdaptive));
    sf.ctrl->sizes[step % tr::kSteps].store(bytes);
    tr::postTail(sf);
    size_t written = 0;
    if (mismatch) {
      rf.conn->recvInto(step, dst.data(), 4000);
      EXPECT_FALSE(sf.conn->help()) << "the receiver expects 4000 bytes";
    } else {
      rf.conn->recvInto(step, dst.data(), bytes);
      ASSERT_TRUE(sf.conn->help());  // one piece
      written = 64 << 10;
    }
    rf.conn->recvInto(UINT64_MAX, nullptr, 0);  // the end of the operation closes the claim
    EXPECT_FALSE(sf.conn->help());
    EXPECT_EQ(std::count(dst.begin() + long(written), dst.end(), 0), long(bytes - written));
    rf.conn->recvInto(step, dst.data(), bytes);
    EXPECT_FALSE(sf.conn->help()) << "the sender has given up on this step";
    bool inDst = false;
    ASSERT_TRUE(rf.conn->land(step, &inDst).ok());
    EXPECT_TRUE(rf.conn->landed(step));
    EXPECT_EQ(memcmp(src.data(), dst.data(), bytes), 0);
    tr::postHead(rf);
    rf.conn->recvInto(UINT64_MAX, nullptr, 0);
  }
  // Sent as one side of an exchange, the same payload goes in 2 pieces of 128 KiB: the sender
  // takes one at most, and the receiver copies the second half (or all) of it.
  for (int helped = 0; helped <= 2; ++helped) {
    SCOPED_TRACE("exchange, pieces the sender copies: " + std::to_string(helped));
    for (size_t i = 0; i < bytes; ++i) src[i] = char(i * 29 + size_t(helped)), dst[i] = 0;
    const uint64_t step = sf.step;
    ASSERT_TRUE(sf.conn->sendFrom(step, src.data(), bytes, tr::SendHow::kTwoRanks));
    sf.ctrl->sizes[step % tr::kSteps].store(bytes);
    tr::postTail(sf);
    rf.conn->recvInto(step, dst.data(), bytes);
    for (int k = 0; k < helped; ++k) ASSERT_TRUE(sf.conn->help()) << "piece " << k;
    if (helped == 1) {  // the sender's piece is in, the rest untouched
      EXPECT_EQ(memcmp(src.data(), dst.data(), bytes / 2), 0);
      EXPECT_EQ(std::count(dst.begin() + long(bytes / 2), dst.end(), 0), long(bytes / 2));
    }
    bool inDst = false;
    ASSERT_TRUE(rf.conn->land(step, &inDst).ok());
    EXPECT_TRUE(rf.conn->landed(step));
    EXPECT_FALSE(sf.conn->help()) << "every piece is taken";
    EXPECT_EQ(memcmp(src.data(), dst.data(), bytes), 0);
    tr::postHead(rf);
    rf.conn->recvInto(UINT64_MAX, nullptr, 0);
  }
  sum();  // steps continue from here: the communicators still work
  destroyAll(comms);
}

// Over tcp the FIFO cannot show the peer's CPU. For a peer on this machine (loopback here),
// which may share this rank's core, waits spin until kUnseenMisses spins in a row run out;
// then kUnseenRest waits do not spin, and spinning resumes after them.
TEST(Waits, ATcpPeerOnThisMachineIsNotSpunForOnceSpinsRunOut) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "1");
  std::vector<ncclComm_t> comms = initThreads(2);
  onThreads(2, [&](int r) {
    std::vector<float> v(1000, float(r + 1));
    ASSERT_EQ(
        ncclAllReduce(v.data(), v.data(), v.size(), ncclFloat, ncclSum, comms[size_t(r)], nullptr),
        ncclSuccess);
    EXPECT_EQ(v[999], 3.0f);
  });
  using tutti::Waiter;
  auto* c = reinterpret_cast<tutti::Comm*>(comms[0]);
  const tutti::transport::FifoView& f = *c->links().recv(1, 0);
  EXPECT_STREQ(f.conn->transportName(), "tcp");
  EXPECT_TRUE(f.conn->localPeerUnseen());
  EXPECT_FALSE(Waiter::peerOnMyCpu(f, Waiter::Dir::kRecv));  // no shared block to read it in
  f.conn->unseenMisses = 0;
  f.conn->unseenRest = 0;
  EXPECT_TRUE(Waiter::unseenMaySpin(f));
  for (uint32_t k = 1; k < Waiter::kUnseenMisses; ++k) Waiter::unseenSpinEnded(f, true);
  Waiter::unseenSpinEnded(f, false);  // an answer in time starts the count again
  EXPECT_TRUE(Waiter::unseenMaySpin(f));
  for (uint32_t k = 0; k < Waiter::kUnseenMisses; ++k) Waiter::unseenSpinEnded(f, true);
  for (uint32_t k = 0; k < Waiter::kUnseenRest; ++k) ASSERT_FALSE(Waiter::unseenMaySpin(f)) << k;
  EXPECT_TRUE(Waiter::unseenMaySpin(f));
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// tcp with the default buffers: 2 MiB slots, steps of at most 512 KiB, except a two-rank
// broadcast's, which fill whole slots. Messages bigger than a slot, with odd lengths: a
// broadcast from either root in and out of place, a send/recv, and an all-reduce.
TEST(TcpDefaultBuffers, BigBroadcastSendRecvAndAllReduceAreExact) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "1");
  ScopedEnv buff("NCCL_BUFFSIZE", nullptr);
  std::vector<ncclComm_t> comms = initThreads(2);
  const size_t count = (5 << 20) / sizeof(int32_t) + 7;  // 5 MiB and 28 bytes
  auto value = [](size_t i, int salt) { return int32_t(i * 2654435761u) ^ salt; };
  onThreads(2, [&](int r) {
    ncclComm_t c = comms[size_t(r)];
    for (int root : {0, 1}) {
      for (bool inPlace : {true, false}) {
        std::vector<int32_t> send(count), recv(count, -1);
        for (size_t i = 0; i < count; ++i) send[i] = r == root ? value(i, root) : -2;
        int32_t* out = inPlace ? send.data() : recv.data();
        ASSERT_EQ(ncclBroadcast(send.data(), out, count, ncclInt32, root, c, nullptr), ncclSuccess);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[i], value(i, root))
              << "root " << root << " in place " << inPlace << " " << i;
        }
      }
    }
    std::vector<int32_t> mine(count), theirs(count, -1);
    for (size_t i = 0; i < count; ++i) mine[i] = value(i, 10 + r);
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    ASSERT_EQ(ncclSend(mine.data(), count, ncclInt32, 1 - r, c, nullptr), ncclSuccess);
    ASSERT_EQ(ncclRecv(theirs.data(), count, ncclInt32, 1 - r, c, nullptr), ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(theirs[i], value(i, 11 - r)) << i;
    std::vector<int32_t> sum(count);
    ASSERT_EQ(ncclAllReduce(mine.data(), sum.data(), count, ncclInt32, ncclSum, c, nullptr),
              ncclSuccess);
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(sum[i], int32_t(uint32_t(value(i, 10)) + uint32_t(value(i, 11)))) << i;
    }
  });
  for (ncclComm_t c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
}
