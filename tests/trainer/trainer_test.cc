// The trainer demo's data-parallel semantics, checked against single-rank training: ranks run
// as threads over real tutti communicators (shm), or as processes under tutti-run.
#include "examples/trainer/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <regex>
#include <thread>

#include "examples/trainer/blas_core.h"
#include "examples/trainer/checkpoint.h"
#include "examples/trainer/gpu_model.h"
#include "examples/trainer/grad_sync.h"
#include "harness/harness.h"

namespace trainer {
namespace {

// The real data set (Debian's dataset-fashion-mnist, installed by scripts/test), cut to a size
// that keeps every run here well under a second.
const Dataset& data() {
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

Options quiet() {
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
std::vector<TrainResult> runRanks(int n, const Options& o, const Dataset* d = &data()) {
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

double maxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

double norm(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    s += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
  return std::sqrt(s);
}

std::vector<float> initialParams(const Options& o) {
  Mlp m({784, o.hidden[0], o.hidden[1], 10}, 1);
  std::vector<float> p(m.numParams());
  Mlp::initParams(m.layers(), o.seed, p.data());
  return p;
}

void expectAllOk(const std::vector<TrainResult>& rs) {
  for (size_t r = 0; r < rs.size(); ++r)
    ASSERT_TRUE(rs[r].ok) << "rank " << r << ": " << rs[r].error;
}

// DDP keeps every replica identical: the same averaged gradient, the same update, bit for bit.
void expectReplicasIdentical(const std::vector<TrainResult>& rs) {
  for (size_t r = 1; r < rs.size(); ++r) {
    EXPECT_EQ(rs[r].params, rs[0].params) << "rank " << r << " drifted from rank 0";
    EXPECT_EQ(rs[r].momentum, rs[0].momentum) << "rank " << r;
  }
}

// Two epochs of 8 steps each: 512 training samples in *small, batch 64.
Options twoShortEpochs(Dataset* small) {
  Options o = quiet();
  o.train_limit = 512;
  *small = data();
  small->train.count = 512;
  o.epochs = 2;
  return o;
}

// A run that resumed (`resumed`) ends where the uninterrupted one (`straight`) did, bit for bit.
void expectSameEnd(const std::vector<TrainResult>& straight,
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
double relativeDiff(const std::vector<float>& a, const std::vector<float>& b,
                    const std::vector<float>& init) {
  double moved = norm(a, init);
  EXPECT_GT(moved, 0.1) << "training did not move the parameters";
  return norm(a, b) / moved;
}
constexpr double kRelTol = 1e-2;

class Equivalence : public ::testing::TestWithParam<int> {};

TEST_P(Equivalence, NRanksWithBatchBEqualOneRankWithBatchNB) {
  const int n = GetParam();
  Options o = quiet();
  o.max_steps = 4;
  std::vector<TrainResult> one = runRanks(1, o);
  std::vector<TrainResult> many = runRanks(n, o);
  expectAllOk(one);
  expectAllOk(many);
  expectReplicasIdentical(many);
  EXPECT_EQ(many[0].steps, 4);
  EXPECT_LT(relativeDiff(one[0].params, many[0].params, initialParams(o)), kRelTol)
      << n << " ranks diverged from 1 rank";
}

INSTANTIATE_TEST_SUITE_P(Trainer, Equivalence, ::testing::Values(2, 4));

TEST(Trainer, AccumulationOfKStepsEqualsOneStepOfKTimesTheBatch) {
  Options o = quiet();
  o.max_steps = 4;
  std::vector<TrainResult> whole = runRanks(2, o);  // 2 ranks x 32 samples
  o.accum = 2;                                      // 2 ranks x 2 x 16 samples
  std::vector<TrainResult> accum = runRanks(2, o);
  o.accum = 4;  // 1 rank x 4 x 16 samples
  std::vector<TrainResult> single = runRanks(1, o);
  expectAllOk(whole);
  expectAllOk(accum);
  expectAllOk(single);
  expectReplicasIdentical(accum);
  const std::vector<float> init = initialParams(o);
  EXPECT_LT(relativeDiff(whole[0].params, accum[0].params, init), kRelTol);
  EXPECT_LT(relativeDiff(whole[0].params, single[0].params, init), kRelTol);
}

// Three ranks, one gradient bucket per layer (the most overlap): buckets all-reduced while
// backward goes on give the bits of buckets all-reduced after it.
void expectOverlapGivesTheSameBits(Options o) {
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

TEST(Trainer, OverlappedBucketsGiveTheSameBitsAsAllReduceAfterBackward) {
  // A bucket all-reduced before its layers' gradients were final would change the result.
  Options o = quiet();
  o.max_steps = 8;
  expectOverlapGivesTheSameBits(o);
}

// --auto-resume (a job restarted whole: torchrun --max-restarts, a requeued Slurm job) starts
// afresh where rank 0 finds no checkpoint, continues the one it finds exactly, and fails where
// the file is there but unreadable rather than throw its training away.
TEST(Trainer, AutoResumeStartsAfreshThenContinuesTheCheckpoint) {
  const std::string dir = ::testing::TempDir();
  const std::string straight = dir + "/tutti_ck_auto_straight", ck = dir + "/tutti_ck_auto";
  std::remove(ck.c_str());
  Dataset small;
  Options o = twoShortEpochs(&small);
  o.checkpoint = straight;
  std::vector<TrainResult> a = runRanks(2, o, &small);
  o.checkpoint = ck;
  o.auto_resume = true;
  // Rank 0's header says where each attempt starts.
  auto header = [&](std::vector<TrainResult>* rs) {
    FILE* f = tmpfile();
    o.out = f;
    *rs = runRanks(2, o, &small);
    o.out = nullptr;
    std::string text(8192, '\0');
    rewind(f);
    text.resize(fread(text.data(), 1, text.size(), f));
    fclose(f);
    return text;
  };
  o.max_steps = 5;  // the first attempt stops here (as if killed after its checkpoint)
  std::vector<TrainResult> first, second;
  const std::string h1 = header(&first);
  EXPECT_NE(h1.find("no checkpoint at " + ck + " yet: starting afresh (--auto-resume)"),
            std::string::npos)
      << h1;
  o.max_steps = -1;
  const std::string h2 = header(&second);
  EXPECT_NE(h2.find("resumed from " + ck + " at step 5"), std::string::npos) << h2;
  expectAllOk(first);
  EXPECT_EQ(first[0].steps, 5);
  expectSameEnd(a, second, 16);
  // A file that is there but not a checkpoint fails the run on every rank, and stays.
  {
    FILE* f = fopen(ck.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string junk(4096, 'x');
    fwrite(junk.data(), 1, junk.size(), f);
    fclose(f);
  }
  std::vector<TrainResult> bad = runRanks(2, o, &small);
  for (size_t r = 0; r < bad.size(); ++r) EXPECT_FALSE(bad[r].ok) << r;
  EXPECT_NE(bad[0].error.find(ck), std::string::npos) << bad[0].error;
  Checkpoint left;
  std::string err;
  EXPECT_FALSE(loadCheckpoint(ck, &left, &err));
  EXPECT_NE(err.find("not a tutti-train checkpoint"), std::string::npos) << err;
  std::remove(ck.c_str());
  std::remove(straight.c_str());
}

TEST(Trainer, ResumeContinuesTheExactTrajectory) {
  const std::string dir = ::testing::TempDir();
  const std::string straight = dir + "/tutti_ck_straight", part = dir + "/tutti_ck_part";
  Dataset small;
  Options o = twoShortEpochs(&small);  // the resume at step 5 crosses an epoch boundary
  o.checkpoint = straight;
  std::vector<TrainResult> a = runRanks(2, o, &small);
  o.checkpoint = part;
  o.max_steps = 5;
  std::vector<TrainResult> b = runRanks(2, o, &small);
  Checkpoint ck;
  std::string err;
  ASSERT_TRUE(loadCheckpoint(part, &ck, &err)) << err;
  EXPECT_EQ(ck.step, 5);
  o.max_steps = -1;
  o.resume = part;
  o.checkpoint = part;
  std::vector<TrainResult> c = runRanks(2, o, &small);
  expectAllOk(b);
  expectSameEnd(a, c, 16);
  // The checkpoints on disk agree too.
  Checkpoint ka, kc;
  ASSERT_TRUE(loadCheckpoint(straight, &ka, &err)) << err;
  ASSERT_TRUE(loadCheckpoint(part, &kc, &err)) << err;
  EXPECT_EQ(ka.step, 16);
  EXPECT_EQ(ka.params, kc.params);
  EXPECT_EQ(ka.params, a[0].params);
  remove(straight.c_str());
  remove(part.c_str());
}

TEST(Trainer, Bf16GradientsStayCloseToFp32ButAreRoundedOnTheWire) {
  Options o = quiet();
  o.max_steps = 10;
  std::vector<TrainResult> fp32 = runRanks(2, o);
  o.grad_dtype = ncclBfloat16;
  std::vector<TrainResult> bf16 = runRanks(2, o);
  expectAllOk(fp32);
  expectAllOk(bf16);
  expectReplicasIdentical(bf16);
  EXPECT_GT(maxAbsDiff(fp32[0].params, bf16[0].params), 0.0) << "bf16 gradients were not rounded";
  EXPECT_LT(relativeDiff(fp32[0].params, bf16[0].params, initialParams(o)), 0.05);
}

TEST(Trainer, LearnsOnThreads) {
  Options o = quiet();
  o.epochs = 3;
  std::vector<TrainResult> rs = runRanks(2, o);
  expectAllOk(rs);
  const auto& e = rs[0].epochs;
  ASSERT_EQ(e.size(), 3u);
  EXPECT_LT(e[2].train_loss, e[0].train_loss);
  EXPECT_GT(e[2].test_acc, 0.6) << "chance is 0.1";
  // Metrics are all-reduced: every rank reports the same figures.
  EXPECT_EQ(rs[1].epochs[2].test_acc, e[2].test_acc);
}

TEST(Trainer, BadSetupsFailOnEveryRankWithAMessage) {
  Options o = quiet();
  o.max_steps = 1;
  {
    std::vector<TrainResult> rs = runRanks(3, o);  // 64 is not divisible by 3
    for (auto& r : rs) {
      EXPECT_FALSE(r.ok);
      EXPECT_TRUE(r.same_everywhere);  // so tutti-train prints it once
      EXPECT_NE(r.error.find("--batch 64 is not divisible by 3 ranks x 1 accumulation"),
                std::string::npos)
          << r.error;
    }
  }
  if (!gpuModelBuilt() || gpuCount() == 0) {  // where the GPU half can run, TrainerGpu tests it
    Options c = o;
    c.device = "cuda";
    std::vector<TrainResult> rs = runRanks(2, c);
    EXPECT_FALSE(rs[0].ok);
    EXPECT_NE(rs[0].error.find("--device cuda"), std::string::npos) << rs[0].error;
  }
  {
    Options m = o;
    m.data_dir = "/nonexistent-tutti-data";
    std::vector<TrainResult> rs = runRanks(2, m, nullptr);
    for (auto& r : rs) {
      EXPECT_FALSE(r.ok);
      EXPECT_NE(r.error.find("/nonexistent-tutti-data/train-images-idx3-ubyte.gz"),
                std::string::npos)
          << r.error;
    }
  }
  {
    Dataset tiny = data();
    tiny.train.count = 40;
    std::vector<TrainResult> rs = runRanks(2, o, &tiny);
    EXPECT_FALSE(rs[1].ok);
    EXPECT_NE(rs[1].error.find("fewer than one global batch of 64"), std::string::npos)
        << rs[1].error;
  }
}

// Flips the bits of mask in the byte at offset of the file.
void flipBits(const std::string& path, std::streamoff offset, char mask) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c = char(c ^ mask);
  f.seekp(offset);
  f.write(&c, 1);
}

TEST(Trainer, BadCheckpointsAreRefusedOnEveryRank) {
  const std::string path = ::testing::TempDir() + "/tutti_ck_bad";
  Options o = quiet();
  o.max_steps = 2;
  o.checkpoint = path;
  expectAllOk(runRanks(2, o));
  Options r = quiet();
  r.resume = path;
  {
    // Another model shape.
    Options h = r;
    h.hidden = {64, 32};
    std::vector<TrainResult> rs = runRanks(2, h);
    EXPECT_FALSE(rs[0].ok);
    EXPECT_NE(rs[0].error.find("holds an MLP 784-256-128-10, this run builds 784-64-32-10"),
              std::string::npos)
        << rs[0].error;
    EXPECT_FALSE(rs[1].ok);
    EXPECT_NE(rs[1].error.find("rank 0 could not load the checkpoint"), std::string::npos);
  }
  {
    // The training set's size is recorded (a resume warns where it differs: the step's place
    // in the epoch depends on it), and the header is under the checksum: a flipped bit in
    // the step is caught, not resumed from.
    Checkpoint ck;
    std::string err;
    ASSERT_TRUE(loadCheckpoint(path, &ck, &err)) << err;
    EXPECT_EQ(ck.train_samples, data().train.count);
    EXPECT_EQ(ck.step, 2);
    flipBits(path, 16, 0x01);  // the step: after the magic (8), version (4), layer count (4)
    EXPECT_FALSE(loadCheckpoint(path, &ck, &err));
    EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
    flipBits(path, 16, 0x01);
    ASSERT_TRUE(loadCheckpoint(path, &ck, &err)) << err;
    EXPECT_EQ(ck.step, 2);
  }
  {
    // One flipped byte in the parameters.
    flipBits(path, 200, 0x10);
    std::vector<TrainResult> rs = runRanks(2, r);
    EXPECT_FALSE(rs[0].ok);
    EXPECT_NE(rs[0].error.find("checksum mismatch"), std::string::npos) << rs[0].error;
    EXPECT_FALSE(rs[1].ok);
  }
  {
    // Truncated.
    ASSERT_EQ(truncate(path.c_str(), 100), 0);
    Checkpoint ck;
    std::string err;
    EXPECT_FALSE(loadCheckpoint(path, &ck, &err));
    EXPECT_NE(err.find("truncated"), std::string::npos) << err;
  }
  remove(path.c_str());
}

TEST(Trainer, GradientBucketsCoverTheBufferInReverseLayerOrder) {
  Mlp m({784, 256, 128, 10}, 1);
  const auto& L = m.layers();
  auto check = [&](size_t cap, std::vector<int> first_layers) {
    std::vector<Bucket> b = makeBuckets(L, cap);
    ASSERT_EQ(b.size(), first_layers.size()) << "cap " << cap;
    size_t end = m.numParams();
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(b[i].first_layer, first_layers[i]);
      EXPECT_EQ(b[i].offset + b[i].count, end) << "bucket " << i << " is not contiguous";
      EXPECT_EQ(b[i].offset, L[size_t(b[i].first_layer)].weight);
      end = b[i].offset;
    }
    EXPECT_EQ(end, 0u);
  };
  check(256 * 1024, {1, 0});  // layers 2+1 (134 KiB), then layer 0 (785 KiB)
  check(1, {2, 1, 0});
  check(size_t(1) << 30, {0});
}

TEST(Trainer, Bf16ConversionRoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(-2.0f), 0xc000);
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(floatToBf16(1.00390625f), 0x3f80);
  EXPECT_EQ(floatToBf16(1.01171875f), 0x3f82);  // 1 + 3 * 2^-8: halfway, rounds up to even
  EXPECT_EQ(floatToBf16(1.0f + 1.5f / 256), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16ToFloat(floatToBf16(NAN))));
  EXPECT_EQ(bf16ToFloat(floatToBf16(3.140625f)), 3.140625f);
}

void writeGz(const std::string& path, const std::vector<unsigned char>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), unsigned(bytes.size())), int(bytes.size()));
  gzclose(f);
}

TEST(Trainer, IdxReaderNamesWhatIsWrong) {
  const std::string p = ::testing::TempDir() + "/tutti_idx_test.gz";
  Split s;
  std::string err;
  writeGz(p, {0, 0, 8, 1, 0, 0, 0, 2, 3, 9});  // labels file with 2 labels
  ASSERT_TRUE(readIdxLabels(p, &s, &err)) << err;
  EXPECT_EQ(s.labels, (std::vector<uint8_t>{3, 9}));
  EXPECT_FALSE(readIdxImages(p, &s, &err));
  EXPECT_NE(err.find("magic 0x00000801, expected 0x00000803"), std::string::npos) << err;
  writeGz(p, {0, 0, 8, 1, 0, 0, 0, 3, 3, 9});  // says 3, holds 2
  EXPECT_FALSE(readIdxLabels(p, &s, &err));
  EXPECT_NE(err.find("cannot read 3 labels"), std::string::npos) << err;
  writeGz(p, {0, 0, 8, 1, 0, 0, 0, 1, 12});
  EXPECT_FALSE(readIdxLabels(p, &s, &err));
  EXPECT_NE(err.find("label 12 of sample 0"), std::string::npos) << err;
  writeGz(p, {0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 2, 10, 20, 30, 40});
  ASSERT_TRUE(readIdxImages(p, &s, &err)) << err;
  EXPECT_EQ(s.count, 1);
  EXPECT_EQ(s.pixels, (std::vector<uint8_t>{10, 20, 30, 40}));
  remove(p.c_str());
}

// OpenBLAS takes a CPU model it does not know for a generic pre-AVX core; tutti-train then
// names the widest kernels the CPU runs, and leaves a core OpenBLAS knows as it is.
TEST(Trainer, AGenericBlasCoreGivesWayToTheWidestKernelsTheCpuRuns) {
  CpuVectors none, avx, avx2, avx512;
  avx.avx = true;
  avx2.avx = avx2.avx2_fma = true;
  avx512.avx = avx512.avx2_fma = avx512.avx512 = true;
  for (const char* generic : {"Prescott", "Core2", "Nehalem", "Unknown", "Opteron_SSE3"}) {
    EXPECT_EQ(betterBlasCore(generic, avx512), "SKYLAKEX") << generic;
    EXPECT_EQ(betterBlasCore(generic, avx2), "HASWELL") << generic;
    EXPECT_EQ(betterBlasCore(generic, avx), "SANDYBRIDGE") << generic;
    EXPECT_EQ(betterBlasCore(generic, none), "") << generic;
  }
  EXPECT_EQ(betterBlasCore("PRESCOTT", avx512), "SKYLAKEX");  // case as OPENBLAS_CORETYPE's
  for (const char* known : {"Haswell", "SkylakeX", "Cooperlake", "Zen", "Sandybridge", ""}) {
    EXPECT_EQ(betterBlasCore(known, avx512), "") << known;
  }
}

TEST(Trainer, OptionsAreParsedAndBadOnesNamed) {
  auto parse = [](std::vector<const char*> args, Options* o, std::string* err) {
    args.insert(args.begin(), "tutti-train");
    return parseOptions(int(args.size()), const_cast<char**>(args.data()), o, err);
  };
  Options o;
  std::string err;
  ASSERT_EQ(parse({"--epochs", "5", "--batch", "256", "--grad-dtype", "bf16", "--hidden",
                   "300,100,50", "--accum", "2", "--no-overlap", "--lr", "0.1"},
                  &o, &err),
            0)
      << err;
  EXPECT_EQ(o.epochs, 5);
  EXPECT_EQ(o.batch, 256);
  EXPECT_EQ(o.grad_dtype, ncclBfloat16);
  EXPECT_EQ(o.hidden, (std::vector<int>{300, 100, 50}));
  EXPECT_EQ(o.accum, 2);
  EXPECT_FALSE(o.overlap);
  EXPECT_FALSE(o.overlap_auto);
  ASSERT_EQ(parse({"--overlap", "on"}, &o, &err), 0) << err;
  EXPECT_TRUE(o.overlap);
  EXPECT_FALSE(o.overlap_auto);
  EXPECT_EQ(parse({"--overlap", "sometimes"}, &o, &err), -1);
  EXPECT_EQ(err, "--overlap sometimes: expected on, off or auto");
  EXPECT_DOUBLE_EQ(o.lr, 0.1);
  EXPECT_EQ(parse({"--help"}, &o, &err), 1);
  EXPECT_EQ(parse({"--epochs", "0"}, &o, &err), -1);
  EXPECT_EQ(err, "--epochs 0: expected an integer from 1");
  EXPECT_EQ(parse({"--grad-dtype", "fp8"}, &o, &err), -1);
  EXPECT_EQ(err, "--grad-dtype fp8: expected fp32 or bf16");
  EXPECT_EQ(parse({"--hidden", "256,,3"}, &o, &err), -1);
  EXPECT_EQ(parse({"--frobnicate", "1"}, &o, &err), -1);
  EXPECT_EQ(err, "unknown option --frobnicate (see --help)");
  EXPECT_EQ(parse({"--batch"}, &o, &err), -1);
  EXPECT_EQ(err, "--batch needs a value");
  EXPECT_EQ(parse({"--verbose"}, &o, &err), -1);  // last on the line: still unknown, not "needs"
  EXPECT_EQ(err, "unknown option --verbose (see --help)");
  Options fresh;
  EXPECT_EQ(parse({"--save-every", "10"}, &fresh, &err), -1);
  EXPECT_EQ(err, "--save-every needs --checkpoint PATH (where to save)");
  Options fresh2;
  EXPECT_EQ(parse({"--auto-resume"}, &fresh2, &err), -1);
  EXPECT_EQ(err, "--auto-resume needs --checkpoint PATH (where to save, and to resume from)");
  Options fresh3;
  EXPECT_EQ(parse({"--auto-resume", "--checkpoint", "a.ck", "--resume", "b.ck"}, &fresh3, &err),
            -1);
  EXPECT_NE(err.find("--auto-resume and --resume b.ck both say where to resume from"),
            std::string::npos)
      << err;
  Options fresh4;
  ASSERT_EQ(parse({"--checkpoint", "a.ck", "--auto-resume"}, &fresh4, &err), 0) << err;
  EXPECT_TRUE(fresh4.auto_resume);
}

// A checkpoint path that cannot be written fails the run at set-up, on every rank, naming the
// path -- not after the first epoch.
TEST(Trainer, AnUnwritableCheckpointPathFailsAtSetUp) {
  Options o = quiet();
  o.checkpoint = "/nonexistent-dir/ck.bin";
  std::vector<TrainResult> rs = runRanks(2, o);
  for (size_t r = 0; r < rs.size(); ++r) {
    EXPECT_FALSE(rs[r].ok) << r;
    EXPECT_EQ(rs[r].steps, 0) << r;
  }
  EXPECT_NE(rs[0].error.find("cannot write the checkpoint /nonexistent-dir/ck.bin"),
            std::string::npos)
      << rs[0].error;
}

// A checkpoint named without a directory is written (and its directory, the working one,
// synced) where the name says.
TEST(Trainer, ACheckpointWithoutADirectoryIsWrittenInTheWorkingOne) {
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  const std::string dir = ::testing::TempDir();
  ASSERT_EQ(chdir(dir.c_str()), 0) << dir;
  Checkpoint ck;
  ck.dims = {4, 3};
  ck.step = 7;
  ck.global_batch = 8;
  ck.train_samples = 16;
  ck.params.assign(15, 0.5f);
  ck.momentum.assign(15, 0.25f);
  std::string err;
  const bool saved = saveCheckpoint("tutti_ck_here.bin", ck, &err);
  Checkpoint back;
  const bool loaded = saved && loadCheckpoint(dir + "/tutti_ck_here.bin", &back, &err);
  std::remove("tutti_ck_here.bin");
  ASSERT_EQ(chdir(cwd), 0);
  ASSERT_TRUE(saved) << err;
  ASSERT_TRUE(loaded) << err;
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.params, ck.params);
}

// The README's main command in miniature: processes under tutti-run, the real binary, its output.
// The GPU half (--device cuda), where this build has it and a GPU is present.
#define SKIP_WITHOUT_TRAINER_GPU()                                                       \
  do {                                                                                   \
    if (!gpuModelBuilt()) GTEST_SKIP() << "this tutti-train has no GPU half (GPU test)"; \
    if (gpuCount() == 0) GTEST_SKIP() << "no usable GPU (GPU test)";                     \
  } while (0)

Options onGpu() {
  Options o = quiet();
  o.device = "cuda";
  o.max_steps = 4;
  return o;
}

// The GPU half computes what the CPU half does: parameters, momentum, and the epoch's losses
// and test accuracy (its sums are kept on the GPU). A weight decay 100 times the default's,
// so that one applied wrongly moves the parameters past the tolerance.
TEST(TrainerGpu, OneRankOnTheGpuFollowsTheCpuRun) {
  SKIP_WITHOUT_TRAINER_GPU();
  Options o = onGpu();
  o.weight_decay = 0.05;
  std::vector<TrainResult> gpu = runRanks(1, o);
  o.device = "cpu";
  std::vector<TrainResult> cpu = runRanks(1, o);
  expectAllOk(gpu);
  expectAllOk(cpu);
  EXPECT_EQ(gpu[0].steps, 4);
  EXPECT_LT(relativeDiff(cpu[0].params, gpu[0].params, initialParams(o)), kRelTol);
  EXPECT_LT(relativeDiff(cpu[0].momentum, gpu[0].momentum,
                         std::vector<float>(cpu[0].momentum.size(), 0.0f)),
            kRelTol);
  ASSERT_EQ(gpu[0].epochs.size(), 1u);
  ASSERT_EQ(cpu[0].epochs.size(), 1u);
  const EpochStats &g = gpu[0].epochs[0], &c = cpu[0].epochs[0];
  EXPECT_NEAR(g.train_loss, c.train_loss, 1e-3 * c.train_loss);
  EXPECT_NEAR(g.train_acc, c.train_acc, 2.0 / 256);  // 4 x 64 samples
  EXPECT_NEAR(g.test_loss, c.test_loss, 1e-3 * c.test_loss);
  EXPECT_NEAR(g.test_acc, c.test_acc, 2.0 / 500);  // a sample or two on a knife's edge
}

class TrainerGpuRanks : public ::testing::TestWithParam<int> {};

// N ranks (on one GPU when there is one) with per-rank batch b equal 1 rank with batch N*b:
// the gradient all-reduce on device buffers averages, and the shards are disjoint.
TEST_P(TrainerGpuRanks, NRanksWithBatchBEqualOneRankWithBatchNB) {
  SKIP_WITHOUT_TRAINER_GPU();
  const int n = GetParam();
  Options o = onGpu();
  std::vector<TrainResult> one = runRanks(1, o);
  std::vector<TrainResult> many = runRanks(n, o);
  expectAllOk(one);
  expectAllOk(many);
  expectReplicasIdentical(many);
  EXPECT_LT(relativeDiff(one[0].params, many[0].params, initialParams(o)), kRelTol);
}

INSTANTIATE_TEST_SUITE_P(Trainer, TrainerGpuRanks, ::testing::Values(2, 4));

// As on the CPU: buckets all-reduced on the communication stream while backward goes on give
// the bits of buckets all-reduced after it (a bucket started before its layers' gradients were
// final, or an optimizer step before the last all-reduce, would not).
TEST(TrainerGpu, OverlappedBucketsGiveTheSameBitsAsAllReduceAfterBackward) {
  SKIP_WITHOUT_TRAINER_GPU();
  expectOverlapGivesTheSameBits(onGpu());
}

TEST(TrainerGpu, AccumulationBf16AndResumeOnTheGpu) {
  SKIP_WITHOUT_TRAINER_GPU();
  Options o = onGpu();
  const std::vector<float> init = initialParams(o);
  std::vector<TrainResult> whole = runRanks(2, o);  // 2 ranks x 32 samples
  expectAllOk(whole);
  {  // 2 ranks x 2 micro-batches of 16: the same steps
    Options a = o;
    a.accum = 2;
    std::vector<TrainResult> accum = runRanks(2, a);
    expectAllOk(accum);
    EXPECT_LT(relativeDiff(whole[0].params, accum[0].params, init), kRelTol);
  }
  {  // bf16 on the wire: rounded, still close, replicas still identical
    Options b = o;
    b.grad_dtype = ncclBfloat16;
    std::vector<TrainResult> bf16 = runRanks(2, b);
    expectAllOk(bf16);
    expectReplicasIdentical(bf16);
    EXPECT_GT(maxAbsDiff(whole[0].params, bf16[0].params), 0.0) << "bf16 gradients not rounded";
    EXPECT_LT(relativeDiff(whole[0].params, bf16[0].params, init), 0.05);
  }

  // Two steps, a checkpoint, two more from it: the four-step trajectory.
  const std::string ck = ::testing::TempDir() + "tutti_gpu_resume.ckpt";
  Options first = o;
  first.max_steps = 2;
  first.checkpoint = ck;
  expectAllOk(runRanks(2, first));
  Options second = o;
  second.resume = ck;
  std::vector<TrainResult> resumed = runRanks(2, second);
  expectAllOk(resumed);
  EXPECT_EQ(resumed[0].steps, 4);
  EXPECT_LT(relativeDiff(whole[0].params, resumed[0].params, init), 1e-5);
  std::remove(ck.c_str());
}

// The real program under real launchers: tutti-run, and Open MPI's mpirun where it is installed
// (scripts/test installs it), which on one host needs no rendezvous address.
TEST(TrainerProcesses, LearnsUnderTuttiRunAndMpirun) {
  const std::string args = " --epochs 2 --train-limit 8000 --test-limit 2000";
  std::vector<std::string> cmds = {std::string(TUTTI_RUN_BIN) + " -n 2 " + TUTTI_TRAIN_BIN + args};
  if (tutti::test::runShell("command -v mpirun").exitCode == 0) {
    cmds.push_back(
        "env -u NCCL_COMM_ID -u MASTER_ADDR -u TUTTI_PORT mpirun --allow-run-as-root "
        "--oversubscribe -np 3 " +
        std::string(TUTTI_TRAIN_BIN) + args + " --batch 96");
  } else {
    printf("no mpirun here: tutti-run alone\n");
  }
  for (const std::string& cmd : cmds) {
    const tutti::test::RunResult r = tutti::test::runShell(cmd);
    const std::string& out = r.output;
    ASSERT_EQ(r.exitCode, 0) << cmd << "\n" << out;
    const bool mpi = cmd.find("mpirun") != std::string::npos;
    EXPECT_NE(out.find(mpi ? "3 CPU ranks" : "2 CPU ranks"), std::string::npos) << cmd << "\n"
                                                                                << out;
    std::regex line(R"(epoch (\d)/2 .* train loss ([0-9.]+) .* test loss [0-9.]+ acc ([0-9.]+)%)");
    std::vector<double> loss, acc;
    for (std::sregex_iterator it(out.begin(), out.end(), line), end; it != end; ++it) {
      loss.push_back(std::stod((*it)[2]));
      acc.push_back(std::stod((*it)[3]));
    }
    ASSERT_EQ(loss.size(), 2u) << "only rank 0 reports, once an epoch\n" << cmd << "\n" << out;
    EXPECT_LT(loss[1], loss[0]) << cmd << "\n" << out;
    EXPECT_GT(acc[1], 70.0) << cmd << "\n" << out;  // chance is 10%
    if (!mpi) EXPECT_NE(out.find("[rank 0] epoch 2/2"), std::string::npos) << out;
  }
}

// A job that tutti-run starts again after a rank failed (--max-restarts, as torchrun's) picks
// up its last checkpoint with --auto-resume and ends where an uninterrupted run does, bit for bit
// (tests/launch/torchrun.sh does the same under a real torchrun).
TEST(TrainerProcesses, ARestartedJobEndsWhereAnUninterruptedOneDoes) {
  const std::string dir = ::testing::TempDir();
  const std::string straight = dir + "/tutti_ck_restart_straight",
                    restarted = dir + "/tutti_ck_restarted";
  std::remove(restarted.c_str());
  const std::string args =
      " --epochs 2 --batch 64 --train-limit 2000 --test-limit 500 --save-every 5";
  const tutti::test::RunResult a = tutti::test::runShell(
      std::string(TUTTI_RUN_BIN) + " -n 2 " + TUTTI_TRAIN_BIN + args + " --checkpoint " + straight);
  ASSERT_EQ(a.exitCode, 0) << a.output;
  const tutti::test::RunResult b = tutti::test::runShell(
      "TUTTI_TRAINER_FAIL_AT=1:12 " + std::string(TUTTI_RUN_BIN) + " -n 2 --max-restarts 1 " +
      TUTTI_TRAIN_BIN + args + " --checkpoint " + restarted + " --auto-resume");
  ASSERT_EQ(b.exitCode, 0) << b.output;
  for (const std::string& want :
       {"no checkpoint at " + restarted + " yet: starting afresh",
        std::string("rank 1: failed at step 12 as TUTTI_TRAINER_FAIL_AT asked"),
        std::string("starting all 2 rank(s) again (restart 1 of 1)"),
        "resumed from " + restarted + " at step 10", std::string("[rank 0] epoch 2/2")}) {
    EXPECT_NE(b.output.find(want), std::string::npos) << want << "\n" << b.output;
  }
  Checkpoint ka, kb;
  std::string err;
  ASSERT_TRUE(loadCheckpoint(straight, &ka, &err)) << err;
  ASSERT_TRUE(loadCheckpoint(restarted, &kb, &err)) << err;
  EXPECT_EQ(kb.step, ka.step);
  EXPECT_EQ(kb.params, ka.params);
  EXPECT_EQ(kb.momentum, ka.momentum);
  std::remove(straight.c_str());
  std::remove(restarted.c_str());
}

// An error every rank makes alike is printed once, not once per rank: by the one process of
// --threads, and by rank 0 alone of tutti-run's processes.
TEST(TrainerProcesses, AnErrorEveryRankMakesIsPrintedOnce) {
  const std::string args = " --batch 64 --max-steps 1 --train-limit 256 --test-limit 64";
  for (const std::string& cmd : {std::string(TUTTI_TRAIN_BIN) + " --threads 3" + args,
                                 std::string(TUTTI_RUN_BIN) + " -n 3 " + TUTTI_TRAIN_BIN + args}) {
    const tutti::test::RunResult r = tutti::test::runShell(cmd);
    const std::string& out = r.output;
    EXPECT_NE(r.exitCode, 0) << cmd << "\n" << out;
    size_t count = 0;
    for (size_t at = out.find("is not divisible by 3 ranks"); at != std::string::npos;
         at = out.find("is not divisible by 3 ranks", at + 1)) {
      ++count;
    }
    EXPECT_EQ(count, 1u) << cmd << "\n" << out;
  }
}

// A rank process runs the widest BLAS kernels its CPU has, also where OpenBLAS does not know the
// CPU (Debian 12's OpenBLAS takes a 5th-generation Xeon, family 6 model 207, for a Prescott, 3x
// slower: tutti-train runs itself again with OPENBLAS_CORETYPE set), under tutti-run too; a
// core the user sets is kept.
TEST(TrainerProcesses, RanksRunTheWidestBlasKernelsTheCpuHas) {
  // tutti-train links the BLAS this test does (the GPU machines' build takes netlib's).
  if (blasCoreName().empty()) GTEST_SKIP() << "the BLAS is not OpenBLAS";
  const std::string args = " --epochs 1 --batch 64 --train-limit 256 --test-limit 64";
  const std::regex line(R"(BLAS: OpenBLAS, (\w+) kernels)");
  for (const std::string& cmd :
       {"env -u OPENBLAS_CORETYPE -u TUTTI_TRAIN_BLAS_CHOSE " + std::string(TUTTI_TRAIN_BIN) + args,
        "env -u OPENBLAS_CORETYPE -u TUTTI_TRAIN_BLAS_CHOSE " + std::string(TUTTI_RUN_BIN) +
            " -n 2 " + TUTTI_TRAIN_BIN + args}) {
    const tutti::test::RunResult r = tutti::test::runShell(cmd);
    ASSERT_EQ(r.exitCode, 0) << cmd << "\n" << r.output;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(r.output, m, line)) << cmd << "\n" << r.output;
    EXPECT_EQ(betterBlasCore(m[1], cpuVectors()), "")
        << "OpenBLAS runs " << m[1] << " kernels on a CPU with AVX\n"
        << cmd << "\n"
        << r.output;
    EXPECT_NE(r.output.find("epoch 1/1"), std::string::npos) << cmd << "\n" << r.output;
  }
  const tutti::test::RunResult r = tutti::test::runShell("env OPENBLAS_CORETYPE=PRESCOTT " +
                                                         std::string(TUTTI_TRAIN_BIN) + args);
  ASSERT_EQ(r.exitCode, 0) << r.output;
  EXPECT_NE(r.output.find("BLAS: OpenBLAS, Prescott kernels (OPENBLAS_CORETYPE=PRESCOTT)"),
            std::string::npos)
      << r.output;
}

// A rank that fails alone in mid-step (TUTTI_TRAINER_FAIL_AT; on the GPU, a CUDA error) must
// not leave the other threads waiting for it until TUTTI_TIMEOUT (600 s here, beyond this
// test's limit): tutti-train aborts every communicator at the first failure.
TEST(TrainerThreads, ARankThatFailsAloneStopsTheOthers) {
  const tutti::test::RunResult r = tutti::test::runShell(
      std::string("TUTTI_TIMEOUT=600 TUTTI_TRAINER_FAIL_AT=2:3 ") + TUTTI_TRAIN_BIN +
      " --threads 4 --epochs 1 --train-limit 4000 --test-limit 500");
  const std::string& out = r.output;
  ASSERT_NE(r.exitCode, -1) << "killed by a signal\n" << out;  // -1: not a normal exit
  EXPECT_EQ(r.exitCode, 1) << out;
  EXPECT_NE(out.find("tutti-train: rank 2: failed at step 3 as TUTTI_TRAINER_FAIL_AT asked"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("epoch 1/1"), std::string::npos) << "the epoch cannot have ended\n" << out;
}

}  // namespace
}  // namespace trainer
