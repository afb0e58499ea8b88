// Step 2: shared-memory tiling on the CUDA cores. A block stages a 128 x 32 slice of A and of B in shared
// memory and each of its 256 threads computes an 8 x 8 patch of the 128 x 128 output tile from registers:
// every loaded element now feeds 128 multiply-adds instead of one. Still FFMA, no Tensor Cores.
#include "docs/gemm_steps/steps.h"

namespace gemm_steps {

constexpr int BM = 128, BN = 128, BK = 32, TM = 8, TN = 8;

__global__ void __launch_bounds__(256)
    smem_kernel(const bf16* a, const bf16* b, bf16* c, int m, int n, int k) {
  __shared__ float as[BK][BM + 4], bs[BK][BN + 4];  // K-major in shared memory: threads read rows of it
  const int tid = threadIdx.x, tr = tid / 16, tc = tid % 16;
  const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
  float acc[TM][TN] = {};
  for (int k0 = 0; k0 < k; k0 += BK) {
    for (int i = tid; i < BM * BK; i += 256) {  // 128 rows x 32 k of A and of B (B is N x K)
      const int r = i / BK, kk = i % BK;
      as[kk][r] = row0 + r < m && k0 + kk < k ? __bfloat162float(a[size_t(row0 + r) * k + k0 + kk]) : 0.f;
      bs[kk][r] = col0 + r < n && k0 + kk < k ? __bfloat162float(b[size_t(col0 + r) * k + k0 + kk]) : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < BK; ++kk) {
      float ra[TM], rb[TN];
#pragma unroll
      for (int i = 0; i < TM; ++i) ra[i] = as[kk][tr * TM + i];
#pragma unroll
      for (int j = 0; j < TN; ++j) rb[j] = bs[kk][tc * TN + j];
#pragma unroll
      for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += ra[i] * rb[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) {
      const int r = row0 + tr * TM + i, col = col0 + tc * TN + j;
      if (r < m && col < n) c[size_t(r) * n + col] = __float2bfloat16_rn(acc[i][j]);
    }
}

void step2_smem_tiling(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, cudaStream_t s) {
  dim3 grid((n + BN - 1) / BN, (m + BM - 1) / BM);
  smem_kernel<<<grid, 256, 0, s>>>(a, b, c, m, n, k);
}

}  // namespace gemm_steps
