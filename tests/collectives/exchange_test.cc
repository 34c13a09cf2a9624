// Two-rank all-reduces over shm by exchange or by the ring, as the machine's state says
// (Engine::exchangeNow, cpu::exchangeAllReduce). Ranks are threads of this process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "collectives/mismatched.h"
#include "harness/harness.h"
#include "runtime/comm.h"
#include "runtime/dtype.h"
#include "runtime/links.h"

using namespace tutti::test;

// Two ranks over shm, all-reduces from TUTTI_EXCHANGE_MIN_BYTES: by exchange (each rank sends
// its whole input by address in 2 MiB chunks, and reduces the other's in its output) while
// rank 0's copies into the ring's slots run slow and both calls are out of place, by the ring
// otherwise; rank 0 says which with a marker, rank 1 answers with one. Slots of 64 KiB: a
// rank's sends per call show the way (its marker, then one step per 2 MiB chunk for the
// exchange; the ring's steps come in pairs of smaller chunks).
namespace {

struct ExchangeCase {
  ncclDataType_t dtype;
  ncclRedOp_t op;
  size_t count;
};

// Each rank's input: values whose sums and products round (so that the order of the operands
// could show), small enough that products do not overflow to infinity.
double exchangeInput(size_t i, int r) {
  return double((i * 2654435761u + size_t(r) * 40503u) % 1000) / 37.0 - 13.0;
}

template <typename T>
void fillInput(std::vector<unsigned char>& buf, size_t count, int r) {
  T* p = reinterpret_cast<T*>(buf.data());
  for (size_t i = 0; i < count; ++i) {
    const double v = exchangeInput(i, r);
    if constexpr (std::is_integral_v<T>) {
      p[i] = T(int64_t(v * 1000));
    } else {
      p[i] = T(v);
    }
  }
}

void fill(std::vector<unsigned char>& buf, const ExchangeCase& c, int r) {
  switch (c.dtype) {
    case ncclFloat32:
      return fillInput<float>(buf, c.count, r);
    case ncclFloat64:
      return fillInput<double>(buf, c.count, r);
    case ncclInt32:
      return fillInput<int32_t>(buf, c.count, r);
    case ncclInt64:
      return fillInput<int64_t>(buf, c.count, r);
    default:
      FAIL() << "no input for dtype " << c.dtype;
  }
}

// What each element must be: op(rank 0's, rank 1's) in the element type.
template <typename T>
T expected(size_t i, ncclRedOp_t op) {
  const double x = exchangeInput(i, 0), y = exchangeInput(i, 1);
  T u, v;
  if constexpr (std::is_integral_v<T>) {
    u = T(int64_t(x * 1000)), v = T(int64_t(y * 1000));
  } else {
    u = T(x), v = T(y);
  }
  switch (op) {
    case ncclSum:
      return T(u + v);
    case ncclProd:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return T(U(u) * U(v));
      } else {
        return T(u * v);
      }
    case ncclMax:
      return std::max(u, v);
    case ncclMin:
      return std::min(u, v);
    case ncclAvg:
      return T((u + v) / T(2));
    default:
      return T(0);
  }
}

// The first element (index) where out differs from the expected values, or -1.
template <typename T>
int64_t firstWrong(const unsigned char* out, const ExchangeCase& c) {
  const T* p = reinterpret_cast<const T*>(out);
  for (size_t i = 0; i < c.count; ++i) {
    const T want = expected<T>(i, c.op);
    if (memcmp(&p[i], &want, sizeof(T)) != 0) return int64_t(i);
  }
  return -1;
}

int64_t firstWrong(const unsigned char* out, const ExchangeCase& c) {
  switch (c.dtype) {
    case ncclFloat32:
      return firstWrong<float>(out, c);
    case ncclFloat64:
      return firstWrong<double>(out, c);
    case ncclInt32:
      return firstWrong<int32_t>(out, c);
    case ncclInt64:
      return firstWrong<int64_t>(out, c);
    default:
      return 0;
  }
}

}  // namespace

TEST(StateAllReduce, ExchangeWhileSlotCopiesRunSlowTheRingOtherwise) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "0");
  ScopedEnv buff("NCCL_BUFFSIZE", "524288");  // 8 slots of 64 KiB
  ScopedEnv channels("NCCL_MAX_NCHANNELS", "1");
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  ScopedEnv mode("TUTTI_SHM_SINGLE_COPY", nullptr);
  ScopedEnv min("TUTTI_EXCHANGE_MIN_BYTES", "65536");
  ScopedEnv recheck("TUTTI_EXCHANGE_RECHECK", nullptr);  // 64
  constexpr size_t kChunk = 2 << 20;
  // 1. The exchange, forced: every type and op it takes, counts of one or more slots and a
  // partial one, and one of two 2 MiB chunks and a 28-byte tail (under the 4 KiB single-copy
  // minimum between threads: through a slot). Both ranks hold exactly op(rank 0's,
  // rank 1's): the same bits. Each rank sends a marker (rank 0 its choice, rank 1 its answer),
  // then one step per 2 MiB chunk. Where either call is in place: the ring, as exact.
  {
    ScopedEnv forced("TUTTI_EXCHANGE", "1");
    const std::vector<ExchangeCase> cases = {
        {ncclFloat32, ncclSum, 5 * 16384 + 7}, {ncclFloat64, ncclProd, 3 * 8192 + 1},
        {ncclInt32, ncclMax, 2 * 16384},       {ncclInt64, ncclMin, 8192 + 100},
        {ncclInt32, ncclAvg, 16384 + 9},       {ncclInt32, ncclSum, 40000},
        {ncclFloat32, ncclSum, (1 << 20) + 7}, {ncclFloat64, ncclAvg, 8192 + 3},
        {ncclFloat32, ncclAvg, 16384 + 9},  // each rank halves both inputs: exact, the same bits
    };
    std::vector<ncclComm_t> comms = initThreads(2);
    onThreads(2, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      tutti::Links& links = reinterpret_cast<tutti::Comm*>(c)->links();
      for (const ExchangeCase& k : cases) {
        // 0: both out of place; 1: rank 0 in place; 2: rank 1 in place.
        for (int mode : {0, 1, 2}) {
          const bool inPlace = mode == r + 1;
          const size_t bytes = k.count * tutti::dtypeSize(k.dtype);
          std::vector<unsigned char> in(bytes), out(bytes, 0xee);
          fill(in, k, r);
          unsigned char* to = inPlace ? in.data() : out.data();
          const tutti::transport::FifoView* f = links.send(1 - r, 0);
          const uint64_t before = f ? f->step : 0;
          ASSERT_EQ(ncclAllReduce(in.data(), to, k.count, k.dtype, k.op, c, nullptr), ncclSuccess)
              << ncclGetLastError(c);
          f = links.send(1 - r, 0);
          ASSERT_NE(f, nullptr);
          const uint64_t exchange = 1 + (bytes + kChunk - 1) / kChunk;
          if (mode == 0) {
            EXPECT_EQ(f->step - before, exchange) << "rank " << r << " dtype " << k.dtype;
          } else {
            EXPECT_GT(f->step - before, exchange) << "rank " << r << " mode " << mode;
          }
          EXPECT_EQ(firstWrong(to, k), -1)
              << "rank " << r << " dtype " << k.dtype << " op " << k.op << " mode " << mode;
        }
      }
    });
    destroyAll(comms);
  }
  // Two channels: each exchanges its share over its own link. 1 Mi + 7 floats: shares of
  // 524352 floats (a 2 MiB chunk and a 256-byte tail, under 4 KiB: through a slot) and 524231
  // (one chunk); the marker and the answer go on channel 0 only.
  {
    ScopedEnv forced("TUTTI_EXCHANGE", "1");
    ScopedEnv two("NCCL_MIN_NCHANNELS", "2");
    const ExchangeCase k{ncclFloat32, ncclSum, (1 << 20) + 7};
    std::vector<ncclComm_t> comms = initThreads(2);
    onThreads(2, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      std::vector<unsigned char> in(k.count * 4), out(k.count * 4, 0xee);
      fill(in, k, r);
      ASSERT_EQ(ncclAllReduce(in.data(), out.data(), k.count, k.dtype, k.op, c, nullptr),
                ncclSuccess)
          << ncclGetLastError(c);
      EXPECT_EQ(firstWrong(out.data(), k), -1) << "rank " << r;
      tutti::Links& links = reinterpret_cast<tutti::Comm*>(c)->links();
      ASSERT_NE(links.send(1 - r, 1), nullptr);
      EXPECT_EQ(links.send(1 - r, 0)->step, 3u) << "rank " << r;
      EXPECT_EQ(links.send(1 - r, 1)->step, 1u) << "rank " << r;
    });
    destroyAll(comms);
  }
  // 2. By state. With the threshold at 10^6 GB/s every copy is slow: the ring until rank 0's
  // verdict (8 timed copies), then 64 exchanges (TUTTI_EXCHANGE_RECHECK), then the ring again
  // (the verdict forgotten, the copies timed anew). At 0 never slow: the ring throughout.
  // 256 KiB calls: the exchange takes a marker and 1 step, the ring a marker and 8.
  const int ops = 200;
  for (const char* slowGBps : {"1000000", "0"}) {
    SCOPED_TRACE(std::string("TUTTI_SHM_SLOW_GBPS=") + slowGBps);
    ScopedEnv slow("TUTTI_SHM_SLOW_GBPS", slowGBps);
    std::vector<ncclComm_t> comms = initThreads(2);
    const ExchangeCase k{ncclFloat32, ncclSum, 4 * 16384};
    std::vector<uint64_t> steps(ops), mixedSteps(3);
    onThreads(2, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      std::vector<unsigned char> in(k.count * 4), out(k.count * 4);
      fill(in, k, r);
      const tutti::transport::FifoView* f = nullptr;
      for (int op = 0; op < ops; ++op) {
        const uint64_t before = f ? f->step : 0;
        ASSERT_EQ(ncclAllReduce(in.data(), out.data(), k.count, k.dtype, k.op, c, nullptr),
                  ncclSuccess)
            << ncclGetLastError(c);
        if (!f) f = reinterpret_cast<tutti::Comm*>(c)->links().send(1 - r, 0);
        ASSERT_NE(f, nullptr);
        if (r == 0) steps[size_t(op)] = f->step - before;
        ASSERT_EQ(firstWrong(out.data(), k), -1) << "rank " << r << " op " << op;
      }
      // Still slow (the last calls went by exchange): either call in place takes the ring
      // (mix 0: both in place; 1: rank 1 only), both out of place the exchange again (2).
      for (int mix : {0, 1, 2}) {
        std::vector<unsigned char> mine = in;
        const bool inPlace = r == 0 ? mix == 0 : mix != 2;
        unsigned char* to = inPlace ? mine.data() : out.data();
        const uint64_t before = f->step;
        ASSERT_EQ(ncclAllReduce(mine.data(), to, k.count, k.dtype, k.op, c, nullptr), ncclSuccess)
            << ncclGetLastError(c);
        if (r == 0) mixedSteps[size_t(mix)] = f->step - before;
        EXPECT_EQ(firstWrong(to, k), -1) << "rank " << r << " mix " << mix;
      }
    });
    destroyAll(comms);
    std::vector<std::pair<uint64_t, int>> runs;  // (steps per call, calls in a row)
    for (uint64_t s : steps) {
      if (runs.empty() || runs.back().first != s) runs.push_back({s, 0});
      ++runs.back().second;
    }
    std::string shape;
    for (auto& [s, len] : runs) shape += " " + std::to_string(s) + " steps x" + std::to_string(len);
    SCOPED_TRACE("rank 0's calls:" + shape);
    if (std::string(slowGBps) == "0") {
      ASSERT_EQ(runs.size(), 1u);
      EXPECT_EQ(runs[0].first, 9u);
    } else {
      // The ring times 4 copies a call (those of its reduced blocks); a slot's first copy
      // does not count: the verdict within 4 calls.
      ASSERT_GE(runs.size(), 3u);
      EXPECT_EQ(runs[0].first, 9u);
      EXPECT_LE(runs[0].second, 4);
      EXPECT_EQ(runs[1].first, 2u);
      EXPECT_EQ(runs[1].second, 64);
      EXPECT_EQ(runs[2].first, 9u);
      EXPECT_EQ(runs.back().first, 2u);
      EXPECT_EQ(mixedSteps[0], 9u);  // both in place
      EXPECT_EQ(mixedSteps[1], 9u);  // rank 1 in place: it answers no
      EXPECT_EQ(mixedSteps[2], 2u);  // both out of place
    }
  }
  // 3. Ranks that disagree fail at once, naming the sizes: both from the minimum (rank 0's
  // marker carries its size), or rank 1 under it (it finds the marker where it expected data).
  // Out of place, so that the exchange would be taken.
  ScopedEnv forced("TUTTI_EXCHANGE", "1");
  for (size_t theirs : {size_t(32768), size_t(8192)}) {
    SCOPED_TRACE("rank 1's count " + std::to_string(theirs));
    const size_t mine = 65536;
    std::vector<ncclComm_t> comms = initThreads(2);
    auto [rc, msg] = runMismatched(comms, [&](int r, ncclComm_t c) {
      std::vector<float> buf(r == 1 ? theirs : mine, 1.0f), out(buf.size());
      return ncclAllReduce(buf.data(), out.data(), buf.size(), ncclFloat32, ncclSum, c, nullptr);
    });
    EXPECT_NE(rc[1], ncclSuccess);
    const std::string want = theirs * 4 >= 65536
                                 ? "rank 0 runs this operation on " + std::to_string(mine * 4) +
                                       " bytes where this rank has " + std::to_string(theirs * 4)
                                 : "sent the way of an operation where this rank expected data";
    EXPECT_NE(msg[1].find(want), std::string::npos) << msg[1];
    for (auto& c : comms) ncclCommAbort(c);
  }
  EXPECT_EQ(leftoverShmSegments(), 0);
}

// Two ranks over tcp, all-reduces up to TUTTI_PAIR_MAX_BYTES: the pair exchange, each rank
// sending its chunk and combining the other's into its output where its own chunk was.
// Out of place the chunks leave straight from the input; in place they go through the slots,
// since a chunk bigger than a socket takes at once is still leaving when the reduction
// overwrites it. 16 MiB in place in 8 MiB chunks (8 MiB slots: loopback sockets take 2 MiB
// chunks whole, and sending those in place straight from the input passed here), three
// times, and out of place once: every element must be both ranks' sum. (A check of the guard
// only where 8 MiB chunks leave in parts: here, with tcp_wmem up to 4 MiB and tcp_rmem up to
// 32 MiB, grown by autotuning over a connection's life, sending in place from the input
// failed it 3 runs of 3.)
TEST(PairExchange, InPlaceChunksAreNotOverwrittenWhileTheyLeave) {
  ScopedEnv shm("NCCL_SHM_DISABLE", "1");
  ScopedEnv buff("NCCL_BUFFSIZE", "67108864");
  ScopedEnv pair("TUTTI_PAIR_MAX_BYTES", "67108864");
  ScopedEnv channels("NCCL_MAX_NCHANNELS", "1");
  ScopedEnv timeout("TUTTI_TIMEOUT", "60");
  const ExchangeCase c{ncclFloat32, ncclSum, size_t(4) << 20};
  std::vector<ncclComm_t> comms = initThreads(2);
  ASSERT_EQ(comms.size(), 2u);
  std::vector<std::string> wrong(2);
  std::vector<int> overNet(2, -1);
  onThreads(2, [&](int r) {
    std::vector<unsigned char> buf(c.count * 4), out(c.count * 4);
    for (int run = 0; run < 4; ++run) {  // both ranks run all four, whatever they find
      const bool inPlace = run < 3;
      fill(buf, c, r);
      unsigned char* dst = inPlace ? buf.data() : out.data();
      const ncclResult_t rc =
          ncclAllReduce(buf.data(), dst, c.count, c.dtype, c.op, comms[size_t(r)], nullptr);
      // Links are made by the first call: then the pair exchange is what runs (2 ranks, under
      // TUTTI_PAIR_MAX_BYTES, a link over the network).
      if (run == 0)
        overNet[size_t(r)] =
            reinterpret_cast<tutti::Comm*>(comms[size_t(r)])->links().usesNet(1 - r);
      if (!wrong[size_t(r)].empty()) continue;
      if (rc != ncclSuccess) {
        wrong[size_t(r)] = "run " + std::to_string(run) + ": " + ncclGetErrorString(rc);
      } else if (int64_t i = firstWrong(dst, c); i >= 0) {
        wrong[size_t(r)] = std::string(inPlace ? "in place" : "out of place") + ", run " +
                           std::to_string(run) + ": element " + std::to_string(i) +
                           " is not both ranks' sum";
      }
    }
  });
  destroyAll(comms);
  EXPECT_EQ(overNet, (std::vector<int>{1, 1})) << "not the pair exchange: no tcp link";
  EXPECT_EQ(wrong[0], "");
  EXPECT_EQ(wrong[1], "");
}

// A PreMulSum's scalar is each rank's own ("multiplies its input locally"): two ranks with
// scalars 1 and 3 and inputs 1 must both get 4. The pair (tcp, small) and the exchange (shm,
// big) let each rank combine both inputs itself, so they must not run it (with the receiver's
// scalar on both inputs, rank 0 got 2 and rank 1 got 6); Avg, the same 1/nranks on both, they
// still run.
TEST(PairExchange, EachRanksOwnPreMulSumScalarScalesOnlyItsInput) {
  ScopedEnv buff("NCCL_BUFFSIZE", "524288");
  ScopedEnv channels("NCCL_MAX_NCHANNELS", "1");
  ScopedEnv timeout("TUTTI_TIMEOUT", "20");
  ScopedEnv forced("TUTTI_EXCHANGE", "1");
  ScopedEnv min("TUTTI_EXCHANGE_MIN_BYTES", "65536");
  for (const char* shmOff : {"1", "0"}) {  // tcp: the pair (small); shm: the exchange (big)
    ScopedEnv shm("NCCL_SHM_DISABLE", shmOff);
    const size_t count = shmOff[0] == '1' ? 16 : 65536 + 5;
    std::vector<ncclComm_t> comms = initThreads(2);
    onThreads(2, [&](int r) {
      ncclComm_t c = comms[size_t(r)];
      float scalar = r == 0 ? 1.0f : 3.0f;
      ncclRedOp_t op;
      ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, c),
                ncclSuccess);
      std::vector<float> in(count, 1.0f), out(count, -1.0f);
      ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclFloat32, op, c, nullptr),
                ncclSuccess)
          << ncclGetLastError(c);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], 4.0f) << "NCCL_SHM_DISABLE=" << shmOff << " rank " << r << " [" << i
                                << "]";
      }
      std::vector<float> avg(count, float(2 * r + 1));  // 1 and 3: 2
      ASSERT_EQ(ncclAllReduce(avg.data(), out.data(), count, ncclFloat32, ncclAvg, c, nullptr),
                ncclSuccess)
          << ncclGetLastError(c);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(out[i], 2.0f) << "avg, NCCL_SHM_DISABLE=" << shmOff << " rank " << r << " [" << i
                                << "]";
      }
      ncclRedOpDestroy(op, c);
    });
    destroyAll(comms);
  }
}
