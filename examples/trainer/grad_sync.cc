#include "examples/trainer/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace trainer {
namespace {

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<Bucket> makeBuckets(const std::vector<Layer>& layers, size_t cap_bytes) {
  std::vector<Bucket> out;
  Bucket cur;
  bool open = false;
  for (int l = int(layers.size()) - 1; l >= 0; --l) {
    const Layer& L = layers[size_t(l)];
    // Layers sit in the buffer in forward order, so walking backwards each layer's slice ends
    // where the open bucket begins.
    size_t n = L.end() - L.weight;
    if (open && (cur.count + n) * sizeof(float) > cap_bytes) {
      out.push_back(cur);
      open = false;
    }
    if (!open) {
      cur = Bucket{L.weight, n, l};
      open = true;
    } else {
      cur.offset = L.weight;
      cur.count += n;
      cur.first_layer = l;
    }
    if (cur.count * sizeof(float) >= cap_bytes) {
      out.push_back(cur);
      open = false;
    }
  }
  if (open) out.push_back(cur);
  return out;
}

uint16_t floatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float bf16ToFloat(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

GradSync::GradSync(ncclComm_t comm, std::vector<Bucket> buckets, ncclDataType_t wire, bool overlap)
    : comm_(comm), buckets_(std::move(buckets)), wire_(wire), overlap_(overlap) {
  size_t total = 0;
  for (const Bucket& b : buckets_) total += b.count;
  if (wire_ == ncclBfloat16) staging_.resize(total);
  ready_.assign(buckets_.size(), 0);
  if (overlap_) thread_ = std::thread([this] { commLoop(); });
}

GradSync::~GradSync() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GradSync::begin(float* grads) {
  std::lock_guard<std::mutex> lock(mu_);
  grads_ = grads;
  done_ = 0;
  last_done_ = 0;
  queue_.clear();
}

void GradSync::layerDone(int layer) {
  if (!overlap_) return;
  bool any = false;
  {
    const double t = now();
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < buckets_.size(); ++i) {
      if (buckets_[i].first_layer == layer) {
        ready_[i] = t;
        queue_.push_back(i);
        any = true;
      }
    }
  }
  if (any) cv_.notify_all();
}

void GradSync::reduce(size_t index) {
  const Bucket& b = buckets_[index];
  ncclResult_t rc;
  float* g = grads_ + b.offset;
  if (wire_ == ncclBfloat16) {
    // The staging slice sits at the bucket's own offset, so buckets never share memory.
    uint16_t* w = staging_.data() + b.offset;
    for (size_t i = 0; i < b.count; ++i) w[i] = floatToBf16(g[i]);
    rc = ncclAllReduce(w, w, b.count, ncclBfloat16, ncclAvg, comm_, nullptr);
    for (size_t i = 0; i < b.count; ++i) g[i] = bf16ToFloat(w[i]);
  } else {
    rc = ncclAllReduce(g, g, b.count, ncclFloat32, ncclAvg, comm_, nullptr);
  }
  const double end = now();
  std::lock_guard<std::mutex> lock(mu_);
  // From when the bucket could start: its layers done and the bucket before it reduced (a
  // wait for the communication thread to wake or to finish that one is communication too).
  comm_s_ += std::max(0.0, end - std::max(ready_[index], last_done_));
  last_done_ = end;
  if (rc != ncclSuccess && rc_ == ncclSuccess) {
    rc_ = rc;
    error_ = std::string("gradient all-reduce failed: ") + ncclGetErrorString(rc) + ": " +
             ncclGetLastError(comm_);
  }
  ++done_;
}

void GradSync::commLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    size_t i = queue_.front();
    queue_.pop_front();
    bool failed = rc_ != ncclSuccess;
    lock.unlock();
    // After a failure the communicator is unusable; count the rest done so finish() returns.
    if (failed) {
      std::lock_guard<std::mutex> l(mu_);
      ++done_;
    } else {
      reduce(i);
    }
    cv_.notify_all();
    lock.lock();
  }
}

bool GradSync::finish(std::string* error) {
  double t0 = now();
  if (!overlap_) {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      ready_[i] = t0;
      if (rc_ == ncclSuccess) reduce(i);
    }
  } else {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ == buckets_.size(); });
  }
  std::lock_guard<std::mutex> lock(mu_);
  // Until the last all-reduce ended (this thread's own wake-up after it is not communication).
  exposed_s_ += std::max(0.0, last_done_ - t0);
  if (rc_ != ncclSuccess) {
    *error = error_;
    return false;
  }
  return true;
}

}  // namespace trainer
