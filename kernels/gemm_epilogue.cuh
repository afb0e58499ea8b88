// The GEMM's epilogue: a consumer's 64-row part of a finished tile goes registers -> shared memory -> TMA
// store, in 64 x CW chunks (CW: one 128-byte swizzle span of the output type), each chunk's stores
// started as soon as it is written.
#pragma once
#include <type_traits>

#include "kernels/gemm_globals.cuh"
#include "kernels/gemm_l2.cuh"

namespace mp::kernels {

// Writes the thread's pairs of one 64 x CW chunk (pair(jb, f): a bf16x2 as uint32_t, or a float2; in the
// accumulator fragment's order) at their swizzled offsets: bf16 with stmatrix (one instruction per 16 x 16
// block and lane: 656 fewer instructions in the default kernel than st.shared.b32, level in time), f32
// with st.shared.v2. Through buf.at() they compiled to generic stores (ST.E, 64-bit addresses), and the
// epilogue took ~1 % of the GEMM's time more (bench/RESULTS.md, GEMM).
template <class OutT, class CTile, class Pair>
__device__ void write_chunk(CTile& buf, Pair pair) {
  using namespace mp::tile;
  constexpr int CW = CTile::cols;
  const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
  const uint32_t base = buf.smem_addr();
  if constexpr (sizeof(OutT) == 2) {
    // Pair f of a 16 x 16 block is the lane's pair of 8 x 8 matrix f: rows + 8 * (f & 1), columns
    // + 8 * (f >> 1). Lane l addresses row l % 8 of matrix l / 8 (16 bytes: one swizzle unit).
    const int m = lane / 8, r = warp * 16 + lane % 8 + 8 * (m & 1);
#pragma unroll
    for (int jb = 0; jb < CW / 16; ++jb)
      stmatrix_x4(base + CTile::layout::offset(r, 16 * jb + 8 * (m >> 1)), pair(jb, 0), pair(jb, 1),
                  pair(jb, 2), pair(jb, 3));
  } else {
#pragma unroll
    for (int jb = 0; jb < CW / 16; ++jb)
#pragma unroll
      for (int f = 0; f < 4; ++f) {
        const uint32_t a = base + CTile::layout::offset(warp * 16 + lane / 4 + 8 * (f & 1),
                                                        16 * jb + 2 * (lane % 4) + 8 * (f >> 1));
        st_shared_v2_f32(a, pair(jb, f));
      }
  }
}

// N adjacent 64 x CW output chunks of a consumer (columns col, col + CW, ...) in buffers buf[0..N) of the
// consumer's `Buffers`: wait until the stores that last read those buffers are done with them, write the
// chunks (pair_of(j): chunk j's pairs, see write_chunk), and start their TMA stores to C as one bulk
// group. Each consumer warpgroup writes its own rows (named barrier `bar`). N = 1: the chunks take turns
// in the buffers; N = Buffers: a whole tile at once (the whole-tile epilogue).
template <int N, int Buffers, class OutT, class CTile, class PairOf>
__device__ void store_chunks(CTile* buf, const gemm_globals& g, int bar, int row, int col, PairOf pair_of) {
  using namespace mp::tile;
  static_assert(N >= 1 && N <= Buffers, "store_chunks: at most one chunk per buffer");
  constexpr int CW = CTile::cols;
  const bool leader = warpgroup::thread_in_group() == 0;
  if (leader) tma::wait_read<Buffers - N>();  // the stores that last read these buffers are done
  named_barrier_sync(bar, warpgroup_threads);
  if constexpr (N > 1) pc::trace_mark(g, pc::trace_epilogue_begin);  // the whole tile (trace builds)
#pragma unroll
  for (int j = 0; j < N; ++j) write_chunk<OutT>(buf[j], pair_of(j));
  fence_async_shared();  // make the generic-proxy writes visible to the TMA engine
  named_barrier_sync(bar, warpgroup_threads);
  if constexpr (N > 1) pc::trace_mark(g, pc::trace_epilogue_written);
  if (leader) {  // the N stores as one bulk group
    if (c_hinted(g)) {
      const uint64_t pol = c_policy(g);
#pragma unroll
      for (int j = 0; j < N; ++j) tma::store_async_hint(&g.c, buf[j], row, col + j * CW, pol);
    } else {
#pragma unroll
      for (int j = 0; j < N; ++j) tma::store_async(&g.c, buf[j], row, col + j * CW);
    }
    tma::commit_group();
  }
}

}  // namespace mp::kernels
