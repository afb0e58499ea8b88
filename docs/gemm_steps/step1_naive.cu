// Step 1: one thread per output element, reading A and B straight from global memory. Every element of
// A and B is read N (resp. M) times; the caches catch some of it, the arithmetic units wait on the rest.
#include "docs/gemm_steps/steps.h"

namespace gemm_steps {

__global__ void naive_kernel(const bf16* a, const bf16* b, bf16* c, int m, int n, int k) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x, row = blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= m || col >= n) return;
  float acc = 0.f;
  for (int kk = 0; kk < k; ++kk)
    acc += __bfloat162float(a[size_t(row) * k + kk]) * __bfloat162float(b[size_t(col) * k + kk]);
  c[size_t(row) * n + col] = __float2bfloat16_rn(acc);
}

void step1_naive(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, cudaStream_t s) {
  dim3 block(32, 8), grid((n + 31) / 32, (m + 7) / 8);
  naive_kernel<<<grid, block, 0, s>>>(a, b, c, m, n, k);
}

}  // namespace gemm_steps
