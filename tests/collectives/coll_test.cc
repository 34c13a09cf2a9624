// The correctness matrix with ranks as threads of this process, over shm and over tcp
// (NCCL_SHM_DISABLE=1), on every communicator size of DESIGN.md.
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/matrix.h"
#include "harness/harness.h"
#include "kernels/cpu/types.h"
#include "runtime/comm.h"
#include "runtime/links.h"
#include "runtime/waiter.h"

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
bool pageMapped(const void* addr) {
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
