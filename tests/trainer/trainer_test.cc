// The trainer's data-parallel semantics, checked against single-rank training, and its parts
// (options, checkpoints, the IDX reader, buckets, bf16, the BLAS core): ranks run as threads
// over real tutti communicators (shm). The GPU half is in trainer_gpu_test.cc, the program
// under launchers in trainer_process_test.cc.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "examples/trainer/blas_core.h"
#include "examples/trainer/checkpoint.h"
#include "examples/trainer/gpu_model.h"
#include "examples/trainer/grad_sync.h"
#include "trainer/trainer_support.h"

namespace trainer {
namespace {

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
    // A corrupt parameter count (2^32) is refused by the file's size, before buffers that large
    // are allocated.
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = 1ull << 32;
    f.seekp(40);  // magic, version, widths, step, batch, seed: 8 + 4 + 4 + 8 + 8 + 8
    f.write(reinterpret_cast<const char*>(&huge), sizeof huge);
    f.close();
    Checkpoint ck;
    std::string err;
    EXPECT_FALSE(loadCheckpoint(path, &ck, &err));
    EXPECT_NE(err.find("parameters) makes"), std::string::npos) << err;
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
  // NaNs whose payload rounding would carry into the exponent (to infinity, or to -0 past
  // the sign) stay NaN, of their sign.
  for (uint32_t bits : {0x7fffffffu, 0x7f800001u, 0xffffffffu, 0xff800001u}) {
    float f;
    memcpy(&f, &bits, 4);
    const float back = bf16ToFloat(floatToBf16(f));
    EXPECT_TRUE(std::isnan(back)) << std::hex << bits;
    EXPECT_EQ(std::signbit(back), std::signbit(f)) << std::hex << bits;
  }
  EXPECT_TRUE(std::isinf(bf16ToFloat(floatToBf16(FLT_MAX))));  // past bf16's largest: infinity
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
  // 2^24 images of 4096 x 4096 (2^48 bytes) announced, 4 bytes there: an error at the end of
  // the data, not an allocation of all of it.
  writeGz(p, {0, 0, 8, 3, 1, 0, 0, 0, 0, 0, 16, 0, 0, 0, 16, 0, 10, 20, 30, 40});
  EXPECT_FALSE(readIdxImages(p, &s, &err));
  EXPECT_NE(err.find("cannot read 16777216 images"), std::string::npos) << err;
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
  ASSERT_EQ(parse({"--epochs=7", "--lr=0.25"}, &o, &err), 0) << err;  // argparse's form too
  EXPECT_EQ(o.epochs, 7);
  EXPECT_DOUBLE_EQ(o.lr, 0.25);
  EXPECT_EQ(parse({"--epochs="}, &o, &err), -1);
  EXPECT_EQ(parse({"--resume="}, &o, &err), -1);  // --resume=$UNSET: not "start afresh"
  EXPECT_EQ(err, "--resume= has no value");
  EXPECT_EQ(parse({"--frobnicate=1"}, &o, &err), -1);
  EXPECT_EQ(err, "unknown option --frobnicate (see --help)");
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

// A temporary file a crashed save left under this pid (a container restarted with a fresh
// pid namespace gives rank 0 the same pid) is overwritten, not a reason to refuse the path.
TEST(Trainer, AStaleTemporaryFileOfThisPidDoesNotBlockTheCheckpoint) {
  const std::string path = ::testing::TempDir() + "/tutti_ck_stale";
  const std::string stale = path + ".tmp." + std::to_string(getpid());
  { std::ofstream(stale) << "half a checkpoint"; }
  Options o = quiet();
  o.max_steps = 1;
  o.checkpoint = path;
  expectAllOk(runRanks(2, o));
  Checkpoint ck;
  std::string err;
  EXPECT_TRUE(loadCheckpoint(path, &ck, &err)) << err;
  EXPECT_EQ(ck.step, 1);
  remove(path.c_str());
  remove(stale.c_str());
}

// A checkpoint records the optimizer's settings and the gradients' wire type; a resume with
// others says that the trajectory is not the same one (and one with the same says nothing).
TEST(Trainer, AResumeWithOtherOptimizerSettingsWarns) {
  const std::string path = ::testing::TempDir() + "/tutti_ck_settings";
  Options o = quiet();
  o.max_steps = 2;
  o.checkpoint = path;
  expectAllOk(runRanks(2, o));
  Checkpoint ck;
  std::string err;
  ASSERT_TRUE(loadCheckpoint(path, &ck, &err)) << err;
  EXPECT_TRUE(ck.has_settings);
  EXPECT_DOUBLE_EQ(ck.lr, o.lr);
  EXPECT_DOUBLE_EQ(ck.momentum_factor, o.momentum);
  EXPECT_DOUBLE_EQ(ck.weight_decay, o.weight_decay);
  EXPECT_FALSE(ck.bf16_grads);
  auto resumeOutput = [&](const Options& r) {
    FILE* out = tmpfile();
    Options with = r;
    with.out = out;
    with.checkpoint.clear();
    with.resume = path;
    with.max_steps = 3;
    expectAllOk(runRanks(2, with));
    std::string text(1 << 16, '\0');
    rewind(out);
    text.resize(fread(&text[0], 1, text.size(), out));
    fclose(out);
    return text;
  };
  std::string same = resumeOutput(o);
  EXPECT_EQ(same.find("warning"), std::string::npos) << same;
  Options other = o;
  other.lr = 0.5;
  other.grad_dtype = ncclBfloat16;
  std::string changed = resumeOutput(other);
  EXPECT_NE(changed.find("was written with --lr 0.05 --momentum 0.9 --weight-decay 0.0005 "
                         "--grad-dtype fp32; this run uses --lr 0.5"),
            std::string::npos)
      << changed;
  EXPECT_NE(changed.find("--grad-dtype bf16, so it does not continue the same trajectory"),
            std::string::npos)
      << changed;
  remove(path.c_str());
}

// FNV-1a, the checkpoints' checksum (examples/trainer/checkpoint.cc), to write older versions.
uint64_t fnv1a(uint64_t h, const std::string& bytes) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Checkpoints of versions 1 and 2 (made here from a version 3 one: without the settings after
// the 64-byte header, version 1 also without the training set's size and with the checksum
// over the arrays alone) still load, and resume without a settings warning.
TEST(Trainer, CheckpointsOfVersionsOneAndTwoStillLoad) {
  const std::string path = ::testing::TempDir() + "/tutti_ck_v3";
  Options o = quiet();
  o.max_steps = 2;
  o.checkpoint = path;
  expectAllOk(runRanks(2, o));
  std::string v3;
  {
    std::ifstream f(path, std::ios::binary);
    v3.assign(std::istreambuf_iterator<char>(f), {});
  }
  ASSERT_GT(v3.size(), 96u);
  Checkpoint want;
  std::string err;
  ASSERT_TRUE(loadCheckpoint(path, &want, &err)) << err;
  for (uint32_t version : {1u, 2u}) {
    std::string header = v3.substr(0, 64), arrays = v3.substr(96);
    memcpy(&header[8], &version, 4);
    if (version == 1) memset(&header[52], 0, 4);  // no training set size
    memset(&header[56], 0, 8);
    const uint64_t basis = 0xcbf29ce484222325ull;
    const uint64_t sum = version == 1 ? fnv1a(basis, arrays) : fnv1a(fnv1a(basis, header), arrays);
    memcpy(&header[56], &sum, 8);
    const std::string old = ::testing::TempDir() + "/tutti_ck_v" + std::to_string(version);
    {
      std::ofstream f(old, std::ios::binary);
      f << header << arrays;
    }
    Checkpoint ck;
    ASSERT_TRUE(loadCheckpoint(old, &ck, &err)) << "version " << version << ": " << err;
    EXPECT_FALSE(ck.has_settings);
    EXPECT_EQ(ck.step, 2);
    EXPECT_EQ(ck.params, want.params);
    EXPECT_EQ(ck.momentum, want.momentum);
    EXPECT_EQ(ck.train_samples, version == 1 ? 0 : want.train_samples);
    Options r = quiet();
    r.resume = old;
    r.max_steps = 3;
    std::vector<TrainResult> rs = runRanks(2, r);
    expectAllOk(rs);
    EXPECT_EQ(rs[0].steps, 3);
    remove(old.c_str());
  }
  remove(path.c_str());
}

// More hidden layers than a checkpoint holds fail at set-up, on every rank, when a checkpoint
// is asked for (the first save would otherwise fail after the epoch's work).
TEST(Trainer, MoreLayersThanACheckpointHoldsFailAtSetUp) {
  Options o = quiet();
  o.hidden.assign(kMaxCheckpointLayers - 1, 8);
  o.checkpoint = ::testing::TempDir() + "/tutti_ck_deep";
  std::vector<TrainResult> rs = runRanks(2, o);
  for (size_t r = 0; r < rs.size(); ++r) {
    EXPECT_FALSE(rs[r].ok) << r;
    EXPECT_NE(rs[r].error.find("a checkpoint holds at most 62 hidden layers; --hidden has 63"),
              std::string::npos)
        << rs[r].error;
  }
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

}  // namespace
}  // namespace trainer
