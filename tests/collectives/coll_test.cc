// The correctness matrix with ranks as threads of this process, over shm and over tcp
// (NCCL_SHM_DISABLE=1), on every communicator size of DESIGN.md; then the small all-reduce
// algorithms' bits, and reductions' edge cases (NaNs, fp16 averages).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/matrix.h"
#include "harness/harness.h"
#include "kernels/cpu/types.h"
#include "runtime/comm.h"
#include "runtime/links.h"

using namespace tutti::test;

namespace {

constexpr size_t kFifoBytes = 8192;  // NCCL_BUFFSIZE in these tests: 1 KiB slots

// How small all-reduces and all-gathers of 3+ ranks run: as the machine decides (ranks
// sharing cores or not), or pinned to one algorithm for every size, so that each runs on both
// transports whatever the machine's core count. (All-gathers: doubling and tree only for a
// power of two of ranks, the ring otherwise; with kHalving, recursive halving and doubling for
// every all-reduce, the ring for all-gathers.)
enum class Small { kDefault, kRing, kFlat, kDoubling, kTree, kHalving };

struct MatrixSetup {
  int nranks;
  const char* transport;  // "shm" or "tcp"
  int minChannels;
  Small small = Small::kDefault;
  // The default NCCL_BUFFSIZE instead of kFifoBytes: shm FIFOs then have cells (1 KiB slots
  // have none), and the cases' payloads, sized for 1 KiB slots, go through them.
  bool cells = false;
};

const char* smallName(Small a) {
  switch (a) {
    case Small::kRing:
      return "ring";
    case Small::kFlat:
      return "flat";
    case Small::kDoubling:
      return "doubling";
    case Small::kTree:
      return "tree";
    case Small::kHalving:
      return "halving";
    default:
      return "default";
  }
}

void PrintTo(const MatrixSetup& s, std::ostream* os) {
  *os << s.nranks << " ranks over " << s.transport << ", " << s.minChannels
      << "+ channels, small all-reduces and all-gathers: " << smallName(s.small)
      << (s.cells ? ", default buffers (cells)" : "");
}

std::string setupName(const ::testing::TestParamInfo<MatrixSetup>& info) {
  std::string name = std::string(info.param.transport) + "_" + std::to_string(info.param.nranks) +
                     "ranks_" + std::to_string(info.param.minChannels) + "ch";
  if (info.param.small != Small::kDefault) name += std::string("_") + smallName(info.param.small);
  if (info.param.cells) name += "_cells";
  return name;
}

// The environment that pins small all-reduces to `a` (nothing for kDefault).
const char* rdMaxFor(Small a) {
  return a == Small::kDoubling ? "1073741824" : a == Small::kDefault ? nullptr : "0";
}
const char* treeMaxFor(Small a) {
  return a == Small::kTree ? "1073741824" : a == Small::kDefault ? nullptr : "0";
}
const char* flatMaxFor(Small a) {
  return a == Small::kFlat ? "1073741824" : a == Small::kDefault ? nullptr : "0";
}
const char* halvingMinFor(Small a) {
  return a == Small::kHalving ? "1" : a == Small::kDefault ? nullptr : "0";
}

class Matrix : public ::testing::TestWithParam<MatrixSetup> {};

TEST_P(Matrix, EveryCollectiveMatchesTheOracle) {
  const MatrixSetup s = GetParam();
  ScopedEnv buff("NCCL_BUFFSIZE", s.cells ? nullptr : std::to_string(kFifoBytes).c_str());
  ScopedEnv shm("NCCL_SHM_DISABLE", std::string(s.transport) == "tcp" ? "1" : nullptr);
  ScopedEnv ch("NCCL_MIN_NCHANNELS", std::to_string(s.minChannels).c_str());
  ScopedEnv timeout("TUTTI_TIMEOUT", "60");
  ScopedEnv rdMax("TUTTI_RD_MAX_BYTES", rdMaxFor(s.small));
  ScopedEnv treeMax("TUTTI_TREE_MAX_BYTES", treeMaxFor(s.small));
  ScopedEnv flatMax("TUTTI_FLAT_MAX_BYTES", flatMaxFor(s.small));
  ScopedEnv rdGather("TUTTI_RD_ALLGATHER_MAX_BYTES", rdMaxFor(s.small));
  ScopedEnv treeGather("TUTTI_TREE_ALLGATHER_MAX_BYTES", treeMaxFor(s.small));
  ScopedEnv flatGather("TUTTI_FLAT_ALLGATHER_MAX_BYTES", flatMaxFor(s.small));
  ScopedEnv halvingMin("TUTTI_HALVING_MIN_BYTES", halvingMinFor(s.small));
  ScopedEnv halvingMax("TUTTI_HALVING_MAX_BYTES",
                       s.small == Small::kHalving ? "1073741824" : nullptr);
  // 3, 4 and 8 ranks over shm: single copy (a receiver copying straight from the sender's
  // buffer) for slots of 256 bytes or more, not only for big ones.
  const bool single =
      std::string(s.transport) == "shm" && (s.nranks == 3 || s.nranks == 4 || s.nranks == 8);
  ScopedEnv copy("TUTTI_SHM_SINGLE_COPY", single ? "1" : nullptr);
  ScopedEnv copyMin("TUTTI_SHM_SINGLE_COPY_MIN", single ? "256" : nullptr);
  // With them, broadcasts of 4 KiB or more flat (the root's buffer read by every receiver),
  // as ranks crowded on fewer cores run them from 64 KiB.
  ScopedEnv flatBcast("TUTTI_FLAT_BROADCAST_MIN_BYTES", single ? "4096" : nullptr);
  // 5 ranks over shm: every broadcast and all-gather through the shared area, in 4 KiB slots,
  // 4 of them.
  const bool area = std::string(s.transport) == "shm" && s.nranks == 5;
  // (8 ranks crowded on this machine's cores take the shared area for broadcasts and big
  // all-gathers by default: the one-channel run keeps the other paths, the two-channel one
  // the default.)
  const bool areaOff = single && s.nranks == 8 && s.minChannels == 1;
  ScopedEnv areaMin("TUTTI_AREA_BROADCAST_MIN_BYTES", area ? "1" : areaOff ? "0" : nullptr);
  ScopedEnv areaGather("TUTTI_AREA_ALLGATHER_MIN_BYTES", area ? "1" : areaOff ? "0" : nullptr);
  ScopedEnv areaChunk("TUTTI_SHM_AREA_CHUNK", area ? "4096" : nullptr);
  ScopedEnv areaSlots("TUTTI_SHM_AREA_SLOTS", area ? "4" : nullptr);
  std::vector<ncclComm_t> comms = initThreads(s.nranks);
  ASSERT_EQ(comms.size(), size_t(s.nranks));
  std::vector<Case> cases = matrixCases(s.nranks, kFifoBytes);
  std::mutex mu;
  std::vector<std::string> failures;
  onThreads(s.nranks, [&](int rank) {
    std::vector<std::string> bad = runCases(comms[size_t(rank)], rank, s.nranks, cases);
    std::lock_guard<std::mutex> lock(mu);
    failures.insert(failures.end(), bad.begin(), bad.end());
  });
  destroyAll(comms);
  EXPECT_EQ(leftoverShmSegments(), 0);
  for (const std::string& f : failures) ADD_FAILURE() << f;
  RecordProperty("cases", int(cases.size()));
}

// Every nranks value on both transports; the two-channel runs split each operation across
// channels (and their workers) even at small sizes; every small all-reduce algorithm on both
// transports (8 ranks over shm as the machine decides: with fewer than 8 cores that is flat,
// doubling and tree by size, and all-gathers flat up to 16 KiB).
INSTANTIATE_TEST_SUITE_P(
    Threads, Matrix,
    ::testing::Values(
        MatrixSetup{1, "shm", 1}, MatrixSetup{2, "shm", 1}, MatrixSetup{3, "shm", 2, Small::kTree},
        MatrixSetup{4, "shm", 1, Small::kRing}, MatrixSetup{5, "shm", 1, Small::kDoubling},
        MatrixSetup{8, "shm", 2}, MatrixSetup{1, "tcp", 1}, MatrixSetup{2, "tcp", 2},
        MatrixSetup{3, "tcp", 1, Small::kRing}, MatrixSetup{4, "tcp", 2, Small::kDoubling},
        MatrixSetup{5, "tcp", 1, Small::kTree}, MatrixSetup{8, "tcp", 1, Small::kFlat},
        MatrixSetup{8, "tcp", 2, Small::kTree}, MatrixSetup{4, "shm", 2, Small::kTree},
        MatrixSetup{8, "shm", 1, Small::kDoubling}, MatrixSetup{5, "tcp", 1, Small::kHalving},
        MatrixSetup{8, "shm", 2, Small::kHalving}, MatrixSetup{4, "tcp", 1, Small::kHalving},
        MatrixSetup{3, "shm", 1, Small::kRing, true},
        MatrixSetup{4, "shm", 2, Small::kDefault, true}),
    setupName);

}  // namespace

namespace {

// Small all-reduces of 3+ ranks run recursive doubling or the flat exchange, where each rank
// combines partial results itself, or the binomial tree (and mid-sized ones halving and
// doubling, where one rank combines each element); with inputs whose sums round (unlike the
// matrix's exact ones) every rank must still end with the same bits, as a ring gives. Also
// checks the size limit between the algorithms and that they agree with a double-precision
// sum, and (the tree) that float max with NaNs and signed zeros gives every rank one answer.
TEST(RecursiveDoubling, EveryRankGetsTheSameBitsAndAlgorithmsAgree) {
  const std::pair<int, Small> runs[] = {
      {3, Small::kDoubling}, {5, Small::kDoubling}, {6, Small::kDoubling}, {8, Small::kDoubling},
      {3, Small::kTree},     {5, Small::kTree},     {6, Small::kTree},     {8, Small::kTree},
      {3, Small::kFlat},     {5, Small::kFlat},     {8, Small::kFlat},     {3, Small::kHalving},
      {6, Small::kHalving},  {8, Small::kHalving}};
  for (auto [nranks, algo] : runs) {
    SCOPED_TRACE("nranks " + std::to_string(nranks) + ", " + smallName(algo));
    // 4 KB of float: the small algorithm; 64 KB: the ring.
    ScopedEnv rdMax("TUTTI_RD_MAX_BYTES", algo == Small::kDoubling ? "16384" : "0");
    ScopedEnv treeMax("TUTTI_TREE_MAX_BYTES", algo == Small::kTree ? "16384" : "0");
    ScopedEnv flatMax("TUTTI_FLAT_MAX_BYTES", algo == Small::kFlat ? "16384" : "0");
    ScopedEnv halvingMin("TUTTI_HALVING_MIN_BYTES", algo == Small::kHalving ? "1" : "0");
    ScopedEnv halvingMax("TUTTI_HALVING_MAX_BYTES", "16384");
    std::vector<ncclComm_t> comms = initThreads(nranks);
    const size_t count = 1000;
    std::vector<std::vector<float>> small(static_cast<size_t>(nranks)),
        big(static_cast<size_t>(nranks));
    std::vector<std::vector<uint16_t>> half(static_cast<size_t>(nranks));
    std::vector<ncclRedOp_t> premul(static_cast<size_t>(nranks));
    std::vector<std::vector<float>> maxed(static_cast<size_t>(nranks));
    onThreads(nranks, [&](int r) {
      auto& s = small[size_t(r)];
      s.resize(count);
      for (size_t i = 0; i < count; ++i) s[i] = 1.0f / float(3 + 7 * r + int(i % 13)) + 0.1f * r;
      std::vector<float> b(count * 16);
      for (size_t i = 0; i < b.size(); ++i) b[i] = s[i % count];
      EXPECT_EQ(
          ncclAllReduce(s.data(), s.data(), count, ncclFloat32, ncclSum, comms[size_t(r)], nullptr),
          ncclSuccess);
      EXPECT_EQ(ncclAllReduce(b.data(), b.data(), b.size(), ncclFloat32, ncclSum, comms[size_t(r)],
                              nullptr),
                ncclSuccess);
      big[size_t(r)] = std::move(b);
      // fp16 with a pre-multiplied sum and Avg: scalings on both sides of the combination.
      auto& h = half[size_t(r)];
      h.assign(count, uint16_t(0x3c00 + 37 * r));  // about 1.0 + r * 0.036
      uint16_t scalar = 0x3555;                    // about 1/3
      EXPECT_EQ(ncclRedOpCreatePreMulSum(&premul[size_t(r)], &scalar, ncclFloat16,
                                         ncclScalarHostImmediate, comms[size_t(r)]),
                ncclSuccess);
      EXPECT_EQ(ncclAllReduce(h.data(), h.data(), count, ncclFloat16, premul[size_t(r)],
                              comms[size_t(r)], nullptr),
                ncclSuccess);
      EXPECT_EQ(
          ncclAllReduce(h.data(), h.data(), count, ncclFloat16, ncclAvg, comms[size_t(r)], nullptr),
          ncclSuccess);
      // Float max over NaNs of different payloads and zeros of both signs: which one wins
      // depends on the order of the combinations, so only an algorithm that gives every rank
      // one rank's result (the ring, the tree) agrees bit for bit.
      auto& m = maxed[size_t(r)];
      m.resize(64);
      for (size_t i = 0; i < m.size(); ++i) {
        uint32_t bits = (i + size_t(r)) % 3 == 0   ? 0x7fc00001u + uint32_t(r)  // NaN, payload r
                        : (i + size_t(r)) % 3 == 1 ? 0x80000000u                // -0
                                                   : 0u;                        // +0
        memcpy(&m[i], &bits, 4);
      }
      EXPECT_EQ(ncclAllReduce(m.data(), m.data(), m.size(), ncclFloat32, ncclMax, comms[size_t(r)],
                              nullptr),
                ncclSuccess);
    });
    // Halving and doubling ran: every core rank's link to rank ^ 2 (no ring neighbour at 6 or
    // 8 ranks; no other algorithm is left on for these sizes) carried its steps.
    const int core = nranks == 8 ? 8 : 4;  // the largest power of two of ranks (6 or 8)
    for (int r = 0; algo == Small::kHalving && nranks >= 6 && r < core; ++r) {
      const tutti::transport::FifoView* f =
          reinterpret_cast<tutti::Comm*>(comms[size_t(r)])->links().send(r ^ 2, 0);
      EXPECT_TRUE(f && f->step > 0) << "rank " << r << ": nothing went to rank " << (r ^ 2);
    }
    for (int r = 1; r < nranks; ++r) {
      EXPECT_EQ(small[size_t(r)], small[0]) << "rank " << r;
      EXPECT_EQ(big[size_t(r)], big[0]) << "rank " << r;
      EXPECT_EQ(half[size_t(r)], half[0]) << "rank " << r;
      EXPECT_EQ(memcmp(maxed[size_t(r)].data(), maxed[0].data(), 64 * 4), 0) << "rank " << r;
    }
    for (size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (int r = 0; r < nranks; ++r) exact += 1.0 / (3 + 7 * r + int(i % 13)) + 0.1 * r;
      ASSERT_NEAR(small[0][i], exact, 1e-5 * exact) << i;
      ASSERT_NEAR(big[0][i], small[0][i], 1e-5 * exact) << i;
    }
    for (int r = 0; r < nranks; ++r) ncclRedOpDestroy(premul[size_t(r)], comms[size_t(r)]);
    destroyAll(comms);
  }
}

}  // namespace

namespace {

// NCCL reads Broadcast's send buffer on the root only: other ranks may pass NULL.
TEST(Broadcast, NonRootRanksMayPassNullSendbuff) {
  std::vector<ncclComm_t> comms = initThreads(3);
  std::vector<std::vector<int32_t>> out(3, std::vector<int32_t>(1000, -1));
  std::vector<int32_t> in(1000);
  for (size_t i = 0; i < in.size(); ++i) in[i] = int32_t(7 * i + 1);
  onThreads(3, [&](int r) {
    EXPECT_EQ(ncclBroadcast(r == 1 ? in.data() : nullptr, out[size_t(r)].data(), in.size(),
                            ncclInt32, 1, comms[size_t(r)], nullptr),
              ncclSuccess)
        << ncclGetLastError(comms[size_t(r)]);
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[size_t(r)], in) << "rank " << r;
  destroyAll(comms);
}

// Max and Min drop a NaN unless every rank holds one there (fmax / fmin, as NCCL's kernels):
// whichever rank holds it, so wherever that rank sits in a chunk's chain, whatever algorithm
// the size picks (16 elements: the small all-reduce; 1 Mi: the ring), float (scalar loop) and
// fp16 (the vector loop). Before, a NaN survived only where its rank started a chain.
TEST(Reductions, MaxAndMinDropANaNWhereverItsRankSits) {
  constexpr int n = 4;
  std::vector<ncclComm_t> comms = initThreads(n);
  for (size_t count : {size_t(16), size_t(1) << 20}) {
    for (int dtype : {int(ncclFloat32), int(ncclFloat16)}) {
      for (int fn : {int(ncclMax), int(ncclMin)}) {
        const int q = 1;  // the rank with NaN everywhere; every rank has NaN at element 0
        std::vector<std::vector<float>> f(n);
        std::vector<std::vector<uint16_t>> h(n);
        onThreads(n, [&](int r) {
          void* buf;
          if (dtype == ncclFloat32) {
            f[size_t(r)].assign(count, r == q ? std::nanf("") : float(r + 1));
            f[size_t(r)][0] = std::nanf("");
            buf = f[size_t(r)].data();
          } else {
            h[size_t(r)].assign(count, r == q ? 0x7e00 : uint16_t(0x3c00 + 0x400 * r));  // 2^r
            h[size_t(r)][0] = 0x7e00;
            buf = h[size_t(r)].data();
          }
          EXPECT_EQ(ncclAllReduce(buf, buf, count, ncclDataType_t(dtype), ncclRedOp_t(fn),
                                  comms[size_t(r)], nullptr),
                    ncclSuccess)
              << ncclGetLastError(comms[size_t(r)]);
        });
        // Ranks 0, 2, 3 hold 1, 3, 4 (float) or 1, 4, 8 (fp16).
        const float want = fn == ncclMax ? (dtype == ncclFloat32 ? 4.0f : 8.0f) : 1.0f;
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) {
            float got;
            if (dtype == ncclFloat32) {
              got = f[size_t(r)][i];
            } else {
              tutti::cpu::half_t x{h[size_t(r)][i]};
              got = tutti::cpu::Elem<tutti::cpu::half_t>::load(x);
            }
            const bool ok = i == 0 ? std::isnan(got) : got == want;
            ASSERT_TRUE(ok) << "dtype " << dtype << " op " << fn << " count " << count << " rank "
                            << r << " element " << i << ": " << got;
          }
        }
      }
    }
  }
  destroyAll(comms);
}

// ncclAvg on fp16 as NCCL computes it (each input times 1/nranks, then the sum): 8 ranks of
// 16384 average to 16384 whatever the algorithm. Summing first overflowed where a partial sum
// is stored as fp16 (the ring): 4 x 16384 is past fp16's largest value, 65504, so inf.
TEST(Reductions, AnFp16AverageDoesNotOverflowOnTheWay) {
  constexpr int n = 8;
  std::vector<ncclComm_t> comms = initThreads(n);
  for (size_t count : {size_t(16), size_t(1) << 18}) {
    std::vector<std::vector<uint16_t>> h(n, std::vector<uint16_t>(count, 0x7400));  // 16384
    onThreads(n, [&](int r) {
      EXPECT_EQ(ncclAllReduce(h[size_t(r)].data(), h[size_t(r)].data(), count, ncclFloat16, ncclAvg,
                              comms[size_t(r)], nullptr),
                ncclSuccess)
          << ncclGetLastError(comms[size_t(r)]);
    });
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(h[size_t(r)][i], 0x7400)
            << "count " << count << " rank " << r << " element " << i;
      }
    }
  }
  destroyAll(comms);
}

}  // namespace
