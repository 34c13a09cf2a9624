// cuBLAS's few calls of tests/cudaemu/include/cublas_v2.h on the emulated CUDA runtime: each
// GEMM is OpenBLAS's, run in the handle's stream order as a host function, but with its inner
// dimension cut in two whose products are summed apart and then added, as a GPU's GEMM may
// (split-K): its sums are not in the CPU's order, so a test that compares the trainer's GPU half
// with its CPU half meets rounding differences here too, not the same bits.
#include <cblas.h>
#include <cublas_v2.h>

#include <memory>
#include <vector>

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
  const int k1 = g->k / 3;  // the first third apart
  if (k1 == 0 || g->m == 0 || g->n == 0) {
    cblas_sgemm(CblasColMajor, g->ta, g->tb, g->m, g->n, g->k, g->alpha, g->a, g->lda, g->b, g->ldb,
                g->beta, g->c, g->ldc);
    return;
  }
  // Column-major: A is m x k (or k x m transposed), B k x n (or n x k).
  const float* a2 = g->a + (g->ta == CblasNoTrans ? size_t(k1) * size_t(g->lda) : size_t(k1));
  const float* b2 = g->b + (g->tb == CblasNoTrans ? size_t(k1) : size_t(k1) * size_t(g->ldb));
  std::vector<float> first(size_t(g->m) * size_t(g->n));
  cblas_sgemm(CblasColMajor, g->ta, g->tb, g->m, g->n, k1, 1.0f, g->a, g->lda, g->b, g->ldb, 0.0f,
              first.data(), g->m);
  cblas_sgemm(CblasColMajor, g->ta, g->tb, g->m, g->n, g->k - k1, g->alpha, a2, g->lda, b2, g->ldb,
              g->beta, g->c, g->ldc);
  for (int j = 0; j < g->n; ++j)
    for (int i = 0; i < g->m; ++i)
      g->c[size_t(j) * size_t(g->ldc) + size_t(i)] +=
          g->alpha * first[size_t(j) * size_t(g->m) + size_t(i)];
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
