// The trainer's GPU half (--device cuda) against its CPU half and against itself: ranks as
// threads on the one GPU. Skips where the build has no GPU half or no GPU is present (ctest
// label gpu).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "examples/trainer/gpu_model.h"
#include "trainer/trainer_support.h"

namespace trainer {
namespace {

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

  // Two steps, a checkpoint, two more from it: the four-step trajectory, on every rank (a rank
  // left with zero momentum, not rank 0's, drifts from step 3 on).
  const std::string ck = ::testing::TempDir() + "tutti_gpu_resume.ckpt";
  auto run = [&](int64_t steps, const std::string& resume, bool autoResume) {
    Options r = o;
    if (steps >= 0) r.max_steps = steps;  // else o's 4 (-1 would be every epoch's steps)
    r.checkpoint = ck;
    r.resume = resume;
    r.auto_resume = autoResume;
    std::vector<TrainResult> rs = runRanks(2, r);
    expectAllOk(rs);
    expectReplicasIdentical(rs);
    EXPECT_EQ(rs[0].steps, steps < 0 ? 4 : steps);
    return rs;
  };
  // --resume; then --auto-resume: no file yet, so every rank starts afresh; then every rank
  // resumes from the file the first attempt left.
  for (bool autoResume : {false, true}) {
    std::remove(ck.c_str());
    run(2, "", autoResume);
    std::vector<TrainResult> resumed = run(-1, autoResume ? "" : ck, autoResume);
    EXPECT_LT(relativeDiff(whole[0].params, resumed[0].params, init), 1e-5) << autoResume;
  }
  std::remove(ck.c_str());
}

}  // namespace
}  // namespace trainer
