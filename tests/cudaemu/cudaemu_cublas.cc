// cuBLAS's few calls of tests/cudaemu/include/cublas_v2.h on the emulated CUDA runtime: each
// GEMM is OpenBLAS's, run in the handle's stream order as a host function.
#include <cblas.h>
#include <cublas_v2.h>

#include <memory>

struct cudaemuCublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

struct Gemm {
  CBLAS_TRANSPOSE ta, tb;
  int m, n, k;
  float alpha;
  const float* a;
  int lda;
  const float* b;
  int ldb;
  float beta;
  float* c;
  int ldc;
};

void runGemm(void* p) {
  std::unique_ptr<Gemm> g(static_cast<Gemm*>(p));
  cblas_sgemm(CblasColMajor, g->ta, g->tb, g->m, g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb,
              g->beta, g->c, g->ldc);
}

CBLAS_TRANSPOSE trans(cublasOperation_t op) {
  return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new cudaemuCublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void*, size_t) {
  return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!alpha || !beta || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
  auto* g = new Gemm{trans(transa), trans(transb), m, n, k, *alpha, A, lda, B, ldb, *beta, C, ldc};
  if (cudaLaunchHostFunc(handle->stream, runGemm, g) != cudaSuccess) {
    delete g;
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  return CUBLAS_STATUS_SUCCESS;
}
