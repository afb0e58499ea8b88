// The staged GEMM tutorial (docs/gemm-tutorial.md): every step computes C = A * B^T (A: M x K, B: N x K,
// C: M x N, bf16 row-major, fp32 accumulation) and is launched through one of these functions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace gemm_steps {
using bf16 = __nv_bfloat16;
void step1_naive(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, cudaStream_t s);
void step2_smem_tiling(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, cudaStream_t s);
void step3_wgmma(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, cudaStream_t s);
void step4_tma_ring(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, cudaStream_t s);
}  // namespace gemm_steps
