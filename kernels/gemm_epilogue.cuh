// The GEMM's epilogue: a consumer's 64-row part of a finished tile goes registers -> shared memory -> TMA
// store, in 64 x CW chunks (CW: one 128-byte swizzle span of the output type), each chunk's stores
// started as soon as it is written.
#pragma once
#include <type_traits>

#include "kernels/gemm_globals.cuh"
#include "kernels/gemm_l2.cuh"

namespace mp::kernels {

// The chunk writes are the tile layer's (warpgroup::write_chunk).
using tile::warpgroup::write_chunk;

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
