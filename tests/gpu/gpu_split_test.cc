// Communicators split from another (ncclCommSplit) running collectives on GPU buffers beside
// their parent, as PyTorch's new_group does once its default group was made with a device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/gpu_support.h"
#include "harness/harness.h"

using namespace tutti::test;

namespace {

// Four ranks as threads on one GPU split by parity (keys reversed: rank r is the child's rank
// 1 - r / 2); rank 3 takes no part in a second split (NCCL_SPLIT_NOCOLOR). Each rank sums in
// place, on its stream, a small (LL) and a larger (Simple) buffer in the parent and in its
// child in turn, three rounds: every result depends on each earlier one, in the right
// communicator.
TEST(GpuSplit, SplitCommunicatorsRunCollectivesBesideTheirParent) {
  SKIP_WITHOUT_GPU();
  constexpr int n = 4;
  std::vector<ncclComm_t> parent = initThreads(n);
  std::vector<ncclComm_t> child(n, nullptr), trio(n, nullptr);
  std::vector<cudaStream_t> streams(n);
  for (auto& s : streams)
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  RankBuffers ps(n, 64), pb(n, 1 << 18), cs(n, 64), cb(n, 1 << 18), ts(n, 64);
  RankFailures failures;
  onThreads(n, [&](int r) {
    cudaStream_t s = streams[size_t(r)];
    auto check = [&](ncclResult_t rc, ncclComm_t c, const char* what) {
      if (rc != ncclSuccess) failures.add(r, std::string(what) + ": " + ncclGetLastError(c));
      return rc == ncclSuccess;
    };
    if (!check(ncclCommSplit(parent[size_t(r)], r % 2, n - r, &child[size_t(r)], nullptr),
               parent[size_t(r)], "ncclCommSplit"))
      return;
    if (!check(ncclCommSplit(parent[size_t(r)], r == 3 ? NCCL_SPLIT_NOCOLOR : 0, r,
                             &trio[size_t(r)], nullptr),
               parent[size_t(r)], "ncclCommSplit (NOCOLOR)"))
      return;
    if ((r == 3) != (trio[size_t(r)] == nullptr)) failures.add(r, "NOCOLOR: wrong communicator");
    int childRank = -1;
    ncclCommUserRank(child[size_t(r)], &childRank);
    if (childRank != 1 - r / 2) failures.add(r, "child rank " + std::to_string(childRank));
    ps.fill(r, float(r + 1), s);
    pb.fill(r, float(r + 1), s);
    cs.fill(r, float(10 * (r + 1)), s);
    cb.fill(r, float(10 * (r + 1)), s);
    ts.fill(r, float(r + 1), s);
    for (int round = 0; round < 3; ++round) {
      for (RankBuffers* b : {&ps, &pb, &cs, &cb}) {
        ncclComm_t c = (b == &ps || b == &pb) ? parent[size_t(r)] : child[size_t(r)];
        if (!check(ncclAllReduce(b->bufs[size_t(r)], b->bufs[size_t(r)], b->count, ncclFloat,
                                 ncclSum, c, s),
                   c, "ncclAllReduce"))
          return;
      }
      if (trio[size_t(r)] && !check(ncclAllReduce(ts.bufs[size_t(r)], ts.bufs[size_t(r)], ts.count,
                                                  ncclFloat, ncclSum, trio[size_t(r)], s),
                                    trio[size_t(r)], "ncclAllReduce (trio)"))
        return;
    }
    // Parent: 1 + 2 + 3 + 4, then times 4 twice. Children: even ranks 10 + 30, odd 20 + 40,
    // then times 2 twice. The trio: 1 + 2 + 3, times 3 twice; rank 3's buffer untouched.
    const float parentSum = 10.0f * 16, childSum = (r % 2 == 0 ? 40.0f : 60.0f) * 4;
    expectResults(failures, r, parent[size_t(r)], s, {{&ps, parentSum}, {&pb, parentSum}});
    expectResults(failures, r, child[size_t(r)], s, {{&cs, childSum}, {&cb, childSum}});
    const std::string trioBad = ts.check(r, r == 3 ? 4.0f : 6.0f * 9, s);
    if (!trioBad.empty()) failures.add(r, "trio: " + trioBad);
  });
  failures.report();
  destroyAll(trio);
  destroyAll(child);
  destroyAll(parent);
  for (auto& s : streams) cudaStreamDestroy(s);
}

}  // namespace
