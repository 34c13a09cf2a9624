// The GPU data path's own code -- the planner (runtime/device_plan.cc), the device primitives
// of both protocols and the kernel (kernels/cuda) -- run on the CPU: every CUDA thread a
// std::thread (kernels/cuda/dev_emu.h), FIFOs in host memory laid out as the p2p transport
// lays them out, ranks as threads. The correctness matrix runs through it, so CI checks the
// kernels' step arithmetic, LL lines, slot sizes, channel shares, reductions and failure
// handling without a GPU. What it cannot check: the GPU's memory model, warp execution,
// the CUDA calls of runtime/device_engine.cc and transports/p2p (tests/gpu does, on a GPU).
// The harness is emu_comm.h; sends and receives, and failures, are in emu_p2p_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/matrix.h"
#include "emu/emu_comm.h"
#include "harness/harness.h"
#include "runtime/dtype.h"

using namespace tutti;
using namespace tutti::test;

namespace {

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

// An LL launch takes a thread per line of its largest step, in whole warps, 64 at least (the
// slot-freeing thread in another warp than thread 0), dev::kThreads at most; Simple launches,
// and LL ones with llFitThreads off (TUTTI_LL_FULL_BLOCKS=1), take dev::kThreads.
TEST(EmuPlan, LLLaunchesTakeTheThreadsTheirStepsNeed) {
  EXPECT_EQ(devplan::llThreadsFor(0), 64);
  EXPECT_EQ(devplan::llThreadsFor(8), 64);
  EXPECT_EQ(devplan::llThreadsFor(64 * 8), 64);
  EXPECT_EQ(devplan::llThreadsFor(64 * 8 + 1), 96);
  EXPECT_EQ(devplan::llThreadsFor(4096), 512);
  EXPECT_EQ(devplan::llThreadsFor(size_t(1) << 30), dev::kThreads);
  // Planned only (no kernel runs): LL slots of the library's default size (16 KiB of lines,
  // 8 KiB of payload), LL up to 64 KiB, gathered up to 4 KiB, one channel.
  constexpr size_t kSlot = 16 << 10;
  auto threadsOf = [](int proto, CollKind kind, size_t count, bool fit) {
    constexpr int n = 4;
    EmuComm comm(n, proto);
    devplan::Config c = comm.cfg;
    c.llFitThreads = fit;
    c.llMaxBytes = 64 << 10;
    c.gatherMaxBytes = 4 << 10;
    c.maxChannels = 1;
    std::vector<float> x(count * size_t(n) + 1);
    const CollArgs op = args(kind, x.data(), x.data(), count, ncclFloat, 0);
    transport::FifoView send = comm.fifo(0, 1, 0).send, recv = comm.fifo(n - 1, 0, 0).recv;
    send.llSlotBytes = recv.llSlotBytes = kSlot;
    auto link = [&](int, int, bool isSend) -> const transport::FifoView* {
      return isSend ? &send : &recv;
    };
    devplan::Plan plan;
    uint64_t seq = 0;
    EXPECT_TRUE(devplan::plan(
                    c, &op, 1, link, [&] { return seq++; }, &plan)
                    .ok());
    return plan.launches.empty() ? -1 : plan.launches[0].threads;
  };
  EXPECT_EQ(threadsOf(dev::kLL, CollKind::kAllReduce, 2, true), 64);      // gathered, 8 bytes
  EXPECT_EQ(threadsOf(dev::kLL, CollKind::kAllReduce, 256, true), 128);   // gathered, 1 KiB
  EXPECT_EQ(threadsOf(dev::kLL, CollKind::kAllReduce, 1024, true), 512);  // gathered, 4 KiB
  EXPECT_EQ(threadsOf(dev::kLL, CollKind::kAllReduce, 2, false), dev::kThreads);
  EXPECT_EQ(threadsOf(dev::kSimple, CollKind::kAllReduce, 2, true), dev::kThreads);
  // By the ring: steps of at most one slot's payload (8 KiB, 1024 lines), or of the channel's
  // share where that is less.
  EXPECT_EQ(threadsOf(dev::kLL, CollKind::kBroadcast, 8192, true), dev::kThreads);  // 32 KiB
  EXPECT_EQ(threadsOf(dev::kLL, CollKind::kBroadcast, 64, true), 64);               // 256 B
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
