// The GEMM's L2 eviction priorities (GemmSchedule::l2_a, l2_b, l2_c; chosen by plan_gemm): the A and B
// tiles of a K step loaded with the priorities the plan gave them, and the policy of the C stores. The
// priorities travel in gemm_globals::l2_hint as a + 4 b + 16 c (tma::l2_priority values); 0: no hints,
// and the plain loads, whose instructions carry no policy operand.
#pragma once
#include "kernels/gemm_globals.cuh"

namespace mp::kernels {

// A K step's A tile (rows `row`, columns kk) and B tile (N-tile columns `col`: B stored N x K when BT, else
// K x N) into one ring stage, completing on `full`.
template <bool BT, class ATile, class BTile>
__device__ inline void load_ab(ATile& a, BTile& b, const gemm_globals& g, tile::semaphore& full, int row,
                               int col, int kk) {
  using namespace mp::tile;
  if (g.l2_hint & 15) {
    const uint64_t pa = tma::l2_policy(tma::l2_priority(g.l2_hint & 3));
    const uint64_t pb = tma::l2_policy(tma::l2_priority((g.l2_hint >> 2) & 3));
    tma::load_async_hint(a, &g.a, full, row, kk, pa);
    if constexpr (BT)
      tma::load_async_hint(b, &g.b, full, col, kk, pb);
    else
      tma::load_async_hint(b, &g.b, full, kk, col, pb);
  } else {
    tma::load_async(a, &g.a, full, row, kk);
    if constexpr (BT)
      tma::load_async(b, &g.b, full, col, kk);
    else
      tma::load_async(b, &g.b, full, kk, col);
  }
}

// Whether the C stores carry a policy, and which (valid only where c_hinted).
__device__ inline bool c_hinted(const gemm_globals& g) { return (g.l2_hint >> 4) != 0; }
__device__ inline uint64_t c_policy(const gemm_globals& g) {
  return tile::tma::l2_policy(tile::tma::l2_priority((g.l2_hint >> 4) & 3));
}

}  // namespace mp::kernels
