// Step 4: TMA and an mbarrier ring. The copy engine brings each 128 x 64 slice of A and 256 x 64 slice of
// B into a 4-stage shared-memory ring, already swizzled, completing on an mbarrier with a byte count.
// One thread issues the copies STAGES - 1 slices ahead, so loads overlap math; but the same warpgroups
// issue the copies and the math, and each block still makes one tile and exits.
#include "docs/gemm_steps/steps.h"
#include "tile/tile.cuh"
#include "tile/tma_host.h"

namespace gemm_steps {
using namespace mp::tile;

constexpr int STAGES = 4;
struct step4_stage {
  st_bf<128, 64> a;
  st_bf<256, 64> b;
};

__global__ void __launch_bounds__(256)
    tma_kernel(const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb, bf16* c, int m,
               int n, int k) {
  extern __shared__ uint8_t raw[];
  auto* ring = reinterpret_cast<step4_stage*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  __shared__ semaphore full[STAGES];
  const int row0 = blockIdx.y * 128, col0 = blockIdx.x * 256, wg = threadIdx.x / 128;
  const int iters = (k + 63) / 64;
  auto issue = [&](int it) {
    step4_stage& s = ring[it % STAGES];
    expect_bytes(full[it % STAGES], sizeof(step4_stage));
    tma::load_async(s.a, &ma, full[it % STAGES], row0, it * 64);
    tma::load_async(s.b, &mb, full[it % STAGES], col0, it * 64);
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) init_semaphore(full[s], 1);
    fence_barrier_init();
    for (int it = 0; it < STAGES - 1 && it < iters; ++it) issue(it);
  }
  __syncthreads();
  rt_fl<16, 256> acc;
  for (int it = 0; it < iters; ++it) {
    wait(full[it % STAGES], (it / STAGES) & 1);
    warpgroup::mma_fence();
    warpgroup::mma_ABt(acc, ring[it % STAGES].a.subtile_rows<64>(wg), ring[it % STAGES].b, it > 0);
    warpgroup::mma_commit_group();
    warpgroup::mma_async_wait<1>();  // iteration it-1 is done: its stage may be refilled
    __syncthreads();                 // ... by both warpgroups
    if (threadIdx.x == 0 && it + STAGES - 1 < iters) issue(it + STAGES - 1);
  }
  warpgroup::mma_async_wait<0>();
  warpgroup::fence_accumulator(acc);
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

void step4_tma_ring(const bf16* a, const bf16* b, bf16* c, int m, int n, int k, cudaStream_t s) {
  const int smem = STAGES * sizeof(step4_stage) + 1024;
  static cudaError_t once =
      cudaFuncSetAttribute(tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  (void)once;
  auto ma = make_tma_map<st_bf<128, 64>>(gl<bf16, 1, 1, -1, -1>(const_cast<bf16*>(a), 1, 1, m, k));
  auto mb = make_tma_map<st_bf<256, 64>>(gl<bf16, 1, 1, -1, -1>(const_cast<bf16*>(b), 1, 1, n, k));
  dim3 grid((n + 255) / 256, (m + 127) / 128);
  tma_kernel<<<grid, 256, smem, s>>>(ma, mb, c, m, n, k);
}

}  // namespace gemm_steps
