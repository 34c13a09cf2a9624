// Averages gradients across ranks the way PyTorch DDP does: the flat gradient buffer is cut
// into buckets (in reverse layer order, because backward produces the last layer first), and
// each bucket's ncclAllReduce(ncclAvg) starts on a communication thread as soon as the
// backward pass has finished every layer in it, overlapping the rest of the backward pass.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "examples/trainer/mlp.h"
#include "nccl.h"

namespace trainer {

struct Bucket {
  size_t offset = 0, count = 0;  // slice of the flat gradient buffer
  int first_layer = 0;           // the lowest layer in it: backward finishes that one last
};

// Buckets of whole layers, last layer first: a layer joins the open bucket while the bucket
// stays within cap_bytes of fp32 gradients, else it starts the next one (so a layer larger
// than the cap is a bucket of its own).
std::vector<Bucket> makeBuckets(const std::vector<Layer>& layers, size_t cap_bytes);

// fp32 <-> bf16, round to nearest even (NaN stays NaN): the wire format of --grad-dtype bf16.
uint16_t floatToBf16(float f);
float bf16ToFloat(uint16_t h);

class GradSync {
 public:
  // wire: ncclFloat32 or ncclBfloat16. overlap=false runs every all-reduce on the caller's
  // thread after backward, for comparison.
  GradSync(ncclComm_t comm, std::vector<Bucket> buckets, ncclDataType_t wire, bool overlap);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  const std::vector<Bucket>& buckets() const { return buckets_; }

  // One synchronisation: begin(), layerDone(l) from backward's callback, then finish().
  void begin(float* grads);
  void layerDone(int layer);
  // Waits for every bucket; false (with *error set) if an all-reduce failed.
  bool finish(std::string* error);

  // Seconds of communication: for each bucket, from when it could start (its layers done and
  // the bucket before it reduced) to the end of its all-reduce (and bf16 conversions); and
  // seconds the training loop waited in finish() for communication that backward did not
  // hide (never more than the first: every bucket is ready while finish() waits). Reset by the
  // caller.
  double commSeconds() const { return comm_s_; }
  double exposedSeconds() const { return exposed_s_; }
  void resetTimers() { comm_s_ = exposed_s_ = 0; }

 private:
  void reduce(size_t index);
  void commLoop();

  ncclComm_t comm_;
  std::vector<Bucket> buckets_;
  ncclDataType_t wire_;
  bool overlap_;
  float* grads_ = nullptr;
  std::vector<uint16_t> staging_;  // bf16 wire buffer, as large as the gradients

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> queue_;  // buckets ready to reduce, in order
  size_t done_ = 0;           // buckets reduced in this synchronisation
  bool stop_ = false;
  ncclResult_t rc_ = ncclSuccess;
  std::string error_;
  std::vector<double> ready_;  // per bucket: when its layers were done (this synchronisation)
  double last_done_ = 0;       // when the last bucket's all-reduce ended
  double comm_s_ = 0, exposed_s_ = 0;
  std::thread thread_;
};

}  // namespace trainer
