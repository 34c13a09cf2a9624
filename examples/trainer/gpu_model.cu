// The trainer's GPU half; see gpu_model.h. Row-major matrices as in mlp.cc: a row-major
// (rows x cols) matrix is, to cuBLAS, a column-major (cols x rows) one with leading dimension
// cols, so each product below is mlp.cc's cblas_sgemm with the operands swapped.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "examples/trainer/gpu_model.h"

// LAUNCH(kernel, grid, block, stream, args...) is kernel<<<grid, block, 0, stream>>>(args...).
// Built for the emulated CUDA runtime instead (TUTTI_CUDA=EMU: this file compiled by the host
// compiler, so that CI runs the GPU half), a launch runs the kernel's threads one after another
// in stream order.
#if defined(__CUDACC__)
#define LAUNCH(kernel, grid, block, stream, ...) \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#else
#include "tests/cudaemu/cudaemu_sequential.h"
#define LAUNCH(kernel, grid, block, stream, ...) \
  cudaemu::launchSequential((stream), unsigned(grid), unsigned(block), kernel, __VA_ARGS__)
#endif

namespace trainer {

bool gpuModelBuilt() { return true; }

int gpuCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

bool selectGpu(int local_rank, std::string* error) {
  const int n = gpuCount();
  if (n == 0) {
    *error = "--device cuda: no usable GPU";
    return false;
  }
  if (cudaError_t e = cudaSetDevice(local_rank % n); e != cudaSuccess) {
    *error = std::string("--device cuda: cudaSetDevice: ") + cudaGetErrorString(e);
    return false;
  }
  return true;
}

namespace {

constexpr int kThreads = 256;
int blocksFor(size_t n) { return int(std::min<size_t>((n + kThreads - 1) / kThreads, 65535)); }

// out (n x m) = bias in every row: the GEMM then accumulates onto it.
__global__ void biasRows(float* out, const float* bias, int n, int m) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < size_t(n) * m;
       i += size_t(gridDim.x) * blockDim.x) {
    out[i] = bias[i % size_t(m)];
  }
}

__global__ void relu(float* v, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    v[i] = fmaxf(v[i], 0.0f);
  }
}

// One thread per sample, as mlp.cc's loop: stable softmax cross-entropy, loss and hits summed
// into sums[0..1]; with delta, d(loss)/d(logits) * scale = scale * (softmax - onehot).
__global__ void softmaxXent(const float* logits, const uint8_t* labels, int n, int classes,
                            float scale, float* delta, double* sums) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float* row = logits + size_t(i) * classes;
  int best = 0;
  for (int c = 1; c < classes; ++c)
    if (row[c] > row[best]) best = c;
  const float mx = row[best];
  double sum = 0;
  for (int c = 0; c < classes; ++c) sum += exp(double(row[c] - mx));
  atomicAdd(&sums[0], log(sum) - double(row[labels[i]] - mx));
  if (best == labels[i]) atomicAdd(&sums[1], 1.0);
  if (!delta) return;
  const float inv = float(1.0 / sum);
  for (int c = 0; c < classes; ++c) {
    const float p = expf(row[c] - mx) * inv;
    delta[size_t(i) * classes + c] = scale * (p - (c == labels[i] ? 1.0f : 0.0f));
  }
}

// db[j] += sum over rows of delta[., j] (one thread per column).
__global__ void biasGrad(const float* delta, int n, int m, float* db) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= m) return;
  float s = 0;
  for (int i = 0; i < n; ++i) s += delta[size_t(i) * m + j];
  db[j] += s;
}

// The gradient through the ReLU below: zero where its output was clipped.
__global__ void reluMask(float* d, const float* act, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    if (act[i] <= 0.0f) d[i] = 0.0f;
  }
}

// torch.optim.SGD: d = g + wd * p; buf = mu * buf + d (buf = d at the first step); p -= lr * buf.
__global__ void sgd(float* p, const float* g, float* buf, size_t n, float lr, float mu, float wd,
                    int started) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float d = g[i] + wd * p[i];
    buf[i] = started ? mu * buf[i] + d : d;
    p[i] -= lr * buf[i];
  }
}

// fp32 <-> bf16 as grad_sync.cc does it: round to nearest even, NaN kept quiet.
__global__ void toBf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint32_t u = __float_as_uint(src[i]);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      dst[i] = uint16_t((u >> 16) | 0x40);
    } else {
      dst[i] = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
  }
}
__global__ void fromBf16(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    dst[i] = __uint_as_float(uint32_t(src[i]) << 16);
  }
}

class CudaModel : public GpuModel {
 public:
  ~CudaModel() override {
    // After a failure a collective of this rank may still be in flight, waiting for peers that
    // gave up: waiting here could take until TUTTI_TIMEOUT, and freeing its buffers is unsafe.
    // The memory is left to the process's exit (the caller aborts the communicator). Before
    // the first collective (a failed set-up) everything is freed.
    if (failed_ && collectiveIssued_) return;
    if (cs_) cudaStreamSynchronize(cs_);
    if (ms_) cudaStreamSynchronize(ms_);
    if (blas_) cublasDestroy(blas_);
    for (cudaEvent_t e : {layerDone_, commDone_, backwardEnd_, staged_})
      if (e) cudaEventDestroy(e);
    for (cudaEvent_t e : bucketStart_) cudaEventDestroy(e);
    for (cudaEvent_t e : bucketEnd_) cudaEventDestroy(e);
    for (void* p : {(void*)params_, (void*)grads_, (void*)mom_, (void*)wire_, (void*)x_, (void*)y_,
                    (void*)sums_, (void*)delta_, (void*)deltaNext_})
      if (p) cudaFree(p);
    if (workspace_) cudaFree(workspace_);
    for (float* a : act_) cudaFree(a);
    if (hostX_) cudaFreeHost(hostX_);
    if (hostY_) cudaFreeHost(hostY_);
    if (hostSums_) cudaFreeHost(hostSums_);
    if (hostState_) cudaFreeHost(hostState_);
    if (cs_) cudaStreamDestroy(cs_);
    if (ms_) cudaStreamDestroy(ms_);
  }

  bool init(ncclComm_t comm, const std::vector<Layer>& layers, int max_batch, int train_batch,
            std::vector<Bucket> buckets, ncclDataType_t wire, bool overlap, std::string* error) {
    comm_ = comm;
    overlap_ = overlap;
    layers_ = layers;
    maxBatch_ = max_batch;
    buckets_ = std::move(buckets);
    wireType_ = wire;
    int dev = -1;
    if (ncclCommCuDevice(comm, &dev) != ncclSuccess || dev < 0) {
      *error =
          "--device cuda: this rank's communicator has no GPU (it was made as a CPU rank; "
          "make it after cudaSetDevice, or with ncclCommInitAll on GPU ids)";
      return false;
    }
    if (!ok(cudaSetDevice(dev), "cudaSetDevice", error)) return false;
    n_ = layers_.back().end();
    int widest = 0;
    for (const Layer& l : layers_) widest = std::max(widest, l.out);
    const size_t inputs = size_t(layers_.front().in);
    bool good = ok(cudaStreamCreateWithFlags(&cs_, cudaStreamNonBlocking), "stream", error) &&
                ok(cudaStreamCreateWithFlags(&ms_, cudaStreamNonBlocking), "stream", error) &&
                ok(cudaMalloc(&params_, n_ * 4), "cudaMalloc", error) &&
                ok(cudaMalloc(&grads_, n_ * 4), "cudaMalloc", error) &&
                ok(cudaMalloc(&mom_, n_ * 4), "cudaMalloc", error) &&
                ok(cudaMalloc(&x_, size_t(max_batch) * inputs * 4), "cudaMalloc", error) &&
                ok(cudaMalloc(&y_, size_t(max_batch)), "cudaMalloc", error) &&
                ok(cudaMalloc(&sums_, 4 * sizeof(double)), "cudaMalloc", error) &&
                ok(cudaMalloc(&delta_, size_t(max_batch) * widest * 4), "cudaMalloc", error) &&
                ok(cudaMalloc(&deltaNext_, size_t(max_batch) * widest * 4), "cudaMalloc", error) &&
                ok(cudaMallocHost(&hostX_, size_t(max_batch) * inputs * 4), "pinned", error) &&
                ok(cudaMallocHost(&hostY_, size_t(max_batch)), "pinned", error) &&
                ok(cudaMallocHost(&hostSums_, 4 * sizeof(double)), "pinned", error) &&
                ok(cudaMallocHost(&hostState_, n_ * 4), "pinned", error);
    if (good && wire == ncclBfloat16) good = ok(cudaMalloc(&wire_, n_ * 2), "cudaMalloc", error);
    for (const Layer& l : layers_) {
      float* a = nullptr;
      if (good) good = ok(cudaMalloc(&a, size_t(max_batch) * l.out * 4), "cudaMalloc", error);
      if (a) act_.push_back(a);
    }
    for (cudaEvent_t* e : {&backwardEnd_, &commDone_}) {
      if (good) good = ok(cudaEventCreate(e), "cudaEventCreate", error);
    }
    // Each bucket is timed on the communication stream, from when the stream reaches it (its
    // layers done and the bucket before ended) to its end: the stream's busy time.
    for (size_t b = 0; good && b < buckets_.size(); ++b) {
      cudaEvent_t start = nullptr, end = nullptr;
      good = ok(cudaEventCreate(&start), "cudaEventCreate", error);
      if (good) bucketStart_.push_back(start);
      if (good) good = ok(cudaEventCreate(&end), "cudaEventCreate", error);
      if (good) bucketEnd_.push_back(end);
    }
    for (cudaEvent_t* e : {&layerDone_, &staged_}) {
      if (good) good = ok(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEvent", error);
    }
    if (!good) return false;
    // cuBLAS's workspace is this rank's own, allocated now: a pool cuBLAS allocated on first
    // use would be a cudaMalloc while a sibling rank's collective may wait for this thread.
    // (After cublasSetStream, which puts a handle back on the default pool.)
    if (!ok(cudaMalloc(&workspace_, kWorkspaceBytes), "cudaMalloc", error)) return false;
    // Plain fp32 products (no TF32), as the CPU's BLAS computes them.
    if (cublasCreate(&blas_) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(blas_, cs_) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(blas_, workspace_, kWorkspaceBytes) != CUBLAS_STATUS_SUCCESS ||
        cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH) != CUBLAS_STATUS_SUCCESS) {
      *error = "cuBLAS could not start on GPU " + std::to_string(dev);
      return false;
    }
    return warmUp(train_batch, error);
  }

  // Both through pinned memory, one buffer after the other (see stage()).
  bool upload(const float* params, const float* momentum, std::string* error) override {
    if (!put(params_, params, error)) return false;
    if (momentum) return put(mom_, momentum, error);
    return ok(cudaMemsetAsync(mom_, 0, n_ * 4, cs_), "upload", error) &&
           ok(cudaStreamSynchronize(cs_), "upload", error);
  }

  bool download(float* params, float* momentum, std::string* error) override {
    return get(params, params_, error) && (!momentum || get(momentum, mom_, error));
  }

  bool broadcast(bool momentum, std::string* error) override {
    collectiveIssued_ = true;
    ncclResult_t rc = ncclBroadcast(params_, params_, n_, ncclFloat32, 0, comm_, cs_);
    if (rc == ncclSuccess && momentum)
      rc = ncclBroadcast(mom_, mom_, n_, ncclFloat32, 0, comm_, cs_);
    if (rc != ncclSuccess) return nccl(rc, "ncclBroadcast of the parameters", error);
    return ok(cudaStreamSynchronize(cs_), "broadcast", error) &&
           collectivesOk("ncclBroadcast of the parameters", error);
  }

  bool microBatch(const float* x, const uint8_t* y, int n, float scale, bool first, bool last,
                  std::string* error) override {
    n = std::min(n, maxBatch_);
    if (!stage(x, y, n, error)) return false;
    if (first && !ok(cudaMemsetAsync(grads_, 0, n_ * 4, cs_), "cudaMemsetAsync", error))
      return false;
    if (!forward(n, scale, true, error)) return false;
    return backward(n, last, error);
  }

  bool update(float lr, float momentum, float weight_decay, bool started,
              std::string* error) override {
    // The step waits for the last all-reduce on the host, not with a wait queued on the
    // compute stream: a stream that waits for a collective could share a hardware queue with
    // a sibling rank's communication stream and hold back the launch that collective needs.
    // (The step ends with a synchronisation anyway.)
    if (pendingTimes_ && !ok(cudaEventSynchronize(commDone_), "the gradient all-reduces", error))
      return false;
    LAUNCH(sgd, blocksFor(n_), kThreads, cs_, params_, grads_, mom_, n_, lr, momentum, weight_decay,
           started ? 1 : 0);
    if (!ok(cudaGetLastError(), "the SGD kernel", error)) return false;
    if (!ok(cudaStreamSynchronize(cs_), "the training step", error)) return false;
    if (!collectivesOk("the gradient all-reduces", error)) return false;
    if (pendingTimes_) {
      pendingTimes_ = false;
      double comm = 0;
      float t = 0, exposed = 0;
      bool timed = true;
      for (size_t b = 0; b < bucketStart_.size(); ++b) {
        timed = timed && cudaEventElapsedTime(&t, bucketStart_[b], bucketEnd_[b]) == cudaSuccess;
        comm += t;
      }
      timed = timed && cudaEventElapsedTime(&exposed, backwardEnd_, commDone_) == cudaSuccess;
      if (!timed) {
        cudaGetLastError();  // timings only: not an error of the step
        comm = exposed = 0;
      }
      comm_s_ += comm / 1e3;
      exposed_s_ += std::max(0.0f, exposed) / 1e3;
    }
    return true;
  }

  bool evaluate(const float* x, const uint8_t* y, int n, std::string* error) override {
    n = std::min(n, maxBatch_);
    return stage(x, y, n, error) && forward(n, 0.0f, false, error);
  }

  bool takeSums(double* train_loss, int64_t* train_right, double* test_loss, int64_t* test_right,
                std::string* error) override {
    if (!ok(cudaMemcpyAsync(hostSums_, sums_, 4 * sizeof(double), cudaMemcpyDeviceToHost, cs_),
            "reading the sums", error) ||
        !ok(cudaMemsetAsync(sums_, 0, 4 * sizeof(double), cs_), "cudaMemsetAsync", error) ||
        !ok(cudaStreamSynchronize(cs_), "reading the sums", error))
      return false;
    *train_loss = hostSums_[0];
    *train_right = int64_t(hostSums_[1]);
    *test_loss = hostSums_[2];
    *test_right = int64_t(hostSums_[3]);
    return true;
  }

  double commSeconds() const override { return comm_s_; }
  double exposedSeconds() const override { return exposed_s_; }
  void resetTimers() override { comm_s_ = exposed_s_ = 0; }
  void abandon() override { failed_ = collectiveIssued_ = true; }

 private:
  bool ok(cudaError_t e, const char* what, std::string* error) {
    if (e == cudaSuccess) return true;
    cudaGetLastError();
    failed_ = true;
    *error = std::string("--device cuda: ") + what + ": " + cudaGetErrorString(e);
    return false;
  }
  bool nccl(ncclResult_t rc, const char* what, std::string* error) {
    failed_ = true;
    *error =
        std::string(what) + " failed: " + ncclGetErrorString(rc) + ": " + ncclGetLastError(comm_);
    return false;
  }
  // A collective's kernel that gave up (peer gone, abort, TUTTI_TIMEOUT) ends normally on the
  // stream: its error is the communicator's, asked for once the stream is done.
  bool collectivesOk(const char* what, std::string* error) {
    ncclResult_t async = ncclSuccess;
    const ncclResult_t rc = ncclCommGetAsyncError(comm_, &async);
    if (rc != ncclSuccess) return nccl(rc, what, error);
    if (async != ncclSuccess && async != ncclInProgress) return nccl(async, what, error);
    return true;
  }
  bool blas(cublasStatus_t s, std::string* error) {
    if (s == CUBLAS_STATUS_SUCCESS) return true;
    failed_ = true;
    *error = "--device cuda: cublasSgemm failed (status " + std::to_string(int(s)) + ")";
    return false;
  }

  // The batch through pinned memory (a pageable copy may hold this thread in the driver while
  // a sibling rank's kernel waits for its next call). Waits for the previous batch's copies
  // first: no collective of this rank is in flight between micro-batches or evaluations.
  bool stage(const float* x, const uint8_t* y, int n, std::string* error) {
    const size_t xb = size_t(n) * layers_.front().in * 4;
    if (!ok(cudaEventSynchronize(staged_), "batch copy", error)) return false;
    memcpy(hostX_, x, xb);
    memcpy(hostY_, y, size_t(n));
    return ok(cudaMemcpyAsync(x_, hostX_, xb, cudaMemcpyHostToDevice, cs_), "batch copy", error) &&
           ok(cudaMemcpyAsync(y_, hostY_, size_t(n), cudaMemcpyHostToDevice, cs_), "batch copy",
              error) &&
           ok(cudaEventRecord(staged_, cs_), "batch copy", error);
  }
  bool put(float* dev, const float* host, std::string* error) {
    memcpy(hostState_, host, n_ * 4);
    return ok(cudaMemcpyAsync(dev, hostState_, n_ * 4, cudaMemcpyHostToDevice, cs_), "upload",
              error) &&
           ok(cudaStreamSynchronize(cs_), "upload", error);
  }
  bool get(float* host, const float* dev, std::string* error) {
    if (!ok(cudaMemcpyAsync(hostState_, dev, n_ * 4, cudaMemcpyDeviceToHost, cs_), "download",
            error) ||
        !ok(cudaStreamSynchronize(cs_), "download", error))
      return false;
    memcpy(host, hostState_, n_ * 4);
    return true;
  }

  // CUDA loads kernels lazily, and loading may wait for the whole GPU -- for a sibling rank's
  // all-reduce that waits for this thread. So every kernel this model launches while a
  // collective may be in flight is loaded now: ours by cudaFuncGetAttributes, cuBLAS's (chosen
  // by shape) by one forward and backward pass at the training batch size, on zeros.
  bool warmUp(int train_batch, std::string* error) {
    const void* kernels[] = {(const void*)biasRows, (const void*)relu,     (const void*)softmaxXent,
                             (const void*)biasGrad, (const void*)reluMask, (const void*)sgd,
                             (const void*)toBf16,   (const void*)fromBf16};
    for (const void* k : kernels) {
      cudaFuncAttributes a;
      if (!ok(cudaFuncGetAttributes(&a, k), "loading the trainer's kernels", error)) return false;
    }
    const int n = std::max(1, std::min(train_batch, maxBatch_));
    const size_t inputs = size_t(layers_.front().in);
    return ok(cudaMemsetAsync(x_, 0, size_t(n) * inputs * 4, cs_), "warm-up", error) &&
           ok(cudaMemsetAsync(y_, 0, size_t(n), cs_), "warm-up", error) &&
           ok(cudaMemsetAsync(params_, 0, n_ * 4, cs_), "warm-up", error) &&
           ok(cudaMemsetAsync(grads_, 0, n_ * 4, cs_), "warm-up", error) &&
           ok(cudaEventRecord(staged_, cs_), "warm-up", error) && forward(n, 1.0f, true, error) &&
           backward(n, /*last=*/false, error) &&
           ok(cudaMemsetAsync(grads_, 0, n_ * 4, cs_), "warm-up", error) &&
           ok(cudaMemsetAsync(sums_, 0, 4 * sizeof(double), cs_), "warm-up", error) &&
           ok(cudaMemsetAsync(mom_, 0, n_ * 4, cs_), "warm-up", error) &&
           ok(cudaStreamSynchronize(cs_), "warm-up", error);
  }

  bool forward(int n, float scale, bool train, std::string* error) {
    const float one = 1.0f;
    const float* in = x_;
    for (size_t l = 0; l < layers_.size(); ++l) {
      const Layer& L = layers_[l];
      float* out = act_[l];
      LAUNCH(biasRows, blocksFor(size_t(n) * L.out), kThreads, cs_, out, params_ + L.bias, n,
             L.out);
      // out (n x out) += in (n x in) * W^T: column-major out^T = W^T' * in^T.
      if (!blas(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, L.out, n, L.in, &one,
                            params_ + L.weight, L.in, in, L.in, &one, out, L.out),
                error))
        return false;
      if (l + 1 < layers_.size())
        LAUNCH(relu, blocksFor(size_t(n) * L.out), kThreads, cs_, out, size_t(n) * L.out);
      in = out;
    }
    const int classes = layers_.back().out;
    LAUNCH(softmaxXent, (n + kThreads - 1) / kThreads, kThreads, cs_, act_.back(), y_, n, classes,
           scale, train ? delta_ : nullptr, sums_ + (train ? 0 : 2));
    return ok(cudaGetLastError(), "the forward kernels", error);
  }

  bool backward(int n, bool last, std::string* error) {
    const float one = 1.0f, zero = 0.0f;
    size_t nextBucket = 0;
    for (int l = int(layers_.size()) - 1; l >= 0; --l) {
      const Layer& L = layers_[size_t(l)];
      const float* in = l == 0 ? x_ : act_[size_t(l) - 1];
      // dW (out x in) += delta^T * in: column-major dW^T = in^T * delta.
      if (!blas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_T, L.in, L.out, n, &one, in, L.in, delta_,
                            L.out, &one, grads_ + L.weight, L.in),
                error))
        return false;
      LAUNCH(biasGrad, (L.out + kThreads - 1) / kThreads, kThreads, cs_, delta_, n, L.out,
             grads_ + L.bias);
      // Layer l's gradients are queued: every bucket whose layers are all done goes to the
      // communication stream now, before the delta for the layer below.
      while (last && overlap_ && nextBucket < buckets_.size() &&
             buckets_[nextBucket].first_layer == l) {
        if (!startBucket(nextBucket, error)) return false;
        ++nextBucket;
      }
      if (l > 0) {
        // delta_next (n x in) = delta * W: column-major delta_next^T = W^T * delta^T.
        if (!blas(cublasSgemm(blas_, CUBLAS_OP_N, CUBLAS_OP_N, L.in, n, L.out, &one,
                              params_ + L.weight, L.in, delta_, L.out, &zero, deltaNext_, L.in),
                  error))
          return false;
        LAUNCH(reluMask, blocksFor(size_t(n) * L.in), kThreads, cs_, deltaNext_, in,
               size_t(n) * L.in);
        std::swap(delta_, deltaNext_);
      }
    }
    if (!ok(cudaGetLastError(), "the backward kernels", error)) return false;
    if (!last) return true;
    if (!ok(cudaEventRecord(backwardEnd_, cs_), "cudaEventRecord", error)) return false;
    // --overlap off: every bucket after the whole backward pass.
    for (; nextBucket < buckets_.size(); ++nextBucket) {
      if (!startBucket(nextBucket, error)) return false;
    }
    // update() waits for this on the host before the optimizer step.
    if (!ok(cudaEventRecord(commDone_, ms_), "cudaEventRecord", error)) return false;
    pendingTimes_ = true;
    return true;
  }

  bool startBucket(size_t index, std::string* error) {
    const Bucket& b = buckets_[index];
    collectiveIssued_ = true;
    if (!ok(cudaEventRecord(layerDone_, cs_), "cudaEventRecord", error) ||
        !ok(cudaStreamWaitEvent(ms_, layerDone_, 0), "cudaStreamWaitEvent", error) ||
        !ok(cudaEventRecord(bucketStart_[index], ms_), "cudaEventRecord", error))
      return false;
    float* g = grads_ + b.offset;
    ncclResult_t rc;
    if (wireType_ == ncclBfloat16) {
      uint16_t* w = wire_ + b.offset;
      LAUNCH(toBf16, blocksFor(b.count), kThreads, ms_, g, w, b.count);
      rc = ncclAllReduce(w, w, b.count, ncclBfloat16, ncclAvg, comm_, ms_);
      LAUNCH(fromBf16, blocksFor(b.count), kThreads, ms_, w, g, b.count);
    } else {
      rc = ncclAllReduce(g, g, b.count, ncclFloat32, ncclAvg, comm_, ms_);
    }
    if (rc != ncclSuccess) return nccl(rc, "ncclAllReduce of a gradient bucket", error);
    // (A launch error of an earlier backward kernel would show here too: hence both named.)
    return ok(cudaGetLastError(),
              wireType_ == ncclBfloat16 ? "the backward or bf16 conversion kernels"
                                        : "the backward kernels",
              error) &&
           ok(cudaEventRecord(bucketEnd_[index], ms_), "cudaEventRecord", error);
  }

  ncclComm_t comm_ = nullptr;
  std::vector<Layer> layers_;
  int maxBatch_ = 0;
  std::vector<Bucket> buckets_;
  ncclDataType_t wireType_ = ncclFloat32;
  size_t n_ = 0;                              // parameters
  cudaStream_t cs_ = nullptr, ms_ = nullptr;  // compute, communication
  cublasHandle_t blas_ = nullptr;
  static constexpr size_t kWorkspaceBytes = 32 << 20;  // what cuBLAS advises for Hopper
  void* workspace_ = nullptr;
  float *params_ = nullptr, *grads_ = nullptr, *mom_ = nullptr, *x_ = nullptr;
  uint16_t* wire_ = nullptr;
  uint8_t* y_ = nullptr;
  double* sums_ = nullptr;  // train loss, train hits, test loss, test hits
  float *delta_ = nullptr, *deltaNext_ = nullptr;
  std::vector<float*> act_;
  float* hostX_ = nullptr;
  uint8_t* hostY_ = nullptr;
  double* hostSums_ = nullptr;
  float* hostState_ = nullptr;  // parameters or momentum on their way up or down
  cudaEvent_t layerDone_ = nullptr, backwardEnd_ = nullptr, commDone_ = nullptr, staged_ = nullptr;
  std::vector<cudaEvent_t> bucketStart_, bucketEnd_;  // per bucket: its all-reduce's span
  bool overlap_ = true;  // buckets start during backward (else after it: --overlap off)
  bool pendingTimes_ = false;
  bool failed_ = false;            // a call failed ...
  bool collectiveIssued_ = false;  // ... after a collective: the destructor leaves everything
  double comm_s_ = 0, exposed_s_ = 0;
};

}  // namespace

std::unique_ptr<GpuModel> GpuModel::create(ncclComm_t comm, const std::vector<Layer>& layers,
                                           int max_batch, int train_batch,
                                           std::vector<Bucket> buckets, ncclDataType_t wire,
                                           bool overlap, std::string* error) {
  auto m = std::make_unique<CudaModel>();
  if (!m->init(comm, layers, max_batch, train_batch, std::move(buckets), wire, overlap, error))
    return nullptr;
  return m;
}

}  // namespace trainer
