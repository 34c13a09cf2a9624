// tutti-perf's GPU side (--mem device): a rank's buffers and stream, and calls captured into a
// CUDA graph. Without CUDA, DeviceMem is empty and never made.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>

#ifdef TUTTI_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace tutti::perf {

// GPU buffers and the rank's stream (--mem device). Every call is checked: a benchmark that
// goes on after a CUDA error measures nothing.
class DeviceMem {
 public:
#ifdef TUTTI_HAVE_CUDA
  static void check(cudaError_t e, const char* what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "tutti-perf: %s: %s\n", what, cudaGetErrorString(e));
    exit(1);
  }
  // All of it at once, before any rank starts: cudaMalloc / cudaFree may wait for the whole
  // GPU, where another rank's kernel may be waiting for this one.
  explicit DeviceMem(size_t bytes) {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaMalloc(&scratch_, sizeof(double)), "cudaMalloc");
    check(cudaMalloc(&send_, bytes), "cudaMalloc");
    check(cudaMalloc(&recv_, bytes), "cudaMalloc");
    bytes_ = bytes;
  }
  ~DeviceMem() {
    cudaFree(send_);
    cudaFree(recv_);
    cudaFree(scratch_);
    cudaStreamDestroy(stream_);
  }
  void reserve(size_t bytes) {
    if (bytes > bytes_) {
      fprintf(stderr, "tutti-perf: %zu bytes of GPU memory needed, %zu allocated\n", bytes, bytes_);
      exit(1);
    }
  }
  char* send() const { return static_cast<char*>(send_); }
  char* recv() const { return static_cast<char*>(recv_); }
  double* scratch() const { return static_cast<double*>(scratch_); }
  cudaStream_t stream() const { return stream_; }
  void sync() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  // In stream order on the rank's stream: the collectives that follow see the bytes.
  void toDevice(void* d, const void* h, size_t n) {
    check(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
  }
  void toHost(void* h, const void* d, size_t n) {
    check(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
    sync();
  }
  void fill(void* d, int v, size_t n) {
    check(cudaMemsetAsync(d, v, n, stream_), "cudaMemsetAsync");
  }

 private:
  cudaStream_t stream_ = nullptr;
  void *send_ = nullptr, *recv_ = nullptr, *scratch_ = nullptr;
  size_t bytes_ = 0;
#endif
};

#ifdef TUTTI_HAVE_CUDA
// The calls `body` makes on `stream`, captured once into a graph (thread-local capture mode: the
// other ranks' threads go on with their own calls), to launch as often as wanted.
class CapturedGraph {
 public:
  template <class Body>
  CapturedGraph(cudaStream_t stream, const Body& body) {
    DeviceMem::check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                     "cudaStreamBeginCapture");
    body();
    DeviceMem::check(cudaStreamEndCapture(stream, &graph_), "cudaStreamEndCapture");
    DeviceMem::check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  ~CapturedGraph() {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(cudaStream_t stream) {
    DeviceMem::check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

 private:
  cudaGraph_t graph_{};
  cudaGraphExec_t exec_{};
};
#endif

}  // namespace tutti::perf
