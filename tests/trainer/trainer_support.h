// What the trainer's tests share: the data set, quiet options, N ranks as threads over real
// tutti communicators (ncclCommInitAll), and the comparisons of their results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "examples/trainer/gpu_model.h"
#include "examples/trainer/mlp.h"
#include "examples/trainer/trainer.h"

namespace trainer {

// The real data set (Debian's dataset-fashion-mnist, installed by scripts/test), cut to a size
// that keeps every run here well under a second.
inline const Dataset& data() {
  static Dataset d;
  static bool loaded = [] {
    std::string err;
    setBlasThreads(1);  // ranks are threads here: one BLAS thread each, as tutti-train --threads
    // TUTTI_TRAINER_DATA: another copy of it (scripts/device-check carries one to GPU machines).
    const char* dir = getenv("TUTTI_TRAINER_DATA");
    bool ok = loadDataset(dir && *dir ? dir : Options().data_dir, 2048, 500, &d, &err);
    if (!ok) ADD_FAILURE() << err << " (apt-get install dataset-fashion-mnist)";
    return ok;
  }();
  EXPECT_TRUE(loaded);
  return d;
}

inline Options quiet() {
  Options o;
  o.out = nullptr;
  o.batch = 64;
  o.lr = 0.05;
  return o;
}

// Trains on n ranks as threads; every rank's result, in rank order. --device cuda puts rank r
// on GPU r % count (several ranks share a GPU where there are fewer). A rank that fails where
// the others cannot hear of it (a CUDA error in mid-step) would leave them waiting inside a
// collective until TUTTI_TIMEOUT, past the test's own limit, its message never shown: once a
// rank has failed, the others get 20 s to finish (ranks that each fail by themselves, as the
// bad set-ups below, take milliseconds), then every communicator is aborted, as tutti-train
// --threads does at once.
inline std::vector<TrainResult> runRanks(int n, const Options& o, const Dataset* d = &data()) {
  std::vector<ncclComm_t> comms(static_cast<size_t>(n), nullptr);
  std::vector<int> devs(static_cast<size_t>(n), -1);
  for (int r = 0; r < n && o.device == "cuda" && gpuCount() > 0; ++r)
    devs[size_t(r)] = r % gpuCount();
  EXPECT_EQ(ncclCommInitAll(comms.data(), n, devs.data()), ncclSuccess)
      << ncclGetLastError(nullptr);
  std::vector<TrainResult> out(static_cast<size_t>(n));
  std::mutex mu;
  std::condition_variable cv;
  int finished = 0, firstFailed = -1;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      TrainResult res = train(comms[size_t(r)], o, d);
      std::lock_guard<std::mutex> lock(mu);
      if (!res.ok && firstFailed < 0) firstFailed = r;
      out[size_t(r)] = std::move(res);
      ++finished;
      cv.notify_all();
    });
  }
  bool aborted = false;
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finished == n || firstFailed >= 0; });
    if (!cv.wait_for(lock, std::chrono::seconds(20), [&] { return finished == n; })) {
      ADD_FAILURE() << "rank " << firstFailed << " failed (" << out[size_t(firstFailed)].error
                    << ") and the others did not finish within 20 s: aborting them";
      aborted = true;
    }
  }
  if (aborted) {
    for (auto c : comms) ncclCommAbort(c);  // safe beside the ranks' own calls
  }
  for (auto& t : threads) t.join();
  if (!aborted) {
    for (auto c : comms) EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
  }
  return out;
}

inline double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

inline double norm(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

inline std::vector<float> initialParams(const Options& o) {
  Mlp m({784, o.hidden[0], o.hidden[1], 10}, 1);
  std::vector<float> p(m.numParams());
  Mlp::initParams(m.layers(), o.seed, p.data());
  return p;
}

inline void expectAllOk(const std::vector<TrainResult>& rs) {
  for (size_t r = 0; r < rs.size(); ++r)
    ASSERT_TRUE(rs[r].ok) << "rank " << r << ": " << rs[r].error;
}

// DDP keeps every replica identical: the same averaged gradient, the same update, bit for bit.
inline void expectReplicasIdentical(const std::vector<TrainResult>& rs) {
  for (size_t r = 1; r < rs.size(); ++r) {
    EXPECT_EQ(rs[r].params, rs[0].params) << "rank " << r << " drifted from rank 0";
    EXPECT_EQ(rs[r].momentum, rs[0].momentum) << "rank " << r;
  }
}

// Two epochs of 8 steps each: 512 training samples in *small, batch 64.
inline Options twoShortEpochs(Dataset* small) {
  Options o = quiet();
  o.train_limit = 512;
  *small = data();
  small->train.count = 512;
  o.epochs = 2;
  return o;
}

// A run that resumed (`resumed`) ends where the uninterrupted one (`straight`) did, bit for bit.
inline void expectSameEnd(const std::vector<TrainResult>& straight,
                   const std::vector<TrainResult>& resumed, int64_t steps) {
  expectAllOk(straight);
  expectAllOk(resumed);
  EXPECT_EQ(straight[0].steps, steps);
  EXPECT_EQ(resumed[0].steps, steps);
  EXPECT_EQ(resumed[0].params, straight[0].params);
  EXPECT_EQ(resumed[0].momentum, straight[0].momentum);
  expectReplicasIdentical(resumed);
}

// How far b is from the reference a, relative to how far training moved a from where it
// started: ||a - b|| / ||a - init||. Summing in another order (other batch splits, the ring's
// order) changes the last bits, and now and then a ReLU input within rounding of zero flips
// and one sample's contribution to one unit moves by lr x gradient (~1e-4 here), so a
// bit-exact or max-abs comparison would depend on the BLAS kernels of the machine. Measured
// over 4 steps: 3e-7 without a flip, 9e-4 with one; ncclSum in place of ncclAvg 0.56-4.3,
// every rank on the same shard 0.56-1.0, shards shifted by one sample 0.10-0.16.
inline double relativeDiff(const std::vector<float>& a, const std::vector<float>& b,
                    const std::vector<float>& init) {
  double moved = norm(a, init);
  EXPECT_GT(moved, 0.1) << "training did not move the parameters";
  return norm(a, b) / moved;
}
inline constexpr double kRelTol = 1e-2;

// Three ranks, one gradient bucket per layer (the most overlap): buckets all-reduced while
// backward goes on give the bits of buckets all-reduced after it.
inline void expectOverlapGivesTheSameBits(Options o) {
  o.batch = 96;
  o.bucket_bytes = 1;
  o.overlap = true;
  std::vector<TrainResult> overlapped = runRanks(3, o);
  o.overlap = false;
  std::vector<TrainResult> after = runRanks(3, o);
  expectAllOk(overlapped);
  expectAllOk(after);
  EXPECT_EQ(overlapped[0].params, after[0].params);
}

}  // namespace trainer
