// The cuBLAS reference for the GEMM: the same row-major product, expressed column-major for cuBLAS
// (C^T = B^T A^T), bf16 inputs, fp32 compute.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/error.h"
#include "kernels/gemm.h"

namespace mp::kernels {

void gemm_bf16_cublas(const void* a, const void* b, void* c, int m, int n, int k, b_layout bl, out_type out,
                      CUstream_st* stream) {
  static cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) fail_user("cuBLAS: cublasCreate failed (no usable GPU?)");
    return h;
  }();
  cublasSetStream(handle, stream);
  const float alpha = 1.f, beta = 0.f;
  // Column-major view: C^T (n x m) = op(B)^T (n x k) * A^T (k x m). Row-major B (k x n) is column-major
  // B^T (n x k): no transpose; row-major B (n x k) is column-major k x n: transpose.
  const cublasOperation_t opb = bl == b_layout::kn ? CUBLAS_OP_N : CUBLAS_OP_T;
  const int ldb = bl == b_layout::kn ? n : k;
  const cudaDataType_t ct = out == out_type::f32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasStatus_t st = cublasGemmEx(handle, opb, CUBLAS_OP_N, n, m, k, &alpha, b, CUDA_R_16BF, ldb, a,
                                   CUDA_R_16BF, k, &beta, c, ct, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  MP_USER_CHECK(st == CUBLAS_STATUS_SUCCESS, "cuBLAS: cublasGemmEx failed with status ", int(st));
}

}  // namespace mp::kernels
