// Step 3: Tensor Cores through wgmma. Two warpgroups share a 128 x 256 output tile (64 rows each, one
// m64n256k16 instruction per 16 of K). A and B still come in through ordinary loads, written into the
// 128-byte-swizzled shared tiles wgmma reads; loading and math take turns (no overlap).
#include "docs/gemm_steps/steps.h"
#include "tile/tile.cuh"

namespace gemm_steps {
using namespace mp::tile;

struct step3_smem {
  st_bf<128, 64> a;
  st_bf<256, 64> b;
};

__global__ void __launch_bounds__(256)
    wgmma_kernel(const bf16* a, const bf16* b, bf16* c, int m, int n, int k) {
  extern __shared__ uint8_t raw[];
  auto& sm = *reinterpret_cast<step3_smem*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  const int row0 = blockIdx.y * 128, col0 = blockIdx.x * 256, wg = threadIdx.x / 128;
  rt_fl<16, 256> acc;
  warp::zero(acc);
  for (int k0 = 0; k0 < k; k0 += 64) {
    // 16-byte loads: a row of 64 bf16 is 8 vectors; zeros outside the matrix.
    for (int i = threadIdx.x; i < (128 + 256) * 8; i += 256) {
      const bool is_a = i < 128 * 8;
      const int r = (is_a ? i : i - 128 * 8) / 8, v = i % 8;
      const int grow = (is_a ? row0 : col0) + r, gk = k0 + v * 8;
      uint4 val = {0, 0, 0, 0};
      if (grow < (is_a ? m : n) && gk < k)
        val = *reinterpret_cast<const uint4*>((is_a ? a : b) + size_t(grow) * k + gk);
      bf16& dst = is_a ? sm.a.at(r, v * 8) : sm.b.at(r, v * 8);
      *reinterpret_cast<uint4*>(&dst) = val;  // 8 elements stay together under the 16-byte swizzle
    }
    fence_async_shared();  // ordinary stores, read next by the Tensor Cores (the async proxy)
    __syncthreads();
    warpgroup::mma_fence();
    warpgroup::mma_ABt(acc, sm.a.subtile_rows<64>(wg), sm.b);
    warpgroup::mma_commit_group();
    warpgroup::mma_async_wait<0>();
    warpgroup::fence_accumulator(acc);
    __syncthreads();
  }
  const int lane = threadIdx.x % 32, w = (threadIdx.x / 32) % 4;
  for (int j = 0; j < 16; ++j)
    for (int f = 0; f < 4; ++f) {
      const int r = row0 + wg * 64 + w * 16 + lane / 4 + 8 * (f & 1),
                col = col0 + 16 * j + 2 * (lane % 4) + 8 * (f >> 1);
      if (r < m && col < n)
        *reinterpret_cast<__nv_bfloat162*>(c + size_t(r) * n + col) =
            __float22bfloat162_rn(acc.tiles[0][j][f]);
    }
}

void step3_wgmma(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, cudaStream_t s) {
  const int smem = sizeof(step3_smem) + 1024;
  static cudaError_t once =
      cudaFuncSetAttribute(wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  (void)once;
  dim3 grid((n + 255) / 256, (m + 127) / 128);
  wgmma_kernel<<<grid, 256, smem, s>>>(a, b, c, m, n, k);
}

}  // namespace gemm_steps
