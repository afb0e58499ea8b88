// Tiles that several blocks finish: split-K (every tile cut into K ranges, for shapes with too few tiles
// to fill the GPU) and stream-K (the last, partial wave's tiles shared out by K ranges). How work items
// map to K ranges of tiles (segment_of; the host-side rules and their CPU tests are in gemm.h), and how
// the items that share a tile add up their fp32 partial sums in a global workspace (fixup).
#pragma once
#include "kernels/gemm.h"
#include "kernels/gemm_globals.cuh"

namespace mp::kernels {

// A work item is a K range of one tile. Items of one block are work = blockIdx.x + j * gridDim.x.
struct gemm_segment {
  int tile;     // tile index (tile_of() turns it into a position)
  int k_first;  // first K step
  int iters;    // K steps (0: an empty item, nothing to do)
  int which;    // which of the tile's `count` partial results this is
  int count;    // how many items share the tile (1: this one stores it alone)
  int fix;      // index of the tile among those shared (workspace and counter)
};

__host__ __device__ inline int gemm_work_count(const gemm_globals& g) {
  if (g.splits > 1) return g.tiles_m * g.tiles_n * g.splits;
  // stream_k_part's items j < 3 of every block (with the last wave's share, j = 2 is always empty)
  return g.dp_tiles + (g.sk_tiles > 0 ? 3 * g.grid : 0);
}

__device__ inline gemm_segment segment_of(const gemm_globals& g, int work) {
  const int tiles = g.tiles_m * g.tiles_n, I = g.k_iters;
  // Split K (KSplit, gemm.h): every split but the last takes iters_per_split steps, the last the rest.
  const KSplit ks{g.iters_per_split, g.splits};
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

// A tile several items share; `acc` is this consumer's 64 x BN accumulator, one of the tile's `Parts`
// (one per consumer warpgroup), and `arrivals` a shared int per consumer. Each item first counts its
// arrival on the tile's counter (low 16 bits). All but the last to arrive write their partial sums to
// their workspace slot and then count the write (in units of written_unit, so that an early write never
// looks like an arrival); the last skips its own write, waits until the others' writes are counted (they
// are running: they have arrived), adds their partials to its accumulators and returns true (the caller
// then stores the tile). Fences order the partials before the counts; the counter goes back to zero for
// the next launch.
//
// With g.fixed_reducer (split-K on the persistent grid, or stream-K), the item numbered last (which ==
// count - 1) adds up, wherever it finishes: the others write, sync and publish the write with one
// release add; it waits (acquire) until the counter holds all of them. Its path to the tile's store then
// has one global round trip fewer (no arrival count). Split-K: the item with the tile's last K range,
// which with uneven splits (split_lead) finishes last anyway; all blocks of the persistent grid are
// resident and walk their items in increasing order, and a reducer waits only for items of smaller index
// (the same tile's earlier splits: work = split * tiles + tile), so no wait can close a cycle. Stream-K:
// the block that reaches the tile last (stream_k_part, gemm.h, also for why no wait closes a cycle).
template <int Parts, int BN>
__device__ bool fixup(tile::rt_fl<16, BN>& acc, int* arrivals, const gemm_globals& g, const gemm_segment& sg,
                      int consumer) {
  using namespace mp::tile;
  constexpr int acc_float4 = BN / 8;  // the float4s of one thread's accumulators
  auto acc_pair = [&acc](int i) { return &acc.tiles[0][i / 2][2 * (i % 2)]; };  // float4 i's two float2
  const int part = consumer;
  const int t = warpgroup::thread_in_group(), bar = 1 + consumer;
  const size_t slot_float4 = size_t(acc_float4) * warpgroup_threads;
  int* counter = &g.counters[sg.fix * Parts + part];
  auto write_partial = [&] {
    float4* mine = g.ws + ((size_t(sg.fix) * Parts + part) * g.slots + sg.which) * slot_float4;
#pragma unroll
    for (int i = 0; i < acc_float4; ++i) {
      const float2* p = acc_pair(i);
      __stcg(&mine[size_t(i) * warpgroup_threads + t], make_float4(p[0].x, p[0].y, p[1].x, p[1].y));
    }
  };
  auto add_partials = [&] {
    const float4* base = g.ws + (size_t(sg.fix) * Parts + part) * g.slots * slot_float4;
    for (int w = 0; w < sg.count; ++w) {
      if (w == sg.which) continue;
#pragma unroll
      for (int i = 0; i < acc_float4; ++i) {
        const float4 v = __ldcg(&base[w * slot_float4 + size_t(i) * warpgroup_threads + t]);
        float2* p = acc_pair(i);
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
  if (t == 0) arrivals[consumer] = atomicAdd(counter, 1) % written_unit;
  named_barrier_sync(bar, warpgroup_threads);
  // arrivals[] is written again only at the next fixup, after both paths below have synced again
  const bool last = arrivals[consumer] == sg.count - 1;
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

}  // namespace mp::kernels
