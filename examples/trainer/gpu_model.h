// The trainer's GPU half (--device cuda): the same MLP, loss, bucketed gradient averaging and
// SGD as the CPU path (mlp.h, grad_sync.h, trainer.cc), with the parameters, gradients and
// optimizer state in GPU memory, matrix products through cuBLAS and everything else in small
// kernels. Gradient buckets are all-reduced (ncclAvg, fp32 or bf16 on the wire) on a
// communication stream as soon as the backward pass on the compute stream has finished their
// layers, so communication overlaps the rest of the backward pass on the GPU itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "examples/trainer/grad_sync.h"
#include "examples/trainer/mlp.h"
#include "nccl.h"

namespace trainer {

// Whether this build has the GPU half (CUDA and cuBLAS found when it was configured).
bool gpuModelBuilt();
// GPUs this process can use (0 without the GPU half), and making GPU (local_rank % count)
// this thread's device before its communicator is made (false with *error set).
int gpuCount();
bool selectGpu(int local_rank, std::string* error);

class GpuModel {
 public:
  // On the communicator's GPU (ncclCommCuDevice). null with *error set when that fails.
  // max_batch: the most samples a batch may have; train_batch: the training micro-batch (the
  // kernels for its shapes are loaded up front, see gpu_model.cu). overlap: each bucket's
  // all-reduce starts as soon as backward is done with its layers; else after all of backward.
  static std::unique_ptr<GpuModel> create(ncclComm_t comm, const std::vector<Layer>& layers,
                                          int max_batch, int train_batch,
                                          std::vector<Bucket> buckets, ncclDataType_t wire,
                                          bool overlap, std::string* error);
  virtual ~GpuModel() = default;

  // Host <-> device copies of the parameters and the momentum buffer (momentum may be null:
  // zeros on upload, not read back on download).
  virtual bool upload(const float* params, const float* momentum, std::string* error) = 0;
  virtual bool download(float* params, float* momentum, std::string* error) = 0;
  // ncclBroadcast from rank 0 of the parameters (and the momentum) in GPU memory.
  virtual bool broadcast(bool momentum, std::string* error) = 0;

  // One micro-batch of n samples (host memory: copied over): forward, loss and accuracy summed
  // on the GPU, backward adding scale * gradient. first: start from zero gradients. last: each
  // gradient bucket's all-reduce starts as soon as backward has finished its layers.
  virtual bool microBatch(const float* x, const uint8_t* y, int n, float scale, bool first,
                          bool last, std::string* error) = 0;
  // torch.optim.SGD with momentum and weight decay on the averaged gradients, after the
  // all-reduces; then waits for the GPU (errors of this step come back here).
  virtual bool update(float lr, float momentum, float weight_decay, bool started,
                      std::string* error) = 0;
  // Forward only, for evaluation: loss and accuracy summed on the GPU.
  virtual bool evaluate(const float* x, const uint8_t* y, int n, std::string* error) = 0;
  // The sums since the last call (train: microBatch; test: evaluate), then zeroed.
  virtual bool takeSums(double* train_loss, int64_t* train_right, double* test_loss,
                        int64_t* test_right, std::string* error) = 0;

  // Seconds the all-reduces took on the communication stream, and seconds of them that
  // outlasted the backward pass (what the step waited for). Reset by the caller.
  virtual double commSeconds() const = 0;
  virtual double exposedSeconds() const = 0;
  virtual void resetTimers() = 0;
  // This rank failed alone while others' collectives may wait for it: the destructor frees
  // nothing (a cudaFree would wait for the whole GPU, where their kernels spin).
  virtual void abandon() = 0;
};

}  // namespace trainer
