// Attention on Hopper with the tile layer. The forward is FlashAttention written as load / compute /
// finish on the pipeline template (tile/pipeline.cuh), the way the GEMM is: a work item is a 128-row query
// tile of one (batch, head); the producer warpgroup's one thread loads the item's two 64-row Q tiles
// once (on the first stage's semaphore, into the block's finish region) and streams K/V tiles through
// the TMA ring; each of the two consumer warpgroups owns 64 query rows and per K/V tile computes
// S = Q K^T (wgmma, A and B from shared), the online softmax in registers (row max and sum over each lane
// quad, exp2 with the scale folded into log2 e), converts P to bf16 in registers and issues O += P V
// (RS-form wgmma, P from registers) asynchronously; the two warpgroups take turns issuing S (named barriers),
// so that one's softmax overlaps the other's matmuls. The decode (split-KV, mma.sync) and the backward
// (wgmma, one block per KV tile; and the CUDA-core fallback) are in attention_decode.cuh,
// attention_backward_sm90.cuh and attention_backward.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/attention.h"
#include "kernels/attention_backward.cuh"
#include "kernels/attention_backward_sm90.cuh"
#include "kernels/attention_decode.cuh"
#include "tile/tile.cuh"
#include "tile/tma_host.h"

namespace mp::kernels {
namespace {
using namespace mp::tile;

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_user("attention: ", what, " failed: ", cudaGetErrorString(e));
}

struct attn_globals {
  CUtensorMap q, k, v;  // (batch, heads or kv_heads, seq, dim), boxes of 64 (Q) or BN (K, V) rows
  bf16* o;
  float* lse;
  int heads, group, seq_q, seq_kv, q_tiles, work;
  int offset;        // seq_kv - seq_q: the causal diagonal's shift
  float scale_log2;  // scale * log2(e)
};

// D: head dim. BN: keys per K/V tile. d256 takes 80, the most that leaves room for two ring stages
// beside Q (2 x 80 KiB + 64 KiB); 128-row K and V tiles would not fit two, and 64 (the first version)
// ran 7 % slower at 8k-16k: the per-tile softmax and turn are paid over fewer keys, and S = Q K^T at
// N = 64 reads shared memory at the limit of its bandwidth. Causal: the mask and the item's K/V range.
// Slots: 0, one block per work item (the Q tiles in the finish region for the block's only item); 1 or
// 2, the persistent grid with that many copies of the Q tiles (tile/pipeline.cuh, item_slots), so that
// a block's next item loads its Q and first K/V tiles while this one computes and stores, and its set-up
// is paid once per SM instead of once per 128 query rows (attention_forward_persistent below).
template <int D, bool Causal, int Slots = 0>
struct attn_fwd_kernel {
  static constexpr int BM = 128, BN = D == 256 ? 80 : 128, consumers = 2;
  static constexpr int producer_registers = 24, consumer_registers = 240;
  using q_tile = st_bf<64, D>;
  using kv_tile = st_bf<BN, D>;
  using p_tile = st_bf<64, BN>;
  struct stage {
    kv_tile k, v;
  };
  // P V with P from registers (RS-form wgmma) rather than through a shared tile (SS form, the first
  // version measured on the H200). The shared tiles of P are then not needed, which leaves d128 a third
  // ring stage. false: the shared-memory path.
  static constexpr bool p_in_registers = true;
  static constexpr int q_copies = Slots > 0 ? Slots : 1;
  struct smem_q {
    q_tile q[q_copies][consumers];  // the item's query rows, one 64-row tile per consumer
  };
  struct smem_qp {
    q_tile q[q_copies][consumers];
    p_tile p[consumers];  // each consumer's P of the current K/V tile, the A operand of P V
  };
  using finish_smem = std::conditional_t<p_in_registers, smem_q, smem_qp>;
  static constexpr int finish_bytes = (int(sizeof(finish_smem)) + 1023) / 1024 * 1024;
  static constexpr int stages_fit =
      (pc::max_shared_bytes - 1024 - finish_bytes - 16 * 8) / int(sizeof(stage));
  static constexpr int stages = stages_fit < 4 ? stages_fit : 4;
  static_assert(stages >= 2, "attention: the ring needs two stages so that loads overlap the math");
  static constexpr int item_slots = Slots;
  // Rolled K loop: the softmax between the two wgmma is long, and unrolling it by the ring depth would
  // only add code and live registers.
  static constexpr bool unroll_ring = false;
  // The two consumers take turns issuing S = Q K^T (after FlashAttention-3's ping-pong): consumer 0's
  // S of tile i waits until consumer 1 has issued its S of tile i - 1, and consumer 1's S of tile i until
  // consumer 0 has issued its S of tile i, which keeps them half a step apart, one's softmax beside the
  // other's wgmma. Two named barriers of both warpgroups carry the turn (ids 3 and 4; 1 and 2 are each
  // consumer's own). The turn covers the S issue only: a turn held across the P V and the next tile's S
  // (FlashAttention-3's) would wait for the next ring stage, which with two stages the other consumer frees
  // only after its own P V, itself waiting for the turn. false: the consumers run unsynchronised.
  static constexpr bool pingpong = true;
  static constexpr int turn_threads = 2 * warpgroup_threads;
  using globals = attn_globals;

  struct state {
    rt_fl<16, D> o;    // this warp's 16 rows of the consumer's 64 x D output accumulator
    float m[2], l[2];  // running max (log2 domain) and sum for the lane's two rows (lane / 4, + 8)
  };
  struct item {
    int b, h, hk, q0, iters, slot;  // slot: the copy of the Q tiles (0 unless Slots is 2)
    bool first, last;               // the block's first and last item (both, one block per item)
  };
  __host__ __device__ static int work_count(const globals& g) { return g.work; }
  // (batch, head) major so that the blocks running together share K/V in L2; with the causal mask the
  // longest query tiles (the last) go first, so the short ones fill the last wave.
  __device__ static item item_of(const globals& g, int work) {
    item w;
    int u = work;  // the tile order's index
    if constexpr (Slots > 0 && Causal) {
      // The persistent grid's block b takes the items b, b + G, b + 2G, ... (G blocks). Longest first in
      // every head, consecutive rounds of G items would give block b the same place in each round, and
      // places correlate with lengths (at 16k keys and d128, G = 132 against 128 tiles a head: block 0 took
      // only long tiles, block 64 only short ones). Every other full round is walked backwards, so a
      // block's long and short tiles alternate.
      const int G = int(gridDim.x), j = work / G, p = work % G;
      if ((j & 1) && (j + 1) * G <= g.work) u = j * G + (G - 1 - p);
    }
    const int bh = u / g.q_tiles, t = u % g.q_tiles;
    const int qt = Causal ? g.q_tiles - 1 - t : t;
    w.b = bh / g.heads, w.h = bh % g.heads, w.hk = w.h / g.group, w.q0 = qt * BM;
    int keys = g.seq_kv;
    if constexpr (Causal) {  // keys up to the diagonal of the tile's last row
      const int last = min(w.q0 + BM, g.seq_q) - 1;
      keys = max(0, min(g.seq_kv, last + g.offset + 1));
    }
    w.iters = (keys + BN - 1) / BN;
    w.slot = Slots == 2 ? ((work - int(blockIdx.x)) / int(gridDim.x)) & 1 : 0;  // the block's k-th item: k % 2
    w.first = Slots == 0 || work < int(gridDim.x);
    w.last = Slots == 0 || work + int(gridDim.x) >= g.work;
    // On the persistent grid every item takes at least one K/V tile, so that the consumers' turns run
    // through every item (below); a tile no row may see is masked whole, which leaves O = 0 and the
    // LSE -inf, as the finish of an item without keys writes.
    if constexpr (Slots > 0) w.iters = max(w.iters, 1);
    return w;
  }
  __device__ static int iters(const item& w) { return w.iters; }
  __device__ static void prefetch(const globals& g) {
    tma::prefetch_map(&g.q);
    tma::prefetch_map(&g.k);
    tma::prefetch_map(&g.v);
  }

  __device__ static void load(stage& s, finish_smem& f, const globals& g, const item& w, int it,
                              semaphore& full) {
    constexpr uint32_t kv_bytes = 2 * tma::bytes<kv_tile>();
    if (it == 0) {
      expect_bytes(full, kv_bytes + consumers * tma::bytes<q_tile>());
      for (int c = 0; c < consumers; ++c)
        tma::load_async(f.q[w.slot][c], &g.q, full, w.q0 + 64 * c, 0, w.h, w.b);
    } else {
      expect_bytes(full, kv_bytes);
    }
    tma::load_async(s.k, &g.k, full, it * BN, 0, w.hk, w.b);
    tma::load_async(s.v, &g.v, full, it * BN, 0, w.hk, w.b);
  }

  // The accumulator starts at zero before the item's first P V (begin: before each item, after the
  // previous one's wgmma are all done). Zeroing it in compute() instead would put an accumulator write on
  // a path where the previous P V may be in flight, for which ptxas injects a wgmma wait into every step.
  __device__ static void begin(state& st, const globals&) {
    warpgroup::zero(st.o);
    st.m[0] = st.m[1] = -INFINITY;
    st.l[0] = st.l[1] = 0.f;
  }

  __device__ static void compute(state& st, stage& s, finish_smem& f, const globals& g, const item& w, int it,
                                 int consumer) {
    const int lane = threadIdx.x % warp_threads;
    const int row0 = w.q0 + 64 * consumer + 16 * warpgroup::warpid() + lane / 4;  // the lane's first row
    // The turn (pingpong): consumer c waits on barrier 3 + c and hands over by arriving on the other's.
    // Over the block's items, consumer 0 waits at every step but the first and consumer 1 arrives after
    // each S but the last; consumer 1 waits at every step and consumer 0 arrives after each S: every wait
    // has its arrival, none is left over at the end, and the two alternate strictly, so neither arrives
    // twice on a barrier before the other has waited on it (which the turn kept per item would allow
    // between one item's last step and the next one's first on the persistent grid).
    if constexpr (pingpong)
      if (consumer == 1 || it > 0 || !w.first) named_barrier_sync(3 + consumer, turn_threads);
    // S = Q K^T; waiting for it also retires the previous tile's P V, whose O and P are touched below.
    rt_fl<16, BN> sc;
    warpgroup::fence_accumulator(sc);
    warpgroup::mma_fence();
    warpgroup::mm_ABt(sc, f.q[w.slot][consumer], s.k);
    warpgroup::mma_commit_group();
    if constexpr (pingpong)
      if (consumer == 0 || it + 1 < w.iters || !w.last) named_barrier_arrive(4 - consumer, turn_threads);
    warpgroup::mma_async_wait<0>();
    warpgroup::fence_accumulator(sc);
    warpgroup::fence_accumulator(st.o);

    // Keys past the end, and with the causal mask keys past a row's diagonal, are -inf. Only the tiles
    // that reach either pay for the test.
    const int key0 = it * BN;
    const bool edge = key0 + BN > g.seq_kv || (Causal && key0 + BN - 1 > w.q0 + 64 * consumer + g.offset);
    if (edge) {
#pragma unroll
      for (int j = 0; j < BN / 16; ++j)
#pragma unroll
        for (int f4 = 0; f4 < 4; ++f4) {
          const int key = key0 + 16 * j + 2 * (lane % 4) + 8 * (f4 >> 1);
          const int limit = Causal ? min(g.seq_kv, row0 + 8 * (f4 & 1) + g.offset + 1) : g.seq_kv;
          float2& x = sc.tiles[0][j][f4];
          if (key >= limit) x.x = -INFINITY;
          if (key + 1 >= limit) x.y = -INFINITY;
        }
    }
    // The online softmax, per row h (lane / 4 + 8 h): the new max, the factor for what came before, the
    // probabilities in the log2 domain.
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < BN / 16; ++j) {
        const float2 a = sc.tiles[0][j][h], b = sc.tiles[0][j][h + 2];
        mx = fmaxf(mx, fmaxf(fmaxf(a.x, a.y), fmaxf(b.x, b.y)));
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(st.m[h], mx * g.scale_log2);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exp2(-inf) = 0
      alpha[h] = mp::tile::exp2_ftz(st.m[h] - m_use);
      st.m[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < BN / 16; ++j)
#pragma unroll
        for (int f2 = h; f2 < 4; f2 += 2) {
          float2& x = sc.tiles[0][j][f2];
          x.x = mp::tile::exp2_ftz(fmaf(x.x, g.scale_log2, -m_use));
          x.y = mp::tile::exp2_ftz(fmaf(x.y, g.scale_log2, -m_use));
          sum += x.x + x.y;
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      st.l[h] = st.l[h] * alpha[h] + sum;
    }
#pragma unroll
    for (int j = 0; j < D / 16; ++j)
#pragma unroll
      for (int f4 = 0; f4 < 4; ++f4) {
        st.o.tiles[0][j][f4].x *= alpha[f4 & 1];
        st.o.tiles[0][j][f4].y *= alpha[f4 & 1];
      }
    // P as bf16: the accumulator's layout is the A-fragment layout, so P feeds the RS-form wgmma from
    // registers (p_in_registers); otherwise through this consumer's shared tile, made visible to the async
    // proxy for all 4 warps first.
    rt_bf<16, BN> pb;
    warp::copy(pb, sc);
    if constexpr (!p_in_registers) {
      warpgroup::store(f.p[consumer], pb);
      fence_async_shared();
      named_barrier_sync(1 + consumer, warpgroup_threads);
    }
    // O += P V, left in flight: the template frees the previous stage meanwhile, and the next tile's
    // S = Q K^T queues behind it.
    warpgroup::fence_accumulator(st.o);
    warpgroup::mma_fence();
    if constexpr (p_in_registers)
      warpgroup::mma_AB(st.o, pb, s.v, true);
    else
      warpgroup::mma_AB(st.o, f.p[consumer], s.v);
    warpgroup::mma_commit_group();
    warpgroup::fence_accumulator(st.o);
  }

  // O / l as bf16 and the LSE, straight from the accumulator to global memory (rows past seq_q skipped).
  __device__ static void finish(state& st, finish_smem&, const globals& g, const item& w, int consumer) {
    warpgroup::fence_accumulator(st.o);
    if (w.iters == 0) {  // no key visible to any row of the tile
      warpgroup::zero(st.o);
      st.m[0] = st.m[1] = -INFINITY;
      st.l[0] = st.l[1] = 0.f;
    }
    const int lane = threadIdx.x % warp_threads;
    const int row0 = w.q0 + 64 * consumer + 16 * warpgroup::warpid() + lane / 4;
    const size_t head_row = (size_t(w.b) * g.heads + w.h) * size_t(g.seq_q);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      if (row >= g.seq_q) continue;
      const bool any = st.l[h] > 0.f;
      const float inv = any ? 1.f / st.l[h] : 0.f;
      bf16* out = g.o + (head_row + row) * D + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < D / 16; ++j)
#pragma unroll
        for (int f2 = h; f2 < 4; f2 += 2) {
          const float2 x = st.o.tiles[0][j][f2];
          *reinterpret_cast<__nv_bfloat162*>(out + 16 * j + 8 * (f2 >> 1)) =
              __float22bfloat162_rn(float2{x.x * inv, x.y * inv});
        }
      if (g.lse && lane % 4 == 0)
        g.lse[head_row + row] = any ? (st.m[h] + log2f(st.l[h])) * 0.69314718055994531f : -INFINITY;
    }
  }
};

template <class ST>
CUtensorMap map_of(const void* p, int batch, int heads, int rows, int cols) {
  return make_tma_map<ST>(
      gl<bf16, -1, -1, -1, -1>(static_cast<bf16*>(const_cast<void*>(p)), batch, heads, rows, cols));
}

template <int D, bool Causal, int Slots>
void run_forward(const AttentionShape& s, const void* q, const void* k, const void* v, void* o, float* lse,
                 float scale, cudaStream_t stream) {
  using K = attn_fwd_kernel<D, Causal, Slots>;
  attn_globals g{};
  g.q = map_of<typename K::q_tile>(q, s.batch, s.heads, s.seq_q, D);
  g.k = map_of<typename K::kv_tile>(k, s.batch, s.kv_heads, s.seq_kv, D);
  g.v = map_of<typename K::kv_tile>(v, s.batch, s.kv_heads, s.seq_kv, D);
  g.o = static_cast<bf16*>(o);
  g.lse = lse;
  g.heads = s.heads, g.group = s.group(), g.seq_q = s.seq_q, g.seq_kv = s.seq_kv;
  g.q_tiles = (s.seq_q + K::BM - 1) / K::BM;
  const long long work = 1ll * s.batch * s.heads * g.q_tiles;
  MP_USER_CHECK(work < (1ll << 31), "attention: ", s.str(), " has too many query tiles for one launch");
  g.work = int(work);
  g.offset = s.seq_kv - s.seq_q;
  g.scale_log2 = float(double(scale) * 1.4426950408889634);
  // Slots 0: one block per work item (the Q tiles live in the finish region; tile/pipeline.cuh); else
  // the persistent grid, one block per SM.
  check_cuda(pc::launch<K>(g, stream, Slots == 0 ? g.work : 0), "the attention forward launch");
}

// The wgmma backward (attention_backward_sm90.cuh): D and the zeroed dQ buffer first, then a block per
// 128-key tile of each (batch, KV head), then dQ rounded to bf16.
template <int D, bool Causal, bwd_dq DQ>
cudaError_t run_backward_wgmma(const AttentionShape& s, const void* q, const void* k, const void* v,
                               const void* o, const float* lse, const void* d_o, void* dq, void* dk, void* dv,
                               float scale, cudaStream_t stream) {
  using K = attn_bwd_wgmma_kernel<D, Causal, DQ>;
  bwd_params p;
  if (cudaError_t e = backward_prologue(p, s, q, k, v, o, lse, d_o, dk, dv, scale, Causal, stream);
      e != cudaSuccess)
    return e;
  attn_bwd_globals g{};
  g.q = map_of<typename K::row_tile>(q, s.batch, s.heads, s.seq_q, D);
  g.d_o = map_of<typename K::row_tile>(d_o, s.batch, s.heads, s.seq_q, D);
  g.k = map_of<typename K::row_tile>(k, s.batch, s.kv_heads, s.seq_kv, D);
  g.v = map_of<typename K::row_tile>(v, s.batch, s.kv_heads, s.seq_kv, D);
  g.lse = lse;
  g.delta = p.delta;
  g.dq_acc = p.dq_acc;
  g.dk = static_cast<bf16*>(dk);
  g.dv = static_cast<bf16*>(dv);
  g.heads = s.heads, g.group = s.group(), g.seq_q = s.seq_q, g.seq_kv = s.seq_kv;
  g.kv_tiles = (s.seq_kv + K::BN - 1) / K::BN;
  const long long work = 1ll * s.batch * s.kv_heads * g.kv_tiles;
  MP_USER_CHECK(work < (1ll << 31), "attention backward: ", s.str(),
                " has too many key tiles for one launch");
  g.work = int(work);
  g.offset = s.seq_kv - s.seq_q;
  g.scale = scale;
  g.scale_log2 = float(double(scale) * 1.4426950408889634);
  // One block per work item (K and V live in the finish region; tile/pipeline.cuh).
  if (cudaError_t e = pc::launch<K>(g, stream, g.work); e != cudaSuccess) return e;
  return backward_epilogue(p, s, dq, stream);
}

void check_pointers(std::initializer_list<std::pair<const void*, const char*>> ps) {
  for (auto [p, name] : ps)
    MP_USER_CHECK(p && reinterpret_cast<uintptr_t>(p) % 16 == 0, "attention: ", name,
                  " must be a 16-byte aligned device pointer");
}
void check_scale(float scale) {
  MP_USER_CHECK(std::isfinite(scale) && scale > 0,
                "attention: the softmax scale must be a positive finite number, got ", scale);
}

}  // namespace

void attention_forward(const AttentionShape& s, const void* q, const void* k, const void* v, void* o,
                       float* lse, float scale, bool causal, CUstream_st* stream) {
  check_attention_shape(s);
  check_scale(scale);
  check_pointers({{q, "Q"}, {k, "K"}, {v, "V"}, {o, "O"}});
  MP_USER_CHECK(reinterpret_cast<uintptr_t>(lse) % 4 == 0,
                "attention: LSE must be a 4-byte aligned device pointer");
  // The persistent grid keeps two copies of Q at d64 (beside four K/V stages), one at d128 (beside three
  // stages: two copies cost a stage and measured 3-12 % slower from 2k) and at d256 (where two would not
  // fit beside two 80-key stages).
  const bool persistent = attention_forward_persistent(s, causal);
  auto go = [&]<int D>() {
    constexpr int P = D == 64 ? 2 : 1;
    if (persistent)
      causal ? run_forward<D, true, P>(s, q, k, v, o, lse, scale, stream)
             : run_forward<D, false, P>(s, q, k, v, o, lse, scale, stream);
    else
      causal ? run_forward<D, true, 0>(s, q, k, v, o, lse, scale, stream)
             : run_forward<D, false, 0>(s, q, k, v, o, lse, scale, stream);
  };
  if (s.dim == 64) return go.template operator()<64>();
  if (s.dim == 128) return go.template operator()<128>();
  return go.template operator()<256>();
}

void attention_decode(const AttentionShape& s, const void* q, const void* k, const void* v, void* o,
                      float* lse, float scale, bool causal, CUstream_st* stream,
                      const AttentionDecodeConfig& config) {
  check_attention_decode_shape(s);
  check_scale(scale);
  check_pointers({{q, "Q"}, {k, "K"}, {v, "V"}, {o, "O"}});
  MP_USER_CHECK(reinterpret_cast<uintptr_t>(lse) % 4 == 0,
                "attention: LSE must be a 4-byte aligned device pointer");
  const AttentionDecodePlan plan = attention_decode_plan(s, pc::device_sm_count(), config);
  check_cuda(launch_decode(s, q, k, v, o, lse, scale, causal, plan, config.pdl, stream),
             "the attention decode launch");
}

void attention_backward(const AttentionShape& s, const void* q, const void* k, const void* v, const void* o,
                        const float* lse, const void* d_o, void* dq, void* dk, void* dv, float scale,
                        bool causal, CUstream_st* stream, attention_backward_impl impl) {
  check_attention_shape(s);
  check_scale(scale);
  check_pointers({{q, "Q"},
                  {k, "K"},
                  {v, "V"},
                  {o, "O"},
                  {lse, "LSE"},
                  {d_o, "dO"},
                  {dq, "dQ"},
                  {dk, "dK"},
                  {dv, "dV"}});
  impl = attention_backward_resolve(impl, s.dim);
  if (impl == attention_backward_impl::cuda_core)
    return check_cuda(launch_backward(s, q, k, v, o, lse, d_o, dq, dk, dv, scale, causal, stream),
                      "the attention backward launch");
  if (s.dim == 256)
    throw mp::not_supported(
        "the wgmma attention backward for dim 256 (its dK and dV accumulators would "
        "need 256 registers per thread); use the CUDA-core backward (attention_backward_impl::cuda_core)");
  auto go = [&]<int D, bwd_dq DQ>() {
    check_cuda(causal ? run_backward_wgmma<D, true, DQ>(s, q, k, v, o, lse, d_o, dq, dk, dv, scale, stream)
                      : run_backward_wgmma<D, false, DQ>(s, q, k, v, o, lse, d_o, dq, dk, dv, scale, stream),
               "the wgmma attention backward launch");
  };
  auto dims = [&]<bwd_dq DQ>() {
    s.dim == 64 ? go.template operator()<64, DQ>() : go.template operator()<128, DQ>();
  };
  if (attention_backward_dq_from_env() == AttentionBackwardDq::atomic)
    dims.template operator()<bwd_dq::atomic>();
  else
    dims.template operator()<bwd_dq::turns>();
}

}  // namespace mp::kernels
