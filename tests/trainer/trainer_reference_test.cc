// The trainer against references of its own making rather than against itself: the MLP's
// gradients against finite differences of its loss, two optimizer steps against torch.optim.SGD's
// formula computed here in double, the test metrics against an evaluation of the final
// parameters here, and the communication share against the part of it backward did not hide.
// (The equivalence tests in trainer_test.cc compare the trainer with itself, so a mistake both
// paths share -- a sign, a momentum variant, a ReLU mask -- would pass them.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "examples/trainer/dataset.h"
#include "examples/trainer/mlp.h"
#include "examples/trainer/rng.h"
#include "trainer/trainer_support.h"

namespace trainer {
namespace {

// d(sum of losses)/d(param) from backward() against central differences of forward(), every
// parameter of a small MLP with two hidden layers.
TEST(TrainerReference, MlpGradientsMatchFiniteDifferences) {
  const std::vector<int> dims = {6, 5, 4, 10};
  const int n = 4;
  Mlp m(dims, n);
  std::vector<float> p(m.numParams());
  Mlp::initParams(m.layers(), 7, p.data());
  Rng rng(11, 0);
  for (float& v : p) v += 0.05f * (float(rng.below(2001)) / 1000.0f - 1.0f);  // biases too
  std::vector<float> x(size_t(n) * size_t(dims[0]));
  for (float& v : x) v = float(rng.below(2001)) / 1000.0f - 1.0f;
  const std::vector<uint8_t> labels = {3, 0, 9, 3};
  int correct = 0;
  m.forward(p.data(), x.data(), labels.data(), n, &correct);
  std::vector<float> g(p.size(), 0.0f);
  m.backward(p.data(), 1.0f, g.data(), {});
  const float h = 1e-2f;
  int bad = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const float keep = p[i];
    p[i] = keep + h;
    const double up = m.forward(p.data(), x.data(), labels.data(), n, &correct);
    p[i] = keep - h;
    const double down = m.forward(p.data(), x.data(), labels.data(), n, &correct);
    p[i] = keep;
    const double fd = (up - down) / (2.0 * double(h));
    if (std::fabs(fd - g[i]) > 2e-3 + 2e-2 * std::fabs(fd)) {
      ++bad;
      ADD_FAILURE() << "parameter " << i << ": backward " << g[i] << ", finite difference " << fd;
    }
  }
  EXPECT_EQ(bad, 0);
}

// One rank, two steps: torch.optim.SGD (momentum, weight decay, no dampening, not Nesterov):
// d = g + wd p; buf = d at the first step, mu buf + d after; p -= lr buf. The gradient is the
// mean over the step's batch, the epoch permutation's first 64 and next 64 samples.
TEST(TrainerReference, TwoStepsFollowTorchsSgdFormula) {
  Options o = quiet();
  o.max_steps = 2;
  o.momentum = 0.9;
  o.weight_decay = 0.01;  // large enough that a missing or misapplied decay shows
  std::vector<TrainResult> rs = runRanks(1, o);
  expectAllOk(rs);
  const std::vector<int> dims = {784, o.hidden[0], o.hidden[1], 10};
  Mlp m(dims, o.batch);
  std::vector<double> p;
  for (float v : initialParams(o)) p.push_back(v);
  std::vector<double> buf(p.size(), 0.0);
  const std::vector<int> perm = epochPermutation(data().train.count, o.seed, 0);
  std::vector<float> x(size_t(o.batch) * 784), pf(p.size()), g(p.size());
  std::vector<uint8_t> y(size_t(o.batch));
  for (int step = 0; step < 2; ++step) {
    gatherBatch(data().train, perm.data() + step * o.batch, o.batch, x.data(), y.data());
    for (size_t i = 0; i < p.size(); ++i) pf[i] = float(p[i]);
    std::fill(g.begin(), g.end(), 0.0f);
    int correct = 0;
    m.forward(pf.data(), x.data(), y.data(), o.batch, &correct);
    m.backward(pf.data(), 1.0f / float(o.batch), g.data(), {});
    for (size_t i = 0; i < p.size(); ++i) {
      const double d = double(g[i]) + o.weight_decay * p[i];
      buf[i] = step == 0 ? d : o.momentum * buf[i] + d;
      p[i] -= o.lr * buf[i];
    }
  }
  std::vector<float> ref(p.begin(), p.end()), refBuf(buf.begin(), buf.end());
  const std::vector<float> init = initialParams(o);
  EXPECT_LT(norm(ref, rs[0].params) / norm(ref, init), 1e-4);
  std::vector<float> zero(buf.size(), 0.0f);
  EXPECT_LT(norm(refBuf, rs[0].momentum) / norm(refBuf, zero), 1e-4);
}

// Test loss and accuracy are summed over ranks and divided by the whole count: 5 test samples
// on 4 ranks (2, 1, 1, 1 each), where a mean of the ranks' means would be far off, give what
// the final parameters give on those samples evaluated here.
TEST(TrainerReference, TestMetricsOverAnUnevenSplitAreTheWholeSetsMeans) {
  Dataset small = data();
  small.test.count = 5;
  Options o = quiet();
  o.epochs = 1;
  o.max_steps = 2;
  std::vector<TrainResult> rs = runRanks(4, o, &small);
  expectAllOk(rs);
  ASSERT_EQ(rs[0].epochs.size(), 1u);
  Mlp m({784, o.hidden[0], o.hidden[1], 10}, 5);
  std::vector<float> x(5 * 784);
  std::vector<uint8_t> y(5);
  const int idx[5] = {0, 1, 2, 3, 4};
  gatherBatch(small.test, idx, 5, x.data(), y.data());
  int correct = 0;
  const double loss = m.forward(rs[0].params.data(), x.data(), y.data(), 5, &correct) / 5;
  for (size_t r = 0; r < rs.size(); ++r) {
    EXPECT_NEAR(rs[r].epochs[0].test_loss, loss, 1e-5 * loss) << "rank " << r;
    EXPECT_DOUBLE_EQ(rs[r].epochs[0].test_acc, correct / 5.0) << "rank " << r;
  }
}

// The part of communication backward did not hide is a part of communication: its share never
// exceeds the communication share (3 ranks, a bucket per layer, overlapped and not).
TEST(TrainerReference, ExposedCommunicationIsPartOfCommunication) {
  Dataset small = data();
  small.train.count = 480;  // 5 steps of 96 an epoch
  for (bool overlap : {true, false}) {
    Options o = quiet();
    o.batch = 96;
    o.epochs = 2;
    o.bucket_bytes = 1;
    o.overlap = overlap;
    std::vector<TrainResult> rs = runRanks(3, o, &small);
    ASSERT_EQ(rs[0].epochs.size(), 2u);
    expectAllOk(rs);
    for (const EpochStats& e : rs[0].epochs) {
      EXPECT_GT(e.comm_share, 0) << "epoch " << e.epoch;
      EXPECT_LE(e.exposed_share, e.comm_share * (1 + 1e-9))
          << "epoch " << e.epoch << (overlap ? ", overlapped" : ", after backward");
    }
  }
}

// DistributedSampler's order: each epoch a permutation of the whole set, a new one every epoch
// (seed + epoch), the same again for the same seed and epoch (so every rank cuts the same order
// into shards, and a resumed run finds it), another for another seed.
TEST(TrainerReference, EachEpochShufflesAfreshAndTheSameSeedRepeats) {
  constexpr int n = 1000;
  auto isPermutation = [](std::vector<int> p) {
    std::sort(p.begin(), p.end());
    for (int i = 0; i < int(p.size()); ++i)
      if (p[size_t(i)] != i) return false;
    return true;
  };
  // Positions where two orders agree: about 1 of n for independent shuffles.
  auto same = [](const std::vector<int>& a, const std::vector<int>& b) {
    int k = 0;
    for (size_t i = 0; i < a.size(); ++i) k += a[i] == b[i];
    return k;
  };
  const std::vector<int> e0 = epochPermutation(n, 42, 0), e1 = epochPermutation(n, 42, 1),
                         e2 = epochPermutation(n, 42, 2), other = epochPermutation(n, 43, 0);
  std::vector<int> identity(n);
  for (int i = 0; i < n; ++i) identity[size_t(i)] = i;
  for (const std::vector<int>* p : {&e0, &e1, &e2, &other}) {
    ASSERT_EQ(p->size(), size_t(n));
    EXPECT_TRUE(isPermutation(*p));
    EXPECT_LT(same(*p, identity), 20);
  }
  EXPECT_EQ(epochPermutation(n, 42, 1), e1);
  EXPECT_LT(same(e0, e1), 20);
  EXPECT_LT(same(e1, e2), 20);
  EXPECT_LT(same(e0, other), 20);
}

}  // namespace
}  // namespace trainer
