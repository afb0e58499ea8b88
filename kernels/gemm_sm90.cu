// The tile-layer GEMM for Hopper: 128 x BN x 64 tiles (BN = 256 or 128), two consumer warpgroups (64 rows
// each, wgmma m64nBNk16 from 128B-swizzled shared tiles), one TMA producer warpgroup, a 4- (6-) stage ring,
// an epilogue through shared memory and TMA stores, a persistent grid walking tiles in M-groups for L2
// reuse; for shapes with few 128-row tiles (small M or N), 64 x 128 (or 64 x 64) tiles with one consumer
// warpgroup and an 8- (13-) stage ring. Work items are decoded once each (item_of), so the producer
// thread's per-K-step work is two TMA issues. Tiles that several blocks finish (split-K for shapes with too
// few tiles; stream-K for the last waves, opt-in) are fixed up in-kernel: partials in a workspace, added
// by the last block to arrive. The schedule a shape gets is host code (plan_gemm in gemm_common.cpp).
// Options: 2-block clusters sharing the B tile through TMA multicast; a deferred epilogue (part of a tile
// written during the next tile's first K steps); the ping-pong schedule (64 x 256 or 128 x 128 tiles, each
// owned by one consumer warpgroup, the two taking turns at the tensor cores so that one's epilogue overlaps
// the other's mainloop; tile/pipeline_pingpong.cuh); split tiles added up in a cluster pair through
// distributed shared memory (split_reduce::cluster, 64 x 128 tiles split 2 ways); and the diagnostics
// data_only / compute_only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "core/error.h"
#include "kernels/gemm.h"
#include "tile/pipeline_pingpong.cuh"
#include "tile/tile.cuh"
#include "tile/tma_host.h"

// How many 64-column output chunks of a tile the deferred epilogue keeps in registers (16 each per
// thread) to write during the next tile; the rest go out at once. Register-bound: see gemm_kernel.
#ifndef MP_GEMM_DEFERRED
#define MP_GEMM_DEFERRED 2
#endif
// Build switch (tenth session): 1 writes bf16 output chunks with stmatrix (one instruction per 16 x 16
// block and lane instead of four st.shared.b32), 0 with st.shared.b32. Measured level within the spread
// (bench/RESULTS.md, tenth session); kept for the 656 fewer instructions in the default kernel.
#ifndef MP_GEMM_STSM
#define MP_GEMM_STSM 1
#endif

namespace mp::kernels {
namespace {
using namespace mp::tile;

// What the kernels take (one struct for every tile shape and output type).
struct gemm_globals {
  CUtensorMap a, b, c;  // c: the output
  int m, n, k;
  int tiles_m, tiles_n, k_iters, group_m;
  // How tiles become work items (see segment_of): split-K (splits > 1) cuts every tile into `splits` K
  // ranges; otherwise the first dp_tiles tiles are one item each and the sk_tiles after them are shared
  // out over the `grid` blocks as equal K ranges (stream-K), so that the last wave has no idle SMs.
  int splits, iters_per_split;
  int dp_tiles, sk_tiles, grid;
  // Tiles finished by several blocks: each writes its fp32 partial to ws (slot `which` of the tile), and
  // one (see fixed_reducer; counters, left at zero after each tile) adds the others' to its own and stores.
  float4* ws;
  int* counters;
  int slots;
  // Split-K tiles on the persistent grid and stream-K tiles: the item numbered last (see fixup) adds the
  // others' partials (a fixed reducer: its counter only counts their writes), instead of the last item to
  // arrive.
  int fixed_reducer;
  int mma_pending;  // wgmma groups left in flight per K step (0 to 2), read by the pipeline template
  int prefetch;     // K steps ahead that the producer asks L2 to fetch the A and B tiles (0: none)
  int data_only;    // diagnostic: no wgmma (GemmSchedule::data_only)
  int compute_only; // diagnostic: no loads (GemmSchedule::compute_only)
  int deferred;     // deferred epilogue (GemmSchedule::epilogue), where the kernel can defer
  unsigned long long* trace;  // diagnostic timeline (GemmSchedule::trace; pc::trace_mark), or null
  int trace_blocks;
  // L2 priorities of the loads of A and B and the stores of C (GemmPlan::l2_a, l2_b, l2_c), as
  // a + 4 b + 16 c of tma::l2_priority values; 0: no hints.
  int l2_hint;
};

// PP: the ping-pong schedule. A work item is then a tile of one consumer warpgroup (the template of
// tile/pipeline_pingpong.cuh), 64 x 256 or 128 x 128 (two m64 slices; 128 accumulator registers either
// way), instead of a 128 x BN tile that both consumers share (64 rows each).
// NC: consumer warpgroups of the cooperative schedule, 64 rows each (BM = 64 * NC); NC = 1 is the small
// tile (64 x 64 or 64 x 128) for problems with too few 128-row tiles to fill the GPU (small M or N).
// KC: split-K 2 ways within a cluster: the two blocks of a cluster take the two K halves of one tile, and
// the second sends its partial sums into the first's shared memory (distributed shared memory), instead
// of both going through a global workspace (fixup); one consumer warpgroup, no multicast.
// WT: the whole-tile epilogue (GemmSchedule::epilogue, epilogue_mode::whole): each consumer has a buffer
// for every chunk of its part of the tile, so it writes them all between one pair of barriers (no waits
// for earlier stores) and issues their stores together; the ring loses a stage to the buffers.
template <int BN, bool BT, class OutT, int CS, bool PP = false, int NC = 2, bool KC = false, bool WT = false>
struct gemm_kernel {
  static_assert(!WT || (BN == 256 && std::is_same_v<OutT, bf16> && CS == 1 && !PP && NC == 2 && !KC),
                "gemm: the whole-tile epilogue is compiled for bf16 128 x 256 tiles of single blocks");
  static_assert(!PP || CS == 1, "gemm: the ping-pong schedule runs without clusters");
  static_assert(!PP || NC == 2, "gemm: the ping-pong schedule has two consumer warpgroups");
  static_assert(!KC || (NC == 1 && CS == 1 && !PP), "gemm: the cluster K split is for 64-row tiles, no multicast");
  static constexpr int BM = PP ? (BN == 256 ? 64 : 128) : 64 * NC, BK = 64;
  static constexpr int MH = PP ? BM / 64 : 1;  // 64-row accumulator slices per consumer
  // Blocks per cluster. With CS = 2, the pair computes M-tiles 2i and 2i+1 of the same N column: each
  // block loads half of the B tile and multicasts it to both, halving B's traffic from L2. With KC, the
  // pair computes one tile, a K half each, and each block's ring is its own.
  static constexpr int cluster = KC ? 2 : CS;
  static constexpr bool multicast = CS > 1;
  // Ping-pong stages (40 KB for 64 x 256, 32 KB for 128 x 128) hold half the math of a shared 128 x 256
  // stage, so the ring is deeper, with a single epilogue buffer per consumer to make room.
  static constexpr int consumers = NC;
  static constexpr int producer_registers = 40, consumer_registers = 232;
  using a_tile = st_bf<BM, BK>;
  using b_tile = std::conditional_t<BT, st_bf<BN, BK>, st_bf<BK, BN>>;  // N x K, or K x N
  // What one TMA box of B covers: with a cluster and B stored N x K, each block loads BN / 2 rows.
  using b_box = std::conditional_t<BT && CS == 2, st_bf<BN / 2, BK>, b_tile>;
  struct stage {
    a_tile a;
    b_tile b;
  };
  // The epilogue goes registers -> shared -> TMA store, 64 x CW chunks (CW = one 128-byte swizzle span
  // of OutT), double-buffered per consumer so one chunk's store overlaps the next chunk's writes (single-
  // buffered for ping-pong, whose epilogue runs in the shadow of the other consumer's mainloop).
  static constexpr int CW = 128 / int(sizeof(OutT));
  static constexpr int coop_chunks = BN / CW;  // a cooperative consumer's chunks per tile
  static constexpr int c_buffers = PP ? 1 : WT ? coop_chunks : 2;
  static constexpr bool whole_tile = WT;
  using c_tile = st<OutT, 64, CW>;
  // The float4s of one thread's accumulators, in the order fixup() keeps them in the workspace.
  static constexpr int acc_float4 = MH * BN / 8;
  // KC: block 1's partial sums arrive in block 0's `part`, laid out as fixup() lays them out (float4 i of
  // thread t at i * 128 + t). It shares its space with the epilogue's buffers, so that the ring keeps its
  // depth (8 stages of 64 x 128: a separate 32 KB would leave 7): block 0 reads the sums into registers,
  // then writes its tile through the same bytes. `full` completes when the sums are in (block 0's
  // expect_bytes and block 1's st.async bytes), `empty` when block 0's epilogue is done with the space
  // (its TMA stores have read it: one remote arrival).
  struct reduce_sems {
    semaphore full, empty;
  };
  struct no_reduce {};
  struct finish_smem {
    union {
      c_tile c[consumers][c_buffers];
      float4 part[KC ? acc_float4 * warpgroup_threads : 1];
    };
    int arrivals[consumers];  // fixup(): the tile counter's value before this consumer's arrival
    std::conditional_t<KC, reduce_sems, no_reduce> red;
  };
  __device__ static void init(finish_smem& fs) {
    if constexpr (KC) {
      init_semaphore(fs.red.full, 1);
      init_semaphore(fs.red.empty, 1);
    }
  }
  using globals = gemm_globals;
  // The ring: as deep as the shared memory allows beside the epilogue buffers (at most 16 stages).
  static constexpr int stage_bytes = (BM + BN) * BK * 2;
  static constexpr int finish_bytes = (int(sizeof(finish_smem)) + 1023) / 1024 * 1024;
  static constexpr int stages_fit = (pc::max_shared_bytes - 1024 - finish_bytes - 16 * 16) / stage_bytes;
  static constexpr int stages = stages_fit < 16 ? stages_fit : 16;
  // The deferred epilogue (bf16 output, cooperative consumers): finish() writes the tile's first chunks
  // at once and packs the last `deferred_chunks` 64 x CW chunks into bf16 registers (the stash), which go
  // out through shared memory and TMA one per K step of the block's next work item, while that item's
  // wgmma keep the tensor cores busy. Two chunks (32 registers) fit beside the 128 accumulators; three
  // or four spill (ptxas -v), so MP_GEMM_DEFERRED is 2.
  static constexpr bool can_defer =
      !PP && !KC && !whole_tile && std::is_same_v<OutT, bf16>;  // KC: the buffers hold `part`
  // 64 x CW output chunks per consumer and tile; the last `deferred_chunks` of them wait in the stash (16
  // registers each), the others go out at once (registers: 128 accumulators + the stash + the K loop's).
  static constexpr int chunks = MH * (BN / CW);
  static constexpr int deferred_chunks = can_defer ? (chunks < MP_GEMM_DEFERRED ? chunks : MP_GEMM_DEFERRED) : 0;
  static constexpr int stash_regs = CW / 16 * 4;  // per chunk and thread
  // The K loop unrolled by the ring depth (tile/pipeline.cuh), except beside the 256-wide stash: 128
  // accumulators + 32 stash registers leave no room for the unrolled loop's constants (32-36 bytes of
  // spills in ptxas -v).
  static constexpr bool unroll_ring = !(can_defer && BN == 256);
  struct state {
    rt_fl<16, BN> acc[MH];
    uint32_t stash[deferred_chunks > 0 ? deferred_chunks * stash_regs : 1];  // bf16 pairs
    int stash_row = 0, stash_col = 0, stash_left = 0;  // where the stash goes; chunks not yet written
    bool data_only = false, deferred = false;           // g's, read once (begin)
    uint32_t red_phase = 0;                             // KC: the parity of the pair's next exchange
  };
  // Each consumer's copies of the flags its K steps test (a parameter load per step is on a lone
  // consumer's critical path).
  __device__ static void begin(state& st, const globals& g) {
    st.data_only = g.data_only != 0;
    st.deferred = g.deferred != 0;
  }

  // The pipeline's first act (pc::prefetch_of): the three tensor maps into the descriptor cache.
  __device__ static void prefetch(const globals& g) {
    tma::prefetch_map(&g.a);
    tma::prefetch_map(&g.b);
    tma::prefetch_map(&g.c);
  }

  // A work item is a K range of one tile. Items of one block are work = blockIdx.x + j * gridDim.x.
  struct segment {
    int tile;     // tile index (tile_of() turns it into a position)
    int k_first;  // first K step
    int iters;    // K steps (0: an empty item, nothing to do)
    int which;    // which of the tile's `count` partial results this is
    int count;    // how many items share the tile (1: this one stores it alone)
    int fix;      // index of the tile among those shared (workspace and counter)
  };
  __host__ __device__ static int work_count(const globals& g) {
    if (KC) return g.tiles_m * g.tiles_n;  // the two blocks of a cluster share each item
    if (g.splits > 1) return g.tiles_m * g.tiles_n * g.splits;
    // stream_k_part's items j < 3 of every block (with the last wave's share, j = 2 is always empty)
    return g.dp_tiles + (g.sk_tiles > 0 ? 3 * g.grid : 0);
  }
  __device__ static segment segment_of(const globals& g, int work) {
    const int tiles = g.tiles_m * g.tiles_n, I = g.k_iters;
    // Split K (KSplit, gemm.h): every split but the last takes iters_per_split steps, the last the rest.
    const KSplit ks{g.iters_per_split, KC ? 2 : g.splits};
    if constexpr (KC) {  // item = tile; block 1 of the cluster takes the first split, block 0 (which adds
                         // the two up) the last (both non-empty: I >= 2)
      const int r = int(cluster_ctarank());
      return r == 1 ? segment{work, ks.first(0), ks.iters(I, 0), 1, 2, work}
                    : segment{work, ks.first(1), ks.iters(I, 1), 0, 2, work};
    }
    if (g.splits > 1) {  // split-K: item = split * tiles + tile (split_item, gemm.h)
      const auto [s, t] = split_item(work, tiles);
      return {t, ks.first(s), ks.iters(I, s), s, g.splits, t};
    }
    if (work < g.dp_tiles) return {work, 0, I, 0, 1, 0};
    // stream-K: block b's j-th item is its part of the j-th shared tile its K range touches
    const int P = g.grid, j = (work - g.dp_tiles) / P, b = (work - g.dp_tiles) % P;
    const StreamKPart sk = stream_k_part(j, b, P, g.sk_tiles, I);
    if (sk.iters == 0) return {0, 0, 0, 0, 1, 0};
    return {g.dp_tiles + sk.tile, sk.first, sk.iters, sk.which, sk.count, sk.tile};
  }
  // A work item decoded once per item (the producer's per-step load must stay cheap): its K range and
  // the tile's position (tile_of, m_row).
  struct item : segment {
    int2 pos;  // (M-tile group, N-tile) of tile_of()
    int row;   // first row of this block's A / C rows
  };
  __device__ static item item_of(const globals& g, int work) {
    item w;
    static_cast<segment&>(w) = segment_of(g, work);
    w.pos = tile_of(g, w.tile);
    w.row = m_row(g, w.pos);
    return w;
  }
  __device__ static int iters(const item& w) { return w.iters; }
  // Tile (tm, tn) of a work item (tm counts M-tile groups of CS tiles): groups of group_m M-tiles are
  // walked column by column, so the blocks running at one time share A rows and B columns in L2.
  __device__ static int2 tile_of(const globals& g, int t) {
    const int per_group = g.group_m * g.tiles_n;
    const int first_m = (t / per_group) * g.group_m;
    const int rows = min(g.group_m, g.tiles_m - first_m);
    const int in = t % per_group;
    return {first_m + in % rows, in / rows};
  }

  __device__ static int m_row(const globals& g, int2 t) {
    const int rank = CS > 1 ? int(cluster_ctarank()) : 0;
    return (t.x * CS + rank) * BM;
  }

  __device__ static void load(stage& s, const globals& g, const item& w, int it, semaphore& full) {
    if (g.compute_only) {  // diagnostic: no data, only the signal that the stage is full
      arrive(full);
      return;
    }
    const int2 t = w.pos;
    const int kk = (w.k_first + it) * BK;
    expect_bytes(full, tma::bytes<a_tile>() + tma::bytes<b_tile>());  // own A, all of B (half from the peer)
    if constexpr (CS == 1) {
      if (g.l2_hint & 15) {
        const uint64_t pa = tma::l2_policy(tma::l2_priority(g.l2_hint & 3));
        const uint64_t pb = tma::l2_policy(tma::l2_priority((g.l2_hint >> 2) & 3));
        tma::load_async_hint(s.a, &g.a, full, w.row, kk, pa);
        if constexpr (BT)
          tma::load_async_hint(s.b, &g.b, full, t.y * BN, kk, pb);
        else
          tma::load_async_hint(s.b, &g.b, full, kk, t.y * BN, pb);
      } else {
        tma::load_async(s.a, &g.a, full, w.row, kk);
        if constexpr (BT)
          tma::load_async(s.b, &g.b, full, t.y * BN, kk);
        else
          tma::load_async(s.b, &g.b, full, kk, t.y * BN);
      }
    } else {
      tma::load_async(s.a, &g.a, full, w.row, kk);
      const int rank = int(cluster_ctarank());
      if constexpr (BT) {
        tma::load_async_multicast(s.b.template subtile_rows<BN / 2>(rank), &g.b, full, 0b11,
                                  t.y * BN + rank * (BN / 2), kk);
      } else {
        constexpr int half = b_tile::layout::chunks / 2;
        tma::load_chunks_multicast(s.b, &g.b, full, 0b11, rank * half, half, kk, t.y * BN);
      }
    }
    // L2 prefetch of K step it + prefetch of the same tile (this block's share of it)
    if (g.prefetch > 0 && it + g.prefetch < w.iters) {
      const int kp = kk + g.prefetch * BK;
      tma::prefetch_l2<a_tile>(&g.a, w.row, kp);
      const int rank = CS > 1 ? int(cluster_ctarank()) : 0;
      if constexpr (BT)
        tma::prefetch_l2<b_box>(&g.b, t.y * BN + rank * (BN / CS), kp);
      else if constexpr (CS == 1)
        tma::prefetch_l2<b_tile>(&g.b, kp, t.y * BN);
      else
        tma::prefetch_l2<st_bf<BK, BN / 2>>(&g.b, kp, t.y * BN + rank * (BN / 2));
    }
  }

  __device__ static void compute(state& st, stage& s, const globals&, const item&, int it, int consumer) {
    if (st.data_only) return;
#pragma unroll
    for (int h = 0; h < MH; ++h) warpgroup::fence_accumulator(st.acc[h]);
    warpgroup::mma_fence();
#pragma unroll
    for (int h = 0; h < MH; ++h) {
      // cooperative: this consumer's 64 rows of the shared A tile; ping-pong: every row is its own
      auto& a = s.a.template subtile_rows<64>(PP ? h : consumer);
      if constexpr (BT)
        warpgroup::mma_ABt(st.acc[h], a, s.b, it > 0);
      else
        warpgroup::mma_AB(st.acc[h], a, s.b, it > 0);
    }
    warpgroup::mma_commit_group();
#pragma unroll
    for (int h = 0; h < MH; ++h) warpgroup::fence_accumulator(st.acc[h]);
  }

  // The parts of a tile (work item) held by different consumers: one per consumer warpgroup (cooperative)
  // or one (ping-pong), times the blocks of a cluster (each computes its own M-tile of the item).
  static constexpr int parts = (PP ? 1 : consumers) * CS;
  __device__ static float2* acc_pair(state& st, int i) {  // the two float2 of float4 number i
    const int h = i / (BN / 8), r = i % (BN / 8);
    return &st.acc[h].tiles[0][r / 2][2 * (r % 2)];
  }

  // A tile several items share. Each item first counts its arrival on the tile's counter (low 16 bits).
  // All but the last to arrive write their partial sums to their workspace slot and then count the write
  // (in units of written_unit, so that an early write never looks like an arrival); the last skips its
  // own write, waits until the others' writes are counted (they are running: they have arrived), adds
  // their partials to its accumulators and returns true (the caller then stores the tile). Fences order
  // the partials before the counts; the counter goes back to zero for the next launch.
  //
  // With g.fixed_reducer (split-K on the persistent grid, or stream-K), the item numbered last (which ==
  // count - 1) adds up, wherever it finishes: the others write, sync and publish the write with one
  // release add; it waits (acquire) until the counter holds all of them. Its path to the tile's store then
  // has one global round trip fewer (no arrival count). Split-K: the item with the tile's last K range,
  // which with uneven splits (split_lead) finishes last anyway; all blocks of the persistent grid are
  // resident and walk their items in increasing order, and a reducer waits only for items of smaller index
  // (the same tile's earlier splits: work = split * tiles + tile), so no wait can close a cycle. Stream-K:
  // the block that reaches the tile last (stream_k_part, gemm.h, also for why no wait closes a cycle).
  __device__ static bool fixup(state& st, finish_smem& fs, const globals& g, const segment& sg, int consumer) {
    const int rank = CS > 1 ? int(cluster_ctarank()) : 0;
    const int part = (PP ? 0 : consumer) + rank * (PP ? 1 : consumers);
    const int t = warpgroup::thread_in_group(), bar = 1 + consumer;
    const size_t slot_float4 = size_t(acc_float4) * warpgroup_threads;
    int* counter = &g.counters[sg.fix * parts + part];
    auto write_partial = [&] {
      float4* mine = g.ws + ((size_t(sg.fix) * parts + part) * g.slots + sg.which) * slot_float4;
#pragma unroll
      for (int i = 0; i < acc_float4; ++i) {
        const float2* p = acc_pair(st, i);
        __stcg(&mine[size_t(i) * warpgroup_threads + t], make_float4(p[0].x, p[0].y, p[1].x, p[1].y));
      }
    };
    auto add_partials = [&] {
      const float4* base = g.ws + (size_t(sg.fix) * parts + part) * g.slots * slot_float4;
      for (int w = 0; w < sg.count; ++w) {
        if (w == sg.which) continue;
#pragma unroll
        for (int i = 0; i < acc_float4; ++i) {
          const float4 v = __ldcg(&base[w * slot_float4 + size_t(i) * warpgroup_threads + t]);
          float2* p = acc_pair(st, i);
          p[0].x += v.x, p[0].y += v.y, p[1].x += v.z, p[1].y += v.w;
        }
      }
    };
    if (g.fixed_reducer) {
      if (sg.which != sg.count - 1) {
        write_partial();
        named_barrier_sync(bar, warpgroup_threads);
        if (t == 0) add_release_gpu(counter, 1);
        return false;
      }
      if (t == 0)
        while (load_acquire_gpu(counter) != sg.count - 1) __nanosleep(32);
      named_barrier_sync(bar, warpgroup_threads);
      add_partials();
      if (t == 0) *counter = 0;  // every other item has counted: nothing adds to it again this launch
      return true;
    }
    constexpr int written_unit = 1 << 16;  // items per tile stay far below this
    if (t == 0) fs.arrivals[consumer] = atomicAdd(counter, 1) % written_unit;
    named_barrier_sync(bar, warpgroup_threads);
    // arrivals[] is written again only at the next fixup, after both paths below have synced again
    const bool last = fs.arrivals[consumer] == sg.count - 1;
    if (!last) {
      write_partial();
      __threadfence();
      named_barrier_sync(bar, warpgroup_threads);
      if (t == 0) atomicAdd(counter, written_unit);
      return false;
    }
    if (t == 0)  // all arrivals and count - 1 writes
      while (atomicAdd(counter, 0) != sg.count + (sg.count - 1) * written_unit) __nanosleep(32);
    named_barrier_sync(bar, warpgroup_threads);
    __threadfence();
    add_partials();
    if (t == 0) *counter = 0;
    return true;
  }

  // KC's fixup: block 1 of the pair, once block 0 is done with the previous item's `part` space, stores its
  // partial sums there (st.async, counted on block 0's red.full) and is done with the item; block 0
  // announces the bytes, waits for them, adds them to its accumulators and returns true: it stores the
  // tile, and its finish() frees the space after the stores (release_part).
  __device__ static bool reduce_pair(state& st, finish_smem& fs) {
    auto& r = fs.red;
    const int t = warpgroup::thread_in_group();
    const uint32_t parity = st.red_phase;
    st.red_phase ^= 1u;
    if (cluster_ctarank() != 0) {
      wait_cluster(r.empty, parity ^ 1u);  // a fresh semaphore counts as having completed phase "-1"
      const uint32_t part = cluster_address(&fs.part[t], 0), full = cluster_address(&r.full, 0);
#pragma unroll
      for (int i = 0; i < acc_float4; ++i) {
        const float2* p = acc_pair(st, i);
        store_async_cluster(part + uint32_t(i * warpgroup_threads * sizeof(float4)),
                            make_float4(p[0].x, p[0].y, p[1].x, p[1].y), full);
      }
      return false;
    }
    if (t == 0) expect_bytes(r.full, uint32_t(sizeof(fs.part)));
    wait_cluster(r.full, parity);
#pragma unroll
    for (int i = 0; i < acc_float4; ++i) {
      const float4 v = fs.part[i * warpgroup_threads + t];
      float2* p = acc_pair(st, i);
      p[0].x += v.x, p[0].y += v.y, p[1].x += v.z, p[1].y += v.w;
    }
    return true;  // the epilogue's first named barrier orders these reads before its writes to the space
  }
  // KC, block 0, after its epilogue: once the TMA stores have read the buffers, block 1 may send the next
  // partial sums (the leader issued the stores, so its wait covers them).
  __device__ static void release_part(finish_smem& fs) {
    if (warpgroup::thread_in_group() == 0) {
      tma::wait_read<0>();
      arrive_cluster(fs.red.empty, 1);
    }
  }

  // Writes the thread's pairs of one 64 x CW chunk (pair(jb, f): a bf16x2 as uint32_t, or a float2; in the
  // accumulator fragment's order) at their swizzled offsets with stmatrix (bf16, MP_GEMM_STSM) or
  // st.shared. Through buf.at() they compiled to generic stores (ST.E, 64-bit addresses), and the epilogue
  // took ~1 % of the GEMM's time more (bench/RESULTS.md, ninth session).
  template <class Pair>
  __device__ static void write_chunk(c_tile& buf, Pair pair) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    const uint32_t base = buf.smem_addr();
    if constexpr (MP_GEMM_STSM && sizeof(OutT) == 2) {
      // Pair f of a 16 x 16 block is the lane's pair of 8 x 8 matrix f: rows + 8 * (f & 1), columns
      // + 8 * (f >> 1). Lane l addresses row l % 8 of matrix l / 8 (16 bytes: one swizzle unit).
      const int m = lane / 8, r = warp * 16 + lane % 8 + 8 * (m & 1);
#pragma unroll
      for (int jb = 0; jb < CW / 16; ++jb)
        stmatrix_x4(base + c_tile::layout::offset(r, 16 * jb + 8 * (m >> 1)), pair(jb, 0), pair(jb, 1),
                    pair(jb, 2), pair(jb, 3));
    } else {
#pragma unroll
      for (int jb = 0; jb < CW / 16; ++jb)
#pragma unroll
        for (int f = 0; f < 4; ++f) {
          const uint32_t a = base + c_tile::layout::offset(warp * 16 + lane / 4 + 8 * (f & 1),
                                                           16 * jb + 2 * (lane % 4) + 8 * (f >> 1));
          if constexpr (std::is_same_v<OutT, float>)
            st_shared_v2_f32(a, pair(jb, f));
          else
            st_shared_b32(a, pair(jb, f));
        }
    }
  }
  // N adjacent 64 x CW output chunks of a consumer (columns col, col + CW, ...) in buffers buf[0..N): wait
  // until the stores that last read those buffers are done with them, write the chunks (pair_of(j): chunk
  // j's pairs, see write_chunk), and start their TMA stores to C as one bulk group. Both consumer
  // warpgroups each write their own rows (named barrier `bar`). N = 1: the chunks take turns in the
  // c_buffers buffers; N = c_buffers: a whole tile at once (whole_tile).
  template <int N, class PairOf>
  __device__ static void store_chunks(c_tile* buf, const globals& g, int bar, int row, int col,
                                      PairOf pair_of) {
    static_assert(N >= 1 && N <= c_buffers, "store_chunks: at most one chunk per buffer");
    const bool leader = warpgroup::thread_in_group() == 0;
    if (leader) tma::wait_read<c_buffers - N>();  // the stores that last read these buffers are done
    named_barrier_sync(bar, warpgroup_threads);
    if constexpr (N > 1) pc::trace_mark(g, pc::trace_epilogue_begin);  // the whole tile (trace builds)
#pragma unroll
    for (int j = 0; j < N; ++j) write_chunk(buf[j], pair_of(j));
    fence_async_shared();  // make the generic-proxy writes visible to the TMA engine
    named_barrier_sync(bar, warpgroup_threads);
    if constexpr (N > 1) pc::trace_mark(g, pc::trace_epilogue_written);
    if (leader) {  // the N stores as one bulk group
      if (g.l2_hint >> 4) {
        const uint64_t pol = tma::l2_policy(tma::l2_priority((g.l2_hint >> 4) & 3));
#pragma unroll
        for (int j = 0; j < N; ++j) tma::store_async_hint(&g.c, buf[j], row, col + j * CW, pol);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) tma::store_async(&g.c, buf[j], row, col + j * CW);
      }
      tma::commit_group();
    }
  }
  // Chunk J of the stash (chunk chunks - deferred_chunks + J of the tile), already packed as bf16 pairs.
  template <int J>
  __device__ static void stash_chunk(state& st, finish_smem& fs, const globals& g, int consumer) {
    constexpr int C = chunks - deferred_chunks + J, h = C / (BN / CW), j = C % (BN / CW);
    store_chunks<1>(
        &fs.c[consumer][C % c_buffers], g, 1 + consumer, st.stash_row + h * 64, st.stash_col + j * CW,
        [&](int) { return [&](int jb, int f) { return st.stash[J * stash_regs + jb * 4 + f]; }; });
  }
  // The next chunk of the stash, if any (the chunk index is dispatched to a compile-time one, so the
  // stash stays in registers).
  __device__ static void drain_one(state& st, finish_smem& fs, const globals& g, int consumer) {
    if constexpr (can_defer) {
      if (st.stash_left == 0) return;
      const int next = deferred_chunks - st.stash_left;
      [&]<int... J>(std::integer_sequence<int, J...>) {
        ((next == J ? stash_chunk<J>(st, fs, g, consumer) : void()), ...);
      }(std::make_integer_sequence<int, deferred_chunks>{});
      --st.stash_left;
    }
  }
  // Pipeline hooks: after each K step's wgmma are issued, one chunk of the previous tile; at the end of the
  // block's work, whatever is left.
  __device__ static void after_compute(state& st, finish_smem& fs, const globals& g, int consumer) {
    if (st.deferred) drain_one(st, fs, g, consumer);
  }
  __device__ static void flush(state& st, finish_smem& fs, const globals& g, int consumer) {
    while (st.stash_left > 0) drain_one(st, fs, g, consumer);
  }

  __device__ static void finish(state& st, finish_smem& fs, const globals& g, const item& w, int consumer) {
#pragma unroll
    for (int h = 0; h < MH; ++h) warpgroup::fence_accumulator(st.acc[h]);
    if (w.iters == 0) return;
    if (w.count > 1) {
      bool mine;
      if constexpr (KC)
        mine = reduce_pair(st, fs);
      else
        mine = fixup(st, fs, g, w, consumer);
      pc::trace_mark(g, pc::trace_fixup_done);
      if (!mine) return;
    }
    const int2 t = w.pos;
    if constexpr (can_defer) {
      if (g.deferred && deferred_chunks > 0) {
        flush(st, fs, g, consumer);  // the previous tile's chunks (normally all out by now)
#pragma unroll
        for (int J = 0; J < deferred_chunks; ++J) {
          constexpr int first = chunks - deferred_chunks;
          const int h = (first + J) / (BN / CW), j = (first + J) % (BN / CW);
#pragma unroll
          for (int jb = 0; jb < CW / 16; ++jb)
#pragma unroll
            for (int f = 0; f < 4; ++f) {
              const __nv_bfloat162 b = __float22bfloat162_rn(st.acc[h].tiles[0][j * (CW / 16) + jb][f]);
              st.stash[J * stash_regs + jb * 4 + f] = *reinterpret_cast<const uint32_t*>(&b);
            }
        }
        st.stash_row = w.row + consumer * 64;
        st.stash_col = t.y * BN;
        st.stash_left = deferred_chunks;
      }
    }
    auto put_acc = [&](int h, int j) {  // the accumulator pairs of chunk j of slice h, in the output type
      return [&st, h, j](int jb, int f) {
        const float2 v = st.acc[h].tiles[0][j * (CW / 16) + jb][f];
        if constexpr (std::is_same_v<OutT, float>) {
          return v;
        } else {
          const __nv_bfloat162 b = __float22bfloat162_rn(v);
          return *reinterpret_cast<const uint32_t*>(&b);
        }
      };
    };
    if constexpr (whole_tile) {  // every chunk in its own buffer: written and stored at once
      store_chunks<coop_chunks>(fs.c[consumer], g, 1 + consumer, w.row + consumer * 64, t.y * BN,
                                [&](int j) { return put_acc(0, j); });
      return;
    }
    // the chunks written now: all, or those before the stash
    const int now = can_defer && g.deferred ? chunks - deferred_chunks : chunks;
#pragma unroll
    for (int h = 0; h < MH; ++h)
#pragma unroll
      for (int j = 0; j < BN / CW; ++j) {
        if (h * (BN / CW) + j >= now) break;
        store_chunks<1>(&fs.c[consumer][(h * (BN / CW) + j) % c_buffers], g, 1 + consumer,
                        w.row + (PP ? h : consumer) * 64, t.y * BN + j * CW,
                        [&](int) { return put_acc(h, j); });
      }
    if constexpr (KC)
      if (w.count > 1) release_part(fs);
  }
};

static_assert(int(l2_priority::normal) == int(tma::l2_priority::normal) &&
                  int(l2_priority::evict_first) == int(tma::l2_priority::evict_first) &&
                  int(l2_priority::evict_last) == int(tma::l2_priority::evict_last),
              "gemm.h's L2 priorities must match tile/tma.cuh's (GemmPlan's go to the kernel as numbers)");
static_assert(pc::trace_points == gemm_trace_points && pc::trace_steps == gemm_trace_times + 1 &&
                  pc::trace_step_count == gemm_trace_step_count,
              "gemm.h's trace layout must match tile/pipeline.cuh's");

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail_user("gemm: ", what, " failed: ", cudaGetErrorString(e));
}

GemmPlan make_plan(int m, int n, int k, const GemmSchedule& s, out_type out) {
  return plan_gemm(m, n, k, s, pc::device_sm_count(), out, pc::device_l2_bytes());
}

// Tensor maps are encoded once per (tile type, pointer, shape) and reused: encoding costs microseconds
// of host time, which small GEMMs would otherwise pay on every call.
template <class ST>
const CUtensorMap& cached_map(const void* p, int depth, int rows, int cols) {
  struct entry {
    const void* p;
    int d, r, c;
    CUtensorMap map;
  };
  thread_local entry cache[16];
  thread_local int next = 0;
  for (auto& e : cache)
    if (e.p == p && e.d == depth && e.r == rows && e.c == cols) return e.map;
  using T = typename ST::elem;
  entry& e = cache[next];
  next = (next + 1) % 16;
  e = {p, depth, rows, cols,
       make_tma_map<ST>(gl<T, 1, -1, -1, -1>(static_cast<T*>(const_cast<void*>(p)), 1, depth, rows, cols))};
  return e.map;
}

// The workspace for tiles that several blocks finish (split-K, stream-K): per stream in use, grow-only, the
// tile counters and the fp32 partials in two allocations. The counters are zeroed whenever their
// allocation grows, and every launch leaves the counters it used at zero, so all of them are zero at every
// launch. (They once shared one allocation, counters first: a launch with more counters than the last one
// then read the previous launch's partials as counters, found them non-zero, and left tiles unwritten.)
struct fixup_space {
  int* counters;
  float4* partials;
};
fixup_space workspace(cudaStream_t stream, size_t counters, size_t partial_float4) {
  struct buffer {
    void* p = nullptr;
    size_t bytes = 0;
    void grow(size_t want, cudaStream_t s, bool zero) {
      if (bytes >= want) return;
      if (p) check_cuda(cudaFreeAsync(p, s), "freeing the GEMM workspace");
      check_cuda(cudaMallocAsync(&p, want, s), "allocating the GEMM workspace");
      if (zero) check_cuda(cudaMemsetAsync(p, 0, want, s), "clearing the GEMM tile counters");
      bytes = want;
    }
  };
  struct entry {
    cudaStream_t s;
    buffer counters, partials;
  };
  thread_local std::vector<entry> ws;
  entry* e = nullptr;
  for (auto& x : ws)
    if (x.s == stream) e = &x;
  if (!e) {
    ws.push_back({stream, {}, {}});
    e = &ws.back();
  }
  e->counters.grow(counters * sizeof(int), stream, true);
  e->partials.grow(partial_float4 * sizeof(float4), stream, false);
  return {static_cast<int*>(e->counters.p), static_cast<float4*>(e->partials.p)};
}

// Which kernels run the K loop unrolled by the ring depth (bench/RESULTS.md, thirteenth session): the
// large shapes' whole-tile kernels and the small tiles do; the 128 x 256 kernels that hold the deferred
// epilogue's stash keep the rolled loop (unrolled, they spill).
static_assert(pc::traits<gemm_kernel<256, true, bf16, 1, false, 2, false, true>>::unroll ==
              bool(MP_PIPELINE_STAGE_UNROLL));
static_assert(pc::traits<gemm_kernel<128, false, bf16, 1, false, 1>>::unroll == bool(MP_PIPELINE_STAGE_UNROLL));
static_assert(!pc::traits<gemm_kernel<256, true, bf16, 1>>::unroll);
static_assert(pc::traits<gemm_kernel<256, true, float, 1>>::unroll == bool(MP_PIPELINE_STAGE_UNROLL));

template <int BN, bool BT, class OutT, int CS, bool PP = false, int NC = 2, bool KC = false, bool WT = false>
void run(const void* a, const void* b, void* c, int m, int n, int k, cudaStream_t stream,
         const GemmSchedule& s, const GemmPlan& p) {
  using K = gemm_kernel<BN, BT, OutT, CS, PP, NC, KC, WT>;
  typename K::globals g{};
  g.a = cached_map<typename K::a_tile>(a, 1, m, k);
  g.b = BT ? cached_map<typename K::b_box>(b, 1, n, k) : cached_map<typename K::b_box>(b, 1, k, n);
  g.c = cached_map<typename K::c_tile>(c, 1, m, n);
  g.m = m, g.n = n, g.k = k;
  g.tiles_m = ((m + K::BM - 1) / K::BM + CS - 1) / CS;
  g.tiles_n = (n + BN - 1) / BN;
  g.k_iters = (k + K::BK - 1) / K::BK;
  g.group_m = std::max(1, s.group_m);
  g.mma_pending = s.mma_pending;
  g.prefetch = s.prefetch;
  g.data_only = s.data_only;
  g.compute_only = s.compute_only;
  g.deferred = s.epilogue == epilogue_mode::deferred;
  g.trace = s.trace, g.trace_blocks = s.trace_blocks;
  g.l2_hint = int(p.l2_a) + 4 * int(p.l2_b) + 16 * int(p.l2_c);
  const KSplit ks = k_split(g.k_iters, p.splits, p.split_lead);
  g.iters_per_split = ks.per_split, g.splits = ks.splits;
  const int tiles = g.tiles_m * g.tiles_n;
  size_t fix_tiles = 0;
  if (KC) {
    MP_INTERNAL_CHECK(g.splits == 2, "gemm: the cluster K split takes exactly 2 K ranges, got ", g.splits);
  } else if (g.splits > 1) {
    fix_tiles = tiles, g.slots = g.splits;
    g.fixed_reducer = s.persistent && s.fixed_reducer;
  } else if (p.sk_tiles > 0) {
    if constexpr (!PP && CS == 1) g.grid = pc::resident_blocks<K>();
    // the plan assumed one block per SM; this is the grid
    g.sk_tiles = stream_k_tiles(tiles, g.grid, g.k_iters, s.stream_k);
    fix_tiles = g.sk_tiles;
    g.slots = g.sk_tiles > 0 ? stream_k_max_parts(g.grid, g.sk_tiles, g.k_iters) : 1;
    g.fixed_reducer = s.fixed_reducer;
  }
  g.dp_tiles = tiles - g.sk_tiles;
  if (fix_tiles > 0) {
    const auto w = workspace(stream, fix_tiles * K::parts,
                             fix_tiles * K::parts * g.slots * K::acc_float4 * warpgroup_threads);
    g.counters = w.counters, g.ws = w.partials;
  }
  const int max_blocks = s.persistent ? 0 : K::work_count(g) * K::cluster;
  if constexpr (PP)
    check_cuda(pc::launch_pingpong<K>(g, stream, max_blocks, s.overlap_launch), "the GEMM kernel launch");
  else
    check_cuda(pc::launch<K>(g, stream, max_blocks, s.overlap_launch), "the GEMM kernel launch");
}

}  // namespace

void gemm_bf16(const void* a, const void* b, void* c, int m, int n, int k, b_layout bl, out_type out,
               CUstream_st* stream, const GemmSchedule& s) {
  check_gemm_shape(m, n, k);
  if (s.trace && !MP_PIPELINE_TRACE)
    throw not_supported("gemm: the timeline trace in this build (configure with -DMP_PIPELINE_TRACE=ON)");
  if (s.overlap_launch && !MP_PIPELINE_PDL)
    throw not_supported("gemm: dependent launches in this build (configure with -DMP_PIPELINE_PDL=ON)");
  for (auto [p, name] : {std::pair{a, "A"}, std::pair{b, "B"}, std::pair<const void*, const char*>{c, "C"}})
    MP_USER_CHECK(p && reinterpret_cast<uintptr_t>(p) % 16 == 0, "gemm: ", name,
                  " must be a 16-byte aligned device pointer");
  const GemmPlan p = make_plan(m, n, k, s, out);
  const bool bt = bl == b_layout::nk;
  const bool f32 = out == out_type::f32;
  if (p.whole_tile) {  // plan_gemm gives it only to bf16 output on 128 x 256 tiles of single blocks
    MP_INTERNAL_CHECK(!f32 && p.bm == 128 && p.bn == 256 && p.cluster == 1 && !p.pingpong,
                      "gemm: a whole-tile epilogue planned for a kernel without one");
    return bt ? run<256, true, bf16, 1, false, 2, false, true>(a, b, c, m, n, k, stream, s, p)
              : run<256, false, bf16, 1, false, 2, false, true>(a, b, c, m, n, k, stream, s, p);
  }
  // One kernel shape (tile width BN, cluster size CS, ping-pong PP, consumers NC, cluster K split KC) in
  // its four instances: B stored N x K or K x N, bf16 or f32 output.
  auto launch = [&]<int BN, int CS, bool PP, int NC, bool KC>() {
    if (bt)
      return f32 ? run<BN, true, float, CS, PP, NC, KC>(a, b, c, m, n, k, stream, s, p)
                 : run<BN, true, bf16, CS, PP, NC, KC>(a, b, c, m, n, k, stream, s, p);
    return f32 ? run<BN, false, float, CS, PP, NC, KC>(a, b, c, m, n, k, stream, s, p)
               : run<BN, false, bf16, CS, PP, NC, KC>(a, b, c, m, n, k, stream, s, p);
  };
  // The kernel shapes plan_gemm can ask for (each one's four instances are compiled).
  if (p.pingpong) {  // 64 x 256 or 128 x 128 tiles, no cluster
    MP_INTERNAL_CHECK(p.bn == 256 || p.bn == 128, "gemm: no ping-pong kernel for block_n ", p.bn);
    return p.bn == 256 ? launch.template operator()<256, 1, true, 2, false>()
                       : launch.template operator()<128, 1, true, 2, false>();
  }
  if (p.bm == 64) {  // one consumer warpgroup: 64 x 64 or 64 x 128 tiles (the latter also in pairs)
    MP_INTERNAL_CHECK(p.bn == 64 || p.bn == 128, "gemm: no 64-row kernel for block_n ", p.bn);
    if (p.bn == 64) return launch.template operator()<64, 1, false, 1, false>();
    if (p.cluster == 2) return launch.template operator()<128, 2, false, 1, false>();
    if (p.cluster_reduce) return launch.template operator()<128, 1, false, 1, true>();
    return launch.template operator()<128, 1, false, 1, false>();
  }
  // two consumer warpgroups on a 128 x 128 or 128 x 256 tile, alone or in block pairs
  MP_INTERNAL_CHECK(p.bn == 256 || p.bn == 128, "gemm: no kernel for block_n ", p.bn);
  if (p.bn == 256)
    return p.cluster == 2 ? launch.template operator()<256, 2, false, 2, false>()
                          : launch.template operator()<256, 1, false, 2, false>();
  return p.cluster == 2 ? launch.template operator()<128, 2, false, 2, false>()
                        : launch.template operator()<128, 1, false, 2, false>();
}

std::string describe_gemm(int m, int n, int k, b_layout, out_type out, const GemmSchedule& s) {
  check_gemm_shape(m, n, k);
  return describe_plan(make_plan(m, n, k, s, out), s);
}

}  // namespace mp::kernels
