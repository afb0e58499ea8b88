// Warpgroup scope (4 consecutive warps starting at a warp index divisible by 4): wgmma into fp32 register
// accumulators, its fence / commit / wait, and register reallocation (setmaxnreg).
// Each warp of the warpgroup holds a 16-row slice of the 64 x N accumulator as an rt_fl<16, N>.
#pragma once
#include "tile/types.cuh"
#include "tile/warp.cuh"

namespace mp::tile::warpgroup {

__device__ inline int warpgroup_id() { return threadIdx.x / warpgroup_threads; }
__device__ inline int thread_in_group() { return threadIdx.x % warpgroup_threads; }

// setmaxnreg: a producer warpgroup gives registers back, consumers take them. Only effective when the
// kernel has a register cap at entry (__launch_bounds__(threads, 1)).
template <int Regs>
__device__ inline void decrease_registers() {
  static_assert(Regs % 8 == 0 && Regs >= 24 && Regs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
}
template <int Regs>
__device__ inline void increase_registers() {
  static_assert(Regs % 8 == 0 && Regs >= 24 && Regs <= 256, "setmaxnreg takes a multiple of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
}

// One struct per hardware instruction: wgmma.mma_async m64nNk16, bf16 x bf16 -> f32, A and B from shared
// memory through descriptors. TransB = 1 reads B MN-major (stored K x N).
template <int N>
struct wgmma_ss_bf16 {
  static_assert(N == 16 || N == 32 || N == 64 || N == 128 || N == 256,
                "wgmma_ss_bf16: this build provides N = 16, 32, 64, 80, 128, 256 (see tile/detail/gen_wgmma.py ss)");
};
#include "tile/detail/wgmma_bf16.inl"
// The same with A from registers (RS form): each warp gives its 16 rows of the 64 x 16 A slice as four
// bf16x2 registers per lane, the mma A-fragment layout, which is the layout of a 16-row register tile's
// 16 x 16 block (fragments 0-3: rows lane/4 and +8, columns 2 (lane%4) and +8).
template <int N>
struct wgmma_rs_bf16 {
  static_assert(
      N == 16 || N == 32 || N == 64 || N == 128 || N == 256,
      "wgmma_rs_bf16: this build provides N = 16, 32, 64, 80, 128, 256 (see tile/detail/gen_wgmma.py rs)");
};
#include "tile/detail/wgmma_rs_bf16.inl"

// Orders this warpgroup's earlier register and shared-memory accesses before the wgmma that follow.
__device__ inline void mma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void mma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Wait until at most N committed groups are still running.
template <int N>
__device__ inline void mma_async_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving accumulator reads / writes across an asynchronous wgmma.
template <int N>
__device__ inline void fence_accumulator(rt_fl<16, N>& acc) {
  float* d = reinterpret_cast<float*>(acc.tiles);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

namespace detail {
template <int N, major BM, class SA, class SB>
__device__ inline void mma(rt_fl<16, N>& acc, const SA& a, const SB& b, bool accumulate) {
  static_assert(std::is_same_v<typename SA::elem, bf16> && std::is_same_v<typename SB::elem, bf16>,
                "warpgroup::mma: this build has bf16 wgmma only");
  static_assert(SA::rows == 64,
                "warpgroup::mma: A must be a 64-row shared tile (the wgmma M), one warpgroup's slice");
  constexpr int K = SA::cols;
  static_assert(K % 16 == 0, "warpgroup::mma: the shared K dimension must be a multiple of 16");
  if constexpr (BM == major::k) {
    static_assert(SB::rows == N, "warpgroup::mma_ABt: B's rows (N) must equal the accumulator's columns");
    static_assert(SB::cols == K, "warpgroup::mma_ABt: B's columns (K) must equal A's columns");
  } else {
    static_assert(SB::cols == N, "warpgroup::mma_AB: B's columns (N) must equal the accumulator's columns");
    static_assert(SB::rows == K, "warpgroup::mma_AB: B's rows (K) must equal A's columns");
  }
  float* d = reinterpret_cast<float*>(acc.tiles);
  // One descriptor per operand; the k16 steps add compile-time constants to its start field.
  const uint64_t da0 = wgmma_operand_desc<typename SA::layout, major::k>(a.smem_addr(), 0);
  const uint64_t db0 = wgmma_operand_desc<typename SB::layout, BM>(b.smem_addr(), 0);
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    const uint64_t da = wgmma_desc_add(da0, wgmma_desc_step<typename SA::layout, major::k>(ks));
    const uint64_t db = wgmma_desc_add(db0, wgmma_desc_step<typename SB::layout, BM>(ks));
    wgmma_ss_bf16<N>::template mma<BM == major::mn ? 1 : 0>(d, da, db, (accumulate || ks > 0) ? 1 : 0);
  }
}
// One K slice of 16 (number ks) of the same product: a single wgmma instruction.
template <int N, major BM, class SA, class SB>
__device__ inline void mma_slice(rt_fl<16, N>& acc, const SA& a, const SB& b, int ks, bool accumulate) {
  static_assert(std::is_same_v<typename SA::elem, bf16> && std::is_same_v<typename SB::elem, bf16>,
                "warpgroup::mma: this build has bf16 wgmma only");
  static_assert(SA::rows == 64,
                "warpgroup::mma: A must be a 64-row shared tile (the wgmma M), one warpgroup's slice");
  static_assert((BM == major::k ? SB::rows : SB::cols) == N,
                "warpgroup::mma: B's N dimension must equal the accumulator's columns");
  const uint64_t da = wgmma_operand_desc<typename SA::layout, major::k>(a.smem_addr(), ks);
  const uint64_t db = wgmma_operand_desc<typename SB::layout, BM>(b.smem_addr(), ks);
  wgmma_ss_bf16<N>::template mma<BM == major::mn ? 1 : 0>(reinterpret_cast<float*>(acc.tiles), da, db,
                                                          accumulate ? 1 : 0);
}
}  // namespace detail

// acc (+)= A[:, 16 ks : 16 ks + 16] * B[16 ks : 16 ks + 16, :] (one wgmma; B stored K x N): a kernel that
// spreads the K slices of a step over several accumulators (independent wgmma chains, summed at the
// end) issues them one by one.
template <int N, class SA, class SB>
__device__ inline void mma_AB_slice(rt_fl<16, N>& acc, const SA& a, const SB& b, int ks, bool accumulate) {
  detail::mma_slice<N, major::mn>(acc, a, b, ks, accumulate);
}
// The same with B stored N x K (acc (+)= A_ks * B_ks^T).
template <int N, class SA, class SB>
__device__ inline void mma_ABt_slice(rt_fl<16, N>& acc, const SA& a, const SB& b, int ks, bool accumulate) {
  detail::mma_slice<N, major::k>(acc, a, b, ks, accumulate);
}

// acc (+)= A * B with A 64 x K (K-major) and B K x N stored row-major (MN-major). Asynchronous: issue
// mma_fence() before and mma_commit_group() / mma_async_wait<>() after. mma_* accumulates, mm_* overwrites.
template <int N, class SA, class SB>
__device__ inline void mma_AB(rt_fl<16, N>& acc, const SA& a, const SB& b) {
  detail::mma<N, major::mn>(acc, a, b, true);
}
template <int N, class SA, class SB>
__device__ inline void mm_AB(rt_fl<16, N>& acc, const SA& a, const SB& b) {
  detail::mma<N, major::mn>(acc, a, b, false);
}
// acc (+)= A * B^T with B stored N x K (K-major).
template <int N, class SA, class SB>
__device__ inline void mma_ABt(rt_fl<16, N>& acc, const SA& a, const SB& b) {
  detail::mma<N, major::k>(acc, a, b, true);
}
template <int N, class SA, class SB>
__device__ inline void mm_ABt(rt_fl<16, N>& acc, const SA& a, const SB& b) {
  detail::mma<N, major::k>(acc, a, b, false);
}

// The same with accumulate-or-overwrite chosen at run time (one copy of the instruction stream, e.g.
// overwrite on a tile's first K step).
template <int N, class SA, class SB>
__device__ inline void mma_AB(rt_fl<16, N>& acc, const SA& a, const SB& b, bool accumulate) {
  detail::mma<N, major::mn>(acc, a, b, accumulate);
}
template <int N, class SA, class SB>
__device__ inline void mma_ABt(rt_fl<16, N>& acc, const SA& a, const SB& b, bool accumulate) {
  detail::mma<N, major::k>(acc, a, b, accumulate);
}

// acc (+)= A * B with A from registers (this warp's 16 rows of the 64 x K operand, a bf16 register tile:
// a softmax's P converted in place) and B K x N in shared memory, stored row-major (MN-major). The
// registers of `a` must stay unchanged until the wgmma completes (mma_async_wait); ptxas keeps them.
template <int N, int K, class SB>
__device__ inline void mma_AB(rt_fl<16, N>& acc, const rt_bf<16, K>& a, const SB& b, bool accumulate) {
  static_assert(std::is_same_v<typename SB::elem, bf16>, "warpgroup::mma_AB: this build has bf16 wgmma only");
  static_assert(SB::cols == N, "warpgroup::mma_AB: B's columns (N) must equal the accumulator's columns");
  static_assert(SB::rows == K, "warpgroup::mma_AB: B's rows (K) must equal A's columns");
  float* d = reinterpret_cast<float*>(acc.tiles);
  const uint64_t db0 = wgmma_operand_desc<typename SB::layout, major::mn>(b.smem_addr(), 0);
#pragma unroll
  for (int ks = 0; ks < K / 16; ++ks) {
    const uint64_t db = wgmma_desc_add(db0, wgmma_desc_step<typename SB::layout, major::mn>(ks));
    wgmma_rs_bf16<N>::template mma<1>(d, reinterpret_cast<const uint32_t*>(a.tiles[0][ks]), db,
                                      (accumulate || ks > 0) ? 1 : 0);
  }
}

// ---- register tiles at warpgroup scope ----
// A warpgroup's register tile is four warps' tiles stacked: warp w of the group holds rows
// [w * RT::rows, (w + 1) * RT::rows) of a (4 * RT::rows)-row tile (the wgmma accumulator is rt_fl<16, N>
// per warp: a 64 x N tile per warpgroup). Element-wise ops, row reductions and row broadcasts act on each
// warp's rows and are the warp-scope ones; loads and stores address the whole stacked tile.
using warp::abs;
using warp::add;
using warp::add_row;
using warp::copy;
using warp::div;
using warp::div_row;
using warp::exp;
using warp::exp2;
using warp::fill;
using warp::log;
using warp::max;
using warp::min;
using warp::mul;
using warp::mul_row;
using warp::neg;
using warp::relu;
using warp::row_max;
using warp::row_sum;
using warp::sub;
using warp::sub_row;
using warp::zero;

__device__ inline int warpid() { return (threadIdx.x / warp_threads) % warpgroup_warps; }

template <reg_tile RT, shared_tile ST>
__device__ inline void load(RT& dst, const ST& src, int r0 = 0, int c0 = 0) {
  static_assert(4 * RT::rows <= ST::rows,
                "warpgroup::load: the shared tile has fewer rows than 4 warps' tiles");
  warp::load(dst, src, r0 + RT::rows * warpid(), c0);
}
template <shared_tile ST, reg_tile RT>
__device__ inline void store(ST& dst, const RT& src, int r0 = 0, int c0 = 0) {
  static_assert(4 * RT::rows <= ST::rows,
                "warpgroup::store: the shared tile has fewer rows than 4 warps' tiles");
  warp::store(dst, src, r0 + RT::rows * warpid(), c0);
}
template <reg_tile RT, global_layout GL>
__device__ inline void load(RT& dst, const GL& g, int row, int col, int d = 0, int b = 0) {
  warp::load(dst, g, row + RT::rows * warpid(), col, d, b);
}
template <global_layout GL, reg_tile RT>
__device__ inline void store(const GL& g, const RT& src, int row, int col, int d = 0, int b = 0) {
  warp::store(g, src, row + RT::rows * warpid(), col, d, b);
}

// Writes a consumer warpgroup thread's accumulator pairs of one 64 x CW output chunk (CW: one 128-byte
// swizzle span of OutT; pair(jb, f): a bf16x2 as uint32_t, or a float2, in the accumulator fragment's
// order) at their swizzled offsets: bf16 with stmatrix (one instruction per 16 x 16 block and lane: 656
// fewer instructions in the GEMM than st.shared.b32, level in time), f32 with st.shared.v2. Through
// buf.at() they compiled to generic stores (ST.E, 64-bit addresses), and the epilogue took ~1 % of the
// GEMM's time more (bench/RESULTS.md, GEMM). The GEMM's epilogue (kernels/gemm_epilogue.cuh) and the
// CUDA lowering's generated matmul kernels use it.
template <class OutT, class CTile, class Pair>
__device__ void write_chunk(CTile& buf, Pair pair) {
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

}  // namespace mp::tile::warpgroup
