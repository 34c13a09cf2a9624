#include "examples/trainer/trainer.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "examples/trainer/blas_core.h"
#include "examples/trainer/checkpoint.h"
#include "examples/trainer/gpu_model.h"
#include "examples/trainer/grad_sync.h"
#include "examples/trainer/mlp.h"
#include "examples/trainer/rng.h"

// OpenBLAS's thread control, declared weak so that another BLAS links too.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace trainer {

void setBlasThreads(int n) {
  if (openblas_set_num_threads) openblas_set_num_threads(std::max(1, n));
}

namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

std::string ncclError(const char* what, ncclResult_t rc, ncclComm_t comm) {
  return std::string(what) + " failed: " + ncclGetErrorString(rc) + ": " + ncclGetLastError(comm);
}

// Every rank learns whether all ranks succeeded, so a rank that cannot go on (no data set, a bad
// checkpoint) ends the run everywhere instead of leaving the others waiting in a collective.
// phase: what the ranks were doing ("set-up", "the checkpoint save"), for the messages.
bool allOk(ncclComm_t comm, bool ok, std::string* error, const std::string& phase = "set-up") {
  int32_t flag = ok ? 1 : 0;
  ncclResult_t rc = ncclAllReduce(&flag, &flag, 1, ncclInt32, ncclMin, comm, nullptr);
  if (rc != ncclSuccess) {
    *error = ncclError(("agreeing on " + phase + " (ncclAllReduce)").c_str(), rc, comm);
    return false;
  }
  if (!flag && ok) *error = "another rank failed during " + phase + " (its own message says why)";
  return flag != 0;
}

std::string dimsText(const std::vector<int>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "-" : "") + std::to_string(dims[i]);
  return s;
}

class Run {
 public:
  Run(ncclComm_t comm, const Options& o) : comm_(comm), o_(o) {}
  TrainResult go(const Dataset* data);

 private:
  bool setUp(const Dataset* data);
  bool initState();
  bool step(const std::vector<int>& perm, int64_t index_in_epoch, double* loss, int64_t* right);
  bool stepGpu(const std::vector<int>& perm, int64_t index_in_epoch);
  void gatherMicroBatch(const std::vector<int>& perm, int64_t index_in_epoch, int m);
  bool evaluate(double* loss, int64_t* right, int64_t* count);
  bool finishEpoch(int epoch, int64_t steps, double t_train, double loss, int64_t right,
                   int64_t seen);
  bool save();
  bool write();
  void say(const char* fmt, ...) __attribute__((format(printf, 2, 3)));
  bool fail(std::string why) {
    res_.error = std::move(why);
    return false;
  }

  ncclComm_t comm_;
  const Options& o_;
  TrainResult res_;
  int rank_ = 0, nranks_ = 1;
  Dataset own_data_;
  const Dataset* data_ = nullptr;
  std::unique_ptr<Mlp> model_;
  std::unique_ptr<GradSync> sync_;
  std::unique_ptr<GpuModel> gpu_;  // --device cuda: the model, its state and its all-reduces
  std::vector<float> params_, grads_, momentum_;
  bool momentum_started_ = false;
  int micro_ = 0;  // samples per rank per micro-batch
  int64_t steps_per_epoch_ = 0, total_steps_ = 0, step_ = 0;
  int64_t fail_at_step_ = -1;  // TUTTI_TRAINER_FAIL_AT names this rank: fail at this step
  bool resumed_ = false;       // the run continues a checkpoint (every rank knows)
  std::string resume_from_;    // rank 0: the checkpoint it continues
  std::vector<float> x_;
  std::vector<uint8_t> y_;
  std::vector<int> idx_;
};

void Run::say(const char* fmt, ...) {
  if (rank_ != 0 || !o_.out) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(o_.out, fmt, ap);
  va_end(ap);
  fflush(o_.out);
}

bool Run::setUp(const Dataset* data) {
  ncclResult_t rc;
  if ((rc = ncclCommUserRank(comm_, &rank_)) != ncclSuccess ||
      (rc = ncclCommCount(comm_, &nranks_)) != ncclSuccess) {
    return fail(ncclError("querying the communicator", rc, comm_));
  }
  // A test hook: TUTTI_TRAINER_FAIL_AT=R:S makes rank R fail alone at step S, before its
  // gradients are all-reduced, as a CUDA error in mid-step would (the others are left waiting
  // for it; tutti-train must stop them). A run that resumed from a checkpoint goes past it, as
  // a job restarted after a passing fault would.
  if (const char* f = getenv("TUTTI_TRAINER_FAIL_AT")) {
    int r = -1;
    long long s = -1;
    if (sscanf(f, "%d:%lld", &r, &s) == 2 && r == rank_) fail_at_step_ = s;
  }
  // Checks that every rank makes alike need no agreement round: each one fails by itself.
  if (!o_.checkpoint.empty() && o_.hidden.size() + 2 > kMaxCheckpointLayers) {
    res_.same_everywhere = true;
    return fail("a checkpoint holds at most " + std::to_string(kMaxCheckpointLayers - 2) +
                " hidden layers; --hidden has " + std::to_string(o_.hidden.size()));
  }
  if (o_.batch % (nranks_ * o_.accum) != 0) {
    res_.same_everywhere = true;
    return fail("--batch " + std::to_string(o_.batch) + " is not divisible by " +
                std::to_string(nranks_) + " ranks x " + std::to_string(o_.accum) +
                " accumulation steps");
  }
  micro_ = o_.batch / (nranks_ * o_.accum);
  std::string err;
  bool ok = true;
  if (data) {
    data_ = data;
  } else if (loadDataset(o_.data_dir, o_.train_limit, o_.test_limit, &own_data_, &err)) {
    data_ = &own_data_;
  } else {
    ok = false;
    err += " (Debian: apt-get install dataset-fashion-mnist, or --data DIR)";
  }
  if (ok && data_->train.count < o_.batch) {
    ok = false;
    err = "the training set has " + std::to_string(data_->train.count) +
          " samples, fewer than one global batch of " + std::to_string(o_.batch);
  }
  // A checkpoint that cannot be written is found now, not after the first epoch.
  if (ok && rank_ == 0 && !o_.checkpoint.empty()) ok = checkpointWritable(o_.checkpoint, &err);
  if (!ok) res_.error = "rank " + std::to_string(rank_) + ": " + err;
  if (!allOk(comm_, ok, &err)) return ok ? fail(err) : false;

  std::vector<int> dims = {data_->train.features()};
  dims.insert(dims.end(), o_.hidden.begin(), o_.hidden.end());
  dims.push_back(10);
  // Evaluation runs in batches of up to 1000, training in micro-batches.
  model_ = std::make_unique<Mlp>(dims, std::max(micro_, 1000));
  const size_t n = model_->numParams();
  params_.assign(n, 0.0f);
  grads_.assign(n, 0.0f);
  momentum_.assign(n, 0.0f);
  x_.resize(size_t(std::max(micro_, 1000)) * size_t(dims[0]));
  y_.resize(size_t(std::max(micro_, 1000)));
  idx_.resize(y_.size());
  steps_per_epoch_ = data_->train.count / o_.batch;  // the last partial batch is dropped
  total_steps_ = steps_per_epoch_ * o_.epochs;
  if (o_.max_steps >= 0) total_steps_ = std::min(total_steps_, o_.max_steps);
  // On the GPU the model all-reduces its own buckets: no communication thread here.
  sync_ = std::make_unique<GradSync>(comm_, makeBuckets(model_->layers(), o_.bucket_bytes),
                                     o_.grad_dtype, o_.overlap && o_.device != "cuda");
  if (o_.device == "cuda") {
    gpu_ = GpuModel::create(comm_, model_->layers(), std::max(micro_, 1000), micro_,
                            makeBuckets(model_->layers(), o_.bucket_bytes), o_.grad_dtype,
                            o_.overlap, &err);
    ok = gpu_ != nullptr;
    if (!ok) res_.error = "rank " + std::to_string(rank_) + ": " + err;
    if (!allOk(comm_, ok, &err)) return ok ? fail(err) : false;
  }
  return true;
}

// Rank 0 initialises (or loads a checkpoint) and broadcasts, as DDP does at construction.
// Rank 0 alone looks for the checkpoint: other hosts need not share its disk.
bool Run::initState() {
  const size_t n = params_.size();
  int64_t meta[4] = {1, 0, 0, 0};  // ok, step, momentum started, resumed
  std::string err;
  if (rank_ == 0) {
    resume_from_ = o_.resume;
    struct stat st;
    // --auto-resume starts afresh only where no file is there at all: one it cannot read fails
    // the run, as --resume does, rather than throw away the training it holds.
    if (o_.auto_resume && (::stat(o_.checkpoint.c_str(), &st) == 0 || errno != ENOENT)) {
      resume_from_ = o_.checkpoint;
    }
    meta[3] = resume_from_.empty() ? 0 : 1;
    if (resume_from_.empty()) {
      Mlp::initParams(model_->layers(), o_.seed, params_.data());
    } else {
      const std::string& path = resume_from_;
      Checkpoint ck;
      if (!loadCheckpoint(path, &ck, &err)) {
        meta[0] = 0;
      } else if (ck.dims != model_->dims()) {
        meta[0] = 0;
        err = path + " holds an MLP " + dimsText(ck.dims) + ", this run builds " +
              dimsText(model_->dims()) + " (check --hidden)";
      } else if (ck.params.size() != n || ck.momentum.size() != n) {  // never past the buffers
        meta[0] = 0;
        err = path + " holds " + std::to_string(ck.params.size()) + " parameters and " +
              std::to_string(ck.momentum.size()) + " momentum values; this MLP has " +
              std::to_string(n);
      } else {
        if (ck.global_batch != o_.batch || ck.seed != o_.seed) {
          say("warning: %s was written with --batch %lld --seed %llu; this run uses --batch %d "
              "--seed %llu, so it does not continue the same trajectory\n",
              path.c_str(), (long long)ck.global_batch, (unsigned long long)ck.seed, o_.batch,
              (unsigned long long)o_.seed);
        }
        if (ck.train_samples != 0 && ck.train_samples != data_->train.count) {
          // The step's epoch and place in the shuffle come from the steps per epoch.
          say("warning: %s was written training on %lld samples; this run trains on %d (check "
              "--train-limit and --data), so step %lld falls elsewhere in the data and the run "
              "does not continue the same trajectory\n",
              path.c_str(), (long long)ck.train_samples, data_->train.count, (long long)ck.step);
        }
        const bool bf16 = o_.grad_dtype == ncclBfloat16;
        if (ck.has_settings && (ck.lr != o_.lr || ck.momentum_factor != o_.momentum ||
                                ck.weight_decay != o_.weight_decay || ck.bf16_grads != bf16)) {
          say("warning: %s was written with --lr %g --momentum %g --weight-decay %g --grad-dtype "
              "%s; this run uses --lr %g --momentum %g --weight-decay %g --grad-dtype %s, so it "
              "does not continue the same trajectory\n",
              path.c_str(), ck.lr, ck.momentum_factor, ck.weight_decay,
              ck.bf16_grads ? "bf16" : "fp32", o_.lr, o_.momentum, o_.weight_decay,
              bf16 ? "bf16" : "fp32");
        }
        params_ = std::move(ck.params);
        momentum_ = std::move(ck.momentum);
        meta[1] = ck.step;
        meta[2] = ck.momentum_started;
      }
    }
    if (!meta[0]) res_.error = "rank 0: " + err;
  }
  ncclResult_t rc = ncclBroadcast(meta, meta, 4, ncclInt64, 0, comm_, nullptr);
  if (rc != ncclSuccess) return fail(ncclError("broadcasting the checkpoint header", rc, comm_));
  if (!meta[0]) {
    if (rank_ != 0) return fail("rank 0 could not load the checkpoint (its message says why)");
    return false;
  }
  resumed_ = meta[3] != 0;
  if (gpu_) {
    // Rank 0's state goes up to its GPU and out from there, GPU to GPU. Every rank learns
    // whether every upload worked first: a rank that failed alone would leave the others in the
    // broadcast until TUTTI_TIMEOUT.
    const bool up = gpu_->upload(params_.data(), resumed_ ? momentum_.data() : nullptr, &err);
    if (!up) res_.error = "rank " + std::to_string(rank_) + ": " + err;
    if (!allOk(comm_, up, &err)) return up ? fail(err) : false;
    if (!gpu_->broadcast(resumed_, &err)) return fail("rank " + std::to_string(rank_) + ": " + err);
  } else if ((rc = ncclBroadcast(params_.data(), params_.data(), n, ncclFloat32, 0, comm_,
                                 nullptr)) != ncclSuccess) {
    return fail(ncclError("broadcasting the parameters", rc, comm_));
  }
  if (!gpu_ && resumed_ &&
      (rc = ncclBroadcast(momentum_.data(), momentum_.data(), n, ncclFloat32, 0, comm_, nullptr)) !=
          ncclSuccess) {
    return fail(ncclError("broadcasting the optimizer state", rc, comm_));
  }
  step_ = meta[1];
  momentum_started_ = meta[2] != 0;
  res_.steps = step_;
  return true;
}

// Micro-batch m of this step into x_ / y_. DistributedSampler's shard: rank r takes positions
// r, r + N, r + 2N, ... of the epoch's permutation, and its j-th sample of this micro-batch is
// position base + r + N * j.
void Run::gatherMicroBatch(const std::vector<int>& perm, int64_t index_in_epoch, int m) {
  const int64_t base = index_in_epoch * o_.batch + int64_t(m) * micro_ * nranks_;
  for (int j = 0; j < micro_; ++j) idx_[size_t(j)] = perm[size_t(base + rank_ + nranks_ * j)];
  gatherBatch(data_->train, idx_.data(), micro_, x_.data(), y_.data());
}

// One optimizer step: k micro-batches of this rank's shard, gradient averaging, SGD update.
bool Run::step(const std::vector<int>& perm, int64_t index_in_epoch, double* loss, int64_t* right) {
  if (step_ == fail_at_step_ && !resumed_) {  // TUTTI_TRAINER_FAIL_AT (setUp)
    if (gpu_) gpu_->abandon();  // as after a CUDA error: the others' kernels wait for it
    return fail("rank " + std::to_string(rank_) + ": failed at step " + std::to_string(step_) +
                " as TUTTI_TRAINER_FAIL_AT asked");
  }
  if (gpu_) return stepGpu(perm, index_in_epoch);
  std::fill(grads_.begin(), grads_.end(), 0.0f);
  const float scale = 1.0f / float(micro_ * o_.accum);  // mean over this rank's samples
  for (int m = 0; m < o_.accum; ++m) {
    gatherMicroBatch(perm, index_in_epoch, m);
    int correct = 0;
    *loss += model_->forward(params_.data(), x_.data(), y_.data(), micro_, &correct);
    *right += correct;
    const bool last = m + 1 == o_.accum;
    // DDP's no_sync(): only the last micro-batch's backward starts the all-reduce.
    if (last) sync_->begin(grads_.data());
    model_->backward(params_.data(), scale, grads_.data(),
                     last ? [this](int l) { sync_->layerDone(l); } : std::function<void(int)>());
  }
  std::string err;
  if (!sync_->finish(&err)) return fail("rank " + std::to_string(rank_) + ": " + err);
  // torch.optim.SGD: d = g + wd * p; buf = mu * buf + d (buf = d at the first step); p -= lr * buf.
  const float lr = float(o_.lr), mu = float(o_.momentum), wd = float(o_.weight_decay);
  for (size_t i = 0; i < params_.size(); ++i) {
    float d = grads_[i] + wd * params_[i];
    momentum_[i] = momentum_started_ ? mu * momentum_[i] + d : d;
    params_[i] -= lr * momentum_[i];
  }
  momentum_started_ = true;
  ++step_;
  return true;
}

// The same step on the GPU; loss and hits are summed there (read at the end of the epoch).
bool Run::stepGpu(const std::vector<int>& perm, int64_t index_in_epoch) {
  const float scale = 1.0f / float(micro_ * o_.accum);
  std::string err;
  for (int m = 0; m < o_.accum; ++m) {
    gatherMicroBatch(perm, index_in_epoch, m);
    if (!gpu_->microBatch(x_.data(), y_.data(), micro_, scale, m == 0, m + 1 == o_.accum, &err)) {
      return fail("rank " + std::to_string(rank_) + ": " + err);
    }
  }
  if (!gpu_->update(float(o_.lr), float(o_.momentum), float(o_.weight_decay), momentum_started_,
                    &err)) {
    return fail("rank " + std::to_string(rank_) + ": " + err);
  }
  momentum_started_ = true;
  ++step_;
  return true;
}

// Each rank scores its interleaved share of the test set; finishEpoch sums them.
bool Run::evaluate(double* loss, int64_t* right, int64_t* count) {
  const Split& t = data_->test;
  const int batch = int(y_.size());
  int n = 0;
  for (int i = rank_; i < t.count; i += nranks_) {
    idx_[size_t(n++)] = i;
    if (n == batch || i + nranks_ >= t.count) {
      gatherBatch(t, idx_.data(), n, x_.data(), y_.data());
      if (gpu_) {
        std::string err;
        if (!gpu_->evaluate(x_.data(), y_.data(), n, &err))
          return fail("rank " + std::to_string(rank_) + ": " + err);
      } else {
        int correct = 0;
        *loss += model_->forward(params_.data(), x_.data(), y_.data(), n, &correct);
        *right += correct;
      }
      *count += n;
      n = 0;
    }
  }
  return true;
}

bool Run::finishEpoch(int epoch, int64_t steps, double t_train, double loss, int64_t right,
                      int64_t seen) {
  double test_loss = 0;
  int64_t test_right = 0, test_count = 0;
  if (!evaluate(&test_loss, &test_right, &test_count)) return false;
  double comm_s = sync_->commSeconds(), exposed_s = sync_->exposedSeconds();
  if (gpu_) {  // the training sums of the epoch and the test sums were kept on the GPU
    std::string err;
    if (!gpu_->takeSums(&loss, &right, &test_loss, &test_right, &err))
      return fail("rank " + std::to_string(rank_) + ": " + err);
    comm_s = gpu_->commSeconds();
    exposed_s = gpu_->exposedSeconds();
    gpu_->resetTimers();
  }
  // One all-reduce carries every rank's sums and timings (counts are exact in double).
  double v[9] = {
      loss,    double(right), double(seen), test_loss, double(test_right), double(test_count),
      t_train, comm_s,        exposed_s};
  ncclResult_t rc = ncclAllReduce(v, v, 9, ncclFloat64, ncclSum, comm_, nullptr);
  if (rc != ncclSuccess) return fail(ncclError("reducing the epoch's metrics", rc, comm_));
  sync_->resetTimers();
  EpochStats s;
  s.epoch = epoch + 1;
  s.steps = steps;
  s.train_loss = v[2] > 0 ? v[0] / v[2] : 0;
  s.train_acc = v[2] > 0 ? v[1] / v[2] : 0;
  s.test_loss = v[5] > 0 ? v[3] / v[5] : 0;
  s.test_acc = v[5] > 0 ? v[4] / v[5] : 0;
  s.seconds = v[6] / nranks_;
  s.samples_per_s = s.seconds > 0 ? double(steps) * o_.batch / s.seconds : 0;
  s.comm_share = v[6] > 0 ? v[7] / v[6] : 0;
  s.exposed_share = v[6] > 0 ? v[8] / v[6] : 0;
  res_.epochs.push_back(s);
  say("epoch %d/%d  step %lld  train loss %.4f acc %.2f%%  test loss %.4f acc %.2f%%  "
      "%.2f s  %.0f samples/s  comm %.1f%% (exposed %.1f%%)\n",
      s.epoch, int((total_steps_ + steps_per_epoch_ - 1) / steps_per_epoch_), (long long)step_,
      s.train_loss, 100 * s.train_acc, s.test_loss, 100 * s.test_acc, s.seconds, s.samples_per_s,
      100 * s.comm_share, 100 * s.exposed_share);
  return true;
}

// Rank 0 writes; every rank learns whether that worked, so a full disk stops the whole run.
bool Run::save() {
  if (o_.checkpoint.empty()) return true;
  bool ok = rank_ != 0 || write();
  std::string err;
  if (!allOk(comm_, ok, &err, "the checkpoint save")) return ok ? fail(err) : false;
  return true;
}

bool Run::write() {
  Checkpoint ck;
  ck.dims = model_->dims();
  ck.step = step_;
  ck.global_batch = o_.batch;
  ck.seed = o_.seed;
  ck.momentum_started = momentum_started_;
  ck.train_samples = data_->train.count;
  ck.has_settings = true;
  ck.lr = o_.lr;
  ck.momentum_factor = o_.momentum;
  ck.weight_decay = o_.weight_decay;
  ck.bf16_grads = o_.grad_dtype == ncclBfloat16;
  std::string err;
  if (gpu_ && !gpu_->download(params_.data(), momentum_.data(), &err))
    return fail("rank 0: " + err);
  ck.params = params_;
  ck.momentum = momentum_;
  if (!saveCheckpoint(o_.checkpoint, ck, &err)) return fail("rank 0: " + err);
  return true;
}

TrainResult Run::go(const Dataset* data) {
  if (!setUp(data) || !initState()) return std::move(res_);
  std::string buckets;
  for (const Bucket& b : sync_->buckets()) {
    buckets += (buckets.empty() ? "" : ", ") + std::to_string((b.count * 4 + 1023) / 1024) + " KiB";
  }
  say("tutti-train: %d %s rank%s, MLP %s (%zu parameters; gradient buckets %s)\n", nranks_,
      gpu_ ? "GPU" : "CPU", nranks_ > 1 ? "s" : "", dimsText(model_->dims()).c_str(),
      params_.size(), buckets.c_str());
  say("  global batch %d = %d rank%s x %d samples x %d accumulation step%s; %lld steps/epoch; "
      "SGD lr %g momentum %g weight decay %g; gradients all-reduced as %s (ncclAvg%s%s)\n",
      o_.batch, nranks_, nranks_ > 1 ? "s" : "", micro_, o_.accum, o_.accum > 1 ? "s" : "",
      (long long)steps_per_epoch_, o_.lr, o_.momentum, o_.weight_decay,
      o_.grad_dtype == ncclBfloat16 ? "bf16" : "fp32",
      o_.overlap ? ", overlapping backward" : ", after backward",
      gpu_                     ? "; on a communication stream of the GPU"
      : o_.overlap_why.empty() ? ""
                               : ("; " + o_.overlap_why).c_str());
  if (!gpu_) say("  %s\n", blasText().c_str());
  if (resumed_) {
    say("  resumed from %s at step %lld\n", resume_from_.c_str(), (long long)step_);
  } else if (o_.auto_resume) {
    say("  no checkpoint at %s yet: starting afresh (--auto-resume)\n", o_.checkpoint.c_str());
  }
  if (step_ >= total_steps_) say("  nothing to do: step %lld reached\n", (long long)step_);

  while (step_ < total_steps_) {
    const int epoch = int(step_ / steps_per_epoch_);
    const std::vector<int> perm = epochPermutation(data_->train.count, o_.seed, epoch);
    const int64_t first = step_;
    const int64_t epoch_end = std::min(int64_t(epoch + 1) * steps_per_epoch_, total_steps_);
    double loss = 0, t0 = now(), t_saving = 0;
    int64_t right = 0;
    while (step_ < epoch_end) {
      if (!step(perm, step_ - int64_t(epoch) * steps_per_epoch_, &loss, &right)) {
        return std::move(res_);
      }
      // (At the epoch's end the epoch's own save follows.)
      if (o_.save_every > 0 && step_ % o_.save_every == 0 && step_ != epoch_end) {
        const double t_save = now();
        if (!save()) return std::move(res_);
        t_saving += now() - t_save;
      }
    }
    // The epoch's time (and so samples/s and the communication share) is training's alone:
    // checkpoints written within it are not counted, as the epoch-end one is not.
    const double t_train = now() - t0 - t_saving;
    const int64_t seen = (step_ - first) * int64_t(micro_) * o_.accum;
    if (!finishEpoch(epoch, step_ - first, t_train, loss, right, seen) || !save()) {
      return std::move(res_);
    }
  }
  std::string err;
  if (gpu_ && !gpu_->download(params_.data(), momentum_.data(), &err)) {
    res_.error = "rank " + std::to_string(rank_) + ": " + err;
    return std::move(res_);
  }
  res_.ok = true;
  res_.steps = step_;
  res_.params = params_;
  res_.momentum = momentum_;
  return std::move(res_);
}

}  // namespace

TrainResult train(ncclComm_t comm, const Options& o, const Dataset* data) {
  Run run(comm, o);
  return run.go(data);
}

}  // namespace trainer
