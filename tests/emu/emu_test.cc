// The GPU data path's own code -- the planner (runtime/device_plan.cc), the device primitives
// of both protocols and the kernel (kernels/cuda) -- run on the CPU: every CUDA thread a
// std::thread (kernels/cuda/dev_emu.h), FIFOs in host memory laid out as the p2p transport
// lays them out, ranks as threads. The correctness matrix runs through it, so CI checks the
// kernels' step arithmetic, LL lines, slot sizes, channel shares, reductions and failure
// handling without a GPU. What it cannot check: the GPU's memory model, warp execution,
// the CUDA calls of runtime/device_engine.cc and transports/p2p (tests/gpu does, on a GPU).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/matrix.h"
#include "emu/emu_launch.h"
#include "harness/harness.h"
#include "kernels/cuda/dev_work.h"
#include "runtime/device_plan.h"
#include "runtime/dtype.h"
#include "transports/transport.h"

using namespace tutti;
using namespace tutti::test;

namespace {

constexpr size_t kSlotBytes = 1024;    // NCCL_BUFFSIZE 8192, as the other matrices
constexpr size_t kLlSlotBytes = 1024;  // 512 payload bytes per LL step
// TUTTI_EMU_* variables change the set-up by hand (to mimic a GPU run's configuration).
size_t envOr(const char* name, size_t v) {
  const char* s = getenv(name);
  return s && *s ? size_t(strtoull(s, nullptr, 10)) : v;
}
const unsigned kThreadsPerBlock = unsigned(envOr("TUTTI_EMU_THREADS", 2));

// One FIFO (sender -> receiver, one channel) in host memory: control block, Simple slots, LL
// slots, and the sender's own step word.
struct EmuFifo {
  char* mem = nullptr;
  uint64_t ownStep = 0;
  transport::FifoView send, recv;
  EmuFifo(int from, int to, int channel) {
    const size_t bytes = transport::deviceFifoBytes(kSlotBytes, kLlSlotBytes);
    mem = static_cast<char*>(aligned_alloc(64, bytes));
    memset(mem, 0, bytes);
    auto* ctrl = new (mem) transport::FifoCtrl();
    ctrl->tail.store(0);
    ctrl->head.store(0);
    ctrl->broken.store(0);
    for (transport::FifoView* v : {&send, &recv}) {
      transport::layDeviceFifo(mem, kSlotBytes, kLlSlotBytes, v);  // as p2p lays it out
      v->channel = channel;
    }
    send.peer = to;
    send.ownStep = &ownStep;
    recv.peer = from;
  }
  ~EmuFifo() { free(mem); }
  bool broken() const { return send.ctrl->broken.load() != 0; }
};

// Every FIFO of an n-rank communicator, and each rank's view of them.
struct EmuComm {
  int n;
  devplan::Config cfg;
  std::vector<std::unique_ptr<EmuFifo>> fifos;  // [(from * n + to) * kMaxChannels + channel]
  struct RankState {
    uint32_t abort = 0;
    uint32_t claim = 0;
    dev::DevError err{};
    uint64_t seq = 0;
  };
  std::vector<std::unique_ptr<RankState>> ranks;
  uint64_t timeoutNs = 60ull * 1000000000ull;
  std::atomic<int> mostP2pBlocks{0};    // the most blocks a launch of sends and receives took
  std::atomic<int> mostP2pLaunches{0};  // the most launches of sends and receives in one run

  explicit EmuComm(int n, int proto = -1) : n(n) {
    cfg.nranks = n;
    cfg.maxChannels = int(envOr("TUTTI_EMU_CHANNELS", 2));
    cfg.channelBytes = envOr("TUTTI_EMU_CHANNEL_BYTES", 2048);  // two channels from 2 KiB on
    cfg.llMaxBytes = envOr("TUTTI_EMU_LL_MAX_BYTES", 1024);     // LL up to 1 KiB per channel
    cfg.proto = proto;
    cfg.oneRankChunkBytes = 4096;
    for (int i = 0; i < n * n * dev::kMaxChannels; ++i) {
      const int c = i % dev::kMaxChannels, to = (i / dev::kMaxChannels) % n,
                from = i / dev::kMaxChannels / n;
      fifos.push_back(std::make_unique<EmuFifo>(from, to, c));
    }
    for (int r = 0; r < n; ++r) ranks.push_back(std::make_unique<RankState>());
  }
  EmuFifo& fifo(int from, int to, int c) {
    return *fifos[size_t((from * n + to) * dev::kMaxChannels + c)];
  }

  // Runs one group of operations on rank r to completion; "" or the error.
  std::string run(int r, const std::vector<CollArgs>& ops) {
    devplan::Config c = cfg;
    c.rank = r;
    RankState& st = *ranks[size_t(r)];
    auto link = [&](int peer, int ch, bool send) -> const transport::FifoView* {
      return send ? &fifo(r, peer, ch).send : &fifo(peer, r, ch).recv;
    };
    devplan::Plan plan;
    int p2pLaunches = 0;
    auto raise = [](std::atomic<int>& most, int v) {
      int m = most.load();
      while (v > m && !most.compare_exchange_weak(m, v)) {
      }
    };
    Status s = devplan::plan(
        c, ops.data(), ops.size(), link, [&] { return st.seq++; }, &plan);
    if (!s.ok()) return "plan: " + s.message();
    size_t next = 0;  // copies in plan order among the launches, as the engine runs them
    auto copiesBefore = [&](size_t i) {
      for (; next < plan.copies.size() && plan.copies[next].beforeLaunch <= i; ++next)
        memcpy(plan.copies[next].dst, plan.copies[next].src, plan.copies[next].bytes);
    };
    for (size_t i = 0; i < plan.launches.size(); ++i) {
      copiesBefore(i);
      devplan::Launch& l = plan.launches[i];
      l.work.abortFlag = &st.abort;
      l.work.err = &st.err;
      l.work.errClaim = &st.claim;
      l.work.timeoutNs = timeoutNs;
      if (l.work.nops > 0 &&
          (l.work.ops[0].kind == dev::kSend || l.work.ops[0].kind == dev::kRecv)) {
        ++p2pLaunches;
        raise(mostP2pBlocks, l.blocks);
      }
      if (l.more.empty()) {
        emuLaunch(l.dtype, l.fn, l.proto, unsigned(l.blocks), kThreadsPerBlock, &l.work);
      } else {
        // As DeviceEngine::launchAll passes it.
        emuLaunchP2pMany(unsigned(l.blocks), kThreadsPerBlock, devplan::p2pWork(l).get());
      }
    }
    copiesBefore(plan.launches.size());
    raise(mostP2pLaunches, p2pLaunches);
    const uint32_t code = __atomic_load_n(&st.err.code, __ATOMIC_ACQUIRE);
    if (code != dev::kErrNone) {
      return "kernel error " + std::to_string(code) + " waiting for rank " +
             std::to_string(st.err.peer) + " on channel " + std::to_string(st.err.channel);
    }
    return "";
  }
};

CollArgs args(CollKind kind, const void* send, void* recv, size_t count, int dtype, int root,
              const RedOpSpec& red = {}) {
  return CollArgs{kind, "emu", send, recv, count, dtype, 0, red, root, nullptr, true};
}

// The matrix case as the operations an NCCL call would queue, on rank r.
std::vector<CollArgs> opsFor(const Case& c, int r, int n, const void* send, void* recv,
                             const uint8_t* scalar) {
  RedOpSpec red;
  if (c.op == ncclAvg) {
    red = tutti::averageSpec(c.dtype, n);
  } else if (isPreMul(c.op)) {
    red.fn = 0;
    red.pre = true;
    memcpy(red.scalar, scalar, 8);
    if (c.op == kPreMulDevice) red.scalarPtr = scalar;
  } else {
    red.fn = c.op;
  }
  const size_t block = c.count * dtypeSize(c.dtype);
  auto at = [&](const void* base, int q) {
    return static_cast<char*>(const_cast<void*>(base)) + block * size_t(q);
  };
  std::vector<CollArgs> ops;
  switch (c.coll) {
    case TestColl::kAllReduce:
      ops.push_back(args(CollKind::kAllReduce, send, recv, c.count, c.dtype, 0, red));
      break;
    case TestColl::kAllGather:
      ops.push_back(args(CollKind::kAllGather, send, recv, c.count, c.dtype, 0));
      break;
    case TestColl::kReduceScatter:
      ops.push_back(args(CollKind::kReduceScatter, send, recv, c.count, c.dtype, 0, red));
      break;
    case TestColl::kBroadcast:
      ops.push_back(args(CollKind::kBroadcast, send, recv, c.count, c.dtype, c.root));
      break;
    case TestColl::kReduce:
      ops.push_back(args(CollKind::kReduce, send, recv, c.count, c.dtype, c.root, red));
      break;
    case TestColl::kSendRecv:
      ops.push_back(args(CollKind::kSend, send, nullptr, c.count, c.dtype, (r + 1) % n));
      ops.push_back(args(CollKind::kRecv, nullptr, recv, c.count, c.dtype, (r + n - 1) % n));
      break;
    case TestColl::kAlltoAll:
      for (int q = 0; q < n; ++q) {
        ops.push_back(args(CollKind::kSend, at(send, q), nullptr, c.count, c.dtype, q));
        ops.push_back(args(CollKind::kRecv, nullptr, at(recv, q), c.count, c.dtype, q));
      }
      break;
    case TestColl::kGather:
      ops.push_back(args(CollKind::kSend, send, nullptr, c.count, c.dtype, c.root));
      for (int q = 0; q < n && r == c.root; ++q)
        ops.push_back(args(CollKind::kRecv, nullptr, at(recv, q), c.count, c.dtype, q));
      break;
    case TestColl::kScatter:
      for (int q = 0; q < n && r == c.root; ++q)
        ops.push_back(args(CollKind::kSend, at(send, q), nullptr, c.count, c.dtype, q));
      ops.push_back(args(CollKind::kRecv, nullptr, recv, c.count, c.dtype, c.root));
      break;
  }
  return ops;
}

struct EmuSetup {
  int nranks;
  int proto;           // -1: by size (LL up to 1 KiB per channel)
  bool gather = true;  // small LL all-reduces by dev::kAlgoGather (false: the ring's)
};

void PrintTo(const EmuSetup& s, std::ostream* os) {
  *os << s.nranks << " ranks, protocol "
      << (s.proto < 0           ? "by size"
          : s.proto == dev::kLL ? "LL"
                                : "Simple")
      << (s.gather ? "" : ", no gather");
}

std::string emuName(const ::testing::TestParamInfo<EmuSetup>& info) {
  return std::to_string(info.param.nranks) + "ranks_" +
         (info.param.proto < 0           ? "auto"
          : info.param.proto == dev::kLL ? "LL"
                                         : "Simple") +
         (info.param.gather ? "" : "_ring");
}

class EmuMatrix : public ::testing::TestWithParam<EmuSetup> {};

TEST_P(EmuMatrix, DeviceKernelsOnTheCpuMatchTheOracle) {
  const EmuSetup s = GetParam();
  EmuComm comm(s.nranks, s.proto);
  if (!s.gather) comm.cfg.gatherMaxBytes = 0;
  const std::vector<Case> cases = matrixCases(s.nranks, kSlotBytes * transport::kSlots);
  std::mutex mu;
  std::vector<std::string> failures;
  onThreads(s.nranks, [&](int r) {
    size_t reported = 0;
    for (const Case& c : cases) {
      std::string bad =
          runCaseWith(r, s.nranks, c, [&](const void* send, void* recv, const uint8_t* scalar) {
            return comm.run(r, opsFor(c, r, s.nranks, send, recv, scalar));
          });
      if (!bad.empty() && reported++ < 10) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back(bad);
      }
    }
  });
  for (const std::string& f : failures) ADD_FAILURE() << f;
  RecordProperty("cases", int(cases.size()));
}

// Every communicator size of DESIGN.md; each protocol forced once beside the size rule.
INSTANTIATE_TEST_SUITE_P(Threads, EmuMatrix,
                         ::testing::Values(EmuSetup{1, -1}, EmuSetup{2, -1}, EmuSetup{2, dev::kLL},
                                           EmuSetup{3, dev::kSimple}, EmuSetup{4, -1},
                                           EmuSetup{4, dev::kLL, false}, EmuSetup{5, dev::kLL},
                                           EmuSetup{8, -1}),
                         emuName);

std::vector<float> filled(size_t n, float v) { return std::vector<float>(n, v); }

// Which all-reduces the planner gives to dev::kAlgoGather: LL ones of one channel that fit one
// LL step, on 2 to kSteps + 1 ranks (the received slots are all held until the reduction), up
// to gatherMaxBytes; never another collective.
TEST(EmuPlan, SmallLLAllReducesGatherOnTwoToNineRanks) {
  auto algoOf = [](int n, int proto, CollKind kind, size_t count, size_t gatherMax) {
    EmuComm comm(n, proto);
    comm.cfg.gatherMaxBytes = gatherMax;
    devplan::Config c = comm.cfg;
    std::vector<float> x(count * size_t(n) + 1);
    const CollArgs op = args(kind, x.data(), x.data(), count, ncclFloat, 0);
    auto link = [&](int peer, int ch, bool send) -> const transport::FifoView* {
      return send ? &comm.fifo(0, peer, ch).send : &comm.fifo(peer, 0, ch).recv;
    };
    devplan::Plan plan;
    uint64_t seq = 0;
    EXPECT_TRUE(devplan::plan(
                    c, &op, 1, link, [&] { return seq++; }, &plan)
                    .ok());
    return plan.launches.empty() ? -1 : plan.launches[0].work.ops[0].algo;
  };
  const size_t most = kLlSlotBytes / 2 / sizeof(float);  // one LL step of floats
  for (int n : {2, 4, 9}) {
    EXPECT_EQ(algoOf(n, -1, CollKind::kAllReduce, 2, 4096), dev::kAlgoGather) << n;
    EXPECT_EQ(algoOf(n, dev::kLL, CollKind::kAllReduce, most, 4096), dev::kAlgoGather) << n;
  }
  EXPECT_EQ(algoOf(10, dev::kLL, CollKind::kAllReduce, 2, 4096), dev::kAlgoRing);
  EXPECT_EQ(algoOf(4, dev::kLL, CollKind::kAllReduce, most + 1, 4096), dev::kAlgoRing);
  EXPECT_EQ(algoOf(4, dev::kSimple, CollKind::kAllReduce, 2, 4096), dev::kAlgoRing);
  EXPECT_EQ(algoOf(4, dev::kLL, CollKind::kAllReduce, 64, 255), dev::kAlgoRing);  // 256 bytes
  EXPECT_EQ(algoOf(4, dev::kLL, CollKind::kAllReduce, 64, 256), dev::kAlgoGather);
  EXPECT_EQ(algoOf(4, dev::kLL, CollKind::kReduceScatter, 2, 4096), dev::kAlgoRing);
  EXPECT_EQ(algoOf(4, dev::kLL, CollKind::kReduce, 2, 4096), dev::kAlgoRing);
}

// The gathered all-reduce reduces in rank order on every rank: on values whose sum rounds, each
// rank holds exactly the float sum of pre(x_0) + pre(x_1) + ... in that order (the ring's order
// differs from chunk to chunk, so a ring would miss it), PreMulSum's scalars applied by their
// own rank. Round after round, between Simple ring all-reduces and sends and receives to the
// ring's neighbours on the same FIFOs, so that the slots it holds and frees at once wrap round
// many times. 9 ranks: kSteps received slots held at once.
TEST(EmuReductions, AGatheredAllReduceSumsInRankOrderOnEveryRank) {
  for (int n : {3, 9}) {
    EmuComm comm(n);  // by size: gathered up to 512 bytes, the Simple ring past 1 KiB
    constexpr size_t kCount = 100;
    auto input = [](int q, size_t i, int round) {
      return 1.0f / float(3 + 7 * q + int(i % 13) + round);
    };
    auto scalar = [](int q) { return 1.0f + 0.1f * float(q); };
    std::mutex mu;
    std::vector<std::string> bad;
    onThreads(n, [&](int r) {
      for (int round = 0; round < 12; ++round) {
        std::string e;
        if (round % 3 == 0) {  // gathered: plain Sum, then PreMulSum with a scalar per rank
          const bool pre = round % 2 == 1;
          RedOpSpec red;
          if (pre) {
            red.pre = true;
            const float sc = scalar(r);
            memcpy(red.scalar, &sc, sizeof sc);
          }
          std::vector<float> x(kCount), y(kCount, -1.0f);
          for (size_t i = 0; i < kCount; ++i) x[i] = input(r, i, round);
          e = comm.run(r,
                       {args(CollKind::kAllReduce, x.data(), y.data(), kCount, ncclFloat, 0, red)});
          for (size_t i = 0; i < kCount && e.empty(); ++i) {
            float want = 0;
            for (int q = 0; q < n; ++q) {
              const float v = pre ? input(q, i, round) * scalar(q) : input(q, i, round);
              want = q == 0 ? v : want + v;
            }
            if (memcmp(&y[i], &want, sizeof want) != 0) {
              char msg[128];
              snprintf(msg, sizeof msg, "element %zu = %.9g, the rank-order sum is %.9g", i,
                       double(y[i]), double(want));
              e = msg;
            }
          }
        } else if (round % 3 == 1) {  // the ring, Simple: 16 KiB
          std::vector<float> x(4096, float(r + 1));
          e = comm.run(r, {args(CollKind::kAllReduce, x.data(), x.data(), x.size(), ncclFloat, 0)});
          for (size_t i = 0; i < x.size() && e.empty(); ++i)
            if (x[i] != float(n * (n + 1) / 2)) e = "ring element " + std::to_string(i);
        } else {  // to the next rank, from the previous: channel 0's ring FIFOs
          std::vector<float> in(kCount, float(r)), out(kCount, -1.0f);
          e = comm.run(
              r, {args(CollKind::kSend, in.data(), nullptr, kCount, ncclFloat, (r + 1) % n),
                  args(CollKind::kRecv, nullptr, out.data(), kCount, ncclFloat, (r + n - 1) % n)});
          for (size_t i = 0; i < kCount && e.empty(); ++i)
            if (out[i] != float((r + n - 1) % n)) e = "received element " + std::to_string(i);
        }
        if (!e.empty()) {
          std::lock_guard<std::mutex> lock(mu);
          bad.push_back("rank " + std::to_string(r) + " round " + std::to_string(round) + ": " + e);
          // The others would wait for this rank until the deadline: stop them now.
          for (auto& st : comm.ranks) __atomic_store_n(&st->abort, 1u, __ATOMIC_RELEASE);
          return;
        }
      }
    });
    for (const std::string& b : bad) ADD_FAILURE() << n << " ranks: " << b;
  }
}

// A group's sends and receives past one kernel's kMaxOps go to p2pManyKernel, up to
// kMaxP2pOps; more is refused by the planner, naming the limit. 2 ranks: rank 0 sends 36
// messages of different sizes to rank 1 and receives 26 (their order kept per direction).
TEST(EmuSteps, ManySendsAndReceivesInOneGroup) {
  EmuComm comm(2);
  constexpr int kSends = 36, kRecvs = 26;
  auto count = [](int m) { return size_t(1 + 37 * m); };  // one LL-free Simple step or several
  std::vector<std::vector<float>> out0(kRecvs), in1(kSends), out1(kSends), in0(kSends);
  std::string e0, e1;
  std::thread t([&] {
    std::vector<CollArgs> ops;
    for (int m = 0; m < kSends; ++m) {
      in0[size_t(m)].assign(count(m), float(m));
      ops.push_back(args(CollKind::kSend, in0[size_t(m)].data(), nullptr, count(m), ncclFloat, 1));
    }
    for (int m = 0; m < kRecvs; ++m) {
      out0[size_t(m)].assign(count(m), -1.0f);
      ops.push_back(args(CollKind::kRecv, nullptr, out0[size_t(m)].data(), count(m), ncclFloat, 1));
    }
    e0 = comm.run(0, ops);
  });
  std::vector<CollArgs> ops;
  for (int m = 0; m < kRecvs; ++m) {  // sends of its own first: another order than rank 0's
    in1[size_t(m)].assign(count(m), float(100 + m));
    ops.push_back(args(CollKind::kSend, in1[size_t(m)].data(), nullptr, count(m), ncclFloat, 0));
  }
  for (int m = 0; m < kSends; ++m) {
    out1[size_t(m)].assign(count(m), -1.0f);
    ops.push_back(args(CollKind::kRecv, nullptr, out1[size_t(m)].data(), count(m), ncclFloat, 0));
  }
  e1 = comm.run(1, ops);
  t.join();
  ASSERT_EQ(e0, "");
  ASSERT_EQ(e1, "");
  for (int m = 0; m < kSends; ++m)
    EXPECT_EQ(out1[size_t(m)], std::vector<float>(count(m), float(m))) << "message " << m;
  for (int m = 0; m < kRecvs; ++m)
    EXPECT_EQ(out0[size_t(m)], std::vector<float>(count(m), float(100 + m))) << "message " << m;

  // 65 to other ranks: refused before any kernel runs.
  std::vector<float> x(4);
  std::vector<CollArgs> tooMany(65, args(CollKind::kSend, x.data(), nullptr, 4, ncclFloat, 1));
  EXPECT_NE(comm.run(0, tooMany).find("at most 64 are supported yet"), std::string::npos);
}

// An all-to-all of 12 ranks, as ncclAlltoAll queues it: 22 sends and receives to other ranks
// on each (past one kernel's kMaxOps), and a copy of its own block.
TEST(EmuSteps, AnAllToAllOfTwelveRanks) {
  constexpr int n = 12;
  constexpr size_t kCount = 300;  // floats per block
  EmuComm comm(n);
  std::mutex mu;
  std::vector<std::string> bad;
  onThreads(n, [&](int r) {
    std::vector<float> in(kCount * n), out(kCount * n, -1.0f);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < kCount; ++i)
        in[size_t(q) * kCount + i] = float(1000 * r + 10 * q) + float(i % 7);
    std::vector<CollArgs> ops;
    for (int q = 0; q < n; ++q) {
      ops.push_back(
          args(CollKind::kSend, in.data() + size_t(q) * kCount, nullptr, kCount, ncclFloat, q));
      ops.push_back(
          args(CollKind::kRecv, nullptr, out.data() + size_t(q) * kCount, kCount, ncclFloat, q));
    }
    std::string e = comm.run(r, ops);
    for (int q = 0; q < n && e.empty(); ++q)
      for (size_t i = 0; i < kCount && e.empty(); ++i)
        if (out[size_t(q) * kCount + i] != float(1000 * q + 10 * r) + float(i % 7))
          e = "block " + std::to_string(q) + " element " + std::to_string(i);
    if (!e.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      bad.push_back("rank " + std::to_string(r) + ": " + e);
      for (auto& st : comm.ranks) __atomic_store_n(&st->abort, 1u, __ATOMIC_RELEASE);
    }
  });
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

// Every rank of comm sends `per` messages to every rank (itself included) and receives `per`
// from each, all in an order of its own (shuffled per rank from seed, each pair's messages in
// turn; seed 0: every send, then every receive), the later messages on each pair past the
// FIFO's 8 slots (they must wait for their receiver). Returns what went wrong on each rank.
std::vector<std::string> exchangeEveryWay(EmuComm& comm, int per, unsigned seed) {
  const int n = comm.n;
  auto count = [](int from, int to, int m) {  // floats; 256 per 1 KiB slot
    return m == 0 ? size_t(1 + 97 * ((from * 5 + to) % 7))
                  : size_t(2600 + 700 * ((from + 2 * to + m) % 5));
  };
  auto value = [](int from, int to, int m, size_t i) {
    return float(10000 * from + 100 * to + 10 * m) + float(i % 9);
  };
  std::mutex mu;
  std::vector<std::string> bad;
  onThreads(n, [&](int r) {
    // [peer * per + m]: this rank's m-th message to / from peer.
    std::vector<std::vector<float>> in(size_t(n * per)), out(size_t(n * per));
    for (int q = 0; q < n; ++q) {
      for (int m = 0; m < per; ++m) {
        std::vector<float>& i = in[size_t(q * per + m)];
        i.resize(count(r, q, m));
        for (size_t k = 0; k < i.size(); ++k) i[k] = value(r, q, m, k);
        out[size_t(q * per + m)].assign(count(q, r, m), -1.0f);
      }
    }
    // Every (peer, direction) `per` times, shuffled: its k-th turn takes message k.
    std::vector<int> turns;
    for (int t = 0; t < 2 * n; t += 2) turns.insert(turns.end(), size_t(per), t);
    for (int t = 1; t < 2 * n; t += 2) turns.insert(turns.end(), size_t(per), t);
    if (seed != 0) std::shuffle(turns.begin(), turns.end(), std::mt19937(seed + 13 * unsigned(r)));
    std::vector<int> taken(size_t(2 * n), 0);
    std::vector<CollArgs> ops;
    for (int t : turns) {
      const int q = t / 2, m = taken[size_t(t)]++;
      if (t % 2 == 0) {
        std::vector<float>& i = in[size_t(q * per + m)];
        ops.push_back(args(CollKind::kSend, i.data(), nullptr, i.size(), ncclFloat, q));
      } else {
        std::vector<float>& o = out[size_t(q * per + m)];
        ops.push_back(args(CollKind::kRecv, nullptr, o.data(), o.size(), ncclFloat, q));
      }
    }
    std::string e = comm.run(r, ops);
    for (int q = 0; q < n && e.empty(); ++q)
      for (int m = 0; m < per && e.empty(); ++m)
        for (size_t k = 0; k < count(q, r, m) && e.empty(); ++k)
          if (out[size_t(q * per + m)][k] != value(q, r, m, k))
            e = "message " + std::to_string(m) + " from rank " + std::to_string(q) + ", element " +
                std::to_string(k);
    if (!e.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      bad.push_back("rank " + std::to_string(r) + ": " + e);
      for (auto& st : comm.ranks) __atomic_store_n(&st->abort, 1u, __ATOMIC_RELEASE);
    }
  });
  return bad;
}

// Ranks sharing a GPU may each have only so many blocks resident (DeviceEngine::findP2pBlockCap):
// past that, a block runs several (peer, direction) pairs in turn, each block only sending or
// only receiving, its pairs in the order of their distance round the ranks. 9 ranks exchanging
// 2 messages every way, with at most 2, 3 and 5 blocks a rank (1 takes 2: a block for each
// direction) and with no cap. A block that both sent and received, or took its pairs in each
// rank's call order, deadlocks here (tried: the kernels then give up at the deadline).
TEST(EmuSteps, SendsAndReceivesFoldedIntoFewBlocksComplete) {
  constexpr int n = 9;
  for (int cap : {1, 2, 3, 5, 0}) {
    EmuComm comm(n);
    comm.cfg.maxP2pBlocks = cap;
    comm.timeoutNs = 20ull * 1000000000ull;
    for (const std::string& b : exchangeEveryWay(comm, 2, 77 + unsigned(cap)))
      ADD_FAILURE() << "cap " << cap << ": " << b;
    // 16 pairs a rank: within the cap where there is one (at least 2), else a block each.
    EXPECT_EQ(comm.mostP2pBlocks.load(), cap > 0 ? std::max(cap, 2) : 2 * (n - 1)) << "cap " << cap;
    EXPECT_EQ(comm.mostP2pLaunches.load(), 1) << "cap " << cap;
  }
}

// Past dev::kMaxP2pOps sends and receives, a group runs in several launches of whole rounds
// (the peers at one distance), in the order of the rounds: 40 ranks exchanging 2 messages
// every way (every send first, then in shuffled orders), 156 operations with other ranks each,
// 4 per round: 3 launches of up to 16 rounds, at most 4 blocks each. A launch that split a
// round (its sends in one launch, its receives in the next) deadlocks here (tried). A round of more
// than kMaxP2pOps is refused, naming its peers; a 2-rank group is one round.
TEST(EmuSteps, ManySendsAndReceivesRunInLaunchesOfWholeRounds) {
  constexpr int n = 40;
  EmuComm comm(n);
  comm.cfg.maxP2pBlocks = 4;
  comm.timeoutNs = 20ull * 1000000000ull;
  for (unsigned seed : {0u, 5u}) {
    for (const std::string& b : exchangeEveryWay(comm, 2, seed))
      ADD_FAILURE() << (seed ? "shuffled: " : "sends first: ") << b;
  }
  EXPECT_EQ(comm.mostP2pLaunches.load(), 3);
  EXPECT_EQ(comm.mostP2pBlocks.load(), 4);

  EmuComm two(2);
  std::vector<float> x(4), y(4);
  std::vector<CollArgs> round(40, args(CollKind::kSend, x.data(), nullptr, 4, ncclFloat, 1));
  round.insert(round.end(), 25, args(CollKind::kRecv, nullptr, y.data(), 4, ncclFloat, 1));
  const std::string e = two.run(0, round);
  EXPECT_NE(e.find("40 sends to rank 1 and 25 receives from rank 1 in one group on GPU buffers "
                   "(the peers 1 apart round the ranks, whose operations run together): at "
                   "most 64 are supported yet"),
            std::string::npos)
      << e;
}

// A receiver that expects another message than the sender sends fails with the sizes, on
// the first differing step and on a missing last step, instead of taking the wrong bytes.
TEST(EmuFailures, SendRecvSizeMismatchIsCaught) {
  for (auto [sendCount, recvCount] : {std::pair<size_t, size_t>{100, 200},       // one step each
                                      std::pair<size_t, size_t>{1536, 1024}}) {  // 6 vs 4 slots
    EmuComm comm(2);
    std::vector<float> a = filled(sendCount, 1), b = filled(recvCount, 0);
    std::string e0, e1;
    std::thread t([&] {
      e0 = comm.run(0, {args(CollKind::kSend, a.data(), nullptr, sendCount, ncclFloat, 1)});
    });
    e1 = comm.run(1, {args(CollKind::kRecv, nullptr, b.data(), recvCount, ncclFloat, 0)});
    comm.ranks[0]->abort = 1;  // the sender may still wait for room the receiver never frees
    t.join();
    EXPECT_NE(e1.find("kernel error 3"), std::string::npos)
        << sendCount << " vs " << recvCount << ": " << e1;
    EXPECT_EQ(comm.ranks[1]->err.peer, 0);
    EXPECT_TRUE(comm.fifo(0, 1, 0).broken()) << "the receiver marks the link broken";
  }
}

// A rank waiting for a peer that never comes: the abort word ends it (code 1), the FIFOs it
// used are marked broken, and a rank waiting on a broken FIFO gives up too (code 4).
TEST(EmuFailures, AbortEndsTheWaitAndBreaksTheLinks) {
  EmuComm comm(2);
  std::vector<float> a = filled(4096, 1);
  std::string e0;
  std::thread t([&] {
    e0 = comm.run(0, {args(CollKind::kAllReduce, a.data(), a.data(), a.size(), ncclFloat, 0)});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  __atomic_store_n(&comm.ranks[0]->abort, 1u, __ATOMIC_RELEASE);
  t.join();
  EXPECT_NE(e0.find("kernel error 1"), std::string::npos) << e0;
  EXPECT_TRUE(comm.fifo(0, 1, 0).broken() || comm.fifo(1, 0, 0).broken());

  // Rank 1 comes late: its first wait sees the broken link instead of waiting for ever.
  std::vector<float> b = filled(4096, 1);
  const std::string e1 =
      comm.run(1, {args(CollKind::kAllReduce, b.data(), b.data(), b.size(), ncclFloat, 0)});
  EXPECT_NE(e1.find("kernel error 4"), std::string::npos) << e1;
}

// No progress for the deadline: the wait gives up with code 2 and names the peer.
TEST(EmuFailures, ALonelyRankTimesOutNamingItsPeer) {
  EmuComm comm(3);
  comm.timeoutNs = 200 * 1000000ull;
  std::vector<float> a = filled(64, 1);
  const auto start = std::chrono::steady_clock::now();
  const std::string e =
      comm.run(1, {args(CollKind::kAllReduce, a.data(), a.data(), a.size(), ncclFloat, 0)});
  EXPECT_NE(e.find("kernel error 2"), std::string::npos) << e;
  EXPECT_EQ(comm.ranks[1]->err.peer, 0) << "rank 1 receives from rank 0 first";
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

// Max and Min drop a NaN unless every rank holds one there (fmax / fmin, as NCCL): whichever
// rank holds it, so wherever that rank sits in a chunk's chain. 4 ranks, 16 floats: a chunk of
// 4 per rank, each chunk's chain starting on another rank. NaN in every element on rank q, and
// in element 0 on every rank.
TEST(EmuReductions, MaxAndMinDropANaNWhereverItsRankSits) {
  constexpr int n = 4;
  constexpr size_t kCount = 16;
  const float nan = std::nanf("");
  for (int fn : {int(ncclMax), int(ncclMin)}) {
    for (int q = 0; q < n; ++q) {
      EmuComm comm(n);
      std::mutex mu;
      std::vector<std::string> bad;
      onThreads(n, [&](int r) {
        std::vector<float> x = filled(kCount, float(r + 1));
        if (r == q) x = filled(kCount, nan);
        x[0] = nan;
        RedOpSpec red;
        red.fn = fn;
        std::string e = comm.run(
            r, {args(CollKind::kAllReduce, x.data(), x.data(), kCount, ncclFloat, 0, red)});
        float want = 0;  // of the ranks other than q: 1..4 without q + 1
        for (int p = 0; p < n; ++p) {
          if (p == q) continue;
          const float v = float(p + 1);
          want = want == 0 ? v : fn == ncclMax ? std::max(want, v) : std::min(want, v);
        }
        if (e.empty() && !std::isnan(x[0])) e = "element 0 = " + std::to_string(x[0]) + ", not NaN";
        for (size_t i = 1; i < kCount && e.empty(); ++i) {
          if (!(x[i] == want)) {
            e = "element " + std::to_string(i) + " = " + std::to_string(x[i]) + ", expected " +
                std::to_string(want);
          }
        }
        if (!e.empty()) {
          std::lock_guard<std::mutex> lock(mu);
          bad.push_back((fn == ncclMax ? "max" : "min") + std::string(", NaN on rank ") +
                        std::to_string(q) + ", rank " + std::to_string(r) + ": " + e);
        }
      });
      for (const std::string& b : bad) ADD_FAILURE() << b;
    }
  }
}

// ncclAvg on fp16 as NCCL computes it: 8 ranks of 16384 average to 16384, where summing first
// overflowed (4 x 16384 is past fp16's 65504) and gave inf.
TEST(EmuReductions, AnFp16AverageDoesNotOverflowOnTheWay) {
  constexpr int n = 8;
  constexpr size_t kCount = 1000;  // LL and Simple steps, two channels
  EmuComm comm(n);
  std::mutex mu;
  std::vector<std::string> bad;
  onThreads(n, [&](int r) {
    std::vector<uint16_t> x(kCount, 0x7400);  // 16384
    std::string e = comm.run(r, {args(CollKind::kAllReduce, x.data(), x.data(), kCount, ncclFloat16,
                                      0, averageSpec(ncclFloat16, n))});
    for (size_t i = 0; i < kCount && e.empty(); ++i) {
      if (x[i] != 0x7400) e = "element " + std::to_string(i) + " = 0x" + std::to_string(x[i]);
    }
    if (!e.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      bad.push_back("rank " + std::to_string(r) + ": " + e);
    }
  });
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

// Operations after operations: each kernel finds its FIFO position in the counters, across
// launches, protocols and send/recv on the ring's own FIFO.
TEST(EmuSteps, MixedSequencesKeepBothEndsInStep) {
  EmuComm comm(3);
  std::mutex mu;
  std::vector<std::string> bad;
  onThreads(3, [&](int r) {
    for (int round = 0; round < 6; ++round) {
      const size_t count = size_t(1) << (2 * round + 1);  // 2 .. 2048 floats: LL and Simple
      std::vector<float> x = filled(count, float(r + 1));
      std::string e =
          comm.run(r, {args(CollKind::kAllReduce, x.data(), x.data(), count, ncclFloat, 0)});
      for (size_t i = 0; i < count && e.empty(); ++i)
        if (x[i] != 6.0f)
          e = "allreduce element " + std::to_string(i) + " = " + std::to_string(x[i]);
      std::vector<float> in = filled(count, float(r)), out = filled(count, -1);
      if (e.empty()) {
        e = comm.run(r,
                     {args(CollKind::kSend, in.data(), nullptr, count, ncclFloat, (r + 1) % 3),
                      args(CollKind::kRecv, nullptr, out.data(), count, ncclFloat, (r + 2) % 3)});
      }
      for (size_t i = 0; i < count && e.empty(); ++i)
        if (out[i] != float((r + 2) % 3)) e = "recv element " + std::to_string(i);
      if (!e.empty()) {
        std::lock_guard<std::mutex> lock(mu);
        bad.push_back("rank " + std::to_string(r) + " round " + std::to_string(round) + ": " + e);
        return;
      }
    }
  });
  for (const std::string& b : bad) ADD_FAILURE() << b;
}

// One rank: collectives become copies, except PreMulSum (a kernel); a group's copies and
// kernels still run in the order they were called. b = a; b *= 2 (in place); c = b: c is 2a.
TEST(EmuSteps, OneRankCopiesKeepTheirPlaceAmongKernels) {
  EmuComm comm(1);
  const size_t count = 1000;
  std::vector<float> a(count), b(count, -1), c(count, -1);
  for (size_t i = 0; i < count; ++i) a[i] = float(i);
  RedOpSpec twice;
  twice.pre = true;
  const float two = 2.0f;
  memcpy(twice.scalar, &two, sizeof(two));
  const std::string e =
      comm.run(0, {args(CollKind::kAllReduce, a.data(), b.data(), count, ncclFloat, 0),
                   args(CollKind::kAllReduce, b.data(), b.data(), count, ncclFloat, 0, twice),
                   args(CollKind::kAllGather, b.data(), c.data(), count, ncclFloat, 0)});
  ASSERT_EQ(e, "");
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(b[i], 2.0f * a[i]) << i;
    ASSERT_EQ(c[i], 2.0f * a[i]) << "element " << i << ": the copy ran before the kernel";
  }
}

}  // namespace
