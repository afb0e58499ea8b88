// The attention backward on wgmma (after FlashAttention-2/3): a work item is a 128-key tile of one
// (batch, KV head); each of the two consumer warpgroups owns 64 of its keys, keeps their dK and dV in
// fp32 registers and walks the query tiles (64 rows) of every query head of the group that see them,
// which the producer streams through the pipeline template's TMA ring (Q and dO per stage; the item's K
// and V tiles once, into the finish region). Per query tile, with the key as the wgmma M dimension:
//   S^T = K Q^T, dP^T = V dO^T        (SS form: K, V and Q, dO all K-major in shared memory)
//   P^T = exp2(S^T scale log2 e - LSE log2 e), dS^T = P^T (dP^T - D)   (registers; masks as the forward)
//   dV += P^T dO, dK += dS^T Q        (RS form: P^T, dS^T from registers are the A fragments)
//   dQ_part = dS K                    (SS form: dS stored transposed into a 64 x 64 shared tile)
// and dQ_part is added into an fp32 buffer with vector atomics: by default one partial per row and
// block, the consumers taking turns at dQ = dS K over the block's 128 keys (bwd_dq below);
// dK, dV (summed over the group's heads inside the block, no atomics) go to global memory at the end.
// D = rowsum(dO * O) and the final rounding of dQ are the kernels of attention_backward.cuh.
// Dims 64 and 128: at 256 the dK and dV accumulators alone would take 256 registers per thread.
// Included once, by attention_sm90.cu, after attention_backward.cuh.
#pragma once
#include <cuda_runtime.h>

#include "kernels/attention_backward.cuh"
#include "tile/tile.cuh"

namespace mp::kernels {
namespace {

struct attn_bwd_globals {
  CUtensorMap q, k, v, d_o;  // boxes of 64 rows
  const float* lse;          // (batch, heads, seq_q), natural log
  const float* delta;        // rowsum(dO * O), like lse
  float* dq_acc;             // like Q, fp32, zeroed before the launch
  tile::bf16 *dk, *dv;
  int heads, group, seq_q, seq_kv, kv_tiles, work;
  int offset;  // seq_kv - seq_q: the causal diagonal's shift
  float scale, scale_log2;
};

// How dQ's partials reach the fp32 buffer (MP_ATTENTION_BWD_DQ), added with vector atomics from
// registers in both:
//   turns (the default): one partial per row and block, over the block's 128 keys. The consumers take
//     turns: consumer (step % 2) computes dQ = dS K from both consumers' dS tiles (double-buffered by the
//     step's parity); the other only arrives on the barrier that says its dS is written and goes on to
//     its next step. Half the atomics of `atomic`, and each consumer skips every other dQ product.
//   atomic: each consumer adds its own 64 keys' partial (64 rows x D), two partials per row and block.
enum class bwd_dq : int { atomic = 0, turns = 1 };

template <int D, bool Causal, bwd_dq DQ = bwd_dq::atomic>
struct attn_bwd_wgmma_kernel {
  static_assert(D == 64 || D == 128, "the wgmma attention backward is built for dims 64 and 128");
  static constexpr int BM = 64, BN = 128, consumers = 2;
  static constexpr bool by_turns = DQ == bwd_dq::turns;
  static constexpr int ds_bufs = by_turns ? 2 : 1;
  static constexpr int producer_registers = 24, consumer_registers = 240;
  using row_tile = tile::st_bf<64, D>;  // 64 query rows (Q, dO) or 64 keys (K, V)
  using ds_tile = tile::st_bf<64, 64>;  // dS of one consumer: 64 query rows x its 64 keys
  struct stage {
    row_tile q, d_o;
  };
  struct finish_smem {
    row_tile k[consumers], v[consumers];
    ds_tile ds[ds_bufs][consumers];  // by turns: by the step's parity, read across consumers
    float lse2[consumers][BM], delta[consumers][BM];  // each consumer's copy of the tile's row values
  };
  static constexpr int finish_bytes = (int(sizeof(finish_smem)) + 1023) / 1024 * 1024;
  static constexpr int stages_fit =
      (tile::pc::max_shared_bytes - 1024 - finish_bytes - 16 * 8) / int(sizeof(stage));
  static constexpr int stages = stages_fit < 4 ? stages_fit : 4;
  static_assert(stages >= 2, "attention backward: the ring needs two stages so that loads overlap the math");
  static constexpr bool unroll_ring = false;
  using globals = attn_bwd_globals;

  struct state {
    tile::rt_fl<16, D> dk, dv;  // this warp's 16 keys of the consumer's 64
  };
  struct item {
    int b, hk, k0, q_first, q_tiles, iters;
  };
  __host__ __device__ static int work_count(const globals& g) { return g.work; }
  __device__ static item item_of(const globals& g, int work) {
    item w;
    const int bh = work / g.kv_tiles;
    w.b = bh / (g.heads / g.group), w.hk = bh % (g.heads / g.group), w.k0 = (work % g.kv_tiles) * BN;
    // With the causal mask, query row i sees key k0 from i = k0 - offset on.
    const int first_row = Causal ? max(0, w.k0 - g.offset) : 0;
    w.q_first = first_row / BM;
    const int all = (g.seq_q + BM - 1) / BM;
    w.q_tiles = first_row < g.seq_q ? all - w.q_first : 0;
    w.iters = w.q_tiles * g.group;
    return w;
  }
  __device__ static int iters(const item& w) { return w.iters; }
  __device__ static void prefetch(const globals& g) {
    tile::tma::prefetch_map(&g.q);
    tile::tma::prefetch_map(&g.k);
    tile::tma::prefetch_map(&g.v);
    tile::tma::prefetch_map(&g.d_o);
  }
  // Iteration it: query head hk * group + it / q_tiles, query tile q_first + it % q_tiles.
  __device__ static int head_of(const globals& g, const item& w, int it) {
    return w.hk * g.group + it / w.q_tiles;
  }
  __device__ static int q0_of(const item& w, int it) { return (w.q_first + it % w.q_tiles) * BM; }

  __device__ static void load(stage& s, finish_smem& f, const globals& g, const item& w, int it,
                              tile::semaphore& full) {
    constexpr uint32_t tile_bytes = tile::tma::bytes<row_tile>();
    expect_bytes(full, (it == 0 ? 2 + 2 * consumers : 2) * tile_bytes);
    if (it == 0)
      for (int c = 0; c < consumers; ++c) {
        tile::tma::load_async(f.k[c], &g.k, full, w.k0 + 64 * c, 0, w.hk, w.b);
        tile::tma::load_async(f.v[c], &g.v, full, w.k0 + 64 * c, 0, w.hk, w.b);
      }
    const int h = head_of(g, w, it), q0 = q0_of(w, it);
    tile::tma::load_async(s.q, &g.q, full, q0, 0, h, w.b);
    tile::tma::load_async(s.d_o, &g.d_o, full, q0, 0, h, w.b);
  }

  __device__ static void begin(state& st, const globals&) {
    tile::warpgroup::zero(st.dk);
    tile::warpgroup::zero(st.dv);
  }

  __device__ static void compute(state& st, stage& s, finish_smem& f, const globals& g, const item& w, int it,
                                 int consumer) {
    using namespace mp::tile;
    const int lane = threadIdx.x % warp_threads, t = warpgroup::thread_in_group();
    const int h = head_of(g, w, it), q0 = q0_of(w, it);
    const int kc0 = w.k0 + 64 * consumer;                                   // this consumer's first key
    const int key_row = kc0 + 16 * warpgroup::warpid() + lane / 4;          // the lane's first key (+8)
    const size_t head_row = (size_t(w.b) * g.heads + h) * size_t(g.seq_q);  // row 0 of head h

    // S^T = K Q^T and dP^T = V dO^T (64 keys x 64 query rows each).
    rt_fl<16, BM> sc, dp;
    warpgroup::fence_accumulator(sc);
    warpgroup::fence_accumulator(dp);
    warpgroup::mma_fence();
    warpgroup::mm_ABt(sc, f.k[consumer], s.q);
    warpgroup::mm_ABt(dp, f.v[consumer], s.d_o);
    warpgroup::mma_commit_group();
    // Meanwhile the tile's LSE (log2 domain) and D into this consumer's shared copy. The previous tile's
    // readers are past the dS barrier below, so the copy is free.
    if (t < BM) {
      const int row = q0 + t;
      f.lse2[consumer][t] = row < g.seq_q ? g.lse[head_row + row] * 1.4426950408889634f : 0.f;
    } else {
      const int row = q0 + t - BM;
      f.delta[consumer][t - BM] = row < g.seq_q ? g.delta[head_row + row] : 0.f;
    }
    named_barrier_sync(1 + consumer, warpgroup_threads);
    warpgroup::mma_async_wait<0>();
    warpgroup::fence_accumulator(sc);
    warpgroup::fence_accumulator(dp);

    // P^T and dS^T in place. Lane element (j, f4, x|y): key key_row + 8 (f4 & 1), query row
    // q0 + 16 j + 2 (lane % 4) + 8 (f4 >> 1) + (0 | 1). Masked: keys past seq_kv, rows past seq_q and,
    // causal, keys past a row's diagonal (only on the tiles that reach one of them).
    const bool edge = kc0 + 64 > g.seq_kv || q0 + BM > g.seq_q || (Causal && kc0 + 63 > q0 + g.offset);
#pragma unroll
    for (int j = 0; j < BM / 16; ++j)
#pragma unroll
      for (int f4 = 0; f4 < 4; ++f4) {
        const int key = key_row + 8 * (f4 & 1), c = 16 * j + 2 * (lane % 4) + 8 * (f4 >> 1);
        float2& x = sc.tiles[0][j][f4];
        float2& y = dp.tiles[0][j][f4];
        float px = mp::tile::exp2_ftz(fmaf(x.x, g.scale_log2, -f.lse2[consumer][c]));
        float py = mp::tile::exp2_ftz(fmaf(x.y, g.scale_log2, -f.lse2[consumer][c + 1]));
        if (edge) {
          const bool kin = key < g.seq_kv;
          if (!kin || q0 + c >= g.seq_q || (Causal && key > q0 + c + g.offset)) px = 0.f;
          if (!kin || q0 + c + 1 >= g.seq_q || (Causal && key > q0 + c + 1 + g.offset)) py = 0.f;
        }
        x = float2{px, py};
        y = float2{px * (y.x - f.delta[consumer][c]), py * (y.y - f.delta[consumer][c + 1])};
      }
    rt_bf<16, BM> pb, dsb;
    warp::copy(pb, sc);
    warp::copy(dsb, dp);

    // dV += P^T dO, dK += dS^T Q (P^T and dS^T from registers; dO and Q are K x N, MN-major).
    warpgroup::fence_accumulator(st.dv);
    warpgroup::fence_accumulator(st.dk);
    warpgroup::mma_fence();
    warpgroup::mma_AB(st.dv, pb, s.d_o, true);
    warpgroup::mma_AB(st.dk, dsb, s.q, true);
    warpgroup::mma_commit_group();
    // Meanwhile dS (query rows x keys) into the shared tile, the K-major A operand of dQ = dS K. The
    // previous tile's dQ wgmma, its last reader, has completed (the wait at the end of compute).
    const int kl = 16 * warpgroup::warpid() + lane / 4;  // the lane's first key within the 64
    ds_tile& ds = f.ds[by_turns ? it & 1 : 0][consumer];
#pragma unroll
    for (int j = 0; j < BM / 16; ++j)
#pragma unroll
      for (int f4 = 0; f4 < 4; ++f4) {
        const int c = 16 * j + 2 * (lane % 4) + 8 * (f4 >> 1);
        const __nv_bfloat162 v2 = dsb.tiles[0][j][f4];
        ds.at(c, kl + 8 * (f4 & 1)) = v2.x;
        ds.at(c + 1, kl + 8 * (f4 & 1)) = v2.y;
      }
    fence_async_shared();
    // By turns: this step's dQ product reads both dS tiles of buffer it % 2. A consumer writes that
    // buffer again two steps later; in between it computes (the step after), so it has synchronized on
    // that step's barrier, which the other consumer reaches only after its dQ product of this step has
    // completed. The consumer that does not compute only arrives and may run a step ahead: the barriers
    // alternate (3, 4) by parity, so its arrival never counts for the step before.
    const bool computes = !by_turns || (it & 1) == consumer;
    if constexpr (by_turns) {
      if (computes) {
        named_barrier_sync(3 + (it & 1), consumers * warpgroup_threads);
      } else {
        named_barrier_arrive(3 + (it & 1), consumers * warpgroup_threads);
        // Its own warps still meet here: the next step's LSE / D copy overwrites what this step's
        // softmax has read (racecheck found that hazard without this barrier; the copy double-buffered
        // instead measured the same at D = 64, and at D = 128 its 1 KB would cost a K / V stage).
        named_barrier_sync(1 + consumer, warpgroup_threads);
      }
    } else
      named_barrier_sync(1 + consumer, warpgroup_threads);
    // dV and dK first: their A registers are then free, and dQ's accumulator takes their place.
    warpgroup::mma_async_wait<0>();
    warpgroup::fence_accumulator(st.dv);
    warpgroup::fence_accumulator(st.dk);
    if (!computes) return;

    rt_fl<16, D> dq;
    warpgroup::fence_accumulator(dq);
    warpgroup::mma_fence();
    if constexpr (by_turns) {
      // dQ = dS (64 rows x the block's 128 keys) K, as two products over the consumers' 64 keys each.
      ds_tile* both = f.ds[it & 1];
      warpgroup::mm_AB(dq, both[0], f.k[0]);
      warpgroup::mma_AB(dq, both[1], f.k[1]);
    } else {
      warpgroup::mm_AB(dq, ds, f.k[consumer]);
    }
    warpgroup::mma_commit_group();
    warpgroup::mma_async_wait<0>();
    warpgroup::fence_accumulator(dq);
    // dQ rows: query row q0 + 16 warp + lane / 4 (+8), columns 16 j + 2 (lane % 4) (+8).
    const int rl = 16 * warpgroup::warpid() + lane / 4;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int row = q0 + rl + 8 * hh;
      if (row >= g.seq_q) continue;
      float* out = g.dq_acc + (head_row + row) * D + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < D / 16; ++j)
#pragma unroll
        for (int f2 = hh; f2 < 4; f2 += 2) {
          const float2 x = dq.tiles[0][j][f2];
          atomicAdd(reinterpret_cast<float2*>(out + 16 * j + 8 * (f2 >> 1)),
                    float2{x.x * g.scale, x.y * g.scale});
        }
    }
  }

  // dK (times the scale) and dV as bf16, straight from the accumulators (keys past seq_kv skipped).
  __device__ static void finish(state& st, finish_smem&, const globals& g, const item& w, int consumer) {
    using namespace mp::tile;
    warpgroup::fence_accumulator(st.dk);
    warpgroup::fence_accumulator(st.dv);
    const int lane = threadIdx.x % warp_threads;
    const int key_row = w.k0 + 64 * consumer + 16 * warpgroup::warpid() + lane / 4;
    const size_t kv_head_row = (size_t(w.b) * (g.heads / g.group) + w.hk) * size_t(g.seq_kv);
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      const int key = key_row + 8 * hh;
      if (key >= g.seq_kv) continue;
      bf16* dk = g.dk + (kv_head_row + key) * D + 2 * (lane % 4);
      bf16* dv = g.dv + (kv_head_row + key) * D + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < D / 16; ++j)
#pragma unroll
        for (int f2 = hh; f2 < 4; f2 += 2) {
          const float2 a = st.dk.tiles[0][j][f2], b = st.dv.tiles[0][j][f2];
          const int col = 16 * j + 8 * (f2 >> 1);
          *reinterpret_cast<__nv_bfloat162*>(dk + col) =
              __float22bfloat162_rn(float2{a.x * g.scale, a.y * g.scale});
          *reinterpret_cast<__nv_bfloat162*>(dv + col) = __float22bfloat162_rn(b);
        }
    }
  }
};

}  // namespace
}  // namespace mp::kernels
